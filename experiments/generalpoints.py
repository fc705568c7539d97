"""
SFT memorises, RL generalises (SPEC §2, §4 GeneralPoints; Ch7 Exp 7-11; Chu et al. 2025):
from one SFT initialisation on --env=generalpoints, keep training with more SFT or with RL (GRPO,
the default recipe) for the same training time, and evaluate both along the way in distribution
(held-out hands, J, Q, K = 10 as in training) and out of distribution (the rule changes: J, Q, K =
11, 12, 13, and the prompt says so). Chu et al. (Llama-3.2-Vision-11B): RL took OOD accuracy from
11.5% to 15.0%, SFT from 11.5% to 3.4%.

Equal compute means equal training wall time here: the sum of the loop's iter_time (RL: rollouts,
scoring and updates; SFT: updates; evaluations excluded), since an RL iteration spends most of its
time sampling, which trained-token counts would not see. RL runs --rl_iters iterations first; SFT
then gets as many iterations as fit in RL's training time at the SFT rate of the initial SFT run
(its metrics.jsonl), unless --sft_iters says how many. Both arms are plotted against their measured
training time, so a mismatch (a busy machine) shows. Each arm is evaluated --evals times after its
start (greedy accuracy on --eval_problems hands of each split, the same problems for both arms;
each split is a census of distinct hands, 119 held-out and 182 OOD, so a larger --eval_problems
evaluates the whole split once).

    python experiments/generalpoints.py                                    # trains out/generalpoints/init first
    python experiments/generalpoints.py --plot=docs/img/generalpoints.png    # the README's figure
    python experiments/generalpoints.py --init_from=out/gp_sft --rl_iters=80 --set env_direct_frac=0.0
    python experiments/generalpoints.py --quick --out=/tmp/gp               # a toy-size smoke test (numbers mean nothing)

--set key=value (repeatable) passes a train.py key to every run (each run takes the keys its
algorithm knows). It writes results.json, generalpoints.md (the table) and the plot into --out.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments.study import (init_checkpoint, pyplot, rows, run, save_figure, save_study, set_keys,  # noqa: E402
                               study_flags)  # (after the path: the script runs from anywhere)
from envs import GeneralPoints  # noqa: E402

# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, prompts_per_iter=2, group_size=2, eval_batch_size=8,
             max_new_tokens=24, train_problems=64, val_examples=8, device="cpu", plot=False)
ARMS = dict(rl=dict(algo="grpo", eval_samples=0),  # greedy accuracy only, as SFT evaluates
            sft=dict(algo="sft"))


def curve(out_dir):
    """[{iter, seconds (training time so far), train_tokens, heldout_acc, ood_acc}] at each evaluation."""
    seconds = tokens = 0.0
    points = []
    for row in rows(out_dir):
        if "loss" in row:  # a training row (log_interval=1: one per iteration)
            seconds, tokens = seconds + row["iter_time"], row["train_tokens"]
        if "heldout_acc" in row:
            points.append(dict(iter=row["iter"], seconds=seconds, train_tokens=tokens,
                               heldout_acc=row["heldout_acc"], ood_acc=row["ood_acc"]))
    return points


def sft_seconds_per_iter(init_dir):
    """The mean iter_time of the initial SFT run: what one more SFT iteration costs."""
    times = [row["iter_time"] for row in rows(init_dir) if "loss" in row]
    if not times:
        raise ValueError(f"{init_dir}/metrics.jsonl has no training rows to time SFT by: pass --sft_iters")
    return sum(times) / len(times)


def table(results):
    """The markdown table: every evaluation of both arms, and the start-to-end change."""
    lines = ["| arm | iteration | training time (s) | tokens trained on | held-out (J,Q,K=10) | OOD (J,Q,K=11,12,13) |",
             "|---|---|---|---|---|---|"]
    for arm, points in results["arms"].items():
        lines += [f"| {arm} | {p['iter']} | {p['seconds']:.1f} | {p['train_tokens']:,.0f} | {p['heldout_acc']:.3f} | "
                  f"{p['ood_acc']:.3f} |" for p in points]
    lines.append("")
    for arm, points in results["arms"].items():
        first, last = points[0], points[-1]
        lines.append(f"- {arm}: held-out {first['heldout_acc']:.1%} → {last['heldout_acc']:.1%}, "
                     f"OOD {first['ood_acc']:.1%} → {last['ood_acc']:.1%} in {last['seconds']:.0f} s of training")
    held_out, ood = results["problems"]["heldout"], results["problems"]["ood"]
    lines.append(f"- (Chu et al. 2025, OOD: RL 11.5% → 15.0%, SFT 11.5% → 3.4%; {held_out} held-out and {ood} OOD "
                 f"distinct hands here: one accuracy is ± at most {98 / min(held_out, ood) ** 0.5:.1f} points at 95%)")
    return "\n".join(lines) + "\n"


def plot(results, path):
    fig, axes = pyplot().subplots(1, 2, figsize=(9, 3.6), sharex=True)
    for ax, key, title in zip(axes, ("heldout_acc", "ood_acc"), ("in distribution (J,Q,K = 10)",
                                                                 "out of distribution (J,Q,K = 11,12,13)")):
        for arm, points in results["arms"].items():
            ax.plot([p["seconds"] for p in points], [p[key] for p in points], marker="o", label=arm)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training time (s)")
    axes[0].set_ylabel("greedy accuracy")
    axes[0].legend()
    save_figure(fig, path)



def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="an SFT checkpoint of --env=generalpoints (default: train one)")
    parser.add_argument("--init_iters", type=int, default=1000, help="iterations of the initial SFT run")
    parser.add_argument("--rl_iters", type=int, default=40, help="GRPO iterations (fixes the compute budget)")
    parser.add_argument("--sft_iters", type=int, default=0, help="SFT iterations (0: as many as fit in RL's time)")
    parser.add_argument("--evals", type=int, default=4, help="evaluations per arm after its start")
    parser.add_argument("--eval_problems", type=int, default=500)
    study_flags(parser, "out/generalpoints", "generalpoints")
    args = parser.parse_args()
    if args.quick:
        args.init_iters, args.rl_iters, args.evals, args.eval_problems = 4, 2, 1, 8
    common = {**(QUICK if args.quick else {}), "env": "generalpoints", "eval_problems": args.eval_problems,
              "log_interval": 1, "checkpoint": False, **set_keys(args)}
    os.makedirs(args.out, exist_ok=True)
    init = init_checkpoint(args, common)

    problems = {split: len(GeneralPoints().problems(split, args.eval_problems)) for split in ("heldout", "ood")}
    results = dict(init_from=init, eval_problems=args.eval_problems, problems=problems, arms={})
    budget = None
    for arm in ("rl", "sft"):
        iters = args.rl_iters if arm == "rl" else args.sft_iters or max(1, round(budget / sft_seconds_per_iter(init)))
        out_dir = os.path.join(args.out, arm)
        run(dict(common, **ARMS[arm], init_from=init, max_iters=iters, eval_interval=max(1, iters // args.evals),
                 out_dir=out_dir, overwrite=True))  # (the study's own directory: a rerun replaces it)
        results["arms"][arm] = curve(out_dir)
        budget = results["arms"][arm][-1]["seconds"]
        print(f"{arm}: {iters} iterations, {budget:.0f} s of training")

    save_study(args.out, "generalpoints", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
