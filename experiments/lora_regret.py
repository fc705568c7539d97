"""
LoRA without regret on the default task (Schulman and Thinking Machines 2025, "LoRA Without Regret": LoRA RL
matches full fine-tuning at about ten times the learning rate, even at rank 1; docs/menu.md). GRPO's recipe
from one SFT checkpoint, through the policy-gradient family's script (experiments/pg_family.py, its defaults:
30 iterations of 8 prompts × 8 answers, 4 optimizer steps per batch, greedy held-out accuracy on 500 problems),
with LoRA at each of --ranks over --lora_rates and full fine-tuning over --full_rates, every run with each of
--seeds. Runs already finished in --out are read, not run again.

The rules, fixed before the runs (docs/menu.md says so): the endpoint is held-out accuracy at the last
iteration; two comparisons, each paired per seed on the same problems (bands.paired_across_seeds, floored
by each seed's per-problem paired band):
  tenfold   the paper's claim as fixed pairs, no choice of a best rate: LoRA at ten times full's rate, for
            every full rate whose tenfold is among --lora_rates
  best      each rank at its best rate against full at its best (best: the mean over the seeds; a choice made
            after the results, the same for both sides)
"matches" is said only where the paired band covers 0 and is narrower than 0.1.

    python experiments/lora_regret.py --sft=out/sft --out=out/lora        # 45 runs, about 20 minutes on 2 cores
    python experiments/lora_regret.py --sft=out/sft --quick --out=/tmp/lora   # a toy-size smoke test

Writes lora_regret.md and accuracy_vs_learning_rate.png into --out (and each setting's pg_family outputs in
its own folder: r1/, r4/, r16/, full/).
"""

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from experiments import pg_family  # noqa: E402
from experiments.study import last_verdicts, paired_ends, pyplot, save_figure  # noqa: E402


def setting_args(args, name, rank, rates):
    """pg_family's command line for one setting (a LoRA rank, or full fine-tuning at rank 0)."""
    flags = [f"--sft={args.sft}", "--arms=grpo", "--edge=", f"--seeds={args.seeds}", f"--out={os.path.join(args.out, name)}",
             "--learning_rates=" + ",".join(f"{lr:g}" for lr in rates)]
    flags += ["--set", f"lora_rank={rank}"] if rank else []
    return flags + (["--iters=2", "--eval_every=1", "--prompts=2", "--group_size=2", "--eval_problems=4"] if args.quick else [])


def verdicts(args, name, lr, seed):
    """The per-problem verdicts of one run's last held-out evaluation."""
    return last_verdicts(os.path.join(args.out, name, f"grpo_lr{lr:g}_{seed}"))


def accuracy(args, name, lr, seeds):
    """Each seed's end accuracy of one setting at one rate."""
    return [sum(v) / len(v) for v in (verdicts(args, name, lr, s) for s in seeds)]


def paired_row(args, a, b, seeds):
    """'a − b' over the seeds, paired on the same problems: (mean, band, per-seed differences)."""
    return paired_ends(*([os.path.join(args.out, name, f"grpo_lr{lr:g}_{s}") for s in seeds] for name, lr in (a, b)))


