"""
The reward model's training-set size against over-optimisation (docs/overoptimisation.md; Gao et al. 2022,
"Scaling Laws for Reward Model Overoptimization", arXiv:2210.10760, who find that a proxy trained on
more data lets the policy travel further before the gold reward turns down, and peak higher).
experiments/overoptimisation.py once per size, from one SFT checkpoint, then the sizes compared:

    python experiments/rm_size.py --init_from=out/sft                          # 256, 1,024 and 4,096 prompts
    python experiments/rm_size.py --quick --out=/tmp/rm_size                    # a toy-size smoke test

THE RULES, fixed here before any run:
- the sizes: the proxy (rm.py, Bradley–Terry, verifier pairs) trained on the pairs of 256, 1,024 and
  4,096 training prompts (--sizes; the ladder's RM uses 2,048), each for rm.py's 150 iterations: equal
  compute, so the smallest set is seen many times and the largest about once.
- everything else is overoptimisation.py's defaults, the same for every size: one SFT checkpoint
  (--init_from), Best-of-N on 500 held-out prompts × 64 samples (the same samples for every size:
  the sampler's seeds are fixed and the proxy only chooses among them), PPO against the proxy for 40
  iterations at KL coefficient 0.01, seeds 1337-1339, binned by 8 iterations.
- the primary comparison: Best-of-N's gold (the verifier's accuracy of the kept answers) at the
  largest N, where the proxy is optimised hardest, the largest size minus the smallest, paired per
  prompt (bands.paired: the same prompts and samples). The verdict: "more data holds gold up" where
  the band's low end is above 0, "more data lowers gold" where its high end is below 0, otherwise
  "null (within the band)".
- beside it: PPO's gold in its last bin, the largest size minus the smallest, paired by seed
  (bands.paired_across_seeds, the t band: a bin's rollouts are fresh samples); each size's turning
  points (overoptimisation.py's: the N or bin of highest gold, and whether gold then falls beyond the
  band) and its proxy's held-out pair accuracy. Whether the peak moves to a larger KL is read off
  those, with no test of its own.

Writes rm_size.md (the table and the verdict), rm_size.png (gold against KL, one line per size, for
Best-of-N and PPO) and results.json into --out; each size's own study is in --out/rm<size>. A size
whose study has finished (its results.json) is read, not run again.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from experiments.overoptimisation import QUICK, band  # noqa: E402
from experiments.study import pyplot, save_figure, save_study, script_once, study_flags, train_once  # noqa: E402

SIZES = (256, 1024, 4096)


def compare(studies):
    """The rules above: {sizes, per_size, bon, ppo, verdict} from {size: overoptimisation results}."""
    small, large = min(studies), max(studies)
    top = str(studies[large]["bon_max"])
    a, b = studies[large]["best_of_n_per_prompt"][top], studies[small]["best_of_n_per_prompt"][top]
    bon, bon_band = bands.paired(a, b)
    last = lambda s: [r["curve"][-1]["gold"] for r in studies[s]["ppo"]["runs"]]
    ppo, ppo_band = bands.paired_across_seeds([x - y for x, y in zip(last(large), last(small))], None)
    verdict = {1: "more data holds gold up", -1: "more data lowers gold",
               0: "null (within the band)"}[bands.beyond(bon, bon_band)]
    per_size = {size: dict(pair_acc=s["rm_val_pair_acc"], bon_gold_top=s["best_of_n"][-1]["gold"],
                           bon_peak=s["turning_points"]["best_of_n"], ppo_peak=s["turning_points"]["ppo"],
                           ppo_last=s["ppo"]["mean"][-1]["gold"])
                for size, s in sorted(studies.items())}
    return dict(sizes=sorted(studies), small=small, large=large, bon_max=int(top), per_size=per_size,
                bon=dict(diff=bon, band=bon_band), ppo=dict(diff=ppo, band=ppo_band, per_seed=[
                    x - y for x, y in zip(last(large), last(small))]), verdict=verdict,
                curves={size: dict(bon=[(p["kl"], p["gold"], p["gold_band"]) for p in s["best_of_n"]],
                                   ppo=[(p["kl"], p["gold"], p["gold_band"]) for p in s["ppo"]["mean"]])
                        for size, s in sorted(studies.items())})


def table(results):
    lines = ["| RM training prompts | held-out pair accuracy | Best-of-N: peak N (KL), gold | gold falls after it | "
             f"gold at N = {results['bon_max']} | PPO: peak bin (KL), gold | gold falls after it | PPO's last bin, gold |",
             "|---:|---:|---|---|---:|---|---|---:|"]
    for size, s in results["per_size"].items():
        b, p = s["bon_peak"], s["ppo_peak"]
        lines.append(f"| {int(size):,} | {s['pair_acc']:.3f} | N = {b['N']} ({b['kl']:.2f}), {b['gold']:.3f} | "
                     f"{'yes' if b['significant'] else 'no'} | {s['bon_gold_top']:.3f} | iterations {p['iters']} "
                     f"({p['kl']:.2f}), {p['gold']:.3f} | {'yes' if p['significant'] else 'no'} | {s['ppo_last']:.3f} |")
    large, small = f"{results['large']:,}", f"{results['small']:,}"
    lines += ["", f"{large} − {small} prompts, Best-of-N's gold at N = {results['bon_max']}, paired per prompt: "
              f"{bands.signed(results['bon']['diff'], results['bon']['band'])}. **Verdict: {results['verdict']}.**",
              "", f"{large} − {small} prompts, PPO's gold in its last bin, paired by seed: "
              f"{bands.signed(results['ppo']['diff'], results['ppo']['band'])} (per seed "
              + ", ".join(f"{d:+.3f}" for d in results["ppo"]["per_seed"]) + ")."]
    return "\n".join(lines) + "\n"


def plot(results, path):
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colours = pyplot().get_cmap("viridis")([0.85, 0.5, 0.1, 0.3, 0.7][:len(results["sizes"])])
    titles = (("bon", "Best-of-N (N = 1, 2, 4, ...), band shaded"),
              ("ppo", "PPO against the proxy (mean of the seeds, band shaded)"))
    for (name, title), ax in zip(titles, axes):
        for colour, size in zip(colours, results["sizes"]):
            xs, ys, halves = zip(*results["curves"][size][name])
            ax.plot(xs, ys, "o-" if name == "bon" else "s-", color=colour, label=f"RM on {int(size):,} prompts")
            band(ax, xs, ys, halves, colour)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("KL to the SFT model (nats)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("gold: verifier accuracy")
    axes[0].set_ylim(bottom=0)
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint of the default task (required unless --quick)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="the proxy's training prompts, comma-separated")
    study_flags(parser, "out/rm_size", "rm_size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(set(sizes)) < 2:
        parser.error(f"--sizes={args.sizes}: at least two different sizes")
    if args.quick:
        # one SFT checkpoint for every size (overoptimisation.py --quick trains one per --out otherwise)
        args.init_from = args.init_from or train_once(os.path.join(args.out, "sft"),
                                                      dict(QUICK, algo="sft", max_iters=2, eval_interval=0))
    os.makedirs(args.out, exist_ok=True)
    results = compare({size: script_once(args, "overoptimisation.py", os.path.join(args.out, f"rm{size}"),
                                         [f"--rm_prompts={size}", f"--init_from={args.init_from}"]) for size in sizes})
    save_study(args.out, "rm_size", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
