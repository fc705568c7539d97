"""
The policy-gradient family side by side (docs/policy-gradient.md): from one SFT checkpoint, on the
default task, GRPO, Dr. GRPO, DAPO, GSPO, CISPO, MaxRL, SAPO and DPPO as their recipes in config/ (each,
with --learning_rates, at every rate of a small sweep, constant after the warm-up), then edge prompt
sampling on GRPO's recipe (--edge: lab/edge_prompts.py, a variant of plain GRPO), every arm with each of --seeds and the same budget
per iteration (--prompts × --group_size), in an off-policy setting where the ratio and its clip act:
every rollout batch is split into --minibatches optimizer steps (4: π_θ moves away from π_old after
the first step; at 1 the ratio is always 1 and the arms differ only in their advantages and
aggregation). Greedy held-out accuracy on --eval_problems problems every --eval_every iterations,
against the rollout tokens decoded so far (DAPO's dynamic sampling decodes extra rollouts: they are
counted). Prints a table, writes results.json and accuracy_vs_rollout_tokens.png into --out; with a
learning-rate sweep also sweep.md and accuracy_vs_learning_rate.png (sweep: each arm against the first at
the same rate, paired per seed, so that no choice of a best rate enters the comparison).

    python experiments/pg_family.py --sft=out/sft
    python experiments/pg_family.py --sft=out/sft --arms=grpo,cispo --iters=12 --seeds=1337 --edge=""
    python experiments/pg_family.py --sft=out/sft --kl_test --seeds=1337,1338,1339     # the KL term, one factor
    python experiments/pg_family.py --sft=out/sft --arms=grpo,maxrl,sapo,dppo --learning_rates=5e-5,1e-4,2e-4 \
        --seeds=1337,1338,1339 --edge="" --out=out/pg_menu                                  # docs/menu.md

An arm's band is the larger of 2 standard errors of its final accuracy across the seeds and the
binomial band of that mean, ± 2·√(p(1 − p)/n). Runs already finished in --out are read, not run again.
"""

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from nanopost import options  # noqa: E402
import train as T  # noqa: E402
from experiments.study import band_line, last_verdicts, pyplot, save_figure  # noqa: E402  (a seed mean and its band, drawn)


def recipe(name, **extra):
    return dict(options.parse_args([os.path.join(ROOT, "config", f"{name}.py")]), **extra)


ARMS = {name: recipe(name) for name in ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "maxrl", "sapo", "dppo")}
FAMILY = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")  # the default --arms: docs/policy-gradient.md's table (MaxRL,
# SAPO and DPPO: docs/menu.md's command)
# the KL claim as a one-factor test (--kl_test): each recipe with and without GRPO's k3 KL term (β = 0.04),
# nothing else changed; per recipe {arm's name: its keys}, the arm with the KL term first
KL_PAIRS = dict(grpo=dict(grpo=ARMS["grpo"], grpo_no_kl=dict(ARMS["grpo"], kl_coef=0.0)),
                cispo=dict(cispo_kl=dict(ARMS["cispo"], kl_coef=0.04), cispo=ARMS["cispo"]))
# edge sampling: a pool small enough that prompts come back within a run (at the defaults, 8 prompts ×
# 30 iterations = 240 draws from 128 prompts: every prompt seen once, then those in the 20-80% band
# again), large enough not to be learnt by heart (a pool of 32 was, in an earlier run: docs)
EDGE = dict(algo="edge_prompts", prompt_pool=128)


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


def final(curves, n):
    """(mean, band or None) of the final accuracy over the seeds' curves, by the project's band rule
    (bands.across_seeds: t·SE from 3 seeds and the binomial band, added in variance; None for 2 seeds)."""
    return bands.across_seeds([points[-1][2] for points in curves], n)


