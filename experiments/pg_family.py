"""
The policy-gradient family side by side (docs/policy-gradient.md): from one SFT checkpoint, on the
default task, GRPO, Dr. GRPO, DAPO, GSPO and CISPO as their recipes in config/, and edge prompt
sampling on top of one of them, all with the same budget per iteration (--prompts × --group_size) in
an off-policy setting where the ratio and its clip act: every rollout batch is split into
--minibatches optimizer steps (4: π_θ moves away from π_old after the first step; at 1 the ratio is
always 1 and the five differ only in their advantages and aggregation). Greedy held-out accuracy on
--eval_problems problems every --eval_every iterations, against the rollout tokens decoded so far
(DAPO's dynamic sampling decodes extra rollouts: they are counted). Prints a table, writes
results.json and accuracy_vs_rollout_tokens.png into --out.

    python experiments/pg_family.py --sft=out/sft
    python experiments/pg_family.py --sft=out/sft --arms=grpo,cispo --iters=40 --set seed=1338

The band of an accuracy is the binomial one, ± 2·√(p(1 − p)/n). Runs already finished in --out are
read, not run again.
"""

import argparse
import json
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train as T  # noqa: E402  (after the path: the script runs from anywhere)


def recipe(name, **extra):
    return dict(T.parse_args([os.path.join(ROOT, "config", f"{name}.py")]), **extra)


ARMS = dict(  # in the order they run: the first finish first
    grpo=recipe("grpo"),
    cispo=recipe("cispo"),
    gspo=recipe("gspo"),
    dapo=recipe("dapo"),
    dr_grpo=recipe("dr_grpo"),
    # edge sampling on GRPO's recipe, a pool small enough that prompts come back (at the defaults,
    # 8 prompts × 12 iterations: each of the 32 is drawn 3 times)
    grpo_edge=recipe("grpo", prompt_sampling="edge", prompt_pool=32),
)


def curve(out_dir):
    """[(iteration, rollout tokens so far, held-out accuracy, clip_frac, ratio_dev)] of one run; the
    last two are the means over the iterations since the previous evaluation."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    tokens, points, clips, devs = 0.0, [], [], []
    for r in rows:
        if "loss" in r:  # decoded tokens of the iteration (extra rollouts included), this rank's clock
            tokens += r["decode_tok_per_s"] * r["time_decode"]
            clips.append(r["clip_frac"])
            devs.append(r["ratio_dev"])
        if "heldout_acc" in r:
            mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
            points.append((r["iter"], tokens, r["heldout_acc"], mean(clips), mean(devs)))
            clips, devs = [], []
    return points


def band(p, n):
    return 2 * math.sqrt(max(p * (1 - p), 0.0) / n)


def plot(results, n, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, points in results.items():
        x = [p[1] / 1e3 for p in points]
        y = [p[2] for p in points]
        ax.errorbar(x, y, yerr=[band(v, n) for v in y], marker="o", capsize=3, label=arm)
    ax.set_xlabel("rollout tokens decoded (thousands)")
    ax.set_ylabel(f"greedy held-out accuracy ({n} problems, ± 2 SE)")
    ax.set_title("One SFT checkpoint, off-policy steps (--minibatches per rollout batch)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", required=True, help="the SFT checkpoint every arm starts from")
    parser.add_argument("--out", default="out/pg_family", help="one directory per arm, results.json and the plot")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--iters", type=int, default=12, help="iterations per arm")
    parser.add_argument("--eval_every", type=int, default=6, help="iterations between held-out evaluations")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    parser.add_argument("--group_size", type=int, default=8, help="answers per prompt")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation (greedy)")
    parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps per rollout batch (1: on-policy)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every arm")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    common = dict(init_from=args.sft, max_iters=args.iters, eval_interval=args.eval_every, prompts_per_iter=args.prompts,
                  group_size=args.group_size,
                  eval_problems=args.eval_problems, eval_samples=0, minibatches=args.minibatches)
    common.update(T.parse_args([f"--{kv}" for kv in args.set]))
    results = {}
    for arm in args.arms.split(","):
        out_dir = os.path.join(args.out, arm)
        done = os.path.exists(os.path.join(out_dir, "metrics.jsonl")) and any(
            p[0] == args.iters for p in curve(out_dir))
        if not done:
            T.train(dict(ARMS[arm], **common, out_dir=out_dir))
        results[arm] = curve(out_dir)
    n = args.eval_problems
    print(f"| arm | held-out accuracy at {args.iters} it. (± 2 SE, {n} problems) | rollout tokens | "
          f"clip_frac | ratio_dev |")
    print("|---|---|---|---|---|")
    for arm, points in results.items():
        it, tokens, acc, clip, dev = points[-1]
        print(f"| {arm} | {acc:.3f} ± {band(acc, n):.3f} (start {points[0][2]:.3f}) | {tokens:,.0f} | "
              f"{clip:.4f} | {dev:.3f} |")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(settings=common, results=results), f, indent=1)
    plot(results, n, os.path.join(args.out, "accuracy_vs_rollout_tokens.png"))


if __name__ == "__main__":
    main()
