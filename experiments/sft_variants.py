"""
SFT's variants against plain SFT on the default task (docs/menu.md): the same runs but for the one thing a
variant changes (--arms, the first the baseline: sft = AdamW; muon = lab/muon.py, Muon for the blocks'
matrices; dft = lab/dft.py, the probability-weighted loss), every seed of --seeds; how many steps and
seconds each takes to reach a level fixed before the runs, and held-out and OOD accuracy at equal steps.

The rule, fixed here before any run (a miss is reported as a miss):
  level     per seed, the baseline's own validation loss at its last iteration (--iters): its end point
  steps     the first evaluation (every --eval_every iterations) at which an arm's val_loss ≤ the level
  seconds   the training time to that iteration: the sum of the run's iter_time (evaluations excluded)
  speed-up  the baseline's steps / the arm's steps, per seed; over seeds its mean and band (bands.paired_across_seeds)
and, at equal steps (--iters), every arm's greedy held-out and OOD accuracy (bands.across_seeds). (The level
is the optimiser's question, Muon's; DFT's is the accuracy: its loss is not the NLL it is measured by.)

    python experiments/sft_variants.py --out=out/muon_sft                 # Muon: 150 iterations from scratch, 3 seeds
    python experiments/sft_variants.py --iters=1000 --eval_every=50 --init_from=out/pretrain --out=out/muon_ladder
    python experiments/sft_variants.py --arms=sft,dft --iters=1000 --eval_every=250 --init_from=out/pretrain \
        --eval_problems=1000 --out=out/dft_vs_sft                         # DFT against SFT
    python experiments/sft_variants.py --quick                            # a smoke test (numbers mean nothing)

Every run takes one thread (beside other work a second one buys little). Runs already finished in --out are
read, not run again. Writes sft_variants.md, sft_variants.png and results.json into --out.
"""

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from experiments.study import finished, last_verdicts, pyplot, rows, run, save_figure, save_study, set_keys, study_flags  # noqa: E402

NAMES = dict(sft="SFT (AdamW)", muon="Muon", dft="DFT")  # the arms' names in the table and the plot


def curve(out_dir):
    """[(iteration, training seconds so far, val_loss, heldout_acc, ood_acc, heldout_work)] at every evaluation
    of a run (heldout_work: the share of greedy held-out answers that show their work)."""
    seconds, points = 0.0, []
    for row in rows(out_dir):
        if "loss" in row:
            seconds += row["iter_time"]
        if "val_loss" in row:
            points.append((row["iter"], seconds, row["val_loss"], row.get("heldout_acc"), row.get("ood_acc"),
                           row.get("heldout_work")))
    return points


def to_level(points, level):
    """(steps, seconds) of the first evaluation at or below the level, or None (a miss)."""
    return next(((it, s) for it, s, loss, *_ in points if it > 0 and loss <= level), None)


def table(results):
    s, n = results["settings"], results["settings"]["eval_problems"]
    base, arms = s["arms"][0], s["arms"][1:]
    lines = [f"Level (fixed rule): {NAMES.get(base, base)}'s own val_loss at iteration {s['iters']}, per seed; "
             f"evaluations every {s['eval_every']} iterations; start: {s['init_from']}.", "",
             "| seed | level | " + " | ".join(f"{NAMES.get(a, a)}: steps, s" for a in s["arms"]) + " | "
             + " | ".join(f"{NAMES.get(a, a)}: speed-up (steps)" for a in arms) + " |",
             "|---|---|" + "---|" * (len(s["arms"]) + len(arms))]
    speedups = {a: [] for a in arms}
    for seed, r in results["seeds"].items():
        base_steps = r[base]["to_level"]
        ups = []
        for a in arms:
            up = base_steps[0] / r[a]["to_level"][0] if base_steps and r[a]["to_level"] else None
            speedups[a].append(up)
            ups.append(f"{up:.2f}x" if up else "-")
        lines.append(f"| {seed} | {r['level']:.4f} | " + " | ".join(steps_cell(r[a]["to_level"]) for a in s["arms"])
                     + " | " + " | ".join(ups) + " |")
    lines.append("")
    for a, ups in speedups.items():
        if None in ups:
            lines.append(f"- {NAMES.get(a, a)} missed the level in {ups.count(None)} of {len(ups)} seeds")
        else:
            mean, half = bands.paired_across_seeds([x - 1 for x in ups], None)  # (steps: no per-problem results)
            lines.append(f"- {NAMES.get(a, a)}: speed-up in steps {1 + mean:.2f}x"
                         + (f" ± {half:.2f}" if half is not None else " (fewer than 3 seeds: no band)"))
    for a in s["arms"]:
        for index, split in ((2, "validation loss"), (3, "greedy held-out accuracy"), (4, "greedy OOD accuracy"),
                             (5, "share of greedy held-out answers that show their work")):
            values = [r[a]["curve"][-1][index] for r in results["seeds"].values()]
            if None not in values:
                lines.append(f"- {NAMES.get(a, a)}: {split} at iteration {s['iters']}: "
                             f"{bands.cell(values, None if index in (2, 5) else n, 4 if index == 2 else 3)} "
                             f"(per seed {', '.join(f'{x:.4f}' for x in values)})")
    for a in arms:  # the accuracy at equal steps, paired on the same held-out problems
        if all("heldout_paired" in r[a] for r in results["seeds"].values()):
            pairs = [r[a]["heldout_paired"] for r in results["seeds"].values()]
            lines.append(f"- {NAMES.get(a, a)} − {NAMES.get(base, base)}, greedy held-out accuracy at iteration {s['iters']}, "
                         f"paired per problem and across seeds: {bands.paired_cell([m for m, _ in pairs], [h for _, h in pairs])}")
    return "\n".join(lines) + "\n"


