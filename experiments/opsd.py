"""
OPSD that can work (SPEC §3 OPSD): self-distillation where the teacher is the student's own current
weights given privileged context, the student sees only the problem (opd.py, --teacher=self). Four
arms from one SFT student, 128 prompts × 1 answer per iteration, learning rate 1e-4:

    answer            the privileged context is the reference answer: the known collapse, the model
                      given the answer prefers to write it at once, and the student learns bare answers
    answer_anchor     the same, plus a KL anchor to the SFT model on the student's samples (anchor_coef)
    solution          the privileged context is a verified worked solution (the demonstration the
                      verifier accepts), every answer position graded (the solution stands in for the
                      problem's text so that prompt + answer fit the context; opd.py PRIVILEGED)
    solution_anchor   the same, plus the anchor

Greedy held-out accuracy and the worked-answer share (answers that write a step before their answer)
on --eval_problems problems, at iterations 2, 4, ..., 10, then every 5 to 30, every 10 after, up to
--iters; one plot of both over iterations, results.json, and a table.

    python experiments/opsd.py --student=out/sft
    python experiments/opsd.py --student=out/sft --anchor_coef=0.5 --iters=40
    python experiments/opsd.py --student=out/sft --quick         # a tiny run of every step (the tests)
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import (ROOT, band, evaluate, parse_study, require_checkpoint, schedule,  # noqa: E402  (this folder)
                     study_parser, train_arm)

sys.path.insert(0, ROOT)
import common as C  # noqa: E402
import opd  # noqa: E402
import train as T  # noqa: E402

ARMS = dict(answer=dict(privileged="answer", anchor=False), answer_anchor=dict(privileged="answer", anchor=True),
            solution=dict(privileged="solution", anchor=False), solution_anchor=dict(privileged="solution", anchor=True))
QUICK = dict(iters=4, eval_problems=16, set=["prompts_per_iter=4", "max_new_tokens=24", "batch_size=4",
                                             "eval_batch_size=16"])


def privileged_answers(run, privileged, n):
    """What the teacher's context asks for: the starting model's greedy answers given the privileged
    prompt instead of the problem, on the n evaluation problems: accuracy and worked share."""
    problems = run.env.problems("heldout", n)
    tokens = C.generate(run, run.raw_model, [run.tok.prompt_ids(opd.privileged_prompt(run.env, p, privileged))
                                             for p in problems])[0]
    texts = [C.response_text(run, t) for t in tokens]
    return dict(acc=sum(run.env.verify(p, t) for p, t in zip(problems, texts)) / n,
                work=sum(map(run.env.shows_work, texts)) / n)


def mean_ungraded(out_dir):
    """The mean ungraded_frac over a run's iterations: the share of answer tokens the teacher never saw."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    values = [r["ungraded_frac"] for r in rows if "ungraded_frac" in r]
    return sum(values) / max(len(values), 1)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = dict(answer="tab:red", answer_anchor="tab:orange", solution="tab:blue", solution_anchor="tab:green")
    for name, r in results.items():
        its = [p["iter"] for p in r["points"]]
        ax.plot(its, [p["acc"] for p in r["points"]], marker=".", color=colors.get(name), label=f"{name}: accuracy")
        ax.plot(its, [p["work"] for p in r["points"]], linestyle="--", color=colors.get(name),
                label=f"{name}: worked share")
    ax.set_xlabel("OPSD iteration (128 student answers each)")
    ax.set_ylabel("held-out: greedy accuracy (solid), worked-answer share (dashed)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = study_parser(__doc__, ARMS, "out/opsd")
    parser.add_argument("--iters", type=int, default=40, help="iterations per arm")
    parser.add_argument("--anchor_coef", type=float, default=1.0, help="β of the anchor arms (opd.py anchor_coef)")
    args = parse_study(parser, argv, QUICK)
    require_checkpoint("student", args.student, f"python train.py --algo sft --out_dir={args.student}")
    common = T.parse_args([f"--{kv}" for kv in args.set])
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    base = T.train(dict(common, algo="opd", init_from=args.student, teacher="self", max_iters=0, eval_interval=0,
                        checkpoint=False, plot=False, out_dir=os.path.join(args.out, "start")))
    start = evaluate(base, base.raw_model, args.eval_problems)
    print(f"student: held-out {start['acc']:.3f}, worked share {start['work']:.2f}", flush=True)
    contexts = {name: privileged_answers(base, name, args.eval_problems) for name in opd.PRIVILEGED}
    for name, c in contexts.items():
        print(f"the same model given the {name} context writes: accuracy {c['acc']:.3f}, worked share {c['work']:.2f}")
    results = {}
    for name in args.arms.split(","):
        arm = dict(common, algo="opd", teacher="self", privileged=ARMS[name]["privileged"],
                   anchor_coef=args.anchor_coef if ARMS[name]["anchor"] else 0.0)
        out_dir = os.path.join(args.out, name)
        points, _ = train_arm(arm, args.student, out_dir, schedule(args.iters), args.eval_problems, start)
        results[name] = dict(points=points, ungraded_frac=mean_ungraded(out_dir), anchor_coef=arm["anchor_coef"])
        report(results, dict(args=vars(args), student=start, privileged_greedy=contexts, arms=results,
                             wall_seconds=time.time() - t0), args)  # after every arm: a stopped study keeps them
    print(f"\nresults.json and opsd.png in {args.out} ({time.time() - t0:.0f} s)")


def report(results, record, args):
    """The tables, results.json and the plot of the arms so far."""
    print(f"\n{'arm':<16} {'anchor β':>8} {'ungraded':>8} {'best acc':>8} {'final acc':>9} {'final work':>10}"
          f"   (band ± {band(0.5, args.eval_problems):.3f} at 0.5)")
    for name, r in results.items():
        best = max(r["points"], key=lambda p: p["acc"])
        final = r["points"][-1]
        print(f"{name:<16} {r['anchor_coef']:>8.2f} {r['ungraded_frac']:>8.3f} {best['acc']:>8.3f} "
              f"{final['acc']:>9.3f} {final['work']:>10.2f}")
    its = [p["iter"] for p in next(iter(results.values()))["points"]]
    print("\nheld-out accuracy / worked share at iteration " + ", ".join(map(str, its)))
    for name, r in results.items():
        print(f"{name:<16} " + "  ".join(f"{p['acc']:.3f}/{p['work']:.2f}" for p in r["points"]))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(record, f, indent=1)
    plot(results, os.path.join(args.out, "opsd.png"))

if __name__ == "__main__":
    main()
