"""
OPSD that can work (SPEC §3 OPSD): self-distillation where the teacher is the student's own current
weights given privileged context, the student sees only the problem (lab/opsd.py, --algo opsd). Seven
OPSD arms and two controls, 128 sampled answers (SFT: rows) per update, learning rate 1e-4
(constant after 5 warm-up iterations), the first four from the SFT student:

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
    reader_sft        the control for "dense ground truth teaches": SFT from the reader on the verified
                      solutions OPSD's teacher reads, problem -> solution, for the problems OPSD's
                      iterations draw (the same seed: the same problems), 128 rows per update drawn at
                      random from them (with replacement), as many updates as the OPSD arms
    reader_grpo       the control for "RL selects": GRPO from the reader (config/grpo.py, 16 × 8)

Every arm runs for each of --seeds; with the reader arms each seed makes its own reader (its SFT is
seeded too), and a seed's arms share it, so arms are compared paired per seed.

Greedy held-out accuracy and the worked-answer share (answers that write a step before their answer)
on --eval_problems problems, at iterations 2, 4, ..., 10, then every 5 to 30, every 10 after, up to
--iters; one plot of both over iterations, results.json, and a table.

    python experiments/opsd.py --student=out/sft
    python experiments/opsd.py --student=out/sft --arms=reader,reader_anchor,reader_frozen,reader_sft,reader_grpo
    python experiments/opsd.py --student=out/sft --anchor_coef=0.5 --iters=40 --seeds=1337
    python experiments/opsd.py --student=out/sft --quick         # a tiny run of every step (the tests)

An arm's start is evaluated once: the student for the first four, the seed's reader for the others.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import (ARMS as DISTILL_ARMS, ROOT, evaluate, parse_study, require_checkpoint,  # noqa: E402  (this folder)
                     schedule, study_parser, train_arm)

sys.path.insert(0, ROOT)
from nanopost import bands  # noqa: E402
import envs  # noqa: E402
from nanopost import options  # noqa: E402
import train as T  # noqa: E402
from nanopost.rollouts import generate, response_text, shard_problems, shard_size  # noqa: E402

ARMS = dict(answer=dict(privileged="answer", anchor=False), answer_anchor=dict(privileged="answer", anchor=True),
            solution=dict(privileged="solution", anchor=False), solution_anchor=dict(privileged="solution", anchor=True),
            reader=dict(privileged="solution", anchor=False, reader=True),
            reader_anchor=dict(privileged="solution", anchor=True, reader=True),
            reader_frozen=dict(privileged="solution", anchor=False, reader=True, frozen=True),
            reader_sft=dict(reader=True, control="sft"), reader_grpo=dict(reader=True, control="grpo"))
QUICK = dict(iters=4, eval_problems=16, reader_iters=2, seeds="1",
             set=["prompts_per_iter=4", "max_new_tokens=24", "batch_size=4", "eval_batch_size=16"])
QUICK_GRPO = dict(prompts_per_iter=2, group_size=2, eval_samples=0)
# the SFT control: OPSD's learning rate and warm-up, 128 rows (OPSD's prompts per iteration) per update
SOLUTION_SFT = dict(algo="sft", learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, eval_interval=0)
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


def make_reader(base, args, common, out):
    """SFT the student on reader_rows for --reader_iters iterations (seeded by common's seed); returns
    the checkpoint's directory."""
    out_dir = os.path.join(out, "reader_model")  # (not an arm's name)
    path = os.path.join(out, "reader_rows.jsonl")
    with open(path, "w") as f:
        for row in reader_rows(base, max(READER["batch_size"] * args.reader_iters, 64)):
            f.write(json.dumps(row) + "\n")
    shared = {k: v for k, v in common.items() if k in options.DEFAULTS}  # (--set keys of every algorithm: SFT's too)
    T.train(dict(shared, **READER, data=path, init_from=args.student, max_iters=args.reader_iters, plot=False,
                 out_dir=out_dir, overwrite=True))  # (the study's own directory: a rerun replaces it)
    return out_dir


def solution_rows(run, iters, path):
    """The SFT control's data, written to path: every problem OPSD's first `iters` iterations draw
    under run's seed (its rollout shards, rollouts.shard_problems) -> the verified worked solution its
    teacher reads in the privileged context; then held-out rows for SFT's validation loss, exactly
    as many as sft.py takes from the end (so every training row is an OPSD problem). Returns
    (rows written for training, val_examples to pass)."""
    n_shards = run.cfg["prompts_per_iter"] // shard_size(run)
    problems = [p for it in range(iters) for s in range(n_shards) for p in shard_problems(run, it, s)[0]]
    n_val = max(1, len(problems) // 19)  # sft.py holds out min(val_examples, rows // 20): this many
    with open(path, "w") as f:
        for p in problems + run.env.problems("heldout", n_val, seed=11):
            f.write(json.dumps(dict(prompt=p["prompt"], completion=run.env.solve(p))) + "\n")
    return len(problems), n_val


def arm_config(name, args, common, student, out):
    """The train.py keys of arm `name` from `student` (its seed in common)."""
    spec = ARMS[name]
    if spec.get("control") == "grpo":
        return DISTILL_ARMS["grpo"] | common | (QUICK_GRPO if args.quick else {})
    if spec.get("control") == "sft":
        path = os.path.join(out, "solution_rows.jsonl")
        start = start_run(common, student, os.path.join(out, "opsd_problems"))
        _, n_val = solution_rows(start, args.iters, path)
        return dict({k: v for k, v in common.items() if k in options.DEFAULTS}, **SOLUTION_SFT, data=path,
                    val_examples=n_val, batch_size=start.cfg["prompts_per_iter"])
    return dict(common, algo="opsd", teacher=student if spec.get("frozen") else "self", privileged=spec["privileged"],
                anchor_coef=args.anchor_coef if spec["anchor"] else 0.0)


def start_run(common, checkpoint, out_dir):
    """An OPSD run of 0 iterations: the checkpoint loaded with the task, to evaluate a start."""
    return T.train(dict(common, algo="opsd", init_from=checkpoint, max_iters=0, eval_interval=0,
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


COLOURS = dict(answer="tab:red", answer_anchor="tab:orange", solution="tab:brown", solution_anchor="tab:pink",
               reader="tab:purple", reader_anchor="tab:blue", reader_frozen="tab:cyan", reader_sft="tab:green",
               reader_grpo="black")


def plot(results, n, path):
    """Accuracy and worked share against iterations, one line per arm (the seeds' mean, its band
    shaded: bands.envelope): the arms from the SFT student on the left, from the reader on the right."""
    from experiments.study import band_line, pyplot, save_figure
    groups = [[a for a in results if not ARMS[a].get("reader")], [a for a in results if ARMS[a].get("reader")]]
    groups = [g for g in groups if g]
    fig, axes = pyplot().subplots(2, len(groups), figsize=(6.5 * len(groups), 7.5), squeeze=False)
    for col, names in enumerate(groups):
        for row, (key, label) in enumerate((("acc", "held-out greedy accuracy"), ("work", "worked-answer share"))):
            ax = axes[row][col]
            for name in names:
                curves = [[(p["iter"], p[key]) for p in s["points"]] for s in results[name]]
                band_line(ax, curves, COLOURS[name], f"{name} ({len(curves)} seeds)" if len(curves) > 1 else name,
                          n if key == "acc" else None, top=1.0, marker=".")
            ax.set_ylim(0, 1)
            ax.set_ylabel(label)
            ax.set_xlabel("iteration (128 sampled answers, or 128 SFT rows, each)")
            ax.legend(fontsize=7)
        axes[0][col].set_title("from the SFT student" if not ARMS[names[0]].get("reader")
                               else "from the reader (each seed its own reader)", fontsize=9)
    save_figure(fig, path)


def main(argv=None):
    parser = study_parser(__doc__, ARMS, "out/opsd")
    parser.add_argument("--iters", type=int, default=40, help="iterations per arm")
    parser.add_argument("--anchor_coef", type=float, default=1.0, help="β of the anchor arms (lab/opsd.py anchor_coef)")
    parser.add_argument("--reader_iters", type=int, default=300, help="SFT iterations that teach the reader arms' "
                        "student to read a reference solution")
    parser.add_argument("--seeds", default="1337,1338,1339", help="comma-separated training seeds (each makes its "
                        "own reader)")
    args = parse_study(parser, argv, QUICK)
    require_checkpoint("student", args.student, f"python train.py --algo sft --out_dir={args.student}")
    common = options.parse_args([f"--{kv}" for kv in args.set])
    names = args.arms.split(",")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    base = start_run(common, args.student, os.path.join(args.out, "start"))
    student = evaluate(base, base.raw_model, args.eval_problems)
    print(f"student: held-out {student['acc']:.3f}, worked share {student['work']:.2f}", flush=True)
    contexts = {name: privileged_answers(base, name, args.eval_problems) for name in envs.PRIVILEGED}
    for name, c in contexts.items():
        print(f"the same model given the {name} context writes: accuracy {c['acc']:.3f}, worked share {c['work']:.2f}")
    results, readers = {name: [] for name in names}, {}
    for seed in (int(s) for s in args.seeds.split(",")):  # every arm of a seed, then the next seed
        seeded, out = dict(common, seed=seed), os.path.join(args.out, f"seed{seed}")
        os.makedirs(out, exist_ok=True)
        starts = {args.student: student}
        if any(ARMS[name].get("reader") for name in names):
            reader = make_reader(base, args, seeded, out)
            after = start_run(seeded, reader, os.path.join(out, "reader_start"))
            starts[reader] = evaluate(after, after.raw_model, args.eval_problems)
            readers[seed] = dict(starts[reader], solution_context=privileged_answers(after, "solution", args.eval_problems))
            print(f"seed {seed}'s reader: held-out {starts[reader]['acc']:.3f}, worked share {starts[reader]['work']:.2f}; "
                  f"given the solution context: accuracy {readers[seed]['solution_context']['acc']:.3f}, worked share "
                  f"{readers[seed]['solution_context']['work']:.2f}", flush=True)
        for name in names:
            start_from = reader if ARMS[name].get("reader") else args.student
            arm = arm_config(name, args, seeded, start_from, out)
            out_dir = os.path.join(out, name)
            points, _ = train_arm(arm, start_from, out_dir, schedule(args.iters), args.eval_problems, starts[start_from])
            results[name].append(dict(seed=seed, points=points, anchor_coef=arm.get("anchor_coef", 0.0),
                                      ungraded_frac=mean_ungraded(out_dir) if arm["algo"] == "opsd" else None))
            report({k: v for k, v in results.items() if v}, dict(
                args=vars(args), student=student, privileged_greedy=contexts, readers=readers, arms=results,
                wall_seconds=time.time() - t0), args)
    print(f"\nresults.json and opsd.png in {args.out} ({time.time() - t0:.0f} s)")


def report(results, record, args):
    """The tables, results.json and the plot of the runs so far: per arm its seeds' accuracy at the
    last iteration (the band across seeds: bands.cell), its best, its worked share; then each reader
    arm against reader_grpo and reader_sft, paired per seed (the same reader, the same problems)."""
    n = args.eval_problems
    print(f"\n{'arm':<16} {'seeds':>5} {'anchor β':>8} {'ungraded':>8} {'final acc':>24} {'best acc':>9} {'work':>5}")
    for name, runs in results.items():
        final = [r["points"][-1] for r in runs]
        ungraded = [r["ungraded_frac"] for r in runs if r["ungraded_frac"] is not None]
        print(f"{name:<16} {len(runs):>5} {runs[0]['anchor_coef']:>8.2f} "
              f"{(f'{sum(ungraded) / len(ungraded):.3f}' if ungraded else '–'):>8} "
              f"{bands.cell([p['acc'] for p in final], n):>24} {max(p['acc'] for r in runs for p in r['points']):>9.3f} "
              f"{sum(p['work'] for p in final) / len(final):>5.2f}")
    for control in ("reader_grpo", "reader_sft"):
        for name in (a for a in results if ARMS[a].get("reader") and a != control and control in results):
            seeds = {r["seed"]: r["points"][-1]["acc"] for r in results[control]}
            diffs = [r["points"][-1]["acc"] - seeds[r["seed"]] for r in results[name] if r["seed"] in seeds]
            if diffs:
                mean, half = bands.paired_across_seeds(diffs, None)  # (no per-problem results kept)
                spread = f"± {half:.3f}" if half is not None else "(per seed: " + ", ".join(f"{d:+.3f}" for d in diffs) + ")"
                print(f"{name} − {control} at the last iteration, paired per seed: {mean:+.3f} {spread}")
    print("\nheld-out accuracy / worked share at each evaluation, per seed")
    for name, runs in results.items():
        for r in runs:
            print(f"{name:<16} {r['seed']:>5} " + "  ".join(f"{p['iter']}: {p['acc']:.3f}/{p['work']:.2f}" for p in r["points"]))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(record, f, indent=1)
    plot(results, n, os.path.join(args.out, "opsd.png"))

if __name__ == "__main__":
    main()
