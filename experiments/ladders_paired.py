"""
Two whole ladders compared stage by stage, paired per seed (docs/menu.md, "The ladder with Muon"): two
`python ladder.py --seeds=K` runs that differ in one thing (--a, --b: their --out_root), on the same
machine, with the same seeds. For every stage both ran, per seed, a − b of the ladder's own evaluation
(ladder_eval.json: greedy held-out accuracy on 1,000 problems, sampled at T = 1 on 200, pass@8; the reward
model's pair accuracy), and over the seeds their mean and band (bands.paired_across_seeds; the ladder
keeps no per-problem answers, so the t band alone). A stage is "lower" or "higher" where its greedy
band excludes 0, otherwise "the same".

    python experiments/ladders_paired.py --a=out_muon --b=out --names=Muon,AdamW --out=out/ladders_paired

Writes ladders_paired.md and ladders_paired.png (a − b per stage, each seed a dot, the band a bar).
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from experiments.study import pyplot, save_figure  # noqa: E402
import ladder  # noqa: E402

FIGURES = (("greedy_acc", "greedy"), ("sampled_acc", "sampled"), ("pass_at_k", "pass@8"))


def evaluations(root, name, seeds):
    """Every seed's ladder_eval.json of one stage, or None where a seed has not run it."""
    found = [ladder.read_json(os.path.join(ladder.stage_path(root, name, k), "ladder_eval.json")) for k in range(1, seeds + 1)]
    return None if None in found else found


def compare(a_root, b_root, seeds):
    """{stage: {figure: (per-seed a − b, mean, band)}} for every stage both ladders ran with every seed."""
    out = {}
    for name, _, _ in ladder.STAGES:
        a, b = evaluations(a_root, name, seeds), evaluations(b_root, name, seeds)
        if a is None or b is None:
            continue
        keys = (("pair_acc", "pair accuracy"),) if a[0]["kind"] == "reward_model" else FIGURES
        out[name] = {}
        for key, label in keys:
            differences = [x[key] - y[key] for x, y in zip(a, b)]
            out[name][label] = (differences, *bands.paired_across_seeds(differences, None))
    return out


def verdict(mean, half):
    """'lower' or 'higher' where the band excludes 0, else 'the same'; no band (under 3 seeds): not judged."""
    if half is None:
        return "not judged (fewer than 3 seeds)"
    return {1: "higher", -1: "lower", 0: "the same"}[bands.beyond(mean, half)]


def table(results, names):
    a, b = names
    lines = [f"{a} − {b}, per stage, paired per seed (the same seeds, the same machine); mean ± the t band over "
             f"the seeds (bands.paired_across_seeds, no per-problem floor: the ladder keeps no answers).", "",
             "| stage | greedy | per seed | verdict | sampled | pass@8 |", "|---|---|---|---|---|---|"]
    for name, figures in results.items():
        if "pair accuracy" in figures:
            d, mean, half = figures["pair accuracy"]
            lines.append(f"| {name} | pair accuracy {bands.signed(mean, half)} | {per_seed(d)} | {verdict(mean, half)} | | |")
            continue
        d, mean, half = figures["greedy"]
        lines.append(f"| {name} | {bands.signed(mean, half)} | {per_seed(d)} | {verdict(mean, half)} | "
                     f"{bands.signed(*figures['sampled'][1:])} | {bands.signed(*figures['pass@8'][1:])} |")
    return "\n".join(lines) + "\n"


def per_seed(differences):
    return ", ".join(f"{d:+.3f}" for d in differences)


def plot(results, names, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    stages = [s for s, f in results.items() if "greedy" in f]
    for i, name in enumerate(stages):
        d, mean, half = results[name]["greedy"]
        ax.scatter([i] * len(d), d, color="#7570b3", s=14, zorder=3)
        ax.errorbar([i], [mean], yerr=[[half or 0], [half or 0]], fmt="o", color="black", capsize=4, zorder=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(stages)), stages, rotation=30)
    ax.set_ylabel(f"greedy held-out accuracy, {names[0]} − {names[1]}")
    ax.set_title(f"The whole ladder, {names[0]} against {names[1]}: each seed a dot, the mean and its band in black",
                 fontsize=9)
    ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the first ladder's --out_root")
    parser.add_argument("--b", required=True, help="the second ladder's --out_root (the baseline)")
    parser.add_argument("--names", default="a,b", help="the two ladders' names in the table, a then b")
    parser.add_argument("--seeds", type=int, default=3, help="the ladders' --seeds")
    parser.add_argument("--out", default="out/ladders_paired")
    args = parser.parse_args(argv)
    names = args.names.split(",")
    results = compare(args.a, args.b, args.seeds)
    os.makedirs(args.out, exist_ok=True)
    text = table(results, names)
    with open(os.path.join(args.out, "ladders_paired.md"), "w") as f:
        f.write(text)
    plot(results, names, os.path.join(args.out, "ladders_paired.png"))
    print(text)
    return results


if __name__ == "__main__":
    main()
