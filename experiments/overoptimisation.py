"""
Reward over-optimisation (Goodhart; SPEC §3 Reward model, PPO, Best-of-N; Gao et al. 2023): a proxy
reward model trained on a limited set of verifier-labelled pairs, optimised two ways from one SFT
model, with the proxy (the RM's score), the gold reward (the verifier: the answer is right) and what
the proxy rewards (answer length in tokens, the share of answers that show their work) measured
against the KL to the SFT model:

    Best-of-N   --bon_max (64) answers per held-out prompt sampled once by the SFT model at T = 1;
                for N = 1, 2, 4, ..., --bon_max the proxy's top answer of each of the --bon_max/N
                disjoint blocks of N is kept, and a prompt's figure is the mean over its blocks;
                KL(π_BoN ‖ π_SFT) = log N − (N − 1)/N (the analytic value for distinct samples).
    PPO         lab/ppo_rm.py (--algo ppo_rm) against the proxy, one run per seed (--seeds, 3: 1337, 1338, 1339),
                a small KL coefficient so that the policy can travel; per iteration its rollouts'
                proxy score, their verifier accuracy (gold on the same answers), their KL to the
                SFT model (Σ_t log π/π_ref, k1, per answer), length and worked share, binned over
                --bin iterations; greedy held-out accuracy at its evaluations. Runs already
                finished in --out (ppo_<seed>, with the same settings) are read, not run again.

Bands follow bands.py. Best-of-N's gold: the binomial band over the prompts; its proxy (each
prompt's kept answers minus the mean of all its samples): the paired band. PPO's figures: the mean
over the seeds, gold with the band across seeds (t·SE from 3 seeds and the binomial band of a bin's
rollouts added in variance), the other figures with the t band alone; two seeds: no band.

The turning point: the point of highest mean gold, tested against every later point.
    Best-of-N   paired, since every N keeps answers from the same samples of the same prompts: per
                prompt the kept gold at the best N minus at the later N, and a per-prompt bootstrap
                (the prompts resampled with replacement, 2,000 times, a fixed seed) of its mean; the
                fall is significant where the 95% interval lies above 0.
    PPO         a bin's rollouts are fresh samples, so the pairing is by seed: per seed the best
                bin's gold minus the later bin's, with bands.paired_across_seeds (3 seeds or more:
                significant where the t band lies above 0; 2 seeds: no band, nothing claimed).
Proxy scores are shown relative to the SFT model's mean (a Bradley–Terry RM's offset is arbitrary),
so they can be negative. Up to 5 of Best-of-N's kept answers at the largest N with the highest proxy
score that the verifier marks wrong are listed. It writes results.json, overoptimisation.md (the
table) and the plot into --out.

    python experiments/overoptimisation.py --init_from=out/sft --set eval_batch_size=512  # the ladder's SFT stage
    python experiments/overoptimisation.py --init_from=out/sft --reward_model=out/rm_small
    python experiments/overoptimisation.py --quick --out=/tmp/goodhart          # a toy-size smoke test

Best-of-N samples eval_batch_size // bon_max prompts per sampler call: eval_batch_size=512 makes
that 8 prompts (512 answers) at bon_max 64 rather than 1 at the default of 100.
--set key=value (repeatable) passes a train.py key to every run (each takes the keys its algorithm knows).
"""

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402  (after the path: the script runs from anywhere)

from nanopost import bands  # noqa: E402
from nanopost.distributed import chunks  # noqa: E402
from nanopost.rollouts import rollouts, score_rollout  # noqa: E402
from experiments.study import (finished, last_logged, pyplot, rows, run, save_figure, save_study,  # noqa: E402
                               set_keys, study_flags, train_once)

# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, eval_batch_size=8, max_new_tokens=16, train_problems=64,
             val_examples=8, prompt_pool=64, heldout_prompts=8, device="cpu", plot=False)
