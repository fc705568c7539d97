"""
Reward the outcome, constrain the process (SPEC §3 RLVP, §4): from one SFT
checkpoint of the calculator environment (--env=calculator), GRPO with four rewards side by side,
the same iterations each:

    outcome         the verifier's reward alone (--algo grpo)
    penalty         outcome + path penalty: R = O + β·Φ, Φ = −λ per rule broken (rlvp, rlvp_bonus=0)
    partial_credit  outcome + penalty + partial credit: +μ per compliant step too (rlvp)
    penalty_only    the path penalty without the outcome (--algo rlvp --path_only=True, rlvp_bonus=0): the
                    inaction trap the chapter warns of, where doing nothing is the safest policy

The rules (envs.Calculator.path_signals): a call that does several operations at once (a shortcut
the verifier cannot see) and an answer no tool computed are violations; a one-operation call that
computes the next step and an answer copied from the last result are compliant. Per iteration it
records violations per episode, the rollouts' success rate and the share of all-fail groups (the
chapter: 3.71 → 0.66 violations per episode, 65% → 8% all-fail groups); every --eval_every
iterations the greedy held-out accuracy. It writes results.json and agentic.png into --out.

    python experiments/agentic.py                                   # trains out/agentic/sft first
    python experiments/agentic.py --init_from=out/calc_sft --iters=60 --arms=outcome,partial_credit
    python experiments/agentic.py --set rlvp_beta=0.3 --set eval_problems=500

--set key=value (repeatable) passes a train.py key to every run (the SFT run takes the keys it knows).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import options  # noqa: E402  (after the path: the script runs from anywhere)
import train as T  # noqa: E402
from experiments.study import pyplot, save_figure  # noqa: E402

ARMS = dict(
    outcome=dict(algo="grpo"),
    penalty=dict(algo="rlvp", rlvp_bonus=0.0),
    partial_credit=dict(algo="rlvp"),
    penalty_only=dict(algo="rlvp", path_only=True, rlvp_bonus=0.0),
)
FIGURES = ("violations_per_episode", "success", "all_fail_frac", "heldout_acc")


def sft_checkpoint(args, common):
    """--init_from when it holds a checkpoint, else an SFT run of --sft_iters on the calculator task."""
    if args.init_from and os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        return args.init_from
    out = os.path.join(args.out, "sft")
    if not os.path.isfile(os.path.join(out, "ckpt.pt")):
        known = options.make_config({"algo": "sft"})
        T.train(dict({k: v for k, v in common.items() if k in known}, algo="sft", env="calculator",
                     max_iters=args.sft_iters, eval_interval=args.sft_iters, out_dir=out))
    return out


def curve(out_dir):
    """[{iter, violations_per_episode, success, all_fail_frac, heldout_acc (at evaluations)}] of one run."""
    points = {}
    for row in map(json.loads, open(os.path.join(out_dir, "metrics.jsonl"))):
        point = points.setdefault(row["iter"], {"iter": row["iter"]})
        if "reward" in row:  # a training row: the iteration's first rollout (a fair sample of the policy)
            point.update(violations_per_episode=row["violations_per_episode"], success=row["reward"],
                         all_fail_frac=row["all_fail_frac"])
        if "heldout_acc" in row:
            point["heldout_acc"] = row["heldout_acc"]
    return [points[i] for i in sorted(points)]


def plot(results, path):
    fig, axes = pyplot().subplots(1, len(FIGURES), figsize=(4 * len(FIGURES), 3.2))
    for ax, key in zip(axes, FIGURES):
        for arm, result in results["arms"].items():
            pts = [(p["iter"], p[key]) for p in result["curve"] if key in p]
            if pts:
                ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None, label=arm)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
    axes[0].legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="an SFT checkpoint of --env=calculator (default: train one)")
    parser.add_argument("--sft_iters", type=int, default=1000)
    parser.add_argument("--iters", type=int, default=60, help="GRPO iterations per arm")
    parser.add_argument("--eval_every", type=int, default=20)
    parser.add_argument("--eval_problems", type=int, default=200)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="out/agentic")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every run")
    args = parser.parse_args()
    common = dict(options.parse_args([f"--{kv}" for kv in args.set]), env="calculator", eval_problems=args.eval_problems,
                  checkpoint=False)
    os.makedirs(args.out, exist_ok=True)
    start = sft_checkpoint(args, dict(common, checkpoint=True))

    results = {"init_from": start, "iters": args.iters, "arms": {}}
    for arm in args.arms.split(","):
        out_dir = os.path.join(args.out, arm)
        T.train(dict(common, **ARMS[arm], init_from=start, max_iters=args.iters,  # (a rerun replaces an arm)
                     eval_interval=min(args.eval_every, args.iters), out_dir=out_dir, overwrite=True))
        results["arms"][arm] = {"overrides": ARMS[arm], "curve": curve(out_dir)}
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    plot(results, os.path.join(args.out, "agentic.png"))

    print(f"\n{'arm':<16}" + "".join(f"{k:>24}" for k in FIGURES) + "   (first -> last)")
    for arm, result in results["arms"].items():
        cells = []
        for key in FIGURES:
            values = [p[key] for p in result["curve"] if key in p]
            cells.append(f"{values[0]:.3f} -> {values[-1]:.3f}" if values else "-")
        print(f"{arm:<16}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
