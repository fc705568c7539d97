"""
OPSD that can work (SPEC §3 OPSD): self-distillation where the teacher is the student's own current
weights given privileged context, the student sees only the problem (opd.py, --teacher=self). Seven
arms, 128 prompts × 1 answer per iteration, learning rate 1e-4, the first four from the SFT student:

    answer            the privileged context is the reference answer: the known collapse, the model
                      given the answer prefers to write it at once, and the student learns bare answers
    answer_anchor     the same, plus a KL anchor to the SFT model on the student's samples (anchor_coef)
    solution          the privileged context is a verified worked solution (the demonstration the
                      verifier accepts), every answer position graded (the solution stands in for the
                      problem's text so that prompt + answer fit the context; envs.PRIVILEGED)
    solution_anchor   the same, plus the anchor
    reader            the solution context, from a student that has learnt to read a reference: the
                      student and the teacher it makes never saw a privileged prompt in SFT, and given
                      one they answer bare (measured first); so before this arm the student gets
                      --reader_iters more SFT iterations on a half-and-half mix of the SFT task and
                      (reference solution -> that worked answer) rows, and the arm starts from there
    reader_anchor     the same, plus the anchor
    reader_frozen     the same as reader, but the teacher is the reader's starting weights, frozen (a
                      checkpoint teacher given the privileged prompt): it cannot drift with the student

Greedy held-out accuracy and the worked-answer share (answers that write a step before their answer)
on --eval_problems problems, at iterations 2, 4, ..., 10, then every 5 to 30, every 10 after, up to
--iters; one plot of both over iterations, results.json, and a table.

    python experiments/opsd.py --student=out/sft
    python experiments/opsd.py --student=out/sft --anchor_coef=0.5 --iters=40
    python experiments/opsd.py --student=out/sft --quick         # a tiny run of every step (the tests)

An arm's start is evaluated once: the student for the first four, the reader for the last three.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import (ROOT, band, evaluate, parse_study, require_checkpoint, schedule,  # noqa: E402  (this folder)
                     study_parser, train_arm)

sys.path.insert(0, ROOT)
import envs  # noqa: E402
import options  # noqa: E402
import train as T  # noqa: E402
from rollouts import generate, response_text  # noqa: E402

ARMS = dict(answer=dict(privileged="answer", anchor=False), answer_anchor=dict(privileged="answer", anchor=True),
            solution=dict(privileged="solution", anchor=False), solution_anchor=dict(privileged="solution", anchor=True),
            reader=dict(privileged="solution", anchor=False, reader=True),
            reader_anchor=dict(privileged="solution", anchor=True, reader=True),
            reader_frozen=dict(privileged="solution", anchor=False, reader=True, frozen=True))
QUICK = dict(iters=4, eval_problems=16, reader_iters=2, set=["prompts_per_iter=4", "max_new_tokens=24", "batch_size=4",
                                                             "eval_batch_size=16"])
# the reader's SFT: continued from the student at a tenth of SFT's peak learning rate
READER = dict(algo="sft", learning_rate=3e-4, min_lr=3e-5, warmup_iters=10, batch_size=32, eval_interval=0)


def reader_rows(run, n):
    """n SFT rows, alternately the SFT task's own (the problem -> the environment's demonstration,
    bare or worked as in SFT) and the solution context -> the worked answer it spells out."""
    rows = []
    for i, problem in enumerate(run.env.problems("train", n, seed=7)):
        if i % 2:
            rows.append(dict(prompt=envs.privileged_prompt(run.env, problem, "solution"), completion=run.env.solve(problem)))
        else:
            rows.append(dict(prompt=problem["prompt"], completion=run.env.demonstration(problem)))
    return rows


def make_reader(base, args, common):
    """SFT the student on reader_rows for --reader_iters iterations; returns the checkpoint's directory."""
    out_dir = os.path.join(args.out, "reader_sft")
    path = os.path.join(args.out, "reader_rows.jsonl")
    with open(path, "w") as f:
        for row in reader_rows(base, max(READER["batch_size"] * args.reader_iters, 64)):
            f.write(json.dumps(row) + "\n")
    shared = {k: v for k, v in common.items() if k in options.DEFAULTS}  # (--set keys of every algorithm: SFT's too)
    T.train(dict(shared, **READER, data=path, init_from=args.student, max_iters=args.reader_iters, plot=False,
                 out_dir=out_dir, overwrite=True))  # (the study's own directory: a rerun replaces it)
    return out_dir


