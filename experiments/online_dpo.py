"""
Online against offline preference data (SPEC §3 "DPO", "GRPO"): does DPO on pairs sampled from the
current policy close the gap to online RL? From one SFT checkpoint, at equal sampled answers and equal
iterations, with each of --seeds (1337, 1338, 1339):

    offline_dpo   dpo.py as it stands: verifier pairs of --iters × --answers / --group_size train prompts,
                  --group_size answers each sampled ONCE by the SFT model before the first step (a prompt with
                  no right answer gets the demonstration as chosen: pairs.builtin_pairs's demo_chosen)
    online_dpo    --algo online_dpo (lab/online_dpo.py): a round every --online_every iterations of
                  --answers × --online_every / --group_size train prompts × --group_size answers from the
                  current policy, labelled by the verifier, each prompt's right answer over its wrong one
    grpo          grpo.py: --answers / --grpo_group_size prompts × --grpo_group_size answers per iteration
    --labelers=verifier,rm,judge adds online_dpo_rm and online_dpo_judge (--reward_model, --judge: the labeler)

How answers are counted: every answer an arm samples to train on, --answers per iteration on average,
--iters × --answers in all; offline DPO samples all of its answers before its first step. Not counted:
the held-out pairs (--heldout_prompts × --group_size answers of the SFT model, the same in both DPO arms,
read only for the val_ figures) and the evaluations. Both DPO arms run dpo.py's loss and defaults (DPO,
β = 0.1, lr 3e-5 cosine to 3e-6 over --iters, 16 pairs per step), π_ref = the SFT model in every round;
GRPO runs grpo.py's defaults (lr 1e-4, k3 KL β = 0.04, one step per iteration). Offline DPO's pairs are
sampled with pairs.py's fixed seed, so its seeds differ only in the order of its batches; the other
arms' seeds also change what they sample. Every seed starts from the same SFT checkpoint.

Measured: greedy held-out accuracy (the verifier) on --eval_problems problems, the same for every arm and
seed, at iteration 0 and every --eval_every iterations (with the worked share and the length); per online
round its pairs, the share of prompts with a pair (1 − the no-pair share) and the verifier's accuracy on
its answers. Bands (bands.py): each arm at each point, the mean over the seeds ± t(0.975, k − 1)·SE and
the binomial band added in variance (across_seeds); the arms at the last point paired by seed (the same seed: the same
start and held-out problems): online − offline, online − GRPO, offline − GRPO (paired_across_seeds, the t band alone:
no per-problem results are kept). It
writes results.json, online_dpo.md (the table) and online_dpo.png (accuracy against the iteration, each
arm's seed mean with its band shaded; the online rounds' pair share) into --out. Runs already finished in
--out with the same settings are read, not run again.

    python experiments/online_dpo.py --init_from=out/sft
    python experiments/online_dpo.py --init_from=out/sft --labelers=verifier,rm --reward_model=out/rm
    python experiments/online_dpo.py --quick --out=/tmp/online_dpo      # a toy-size smoke test (numbers mean nothing)

--set key=value (repeatable) passes a train.py key to every run (each takes the keys its algorithm knows).
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from lab.online_dpo import LABELERS  # noqa: E402
from experiments.study import (band_line, finished, pyplot, rows, run, save_figure, save_study,  # noqa: E402
                               set_keys, study_flags, train_once)

# --quick: a tiny model on one-step problems (1 + 2), its SFT long enough that some sampled answers are
# right (about 1 in 5), so that online rounds find pairs; the whole study in under a minute
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, eval_batch_size=64, max_new_tokens=12, train_problems=512,
             val_examples=8, heldout_prompts=8, env_ops=1, env_direct_frac=1.0, device="cpu", plot=False)
QUICK_SFT = dict(max_iters=400, learning_rate=5e-3, min_lr=5e-4, batch_size=16)
SEEDS = (1337, 1338, 1339)


def arms(args):
    """{arm: its train.py keys}, every arm sampling --answers answers per iteration on average."""
    A, N, G = args.answers, args.iters, args.group_size
    out = dict(offline_dpo=dict(algo="dpo", group_size=G, train_prompts=A * N // G))
    for labeler in args.labelers:
        out["online_dpo" if labeler == "verifier" else f"online_dpo_{labeler}"] = dict(
            algo="online_dpo", group_size=G, online_every=args.online_every,
            online_prompts=A * args.online_every // G, online_labeler=labeler,
            **dict(rm=dict(reward_model=args.reward_model), judge=dict(judge=args.judge)).get(labeler, {}))
    out["grpo"] = dict(algo="grpo", prompts_per_iter=A // args.grpo_group_size, group_size=args.grpo_group_size)
    return out


def answers_sampled(out_dir):
    """The answers a finished run sampled to train on, from its config.json and metrics.jsonl."""
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    if cfg["algo"] == "grpo":
        return cfg["prompts_per_iter"] * cfg["group_size"] * cfg["max_iters"]
    if cfg["algo"] == "online_dpo":
        return max(r["answers_sampled"] for r in rows(out_dir) if "answers_sampled" in r)
    return cfg["train_prompts"] * cfg["group_size"]  # (offline: sampled once, before the first step)


def curve(out_dir):
    """[{iter, heldout_acc, heldout_work, heldout_len}] at each evaluation of a run."""
    return [dict(iter=r["iter"], heldout_acc=r["heldout_acc"], heldout_work=r["heldout_work"], heldout_len=r["heldout_len"])
            for r in rows(out_dir) if "heldout_acc" in r]


def rounds(out_dir):
    """[{round, iter (its first), online_pairs, online_pair_share, online_sampled_acc, ...}] of an online run."""
    seen = {}
    for r in rows(out_dir):
        if "online_round" in r and r["online_round"] not in seen:
            seen[r["online_round"]] = dict(round=r["online_round"], iter=r["iter"] - 1,
                                           **{k: v for k, v in r.items() if k.startswith("online_") and k != "online_round"})
    return list(seen.values())


def run_arm(args, common, name, keys):
    """{seed: {out_dir, answers_sampled, wall_seconds (None: read, not run), curve, rounds}} of one arm."""
    runs = {}
    for seed in args.seeds:
        out_dir = os.path.join(args.out, f"{name}_{seed}")
        overrides = dict(common, **keys, seed=seed, out_dir=out_dir, overwrite=True)
        t0, ran = time.time(), not finished(out_dir, overrides, "heldout_acc")
        if ran:
            run(overrides)  # (an unfinished run starts over)
        runs[str(seed)] = dict(out_dir=out_dir, answers_sampled=answers_sampled(out_dir),
                               wall_seconds=time.time() - t0 if ran else None, curve=curve(out_dir),
                               rounds=rounds(out_dir) if keys["algo"] == "online_dpo" else None)
    return runs


def summarise(results, n):
    """Per arm and evaluation the seeds' mean and band; at the last point each arm's figure and the paired
    differences by seed."""
    arms_, points, final, paired = results["arms"], {}, {}, []
    for arm, runs in arms_.items():
        curves = [r["curve"] for r in runs.values()]
        points[arm] = [dict(iter=c[0]["iter"], **dict(zip(("mean", "band"), bands.across_seeds(
            [p["heldout_acc"] for p in c], n)))) for c in zip(*curves)]
        last = [c[-1] for c in curves]
        final[arm] = dict(mean=points[arm][-1]["mean"], band=points[arm][-1]["band"],
                          per_seed=[p["heldout_acc"] for p in last], start=curves[0][0]["heldout_acc"],
                          work=sum(p["heldout_work"] for p in last) / len(last),
                          length=sum(p["heldout_len"] for p in last) / len(last))
    online = [arm for arm in arms_ if arm.startswith("online_dpo")]
    comparisons = ([(arm, "offline_dpo") for arm in online] + [(arm, "grpo") for arm in online] + [("offline_dpo", "grpo")]
                   + [(arm, "online_dpo") for arm in online if arm != "online_dpo" and "online_dpo" in arms_])
    for a, b in comparisons:
        per_seed = [x - y for x, y in zip(final[a]["per_seed"], final[b]["per_seed"])]
        mean, band = bands.paired_across_seeds(per_seed, None)  # (no per-problem results kept)
        paired.append(dict(arms=f"{a} − {b}", mean=mean, band=band, per_seed=per_seed))
    return points, final, paired


def table(results):
    n, iters = results["eval_problems"], results["iters"]
    lines = [f"From `{results['init_from']}`, {iters} iterations per arm, {results['answers_per_iter']} answers sampled "
             f"per iteration on average ({iters * results['answers_per_iter']:,} in all; offline DPO's before its first "
             f"step), seeds {', '.join(map(str, results['seeds']))}. Greedy held-out accuracy on {n} problems; "
             "mean over the seeds ± t·SE and the binomial band, added in variance (bands.py).", "",
             "| arm | answers sampled | " + " | ".join(f"it. {i}" for i in results["eval_iters"])
             + f" | per seed at it. {iters} | worked share | length |", "|---" * (len(results["eval_iters"]) + 5) + "|"]
    cell = lambda p: f"{p['mean']:.3f}" + ("" if p["band"] is None else f" ± {p['band']:.3f}")
    for arm, runs in results["arms"].items():
        f = results["final"][arm]
        answers = sorted({r["answers_sampled"] for r in runs.values()})
        lines.append(f"| {arm} | {', '.join(f'{a:,}' for a in answers)} | " + " | ".join(map(cell, results["points"][arm]))
                     + f" | {', '.join(f'{v:.3f}' for v in f['per_seed'])} | {f['work']:.3f} | {f['length']:.1f} |")
    lines += ["", f"Paired by seed at it. {iters} (t band from 3 seeds or more; fewer: none claimed):", ""]
    for d in results["paired"]:
        lines.append(f"- {d['arms']}: {bands.paired_cell(d['per_seed'], None)}")
    for arm, per_seed in results["rounds"].items():
        first = [r[0] for r in per_seed.values()]
        last = [r[-1] for r in per_seed.values()]
        mean = lambda part, key: sum(r[key] for r in part) / len(part)
        lines.append(f"- {arm}'s rounds (the seeds' mean, first → last round): pairs {mean(first, 'online_pairs'):.1f} → "
                     f"{mean(last, 'online_pairs'):.1f}, prompts with a pair {mean(first, 'online_pair_share'):.3f} → "
                     f"{mean(last, 'online_pair_share'):.3f}, sampled accuracy {mean(first, 'online_sampled_acc'):.3f} → "
                     f"{mean(last, 'online_sampled_acc'):.3f}"
                     + (f", pairs the verifier orders the same way {mean(last, 'online_label_agrees'):.3f} (last)"
                        if "online_label_agrees" in last[0] else ""))
    return "\n".join(lines) + "\n"


def plot(results, path):
    plt = pyplot()
    colours = plt.get_cmap("Dark2").colors
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, (arm, runs) in enumerate(results["arms"].items()):
        band_line(axes[0], [[(p["iter"], p["heldout_acc"]) for p in r["curve"]] for r in runs.values()],
                  colours[k % len(colours)], arm, results["eval_problems"], top=1.0, marker="o")
        if results["rounds"].get(arm):
            band_line(axes[1], [[(p["iter"], p["online_pair_share"]) for p in per_seed]
                                for per_seed in results["rounds"][arm].values()], colours[k % len(colours)],
                      f"{arm}: prompts with a pair", top=1.0, marker=".")
            band_line(axes[1], [[(p["iter"], p["online_sampled_acc"]) for p in per_seed]
                                for per_seed in results["rounds"][arm].values()], colours[k % len(colours)],
                      f"{arm}: sampled accuracy", top=1.0, ls="--", marker="x")
    axes[0].set_xlabel(f"iteration ({results['answers_per_iter']} answers sampled per iteration; offline DPO: all before it. 0)",
                       fontsize=8)
    axes[0].set_ylabel(f"greedy held-out accuracy ({results['eval_problems']} problems)")
    axes[0].set_title(f"{len(results['seeds'])} seeds' mean, shaded: "
                      + ("the band" if len(results["seeds"]) >= 3 else "their range"), fontsize=9)
    axes[1].set_xlabel("iteration (a round's first)")
    axes[1].set_title("online rounds: the current policy's answers", fontsize=9)
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint every arm starts from (required)")
    parser.add_argument("--iters", type=int, default=40, help="iterations per arm")
    parser.add_argument("--answers", type=int, default=128, help="answers sampled per iteration, every arm (GRPO: 16 × 8)")
    parser.add_argument("--group_size", type=int, default=4, help="DPO arms: answers per prompt (dpo.py's group_size)")
    parser.add_argument("--grpo_group_size", type=int, default=8, help="GRPO: answers per prompt")
    parser.add_argument("--online_every", type=int, default=4, help="online DPO: iterations per round")
    parser.add_argument("--labelers", default="verifier", help=f"online DPO's labelers, comma-separated, from {LABELERS}")
    parser.add_argument("--reward_model", default="", help="the labeler of online_dpo_rm: a checkpoint of --algo rm")
    parser.add_argument("--judge", default="", help="the labeler of online_dpo_judge (experiments/judge_agreement.py)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated training seeds of every arm")
    parser.add_argument("--eval_every", type=int, default=10, help="iterations between held-out evaluations")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation (greedy)")
    study_flags(parser, "out/online_dpo", "online_dpo")
    args = parser.parse_args(argv)
    if args.quick:
        args.iters, args.answers, args.grpo_group_size, args.online_every = 2, 16, 4, 2
        args.eval_every, args.eval_problems = 1, 8
        args.init_from = args.init_from or train_once(os.path.join(args.out, "sft"),
                                                      dict(QUICK, **QUICK_SFT, algo="sft", eval_interval=0))
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.labelers = args.labelers.split(",")
    for labeler in args.labelers:
        if labeler not in LABELERS:
            parser.error(f"--labelers: {labeler!r} is not one of {LABELERS}")
    needs = dict(rm=("reward_model", "python train.py --algo rm --init_from=out/sft --out_dir=out/rm"),
                 judge=("judge", "python experiments/judge_agreement.py --init_from=out/sft (out/judge_study/judge)"))
    for labeler, (flag, maker) in needs.items():
        path = getattr(args, flag)
        if labeler in args.labelers and not os.path.isfile(os.path.join(path, "ckpt.pt")):
            parser.error(f"--labelers={labeler} needs --{flag}=DIR with a checkpoint ({path!r} holds none): make one "
                         f"with `{maker}`")
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint: run the ladder's sft stage first "
                     f"(`python train.py --algo sft --out_dir=out/sft`, or `python ladder.py`)")
    for what, total, by in (("--answers", args.answers, args.grpo_group_size), ("--answers × --online_every",
                            args.answers * args.online_every, args.group_size), ("--iters", args.iters, args.online_every),
                            ("--iters", args.iters, args.eval_every)):
        if total % by:
            parser.error(f"{what} = {total} is not a multiple of {by}: the arms would not sample equal answers "
                         f"(or an evaluation would fall between rounds)")
    common = {**(QUICK if args.quick else {}), "init_from": args.init_from, "max_iters": args.iters,
              "eval_interval": args.eval_every, "eval_problems": args.eval_problems, "eval_samples": 0,
              "log_interval": 1, "checkpoint": False, **set_keys(args)}
    os.makedirs(args.out, exist_ok=True)
    results = dict(init_from=args.init_from, seeds=args.seeds, iters=args.iters, answers_per_iter=args.answers,
                   eval_problems=args.eval_problems, eval_iters=list(range(0, args.iters + 1, args.eval_every)),
                   settings=dict(common, group_size=args.group_size, grpo_group_size=args.grpo_group_size,
                                 online_every=args.online_every, labelers=args.labelers),
                   arms={name: run_arm(args, common, name, keys) for name, keys in arms(args).items()})
    results["rounds"] = {arm: {seed: r.pop("rounds") for seed, r in runs.items()}
                         for arm, runs in results["arms"].items() if arm.startswith("online_dpo")}
    results["points"], results["final"], results["paired"] = summarise(results, args.eval_problems)
    save_study(args.out, "online_dpo", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