SEEDS = (1337, 1338, 1339)
RESAMPLES = 2000  # the paired bootstrap's resamples of the prompts
EXAMPLES = 5      # high-proxy, gold-wrong answers listed


def proxy_model(args, common):
    """--reward_model, or a Bradley–Terry RM trained on --rm_prompts prompts' verifier pairs."""
    if args.reward_model:
        return args.reward_model
    return train_once(os.path.join(args.out, "rm"), dict(common, algo="rm", init_from=args.init_from, pairs="verifier",
                                                         train_prompts=args.rm_prompts, max_iters=args.rm_iters,
                                                         eval_interval=args.rm_iters))


@torch.no_grad()
def sample_answers(args, common, reward_model):
    """--bon_max answers per one of --bon_problems held-out prompts from the SFT model at T = 1, scored:
    (problems, texts in prompt-major order, and (prompts, bon_max) tensors of proxy, gold, length in
    tokens and worked (1.0 where the answer shows its work, env.shows_work))."""
    r = run(dict(common, algo="ppo_rm", init_from=args.init_from, reward_model=reward_model, max_iters=0,
                 eval_interval=0, out_dir=os.path.join(args.out, "bon")))
    policy, size = r.raw_model.policy.eval(), r.cfg["eval_batch_size"]
    problems = r.env.problems("heldout", args.bon_problems, seed=3)
    proxy, gold, length, worked, texts = [], [], [], [], []
    for k, chunk in enumerate(chunks(problems, max(1, size // args.bon_max))):
        roll = rollouts(r, policy, chunk, args.bon_max, temperature=1.0, seed=k, batch_size=size)
        proxy.append(score_rollout(r, r.state.reward_model, roll).view(len(chunk), -1).cpu())
        gold.append(roll.verified.view(len(chunk), -1).cpu())
        length.append(roll.lengths.float().view(len(chunk), -1).cpu())
        worked.append(torch.tensor([float(r.env.shows_work(t)) for t in roll.texts]).view(len(chunk), -1))
        texts += roll.texts
    return problems, texts, torch.cat(proxy), torch.cat(gold), torch.cat(length), torch.cat(worked)


def kept(proxy, N):
    """Per prompt and block of N samples, the index (into the prompt's samples) of the proxy's top one:
    (prompts, bon_max // N). The blocks are disjoint, so every N uses the same samples."""
    blocks = proxy.size(1) // N
    top = proxy[:, :blocks * N].reshape(len(proxy), blocks, N).argmax(2)
    return top + torch.arange(blocks).unsqueeze(0) * N


def best_of_n(proxy, gold, length, worked):
    """Best-of-N for N = 1, 2, 4, ... up to the samples per prompt (a power of two), from (prompts,
    samples) tensors: [{N, kl, proxy, proxy_band, gold, gold_band, length, worked}] and, per N, the
    kept gold of each prompt (the mean over its blocks: at N = 1, the mean over all its samples),
    which the paired turning-point test reads."""
    prompts, samples = proxy.shape
    if samples & (samples - 1):
        raise ValueError(f"best_of_n: {samples} samples per prompt, a power of two is needed (blocks of every N)")
    points, per_prompt, N = [], {}, 1
    while N <= samples:
        pick = kept(proxy, N)
        chosen = lambda x: x.gather(1, pick).mean(1)  # per prompt: the mean over its blocks
        gold_n = chosen(gold)
        # proxy − SFT's, paired per prompt: its kept answers minus the mean of all its samples
        lift, lift_band = bands.paired(chosen(proxy).tolist(), proxy.mean(1).tolist())
        mean = float(gold_n.mean())
        points.append(dict(N=N, kl=math.log(N) - (N - 1) / N, proxy=lift, proxy_band=lift_band, gold=mean,
                           # a prompt's figure averages several blocks at small N: the binomial band is an upper bound
                           gold_band=bands.binomial(mean, prompts),
                           length=float(chosen(length).mean()), worked=float(chosen(worked).mean())))
        per_prompt[N] = gold_n
        N *= 2
    return points, per_prompt


def paired_bootstrap(differences, resamples=RESAMPLES, seed=0):
    """(mean, low, high) of per-prompt paired differences: their mean and the 95% percentile interval
    of the mean over `resamples` resamplings of the prompts with replacement (a fixed seed: the same
    interval on every run)."""
    d = torch.as_tensor(differences, dtype=torch.float64).flatten()
    picks = torch.randint(0, len(d), (resamples, len(d)), generator=torch.Generator().manual_seed(seed))
    means = d[picks].mean(1)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return float(d.mean()), low, high


def bon_turning_point(points, per_prompt, resamples=RESAMPLES, seed=0):
    """The N of highest mean gold and, for every larger N, the paired fall from it (per prompt: gold at
    the best N minus gold at the later N) with its bootstrap 95% interval; significant where some
    interval lies above 0. (One test per later N at 95% each, not corrected: the later N share their
    samples, so the tests are far from independent.)"""
    best = max(range(len(points)), key=lambda i: points[i]["gold"])
    top = points[best]
    drops = []
    for p in points[best + 1:]:
        mean, low, high = paired_bootstrap(per_prompt[top["N"]] - per_prompt[p["N"]], resamples, seed)
        drops.append(dict(N=p["N"], kl=p["kl"], gold=p["gold"], drop=mean, low=low, high=high, significant=low > 0))
    return dict(N=top["N"], kl=top["kl"], gold=top["gold"], drops=drops, significant=any(d["significant"] for d in drops))


def ppo_curve(out_dir, bin_iters):
    """[{iters, kl, proxy, gold, gold_band, len_mean, work_frac, rollouts}] of a PPO run's rollouts,
    binned, and [{iter, heldout_acc, heldout_kl_ref}] of its evaluations. (ppo.py logs len_mean and
    work_frac per iteration: the rollouts' mean length in tokens and their share that shows its work.)"""
    logged = rows(out_dir)
    train = [r for r in logged if "rm_score" in r]
    evals = [dict(iter=r["iter"], heldout_acc=r["heldout_acc"], heldout_kl_ref=r.get("heldout_kl_ref"))
             for r in logged if "heldout_acc" in r]
    n = json.load(open(os.path.join(out_dir, "config.json")))
    per_iter = n["batch_size"] * n["gradient_accumulation_steps"] * n["minibatches"]
    base = train[0]["rm_score"]  # the first iteration's rollouts are the SFT model's (no update yet)
    points = []
    for k in range(0, len(train) - bin_iters + 1, bin_iters):
        part = train[k:k + bin_iters]
        mean = lambda key: sum(r[key] for r in part) / len(part)
        gold, count = mean("verifier_acc"), per_iter * len(part)
        points.append(dict(iters=f"{part[0]['iter']}-{part[-1]['iter']}", kl=mean("kl_ref"), proxy=mean("rm_score") - base,
                           gold=gold, gold_band=bands.binomial(gold, count), len_mean=mean("len_mean"),
                           work_frac=mean("work_frac"), rollouts=count))
    return points, evals


def ppo_runs(args, common, reward_model):
    """One PPO run per seed against the same proxy (out dirs ppo_<seed>): [{seed, curve, evals}]."""
    runs = []
    for seed in args.seeds:
        out_dir = os.path.join(args.out, f"ppo_{seed}")
        overrides = dict(common, algo="ppo_rm", init_from=args.init_from, reward_model=reward_model,
                         kl_coef=args.kl_coef, max_iters=args.ppo_iters, eval_samples=0, seed=seed, out_dir=out_dir,
                         eval_interval=max(1, args.ppo_iters // args.ppo_evals))
        if not finished(out_dir, overrides, "rm_score"):
            run(overrides)
        curve, evals = ppo_curve(out_dir, args.bin)
        runs.append(dict(seed=seed, curve=curve, evals=evals))
    return runs


def ppo_mean(runs):
    """Per bin, the mean over the seeds' curves with its band (bands.across_seeds): gold as an accuracy
    on the bin's rollouts, proxy, KL, length and worked share with the t band alone (n = None)."""
    points = []
    for parts in zip(*(r["curve"] for r in runs)):
        point = dict(iters=parts[0]["iters"], rollouts=parts[0]["rollouts"], seeds=len(parts),
                     gold_per_seed=[p["gold"] for p in parts])
        for key in ("gold", "proxy", "kl", "len_mean", "work_frac"):
            point[key], point[f"{key}_band"] = bands.across_seeds([p[key] for p in parts],
                                                                  parts[0]["rollouts"] if key == "gold" else None)
        points.append(point)
    return points


def ppo_turning_point(runs, mean):
    """The bin of highest mean gold and, for every later bin, the fall from it paired by seed (per seed:
    the best bin's gold minus the later bin's) with bands.paired_across_seeds: a t band from 3 seeds,
    none from fewer (band None; a fall is then never called significant)."""
    best = max(range(len(mean)), key=lambda i: mean[i]["gold"])
    drops = []
    for j in range(best + 1, len(mean)):
        per_seed = [r["curve"][best]["gold"] - r["curve"][j]["gold"] for r in runs]
        drop, band = bands.paired_across_seeds(per_seed, None)  # (each bin's own rollouts: no shared problems)
        drops.append(dict(iters=mean[j]["iters"], kl=mean[j]["kl"], gold=mean[j]["gold"], drop=drop, band=band,
                          per_seed=per_seed, significant=band is not None and drop - band > 0))
    return dict(iters=mean[best]["iters"], kl=mean[best]["kl"], gold=mean[best]["gold"], drops=drops,
                significant=any(d["significant"] for d in drops))


def wrong_examples(problems, texts, proxy, gold, k=EXAMPLES):
    """Up to k of Best-of-N's kept answers at the largest N (one block: each prompt's top-proxy sample)
    that the verifier marks wrong, highest proxy first: [{prompt, answer, proxy (− SFT's mean),
    proxy_raw, correct}]."""
    samples = proxy.size(1)
    top = proxy.argmax(1)
    wrong = [(float(proxy[i, j]), i, int(j)) for i, j in enumerate(top.tolist()) if gold[i, j] == 0]
    base = float(proxy.mean())
    return [dict(prompt=problems[i]["prompt"], answer=texts[i * samples + j], proxy=score - base, proxy_raw=score,
                 correct=problems[i].get("answer")) for score, i, j in sorted(wrong, reverse=True)[:k]]


def interval(d):
    return f"{d['drop']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def table(results):
    ppo, seeds = results["ppo"], [r["seed"] for r in results["ppo"]["runs"]]
    rm_acc = results["rm_val_pair_acc"]  # (None: a given RM whose run logged none)
    lines = [f"Proxy: a reward model on {results['rm_pairs_note']}, held-out pair accuracy "
             f"{'–' if rm_acc is None else f'{rm_acc:.3f}'}. Best-of-N: {results['bon_prompts']} held-out prompts × "
             f"{results['bon_max']} samples, every N keeping answers from the same samples; PPO: seeds "
             f"{', '.join(map(str, seeds))}, the mean over them. Bands 95% (bands.py): Best-of-N's gold binomial over "
             "the prompts, its proxy paired per prompt; PPO's across the seeds.", "",
             "| optimiser | point | KL to SFT (nats) | proxy − SFT's | gold (verifier accuracy) | gold per seed "
             "| length (tokens) | worked share |", "|---|---|---|---|---|---|---|---|"]
    for p in results["best_of_n"]:
        lines.append(f"| Best-of-N | N = {p['N']} | {p['kl']:.2f} | {p['proxy']:+.3f} ± {p['proxy_band']:.3f} | "
                     f"{p['gold']:.3f} ± {p['gold_band']:.3f} | | {p['length']:.1f} | {p['worked']:.3f} |")
    def cell(p, key, fmt):  # 'mean ± band', or the mean alone where no band is claimed (fewer than 3 seeds)
        half = p[key + "_band"]
        return f"{p[key]:{fmt}}" + (f" ± {half:{fmt.lstrip('+')}}" if half is not None else "")
    for p in ppo["mean"]:
        lines.append(f"| PPO | iterations {p['iters']} | {cell(p, 'kl', '.2f')} | {cell(p, 'proxy', '+.3f')} | "
                     f"{cell(p, 'gold', '.3f')} | {', '.join(f'{g:.3f}' for g in p['gold_per_seed'])} | "
                     f"{cell(p, 'len_mean', '.1f')} | {cell(p, 'work_frac', '.3f')} |")
    if len(seeds) == 2:
        lines.append("\n(PPO: two seeds, no band is claimed for their mean.)")
    lines += ["", "Turning points (the point of highest mean gold against every later one):", ""]
    turn = results["turning_points"]["best_of_n"]
    lines.append(f"- Best-of-N: gold peaks at N = {turn['N']} (KL {turn['kl']:.2f} nats, {turn['gold']:.3f}). "
                 + ("No larger N." if not turn["drops"] else
                    f"The paired fall to each larger N (per-prompt bootstrap, {results['bootstrap_resamples']} "
                    "resamples, 95% interval): " + "; ".join(f"N = {d['N']}: {interval(d)}" for d in turn["drops"])
                    + (". Significant: gold turns down." if turn["significant"] else ". No interval lies above 0.")))
    turn = results["turning_points"]["ppo"]
    how = ("paired by seed, t band" if len(seeds) >= 3 else
           f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}: no band, nothing claimed")
    falls = [f"iterations {d['iters']}: {d['drop']:+.3f}" + ("" if d["band"] is None else f" ± {d['band']:.3f}")
             for d in turn["drops"]]
    lines.append(f"- PPO: mean gold peaks at iterations {turn['iters']} (KL {turn['kl']:.2f} nats, {turn['gold']:.3f}). "
                 + ("No later bin." if not falls else f"The fall to each later bin ({how}): " + "; ".join(falls)
                    + (". Significant: gold turns down." if turn["significant"] else ". No fall is significant.")))
    for r in ppo["runs"]:
        lines.append(f"- PPO seed {r['seed']}, greedy held-out accuracy at its evaluations: " + ", ".join(
            f"iteration {e['iter']}: {e['heldout_acc']:.3f}" for e in r["evals"]))
    lines += ["", f"### High-proxy answers the verifier marks wrong (Best-of-N, N = {results['bon_max']})", ""]
    if not results["examples"]:
        lines.append("None: every kept answer at the largest N is right.")
    indent = lambda text: "\n".join("    " + line for line in str(text).splitlines() or [""])
    for k, e in enumerate(results["examples"], 1):
        lines += [f"{k}. proxy − SFT's {e['proxy']:+.3f}; the correct answer: {e['correct']}", "",
                  "    prompt:", indent(indent(e["prompt"])), "", "    answer:", indent(indent(e["answer"])), ""]
    return "\n".join(lines) + "\n"


BON, PPO = "#1b9e77", "#d95f02"  # Dark2's green and orange: apart in hue and lightness, colour-blind safe


def band(ax, x, y, half, colour):
    if all(h is not None for h in half):
        ax.fill_between(x, [a - h for a, h in zip(y, half)], [a + h for a, h in zip(y, half)], color=colour,
                        alpha=0.2, lw=0)


def plot(results, path):
    bon, ppo, runs = results["best_of_n"], results["ppo"]["mean"], results["ppo"]["runs"]
    k = len(runs)
    ppo_label = "PPO, 1 seed" if k == 1 else f"PPO, mean of {k} seeds" + (" (no band: 2 seeds)" if k == 2 else "")
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.2))
    x_bon, x_ppo = [p["kl"] for p in bon], [p["kl"] for p in ppo]

    ax = axes[0]  # gold: 5 lines at 3 seeds (each seed's drawn only up to 4 seeds, to stay readable)
    ax.plot(x_bon, [p["gold"] for p in bon], "o-", color=BON, label="Best-of-N (N = 1, 2, 4, ...)")
    band(ax, x_bon, [p["gold"] for p in bon], [p["gold_band"] for p in bon], BON)
    ax.plot(x_ppo, [p["gold"] for p in ppo], "s-", color=PPO, label=ppo_label)
    band(ax, x_ppo, [p["gold"] for p in ppo], [p["gold_band"] for p in ppo], PPO)
    if k <= 4:
        for s, r in enumerate(runs):
            ax.plot([p["kl"] for p in r["curve"]], [p["gold"] for p in r["curve"]], ":", color=PPO, lw=1, alpha=0.6,
                    label="PPO, each seed" if s == 0 else None)
    for name, colour in (("best_of_n", BON), ("ppo", PPO)):
        turn = results["turning_points"][name]
        ax.axvline(turn["kl"], color=colour, ls="--", lw=0.8)
        ax.plot([turn["kl"]], [turn["gold"]], "*", ms=14, color=colour, mec="black",
                mfc=colour if turn["significant"] else "white")
    ax.plot([], [], "*", ms=10, color="grey", mec="black", label="peak: filled if gold then falls significantly")
    top = max([p["gold"] + (p["gold_band"] or 0) for p in bon + ppo] + [0.05])
    ax.set_ylim(0, min(1.0, top * 1.15))
    ax.set_ylabel("gold: verifier accuracy (band 95%)")
    ax.set_title("Gold reward (axis from 0)", fontsize=10)

    ax = axes[1]  # proxy: 2 lines and the baseline
    ax.axhline(0, color="grey", lw=0.8, label="the SFT model's mean (0)")
    ax.plot(x_bon, [p["proxy"] for p in bon], "o-", color=BON, label="Best-of-N")
    band(ax, x_bon, [p["proxy"] for p in bon], [p["proxy_band"] for p in bon], BON)
    ax.plot(x_ppo, [p["proxy"] for p in ppo], "s-", color=PPO, label=ppo_label)
    band(ax, x_ppo, [p["proxy"] for p in ppo], [p["proxy_band"] for p in ppo], PPO)
    ax.set_ylim(bottom=min([0.0] + [p["proxy"] - (p["proxy_band"] or 0) for p in bon + ppo]) - 0.1)
    ax.set_ylabel("proxy: RM score − SFT's mean (can be < 0)")
    ax.set_title("Proxy reward (from the SFT baseline, 0)", fontsize=10)

    ax = axes[2]  # what the proxy rewards: 4 lines on two axes, each from 0
    ax.plot(x_bon, [p["length"] for p in bon], "o-", color=BON, label="length, Best-of-N")
    ax.plot(x_ppo, [p["len_mean"] for p in ppo], "s-", color=PPO, label="length, PPO")
    band(ax, x_ppo, [p["len_mean"] for p in ppo], [p["len_mean_band"] for p in ppo], PPO)
    ax.set_ylim(0, max([p["length"] for p in bon] + [p["len_mean"] for p in ppo] + [1]) * 1.15)
    ax.set_ylabel("answer length (tokens), solid")
    share = ax.twinx()
    share.plot(x_bon, [p["worked"] for p in bon], "o--", color=BON, mfc="white", label="worked share, Best-of-N")
    share.plot(x_ppo, [p["work_frac"] for p in ppo], "s--", color=PPO, mfc="white", label="worked share, PPO")
    share.set_ylim(0, 1.05)
    share.set_ylabel("share that shows its work, dashed")
    ax.set_title("What the proxy rewards (Best-of-N: the kept answers)", fontsize=10)
    handles = [h for a in (ax, share) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="lower right")

    for ax in axes:
        ax.set_xlabel("KL to the SFT model (nats)")
        ax.set_xlim(left=min([0.0] + x_bon + x_ppo))  # 0, unless a k1 estimate of PPO's KL came out below it
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint of the default task (required)")
    parser.add_argument("--reward_model", default="", help="a proxy RM checkpoint (default: train one)")
    parser.add_argument("--rm_prompts", type=int, default=256, help="training prompts of the proxy's verifier pairs")
    parser.add_argument("--rm_iters", type=int, default=150, help="the proxy's training iterations (rm.py's default)")
    parser.add_argument("--bon_problems", type=int, default=500, help="held-out prompts for Best-of-N")
    parser.add_argument("--bon_max", type=int, default=64, help="the largest N and the samples per prompt (a power of two)")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="PPO runs, one per seed (1337, 1338, ...)")
    parser.add_argument("--ppo_iters", type=int, default=40, help="PPO iterations against the proxy")
    parser.add_argument("--kl_coef", type=float, default=0.01, help="PPO's KL coefficient β")
    parser.add_argument("--bin", type=int, default=8, help="PPO iterations per plotted point")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per PPO evaluation")
    parser.add_argument("--ppo_evals", type=int, default=1, help="PPO's greedy held-out evaluations after its start")
    study_flags(parser, "out/overoptimisation", "overoptimisation")
    args = parser.parse_args()
    if args.quick:
        args.rm_prompts, args.bon_problems, args.bon_max, args.ppo_iters, args.bin, args.eval_problems = 16, 4, 4, 4, 2, 4
        args.ppo_evals, args.rm_iters = 4, 4
        args.init_from = args.init_from or train_once(os.path.join(args.out, "sft"),
                                                      dict(QUICK, algo="sft", max_iters=2, eval_interval=0))
    if args.bon_max < 1 or args.bon_max & (args.bon_max - 1):
        parser.error(f"--bon_max={args.bon_max}: a power of two (every N's blocks share the samples)")
    if args.seeds < 1:
        parser.error("--seeds: at least 1")
    args.seeds = [SEEDS[0] + k for k in range(args.seeds)]
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint: run the ladder's sft stage first")
    common = {**(QUICK if args.quick else {}), "eval_problems": args.eval_problems, "log_interval": 1,
              "checkpoint": False, **set_keys(args)}
    os.makedirs(args.out, exist_ok=True)

    reward_model = proxy_model(args, common)
    results = dict(init_from=args.init_from, reward_model=reward_model, kl_coef=args.kl_coef,
                   rm_pairs_note=f"the verifier pairs of {args.rm_prompts} training prompts" if not args.reward_model
                   else reward_model,
                   rm_val_pair_acc=last_logged(reward_model, "val_pair_acc"), bon_max=args.bon_max,
                   bootstrap_resamples=RESAMPLES)
    problems, texts, proxy, gold, length, worked = sample_answers(args, common, reward_model)
    points, per_prompt = best_of_n(proxy, gold, length, worked)
    results.update(bon_prompts=len(problems), bon_sample_gold=float(gold.mean()), best_of_n=points,
                   best_of_n_per_prompt={str(N): g.tolist() for N, g in per_prompt.items()},
                   examples=wrong_examples(problems, texts, proxy, gold))
    runs = ppo_runs(args, common, reward_model)
    results["ppo"] = dict(runs=runs, mean=ppo_mean(runs))
    results["turning_points"] = dict(best_of_n=bon_turning_point(points, per_prompt),
                                     ppo=ppo_turning_point(runs, results["ppo"]["mean"]))
    save_study(args.out, "overoptimisation", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