def start_run(common, checkpoint, out_dir):
    """An OPSD run of 0 iterations: the checkpoint loaded with the task, to evaluate a start."""
    return T.train(dict(common, algo="opd", init_from=checkpoint, teacher="self", max_iters=0, eval_interval=0,
                        checkpoint=False, plot=False, out_dir=out_dir))


def privileged_answers(run, privileged, n):
    """What the teacher's context asks for: the starting model's greedy answers given the privileged
    prompt instead of the problem, on the n evaluation problems: accuracy and worked share."""
    problems = run.env.problems("heldout", n)
    tokens = generate(run, run.raw_model, [run.tok.prompt_ids(envs.privileged_prompt(run.env, p, privileged))
                                             for p in problems])[0]
    texts = [response_text(run, t) for t in tokens]
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
    fig, ax = plt.subplots(figsize=(11, 4.8))
    colors = dict(answer="tab:red", answer_anchor="tab:orange", solution="tab:blue", solution_anchor="tab:green",
                  reader="tab:purple", reader_anchor="tab:brown", reader_frozen="tab:olive")
    for name, r in results.items():
        its = [p["iter"] for p in r["points"]]
        ax.plot(its, [p["acc"] for p in r["points"]], marker=".", color=colors.get(name), label=f"{name}: accuracy")
        ax.plot(its, [p["work"] for p in r["points"]], linestyle="--", color=colors.get(name),
                label=f"{name}: worked share")
    ax.set_xlabel("OPSD iteration (128 student answers each)")
    ax.set_ylabel("held-out greedy accuracy (solid),\nworked-answer share (dashed)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the axes: no line hidden
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = study_parser(__doc__, ARMS, "out/opsd")
    parser.add_argument("--iters", type=int, default=40, help="iterations per arm")
    parser.add_argument("--anchor_coef", type=float, default=1.0, help="β of the anchor arms (opd.py anchor_coef)")
    parser.add_argument("--reader_iters", type=int, default=300, help="SFT iterations that teach the reader arms' "
                        "student to read a reference solution")
    args = parse_study(parser, argv, QUICK)
    require_checkpoint("student", args.student, f"python train.py --algo sft --out_dir={args.student}")
    common = options.parse_args([f"--{kv}" for kv in args.set])
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    base = start_run(common, args.student, os.path.join(args.out, "start"))
    starts = {args.student: evaluate(base, base.raw_model, args.eval_problems)}
    print(f"student: held-out {starts[args.student]['acc']:.3f}, worked share {starts[args.student]['work']:.2f}", flush=True)
    contexts = {name: privileged_answers(base, name, args.eval_problems) for name in envs.PRIVILEGED}
    for name, c in contexts.items():
        print(f"the same model given the {name} context writes: accuracy {c['acc']:.3f}, worked share {c['work']:.2f}")
    names = args.arms.split(",")
    reader = None
    if any(ARMS[name].get("reader") for name in names):
        reader = make_reader(base, args, common)
        after = start_run(common, reader, os.path.join(args.out, "reader_start"))
        starts[reader] = evaluate(after, after.raw_model, args.eval_problems)
        contexts["reader: solution"] = privileged_answers(after, "solution", args.eval_problems)
        print(f"the reader: held-out {starts[reader]['acc']:.3f}, worked share {starts[reader]['work']:.2f}; given the "
              f"solution context: accuracy {contexts['reader: solution']['acc']:.3f}, worked share "
              f"{contexts['reader: solution']['work']:.2f}", flush=True)
    results = {}
    for name in names:
        student = reader if ARMS[name].get("reader") else args.student
        teacher = student if ARMS[name].get("frozen") else "self"
        arm = dict(common, algo="opd", teacher=teacher, privileged=ARMS[name]["privileged"],
                   anchor_coef=args.anchor_coef if ARMS[name]["anchor"] else 0.0)
        out_dir = os.path.join(args.out, name)
        points, _ = train_arm(arm, student, out_dir, schedule(args.iters), args.eval_problems, starts[student])
        results[name] = dict(points=points, ungraded_frac=mean_ungraded(out_dir), anchor_coef=arm["anchor_coef"])
        report(results, dict(args=vars(args), student=starts[args.student], reader=starts.get(reader),
                             privileged_greedy=contexts, arms=results, wall_seconds=time.time() - t0), args)
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