def steps_cell(reached):
    """'steps, seconds' to the level, or a miss."""
    return f"{reached[0]}, {reached[1]:.0f}" if reached else "miss (not reached)"


def plot(results, path):
    """Left: validation loss against iteration (the level dashed); right: greedy held-out accuracy; one line per
    seed and arm."""
    plt = pyplot()
    fig, (ax, acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm, colour in zip(results["settings"]["arms"], ("#1b9e77", "#d95f02", "#7570b3", "#e7298a")):
        name = NAMES.get(arm, arm)
        for k, r in enumerate(results["seeds"].values()):
            c = r[arm]["curve"]
            ax.plot([p[0] for p in c], [p[2] for p in c], color=colour, alpha=0.8, marker=".",
                    label=name if k == 0 else None)
            acc.plot([p[0] for p in c], [p[3] for p in c], color=colour, alpha=0.8, marker=".",
                     label=name if k == 0 else None)
    for k, r in enumerate(results["seeds"].values()):
        ax.axhline(r["level"], color="grey", lw=0.6, ls="--", label="level (the baseline's end, per seed)" if k == 0 else None)
    ax.set_ylabel("validation loss (held-out demonstrations)")
    ax.set_yscale("log")
    acc.set_ylabel(f"greedy held-out accuracy ({results['settings']['eval_problems']} problems)")
    for a in (ax, acc):
        a.set_xlabel("iteration")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle("SFT on the default task: " + " vs ".join(NAMES.get(a, a) for a in results["settings"]["arms"])
                 + f", one line per seed (start: {os.path.basename(results['settings']['init_from'])})", fontsize=9)
    save_figure(fig, path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="sft,muon", help=f"comma-separated --algo names, the baseline first: from "
                        f"{', '.join(NAMES)} (or any variant of SFT's lab)")
    parser.add_argument("--iters", type=int, default=150, help="iterations of every run (the baseline's end point is the level)")
    parser.add_argument("--eval_every", type=int, default=25, help="iterations between evaluations (the steps' resolution)")
    parser.add_argument("--seeds", default="1337,1338,1339", help="comma-separated training seeds")
    parser.add_argument("--init_from", default="scratch", help="where both arms start (the ladder's SFT: out/pretrain)")
    parser.add_argument("--eval_problems", type=int, default=200, help="held-out problems for the greedy accuracy")
    study_flags(parser, "out/sft_variants", "sft_variants")
    args = parser.parse_args(argv)
    iters, every = (6, 3) if args.quick else (args.iters, args.eval_every)
    torch.set_num_threads(1)
    common = dict(init_from=args.init_from, max_iters=iters, eval_interval=every, log_interval=1, plot=False,
                  eval_at_start=False, eval_problems=args.eval_problems, lr_decay_iters=iters)
    if args.quick:
        common.update(n_layer=1, n_head=1, n_embd=16, train_problems=64, val_examples=8, eval_problems=4, batch_size=4)
    common.update(set_keys(args))
    os.makedirs(args.out, exist_ok=True)
    arms = args.arms.split(",")
    results = dict(settings=dict(common, iters=iters, eval_every=every, seeds=args.seeds, arms=arms), seeds={})
    for seed in [int(s) for s in args.seeds.split(",")]:
        curves = {}
        for arm in arms:
            overrides = dict(common, algo=arm, seed=seed, out_dir=os.path.join(args.out, f"{arm}_{seed}"), overwrite=True)
            if not finished(overrides["out_dir"], overrides, "val_loss"):
                run(overrides)
            curves[arm] = curve(overrides["out_dir"])
        level = curves[arms[0]][-1][2]
        results["seeds"][seed] = dict(level=level, **{arm: dict(curve=c, to_level=to_level(c, level))
                                                     for arm, c in curves.items()})
        base_verdicts = last_verdicts(os.path.join(args.out, f"{arms[0]}_{seed}"))
        for arm in arms[1:]:  # the last evaluation's held-out answers, arm − baseline on the same problems
            verdicts = last_verdicts(os.path.join(args.out, f"{arm}_{seed}"))
            results["seeds"][seed][arm]["heldout_paired"] = bands.paired(verdicts, base_verdicts)
    save_study(args.out, "sft_variants", results, table, plot, args.plot)
    return results


if __name__ == "__main__":
    main()