def verdict_text(mean, half):
    """The rule, as a word: matches (band covers 0, narrower than 0.1), or the sign, or no claim."""
    if half is None:
        return "(fewer than 3 seeds: no claim)"
    if abs(mean) <= half:
        return "matches" if half < 0.1 else "a null (the band is too wide to say it matches)"
    return "LoRA ahead" if mean > 0 else "LoRA behind"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", required=True, help="the SFT checkpoint every run starts from")
    parser.add_argument("--out", default="out/lora", help="one folder per setting, the table and the plot")
    parser.add_argument("--ranks", default="1,4,16", help="LoRA ranks")
    parser.add_argument("--lora_rates", default="1e-4,3e-4,1e-3,3e-3", help="LoRA's learning rates")
    parser.add_argument("--full_rates", default="3e-5,1e-4,3e-4", help="full fine-tuning's learning rates")
    parser.add_argument("--seeds", default="1337,1338,1339", help="comma-separated training seeds")
    parser.add_argument("--workers", type=int, default=2, help="settings run side by side (each run takes one thread)")
    parser.add_argument("--quick", action="store_true", help="a toy-size smoke test (numbers mean nothing)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    lora_rates, full_rates = ([float(x) for x in r.split(",")] for r in (args.lora_rates, args.full_rates))
    settings = [(f"r{r}", int(r), lora_rates) for r in args.ranks.split(",")] + [("full", 0, full_rates)]
    with ProcessPoolExecutor(args.workers) as pool:  # (pg_family runs each run on one thread)
        list(pool.map(pg_family.main, [setting_args(args, *s) for s in settings]))
    text = report(args, settings, seeds)
    with open(os.path.join(args.out, "lora_regret.md"), "w") as f:
        f.write(text)
    print(text)
    plot(args, settings, seeds)


def report(args, settings, seeds):
    """The table of every setting's end accuracy at every rate, and the two comparisons (the rules above)."""
    lora_rates, full_rates = settings[0][2], settings[-1][2]
    n = len(verdicts(args, "full", full_rates[0], seeds[0]))
    lines = [f"End accuracy (held-out, {n} problems; the seeds' mean ± band, bands.across_seeds):", "",
             "| setting | " + " | ".join(f"{lr:g}" for lr in sorted(set(lora_rates + full_rates))) + " |",
             "|---" * (len(set(lora_rates + full_rates)) + 1) + "|"]
    best = {}
    for name, _, rates in settings:
        cells = []
        for lr in sorted(set(lora_rates + full_rates)):
            if lr in rates:
                values = accuracy(args, name, lr, seeds)
                cells.append(bands.cell(values, n))
                if name not in best or sum(values) > best[name][1]:
                    best[name] = (lr, sum(values))
            else:
                cells.append("")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "LoRA − full, paired per seed on the same problems:", "",
              "| comparison | LoRA − full | per seed | by the rule |", "|---|---|---|---|"]
    for name, _, _ in settings[:-1]:
        pairs = [(lr * 10, lr) for lr in full_rates if any(abs(lr * 10 - x) < 1e-12 for x in lora_rates)]
        pairs.append((best[name][0], best["full"][0]))
        for k, (lora_lr, full_lr) in enumerate(pairs):
            mean, half, per_seed = paired_row(args, (name, lora_lr), ("full", full_lr), seeds)
            kind = "best against best" if k == len(pairs) - 1 else "tenfold"
            lines.append(f"| {name} at {lora_lr:g} − full at {full_lr:g} ({kind}) | {mean:+.3f}"
                         + (f" ± {half:.3f}" if half is not None else "") + f" | {', '.join(f'{d:+.3f}' for d in per_seed)} | "
                         f"{verdict_text(mean, half)} |")
    return "\n".join(lines) + "\n"


def plot(args, settings, seeds):
    """Each setting's end accuracy against the learning rate, the seeds' mean and band."""
    n = len(verdicts(args, "full", settings[-1][2][0], seeds[0]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, _, rates in settings:
        ends = [bands.across_seeds(accuracy(args, name, lr, seeds), n) for lr in rates]
        ax.errorbar(rates, [m for m, _ in ends], yerr=[h or 0.0 for _, h in ends], marker="o", capsize=3,
                    label="full fine-tuning" if name == "full" else f"LoRA rank {name[1:]}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (constant after the warm-up)")
    ax.set_ylabel(f"greedy held-out accuracy at the end ({n} problems)")
    ax.set_title(f"GRPO with LoRA against full fine-tuning, equal rollouts; {len(seeds)} seeds' mean and band", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, os.path.join(args.out, "accuracy_vs_learning_rate.png"), dpi=110)


if __name__ == "__main__":
    main()
