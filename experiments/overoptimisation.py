"""
Reward over-optimisation (Goodhart; SPEC §3 Reward model, PPO, Best-of-N; Gao et al. 2023): a proxy
reward model trained on a limited set of verifier-labelled pairs, optimised two ways from one SFT
model, with the proxy (the RM's score) and the gold reward (the verifier: the answer is right)
measured against the KL to the SFT model:

    Best-of-N   N answers per held-out prompt sampled by the SFT model at T = 1, the proxy's top one
                kept; KL(π_BoN ‖ π_SFT) = log N − (N − 1)/N (the analytic value for distinct samples).
                Each N's figures average over the Nmax/N disjoint blocks of Nmax samples per prompt.
    PPO         ppo.py --reward=rm against the proxy, a small KL coefficient so that the policy can
                travel; per iteration its rollouts' proxy score, their verifier accuracy (gold on the
                same answers) and their KL to the SFT model (Σ_t log π/π_ref, k1, per answer), binned
                over --bin iterations; greedy held-out accuracy at its evaluations.

Proxy scores are shown relative to the SFT model's mean (a Bradley–Terry RM's offset is arbitrary).
The point where gold turns down is marked when a later point is below the best one by more than
its noise band (2 standard errors). It writes results.json, overoptimisation.md (the table) and the
plot into --out.

    python experiments/overoptimisation.py --init_from=out/sft                  # the ladder's SFT stage
    python experiments/overoptimisation.py --init_from=out/sft --reward_model=out/rm_small
    python experiments/overoptimisation.py --quick --out=/tmp/goodhart          # a toy-size smoke test

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

import options  # noqa: E402
from distributed import chunks  # noqa: E402
from rollouts import rollouts, score_responses  # noqa: E402
from experiments.generalpoints import run, save_study  # noqa: E402  (train.train with the keys of the run's algorithm)

# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, eval_batch_size=8, max_new_tokens=16, train_problems=64,
             val_examples=8, prompt_pool=64, heldout_prompts=8, device="cpu", plot=False)


def last_eval(out_dir, key):
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return [r[key] for r in rows if key in r][-1]


def proxy_model(args, common):
    """--reward_model, or a Bradley–Terry RM trained on --rm_prompts prompts' verifier pairs."""
    if args.reward_model:
        return args.reward_model
    out = os.path.join(args.out, "rm")
    if not os.path.isfile(os.path.join(out, "ckpt.pt")):
        run(dict(common, algo="rm", init_from=args.init_from, pairs="verifier", train_prompts=args.rm_prompts,
                 max_iters=args.rm_iters, eval_interval=args.rm_iters, checkpoint=True, out_dir=out))
    return out