def plot(results, n, path):
    """One line per arm: the seeds' mean accuracy against the mean rollout tokens, its band shaded
    (study.band_line: t·SE from 3 seeds; with 2 seeds the band is their range)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = plt.get_cmap("Dark2").colors
    for k, (arm, curves) in enumerate(results.items()):
        band_line(ax, [[(p[1] / 1e3, p[2]) for p in c] for c in curves], colours[k % len(colours)], arm, n, top=1.0,
                  marker="o")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rollout tokens decoded (thousands, the seeds' mean)")
    ax.set_ylabel(f"greedy held-out accuracy ({n} problems)")
    ax.set_title("One SFT checkpoint, off-policy steps; each arm's seed mean, shaded: "
                 + ("the band" if min(map(len, results.values())) >= 3 else "the seeds' range"), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def run_arm(name, arm, seeds, common, out):
    """The arm's curve for every seed, trained where not finished already."""
    curves = []
    for seed in seeds:
        out_dir = os.path.join(out, f"{name}_{seed}")
        finished = os.path.exists(os.path.join(out_dir, "metrics.jsonl")) and any(
            p[0] == common["max_iters"] for p in curve(out_dir))
        if not finished:
            T.train(dict(arm, **common, seed=seed, out_dir=out_dir, overwrite=True))  # (an unfinished arm starts over)
        curves.append(curve(out_dir))
    return curves


