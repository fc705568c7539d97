"""
Sample efficiency of on-policy distillation against RL (issue 10 part 4; SPEC §3 On-policy
distillation): from one SFT checkpoint, OPD with each KL estimator, OPSD and GRPO (config/grpo.py)
for the same number of iterations, all with 128 rollouts per iteration (GRPO 16 prompts × 8, OPD
128 prompts × 1), greedy held-out accuracy every --eval_every iterations. It prints, per arm, the
iterations, rollout tokens and training wall time (evaluation excluded) to reach a target accuracy
(default: halfway from the student's start to the teacher's), writes results.json and one plot,
accuracy_vs_rollout_tokens.png, into --out.

    python experiments/opd_vs_grpo.py --student=out/sft --teacher=out/teacher
    python experiments/opd_vs_grpo.py --student=out/sft --teacher=out/teacher --iters=100 --target=0.6
    python experiments/opd_vs_grpo.py --student=out/sft --teacher=out/teacher --arms=opd_full,grpo --set device=cuda

--set key=value (repeatable) passes a train.py key to every arm (e.g. eval_problems=500).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train as T  # noqa: E402  (after the path: the script runs from anywhere)

ARMS = dict(
    opd_full=dict(algo="opd", kl_estimator="full"),
    opd_sampled=dict(algo="opd", kl_estimator="sampled"),
    opd_topk=dict(algo="opd", kl_estimator="topk"),
    opsd=dict(algo="opd", teacher="self"),
    grpo=dict(T.parse_args([os.path.join(ROOT, "config", "grpo.py")]), algo="grpo", group_size=8),  # 16 × 8 = 128
)


def held_out_accuracy(model_dir, out_dir, common):
    """Greedy held-out accuracy of a checkpoint, measured as every arm measures it (its iteration 0)."""
    run = T.train(dict(common, algo="opd", init_from=model_dir, teacher="self", max_iters=0, eval_interval=1,
                       out_dir=out_dir))
    return run.metrics["heldout_acc"]


def curve(out_dir, arm):
    """[(iteration, rollout tokens so far, training seconds so far, held-out accuracy)] of one run."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    tokens = seconds = 0.0
    per_iter = {}
    for r in rows:
        if "loss" in r:
            # GRPO logs the mean answer length of its P × G rollouts; OPD logs the total
            tokens += r["rollout_tokens"] if "rollout_tokens" in r else r["len_mean"] * arm["prompts_per_iter"] * arm["group_size"]
            seconds += r["iter_time"]
            per_iter[r["iter"]] = (tokens, seconds)
    per_iter[0] = (0.0, 0.0)
    return [(r["iter"], *per_iter[r["iter"]], r["heldout_acc"]) for r in rows if "heldout_acc" in r]


def first_reaching(points, target):
    return next(((it, tokens, seconds) for it, tokens, seconds, acc in points if acc >= target), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", default="out/sft")
    parser.add_argument("--teacher", default="out/teacher")
    parser.add_argument("--iters", type=int, default=60, help="iterations per arm (the fixed budget)")
    parser.add_argument("--eval_every", type=int, default=5)
    parser.add_argument("--target", type=float, default=None, help="held-out accuracy to reach (default: halfway)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="out/opd_vs_grpo")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every arm")
    args = parser.parse_args()
    common = T.parse_args([f"--{kv}" for kv in args.set])
    os.makedirs(args.out, exist_ok=True)

    start = held_out_accuracy(args.student, os.path.join(args.out, "start"), common)
    teacher = held_out_accuracy(args.teacher, os.path.join(args.out, "teacher"), common)
    target = args.target if args.target is not None else (start + teacher) / 2
    print(f"held-out accuracy: student {start:.3f}, teacher {teacher:.3f}; target {target:.3f}")

    results = {}
    for name in args.arms.split(","):
        arm = dict(ARMS[name], **({"teacher": args.teacher} if name.startswith("opd") else {}))
        out_dir = os.path.join(args.out, name)
        T.train(dict(arm, init_from=args.student, max_iters=args.iters, eval_interval=args.eval_every,
                     out_dir=out_dir, checkpoint=False, **common))
        arm = T.make_config(dict(arm, **common))  # the run's own values (prompts_per_iter, group_size)
        points = curve(out_dir, arm)
        results[name] = dict(points=points, reached=first_reaching(points, target))

    print(f"\n{'arm':<12} {'final acc':>9} {'iterations':>10} {'rollout tokens':>14} {'seconds':>8}   (to reach {target:.3f})")
    for name, r in results.items():
        it, tokens, seconds = r["reached"] or ("-", float("nan"), float("nan"))
        print(f"{name:<12} {r['points'][-1][3]:>9.3f} {it:>10} {tokens:>14,.0f} {seconds:>8.1f}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(student=start, teacher=teacher, target=target, iters=args.iters, arms=results), f, indent=1)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        ax.plot([p[1] for p in r["points"]], [p[3] for p in r["points"]], marker=".", label=name)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.3f}")
    ax.axhline(teacher, color="black", linestyle=":", linewidth=1, label=f"teacher {teacher:.3f}")
    ax.set_xlabel("rollout tokens")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "accuracy_vs_rollout_tokens.png"), dpi=100)
    print(f"results.json and accuracy_vs_rollout_tokens.png in {args.out}")


if __name__ == "__main__":
    main()