@torch.no_grad()
def best_of_n(args, common, reward_model):
    """Best-of-N by the proxy on --bon_problems held-out prompts: [{N, kl, proxy, gold, gold_band}]."""
    r = run(dict(common, algo="ppo", init_from=args.init_from, reward="rm", reward_model=reward_model, max_iters=0,
                 eval_interval=0, out_dir=os.path.join(args.out, "bon")))
    policy, problems, size = r.raw_model.policy.eval(), r.env.problems("heldout", args.bon_problems, seed=3), r.cfg["eval_batch_size"]
    proxy, gold = [], []
    for k, chunk in enumerate(chunks(problems, max(1, size // args.bon_max))):
        roll = rollouts(r, policy, chunk, args.bon_max, temperature=1.0, seed=k, batch_size=size)
        with r.autocast:
            proxy.append(torch.cat([score_responses(r.state.reward_model, ids, mask) for ids, mask in
                                    zip(chunks(roll.ids, size), chunks(roll.mask, size))]).view(len(chunk), -1))
        gold.append(roll.verified.view(len(chunk), -1).cpu())
    proxy, gold = torch.cat(proxy).cpu(), torch.cat(gold)
    base = float(proxy.mean())
    points, N = [], 1
    while N <= args.bon_max:
        blocks = args.bon_max // N
        p, g = proxy[:, :blocks * N].reshape(-1, N), gold[:, :blocks * N].reshape(-1, N)
        top = p.argmax(1, keepdim=True)
        chosen = g.gather(1, top).view(len(problems), blocks).mean(1)  # per prompt: the mean over its blocks
        mean = float(chosen.mean())
        points.append(dict(N=N, kl=math.log(N) - (N - 1) / N, proxy=float(p.gather(1, top).mean()) - base, gold=mean,
                           gold_band=2 * float(chosen.std(unbiased=True)) / math.sqrt(len(problems))))
        N *= 2
    return points


def ppo_curve(out_dir, bin_iters):
    """[{iters, kl, proxy, gold, gold_band, rollouts}] of a PPO run's rollouts, binned, and
    [{iter, heldout_acc, heldout_kl_ref}] of its evaluations."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    train = [r for r in rows if "rm_score" in r]
    evals = [dict(iter=r["iter"], heldout_acc=r["heldout_acc"], heldout_kl_ref=r.get("heldout_kl_ref"))
             for r in rows if "heldout_acc" in r]
    n = json.load(open(os.path.join(out_dir, "config.json")))
    per_iter = n["batch_size"] * n["gradient_accumulation_steps"] * n["minibatches"]
    base = train[0]["rm_score"]
    points = []
    for k in range(0, len(train) - bin_iters + 1, bin_iters):
        part = train[k:k + bin_iters]
        mean = lambda key: sum(r[key] for r in part) / len(part)
        gold, count = mean("verifier_acc"), per_iter * len(part)
        points.append(dict(iters=f"{part[0]['iter']}-{part[-1]['iter']}", kl=mean("kl_ref"), proxy=mean("rm_score") - base,
                           gold=gold, gold_band=2 * math.sqrt(max(gold * (1 - gold), 1e-12) / count), rollouts=count))
    return points, evals


def turning_point(points):
    """The point of highest gold when a later point lies below it by more than both bands, else None."""
    best = max(range(len(points)), key=lambda i: points[i]["gold"])
    later = points[best + 1:]
    drop = any(points[best]["gold"] - p["gold"] > points[best]["gold_band"] + p["gold_band"] for p in later)
    return points[best] if drop else None


def table(results):
    lines = [f"Proxy: a reward model on {results['rm_pairs_note']}, held-out pair accuracy "
             f"{results['rm_val_pair_acc']:.3f}.", "",
             "| optimiser | point | KL to SFT (nats) | proxy − SFT's | gold (verifier accuracy) |", "|---|---|---|---|---|"]
    for p in results["best_of_n"]:
        lines.append(f"| Best-of-N | N = {p['N']} | {p['kl']:.2f} | {p['proxy']:+.3f} | {p['gold']:.3f} ± {p['gold_band']:.3f} |")
    for p in results["ppo"]:
        lines.append(f"| PPO | iterations {p['iters']} | {p['kl']:.2f} | {p['proxy']:+.3f} | {p['gold']:.3f} ± {p['gold_band']:.3f} |")
    lines.append("")
    for name in ("best_of_n", "ppo"):
        turn = results["turning_points"][name]
        lines.append(f"- {name}: " + (f"gold peaks at KL {turn['kl']:.2f} nats ({turn['gold']:.3f}) and then falls "
                                      f"by more than the band" if turn else "gold does not fall significantly below its best point"))
    lines.append("- PPO greedy held-out accuracy at its evaluations: " + ", ".join(
        f"iteration {e['iter']}: {e['heldout_acc']:.3f}" for e in results["ppo_evals"]))
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, name, title in zip(axes, ("best_of_n", "ppo"), ("Best-of-N by the proxy", "PPO against the proxy")):
        points = results[name]
        kl = [p["kl"] for p in points]
        ax.plot(kl, [p["proxy"] for p in points], "o-", color="C0", label="proxy (RM score − SFT's)")
        ax.set_xlabel("KL to the SFT model (nats)")
        ax.set_ylabel("proxy", color="C0")
        gold_ax = ax.twinx()
        gold_ax.errorbar(kl, [p["gold"] for p in points], yerr=[p["gold_band"] for p in points], fmt="s-", color="C3",
                         capsize=2, label="gold (verifier accuracy)")
        gold_ax.set_ylabel("gold", color="C3")
        turn = results["turning_points"][name]
        if turn:
            gold_ax.axvline(turn["kl"], color="grey", ls=":")
            gold_ax.annotate("gold turns down", (turn["kl"], turn["gold"]), fontsize=8)
        ax.set_title(title, fontsize=10)
        lines = ax.get_legend_handles_labels(), gold_ax.get_legend_handles_labels()
        ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint of the default task (required)")
    parser.add_argument("--reward_model", default="", help="a proxy RM checkpoint (default: train one)")
    parser.add_argument("--rm_prompts", type=int, default=256, help="training prompts of the proxy's verifier pairs")
    parser.add_argument("--rm_iters", type=int, default=150, help="the proxy's training iterations (rm.py's default)")
    parser.add_argument("--bon_problems", type=int, default=500, help="held-out prompts for Best-of-N")
    parser.add_argument("--bon_max", type=int, default=16, help="the largest N (a power of two)")
    parser.add_argument("--ppo_iters", type=int, default=40, help="PPO iterations against the proxy")
    parser.add_argument("--kl_coef", type=float, default=0.01, help="PPO's KL coefficient β")
    parser.add_argument("--bin", type=int, default=8, help="PPO iterations per plotted point")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per PPO evaluation")
    parser.add_argument("--ppo_evals", type=int, default=1, help="PPO's greedy held-out evaluations after its start")
    parser.add_argument("--quick", action="store_true", help="toy sizes, for a smoke test (numbers mean nothing)")
    parser.add_argument("--out", default="out/overoptimisation")
    parser.add_argument("--plot", default="", help="the plot's path (default: OUT/overoptimisation.png)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every run")
    args = parser.parse_args()
    if args.quick:
        args.rm_prompts, args.bon_problems, args.bon_max, args.ppo_iters, args.bin, args.eval_problems = 16, 4, 4, 4, 2, 4
        args.ppo_evals, args.rm_iters = 4, 4
        if not args.init_from:
            args.init_from = os.path.join(args.out, "sft")
            run(dict(QUICK, algo="sft", max_iters=2, eval_interval=0, checkpoint=True, out_dir=args.init_from))
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint: run the ladder's sft stage first")
    common = {**(QUICK if args.quick else {}), "eval_problems": args.eval_problems, "log_interval": 1,
              "checkpoint": False, **options.parse_args([f"--{kv}" for kv in args.set])}
    os.makedirs(args.out, exist_ok=True)

    reward_model = proxy_model(args, common)
    results = dict(init_from=args.init_from, reward_model=reward_model, kl_coef=args.kl_coef,
                   rm_pairs_note=f"the verifier pairs of {args.rm_prompts} training prompts" if not args.reward_model
                   else reward_model,
                   rm_val_pair_acc=last_eval(reward_model, "val_pair_acc"))
    results["best_of_n"] = best_of_n(args, common, reward_model)
    out_dir = os.path.join(args.out, "ppo")
    run(dict(common, algo="ppo", init_from=args.init_from, reward="rm", reward_model=reward_model,
             kl_coef=args.kl_coef, max_iters=args.ppo_iters, eval_interval=max(1, args.ppo_iters // args.ppo_evals),
             eval_samples=0, out_dir=out_dir))
    results["ppo"], results["ppo_evals"] = ppo_curve(out_dir, args.bin)
    results["turning_points"] = {name: turning_point(results[name]) for name in ("best_of_n", "ppo")}
    save_study(args.out, "overoptimisation", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