def kl_test(seeds, common, out, n):
    """Each of KL_PAIRS with and without the KL term, every seed: the accuracy at the end, the fall
    from the best evaluation after the start to the end, and with-KL minus without, paired per seed
    (the same seed: the same prompts, the same held-out problems) with bands.paired_across_seeds.
    Writes kl_test.md and kl_test.png into `out`."""
    lines = [f"| recipe | arm | held-out at it. {common['max_iters']} (per seed) | fall from its best evaluation (per seed) |",
             "|---|---|---|---|"]
    diffs, curves = [], {}
    for recipe, arms in KL_PAIRS.items():
        pair = {}
        for label, (name, arm) in zip(("with KL", "without KL"), arms.items()):
            pair[label] = run_arm(name, arm, seeds, common, out)
            ends = [c[-1][2] for c in pair[label]]
            falls = [max(p[2] for p in c[1:]) - c[-1][2] for c in pair[label]]
            lines.append(f"| {recipe} | {label} | {bands.cell(ends, n)} ({', '.join(f'{v:.3f}' for v in ends)}) | "
                         f"{sum(falls) / len(falls):.3f} ({', '.join(f'{v:.3f}' for v in falls)}) |")
        end_gap = [a[-1][2] - b[-1][2] for a, b in zip(pair["with KL"], pair["without KL"])]
        mean, half = bands.paired_across_seeds(end_gap, None)  # (no per-problem results kept)
        diffs.append(f"- {recipe}: with KL minus without at it. {common['max_iters']}: {mean:+.3f}"
                     + (f" ± {half:.3f}" if half is not None else " (two seeds: no band)")
                     + f" (per seed {', '.join(f'{d:+.3f}' for d in end_gap)})")
        curves[recipe] = pair
    text = "\n".join(lines + [""] + diffs) + "\n"
    with open(os.path.join(out, "kl_test.md"), "w") as f:
        f.write(text)
    print(text)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.6), sharey=True)
    for ax, (recipe, pair) in zip(axes, curves.items()):
        for (label, runs), colour in zip(pair.items(), ("#1b9e77", "#d95f02")):
            band_line(ax, [[(p[0], p[2]) for p in c] for c in runs], colour, label, n, top=1.0, marker="o")
        ax.set_title(f"{recipe}: the KL term alone changed", fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel(f"greedy held-out accuracy ({n} problems),\n{len(seeds)} seeds' mean and band")
    axes[0].legend()
    save_figure(fig, os.path.join(out, "kl_test.png"), dpi=100)


def sweep(results, names, rates, seeds, n, out):
    """With a learning-rate sweep: each arm's end against the rate (accuracy_vs_learning_rate.png), and
    every other arm minus the first at the same rate, paired per seed on the same problems: no choice of
    a best rate enters the comparison (bands.paired_cell: the t band over seeds, floored by each seed's
    per-problem paired band). Writes sweep.md."""
    lines = [f"| arm − {names[0]}, at the same learning rate | " + " | ".join(f"{lr:g}" for lr in rates) + " |",
             "|---" * (len(rates) + 1) + "|"]
    for name in names[1:]:
        cells = []
        for lr in rates:
            pairs = [bands.paired(last_verdicts(os.path.join(out, f"{name}_lr{lr:g}_{s}")),
                                  last_verdicts(os.path.join(out, f"{names[0]}_lr{lr:g}_{s}"))) for s in seeds]
            cells.append(bands.paired_cell([m for m, _ in pairs], [h for _, h in pairs]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write(text)
    print(text)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for k, name in enumerate(names):
        mean_band = [final(results[f"{name}_lr{lr:g}"], n) for lr in rates]
        shift = 1 + 0.04 * (k - (len(names) - 1) / 2)  # (side by side at each rate)
        ax.errorbar([lr * shift for lr in rates], [m for m, _ in mean_band], yerr=[h or 0.0 for _, h in mean_band],
                    marker="o", capsize=3, label=name)
    start = results[f"{names[0]}_lr{rates[0]:g}"][0][0][2]
    ax.axhline(start, color="gray", lw=0.8, ls="--", label="the start")
    ax.set_xscale("log")
    ax.set_xticks(rates, [f"{lr:g}" for lr in rates])
    ax.minorticks_off()
    ax.set_xlabel("learning rate (constant after the warm-up)")
    ax.set_ylabel(f"greedy held-out accuracy at the end ({n} problems)")
    ax.set_title(f"Every arm at every rate, equal rollouts; {len(seeds)} seeds' mean and band", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, os.path.join(out, "accuracy_vs_learning_rate.png"), dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", required=True, help="the SFT checkpoint every arm starts from")
    parser.add_argument("--out", default="out/pg_family", help="one directory per arm and seed, results.json and the plot")
    parser.add_argument("--arms", default=",".join(FAMILY), help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--edge", default="grpo", help="the recipe edge sampling runs on: grpo (lab/edge_prompts.py "
                        "changes plain GRPO's prompts), or empty for none")
    parser.add_argument("--kl_test", action="store_true", help="the KL claim as a one-factor test: grpo and cispo, "
                        "each with and without the KL term (KL_PAIRS), every seed; kl_test.md and kl_test.png")
    parser.add_argument("--seeds", default="1337,1338", help="comma-separated training seeds of every arm")
    parser.add_argument("--iters", type=int, default=30, help="iterations per arm")
    parser.add_argument("--eval_every", type=int, default=10, help="iterations between held-out evaluations")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    parser.add_argument("--group_size", type=int, default=8, help="answers per prompt")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation (greedy)")
    parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps per rollout batch (1: on-policy)")
    parser.add_argument("--learning_rates", default="", help="comma-separated: every arm at each (constant: min_lr the "
                        "same), named ARM_lrLR; empty = each recipe's own (grpo.py's 1e-4)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every arm")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    common = dict(init_from=args.sft, max_iters=args.iters, eval_interval=args.eval_every, prompts_per_iter=args.prompts,
                  group_size=args.group_size, eval_problems=args.eval_problems, eval_samples=0,
                  minibatches=args.minibatches, plot=False)
    common.update(options.parse_args([f"--{kv}" for kv in args.set]))
    seeds, n = [int(s) for s in args.seeds.split(",")], args.eval_problems
    os.makedirs(args.out, exist_ok=True)
    if args.kl_test:
        return kl_test(seeds, common, args.out, n)
    results = {}
    for name in args.arms.split(","):  # each arm at every learning rate of the sweep (none: its recipe's)
        for lr in [float(x) for x in args.learning_rates.split(",") if x] or [None]:
            label, arm = (name, ARMS[name]) if lr is None else (f"{name}_lr{lr:g}", dict(ARMS[name], learning_rate=lr, min_lr=lr))
            results[label] = run_arm(label, arm, seeds, common, args.out)
    if args.edge:
        results["grpo_edge"] = run_arm("grpo_edge", dict(ARMS["grpo"], **EDGE), seeds, common, args.out)
    print(f"| arm | held-out accuracy at {args.iters} it. (mean of {len(seeds)} seeds ± band, {n} problems) | per seed | "
          f"rollout tokens | clip_frac | ratio_dev |")
    print("|---|---|---|---|---|---|")
    for arm, curves in results.items():
        cell = bands.cell([points[-1][2] for points in curves], n)
        per_seed = ", ".join(f"{points[-1][2]:.3f}" for points in curves)
        average = lambda i: sum(points[-1][i] for points in curves) / len(curves)
        print(f"| {arm} | {cell} (start {curves[0][0][2]:.3f}) | {per_seed} | {average(1):,.0f} | "
              f"{average(3):.4f} | {average(4):.3f} |")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(settings=dict(common, seeds=seeds), results=results), f, indent=1)
    plot(results, n, os.path.join(args.out, "accuracy_vs_rollout_tokens.png"))
    rates = [float(x) for x in args.learning_rates.split(",") if x]
    if len(rates) > 1:
        sweep(results, args.arms.split(","), rates, seeds, n, args.out)


if __name__ == "__main__":
    main()
