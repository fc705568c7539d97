"""
Online against offline DPO, the demonstration fallback removed (SPEC §3 "DPO"): does
DPO on pairs sampled from the current policy beat DPO on pairs sampled once from the start, when neither
arm is given a gold demonstration, from a start whose answers do not yet show what the policy will do?
The rules, fixed here before any run:

    start         an SFT model trained on demonstrations 90% bare answers (--env_direct_frac=0.9; the ladder's
                  SFT otherwise): it samples few worked answers, so the worked-over-bare preference that lifts
                  accuracy is rare in its own pairs and must be found by the policy as it moves (docs/reward_sources.md)
    offline_dpo   dpo.py's loss and defaults on verifier pairs of --iters × --answers / --group_size train prompts,
                  --group_size answers each sampled ONCE by the start before the first step, WITHOUT the
                  demonstration fallback (pairs.builtin_pairs(..., demo_fallback=False), train and held-out pairs:
                  a prompt with no right sample makes no pair, as online DPO's rounds); its pair counts are kept
                  (--demo_fallback: dpo.py's pairs, the demonstration chosen there: the earlier, confounded study)
    online_dpo    --algo online_dpo (lab/online_dpo.py): a round every --online_every iterations of
                  --answers × --online_every / --group_size train prompts × --group_size answers from the
                  current policy, labelled by the verifier, each prompt's right answer over its wrong one
    grpo          (optional, --grpo; off by default) grpo.py: --answers / --grpo_group_size prompts × --grpo_group_size
                  answers per iteration
    --labelers=verifier,rm,judge adds online_dpo_rm and online_dpo_judge (--reward_model, --judge: the labeler)

    iterations    --iters 200 per arm; seeds 1337, 1338, 1339 (every seed from the same start)
    evaluation    greedy held-out accuracy (the verifier) on --eval_problems 500 problems, the same for every arm
                  and seed, at iteration 0 and every --eval_every 20 iterations, with the worked share and the length
    endpoint      the last evaluation's greedy held-out accuracy (iteration --iters)
    comparison    online − offline per seed on the same 500 problems, bands.paired_across_seeds over the seeds,
                  floored by each seed's per-problem paired band (bands.paired on the last evaluation's
                  answers.jsonl verdicts); a null stays a null
    saturation    at each evaluation, the share of a DPO arm's training pairs whose DPO sigmoid is saturated,
                  σ(z) > 0.99, z = β[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))] the pair's
                  implicit-reward margin against π_ref (its loss slope σ(−z) under 0.01, from 0.5 at the start):
                  offline, all its pairs (those not yet trained on included); online, the current round's pairs
                  (none at iteration 0). Computed here, after the arm's own evaluation; dpo.py's loss is unchanged.

How answers are counted: every answer an arm samples to train on, --answers per iteration on average,
--iters × --answers in all; offline DPO samples all of its answers before its first step. Not counted:
the held-out pairs (--heldout_prompts × --group_size answers of the start, read only for the val_
figures) and the evaluations. Both DPO arms run dpo.py's loss and defaults (β = 0.1, lr 3e-5 cosine to
3e-6 over --iters, 16 pairs per step), π_ref = the start in every round; GRPO runs grpo.py's defaults.
Offline DPO's pairs are sampled with pairs.py's fixed seed, so its seeds differ only in the order of its
batches; the other arms' seeds also change what they sample.

Bands (bands.py): each arm at each point, the mean over the seeds ± t(0.975, k − 1)·SE and the binomial
band added in variance (across_seeds); the paired differences as above. It writes results.json,
online_dpo.md (the tables) and online_dpo.png (accuracy against the iteration; the saturated share; the
online rounds' pair share) into --out. Runs already finished in --out with the same settings are read,
not run again.

    python train.py --algo sft --init_from=out/pretrain --env_direct_frac=0.9 --out_dir=out/sft_direct90
    python experiments/online_dpo.py --init_from=out/sft_direct90 --out=out/online_dpo_direct90
    python experiments/online_dpo.py --quick --out=/tmp/online_dpo      # a toy-size smoke test (numbers mean nothing)

--set key=value (repeatable) passes a train.py key to every run (each takes the keys its algorithm knows).
"""

import argparse
import json
import math
import os
import sys
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import dpo  # noqa: E402  (after the path: the script runs from anywhere)
from lab import online_dpo  # noqa: E402
from nanopost import bands, pairs  # noqa: E402
from nanopost.checkpoints import load_reference  # noqa: E402
from nanopost.distributed import chunks  # noqa: E402
from nanopost.evaluation import write_samples  # noqa: E402
from nanopost.passports import preference_passport, write_passport  # noqa: E402
from experiments.study import (band_line, finished, last_verdicts, pyplot, rows, run, save_figure,  # noqa: E402
                               save_study, set_keys, study_flags, train_once)

LABELERS = online_dpo.LABELERS
SATURATED = 0.99  # σ(z) above it: a pair's loss slope σ(−z) is under 0.01 (0.5 at the start, z = 0)
PAIR_COUNTS = "pair_counts.json"  # the offline arm's pairs made and prompts dropped, in its out_dir

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
    if args.grpo:
        out["grpo"] = dict(algo="grpo", prompts_per_iter=A // args.grpo_group_size, group_size=args.grpo_group_size)
    return out


# ----------------------------------------------------------------------------------------------
# What the study runs in place of dpo.py and lab/online_dpo.py (train.train's algo=): the offline pairs
# without the demonstration fallback, and each DPO arm's evaluation followed by the saturated share

def offline_setup(run, saved, demo_fallback):
    """dpo.setup with the built-in verifier pairs (train and held-out) made by pairs.builtin_pairs with
    `demo_fallback` (False, the study's rule: a prompt where no sampled answer is right makes no pair; True:
    dpo.py's pairs, the demonstration chosen there). Its counts go to out_dir/PAIR_COUNTS."""
    cfg = run.cfg
    if cfg["data"] or cfg["pairs"] != "verifier":
        raise ValueError(f"experiments/online_dpo.py's offline arm builds verifier pairs itself: drop --data / "
                         f"--pairs={cfg['pairs']!r} from --set")
    reference = load_reference(run)
    train_pairs, counts = pairs.builtin_pairs(run, reference, "train", cfg["train_prompts"], seed=1,
                                              demo_fallback=demo_fallback)
    heldout_pairs, heldout_counts = pairs.builtin_pairs(run, reference, "heldout", cfg["heldout_prompts"], seed=1,
                                                        demo_fallback=demo_fallback)
    write_samples(run, 0, [pairs.describe(run, ex) for ex in train_pairs[:4]])
    state = SimpleNamespace(reference=reference, train_examples=train_pairs, heldout_examples=heldout_pairs,
                            skipped_rows=0)
    state.ref_cache_path = dpo.attach_reference(run, reference, [train_pairs, heldout_pairs])
    write_passport(run, preference_passport(
        run, f"the DPO loss (SPEC §3), β = {cfg['beta']}; the reference's log-probs computed once and cached; "
             + ("the verifier pairs with the demonstration fallback (pairs.py's demo_chosen)" if demo_fallback else
                "the verifier pairs WITHOUT the demonstration fallback (experiments/online_dpo.py: a prompt with "
                "no right sample makes no pair)"), references=f"π_ref = `{cfg['init_from']}` frozen"))
    if run.master:
        print(f"offline verifier pairs, demo_fallback={demo_fallback}: train {counts}, heldout {heldout_counts}")
        with open(os.path.join(cfg["out_dir"], PAIR_COUNTS), "w") as f:
            json.dump(dict(train=counts, heldout=heldout_counts, train_prompts=cfg["train_prompts"],
                           demo_fallback=demo_fallback), f)
    return state


def training_pairs(state):
    """The pairs a DPO arm trains on now: online DPO's current round (None before the first), offline's all."""
    return state.round_examples if hasattr(state, "round_examples") else state.train_examples


@torch.no_grad()
def saturation(run, model, examples):
    """{train_pairs_saturated: the share of `examples` with σ(z) > SATURATED, train_pairs_z: the mean z},
    z = β[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))] (dpo.implicit_rewards, π_ref's
    sums cached on each example), the logit inside DPO's loss −log σ(z)."""
    z = []
    for chunk in chunks(examples, run.cfg["eval_batch_size"]):
        batch = pairs.collate(run, chunk)
        with run.autocast:
            sums, _ = dpo.sequence_sums(run, model, batch)
        reward_w, reward_l = dpo.implicit_rewards(run, batch, sums)
        z.append((reward_w - reward_l).float())
    z = torch.cat(z)
    return dict(train_pairs_saturated=float((z > math.log(SATURATED / (1 - SATURATED))).float().mean()),
                train_pairs_z=float(z.mean()), train_pairs_n=len(examples))


def evaluate_with_saturation(run, state, it):
    """The arm's own evaluation (dpo.evaluate, which online DPO shares), then the saturation of its training pairs."""
    figures = dpo.evaluate(run, state, it)
    examples = training_pairs(state)
    return {**figures, **(saturation(run, run.raw_model, examples) if examples else {})}


def module_of(arm, demo_fallback=False):
    """What train.train runs for an arm: dpo.py with offline_setup (`demo_fallback`) and the saturated share,
    lab/online_dpo.py with the saturated share, or None (the --algo module as it is: GRPO)."""
    if arm == "offline_dpo":
        def setup(run, saved):
            return offline_setup(run, saved, demo_fallback)
        return SimpleNamespace(**{**vars(dpo), "setup": setup, "evaluate": evaluate_with_saturation})
    if arm.startswith("online_dpo"):
        return SimpleNamespace(**{**vars(online_dpo), "evaluate": evaluate_with_saturation})
    return None


def answers_sampled(out_dir):
    """The answers a finished run sampled to train on, from its config.json and metrics.jsonl."""
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    if cfg["algo"] == "grpo":
        return cfg["prompts_per_iter"] * cfg["group_size"] * cfg["max_iters"]
    if cfg["algo"] == "online_dpo":
        return max(r["answers_sampled"] for r in rows(out_dir) if "answers_sampled" in r)
    return cfg["train_prompts"] * cfg["group_size"]  # (offline: sampled once, before the first step)


def curve(out_dir):
    """[{iter, heldout_acc, heldout_work, heldout_len, and a DPO arm's train_pairs_saturated, _z, _n}] at each
    evaluation of a run."""
    keys = ("heldout_acc", "heldout_work", "heldout_len", "train_pairs_saturated", "train_pairs_z", "train_pairs_n")
    return [dict(iter=r["iter"], **{k: r[k] for k in keys if k in r}) for r in rows(out_dir) if "heldout_acc" in r]


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
        module, counts = module_of(name, args.demo_fallback), os.path.join(out_dir, PAIR_COUNTS)
        t0 = time.time()
        ran = not finished(out_dir, overrides, "heldout_acc" if module is None else "train_pairs_saturated") or (
            name == "offline_dpo" and json.load(open(counts))["demo_fallback"] != args.demo_fallback)
        if ran:
            run(overrides, algo=module)  # (an unfinished run starts over)
        runs[str(seed)] = dict(out_dir=out_dir, answers_sampled=answers_sampled(out_dir),
                               wall_seconds=time.time() - t0 if ran else None, curve=curve(out_dir),
                               verdicts=last_verdicts(out_dir),
                               pair_counts=json.load(open(counts)) if os.path.isfile(counts) else None,
                               rounds=rounds(out_dir) if keys["algo"] == "online_dpo" else None)
    return runs


def summarise(results, n):
    """Per arm and evaluation the seeds' mean and band (and a DPO arm's saturated share: the seeds' values and
    mean); at the last point each arm's figure and the paired differences by seed, floored by each seed's
    per-problem paired band where the runs kept their verdicts."""
    arms_, points, final, paired = results["arms"], {}, {}, []
    for arm, runs in arms_.items():
        curves = [r["curve"] for r in runs.values()]
        points[arm] = []
        for c in zip(*curves):
            mean, band = bands.across_seeds([p["heldout_acc"] for p in c], n)
            saturated = [p.get("train_pairs_saturated") for p in c]
            points[arm].append(dict(iter=c[0]["iter"], mean=mean, band=band, **(
                dict(saturated=saturated, saturated_mean=sum(saturated) / len(saturated)) if None not in saturated else {})))
        last = [c[-1] for c in curves]
        final[arm] = dict(mean=points[arm][-1]["mean"], band=points[arm][-1]["band"],
                          per_seed=[p["heldout_acc"] for p in last], start=curves[0][0]["heldout_acc"],
                          work=sum(p["heldout_work"] for p in last) / len(last),
                          length=sum(p["heldout_len"] for p in last) / len(last))
    online = [arm for arm in arms_ if arm.startswith("online_dpo")]
    comparisons = [(arm, "offline_dpo") for arm in online] + [(arm, "online_dpo") for arm in online if arm != "online_dpo"
                                                             and "online_dpo" in arms_]
    if "grpo" in arms_:
        comparisons += [(arm, "grpo") for arm in online] + [("offline_dpo", "grpo")]
    for a, b in comparisons:
        per_seed = [x - y for x, y in zip(final[a]["per_seed"], final[b]["per_seed"])]
        verdicts = [(arms_[a][seed].get("verdicts"), arms_[b][seed].get("verdicts")) for seed in arms_[a]]
        floors = None if any(va is None or vb is None for va, vb in verdicts) else [bands.paired(va, vb)[1]
                                                                                   for va, vb in verdicts]
        mean, band = bands.paired_across_seeds(per_seed, floors)
        paired.append(dict(arms=f"{a} − {b}", mean=mean, band=band, per_seed=per_seed, per_problem_bands=floors))
    return points, final, paired


def table(results):
    n, iters = results["eval_problems"], results["iters"]
    lines = [f"From `{results['init_from']}`, {iters} iterations per arm, {results['answers_per_iter']} answers sampled "
             f"per iteration on average ({iters * results['answers_per_iter']:,} in all; offline DPO's before its first "
             f"step), seeds {', '.join(map(str, results['seeds']))}; offline DPO's pairs "
             f"{'with' if results['settings']['demo_fallback'] else 'without'} the demonstration "
             f"fallback. Greedy held-out accuracy on {n} problems; "
             "mean over the seeds ± t·SE and the binomial band, added in variance (bands.py).", "",
             "| arm | answers sampled | " + " | ".join(f"it. {i}" for i in results["eval_iters"])
             + f" | per seed at it. {iters} | worked share | length |", "|---" * (len(results["eval_iters"]) + 5) + "|"]
    cell = lambda p: f"{p['mean']:.3f}" + ("" if p["band"] is None else f" ± {p['band']:.3f}")
    for arm, runs in results["arms"].items():
        f = results["final"][arm]
        answers = sorted({r["answers_sampled"] for r in runs.values()})
        lines.append(f"| {arm} | {', '.join(f'{a:,}' for a in answers)} | " + " | ".join(map(cell, results["points"][arm]))
                     + f" | {', '.join(f'{v:.3f}' for v in f['per_seed'])} | {f['work']:.3f} | {f['length']:.1f} |")
    lines += ["", f"Paired by seed at it. {iters}, the endpoint (t band from 3 seeds or more, floored by each seed's "
                  "per-problem paired band; fewer seeds: none claimed):", ""]
    for d in results["paired"]:
        lines.append(f"- {d['arms']}: {bands.paired_cell(d['per_seed'], d.get('per_problem_bands'))}")
    dpo_arms = [arm for arm, p in results["points"].items() if any("saturated" in q for q in p)]
    if dpo_arms:
        lines += ["", f"Training pairs saturated, σ(z) > {SATURATED} (z: the implicit-reward margin r̂(y_w) − r̂(y_l), "
                      "β times the log-ratios to π_ref): offline DPO all its pairs, online DPO its current round's; the seeds' "
                      "mean (per seed):", "", "| arm | " + " | ".join(f"it. {i}" for i in results["eval_iters"]) + " |",
                  "|---" * (len(results["eval_iters"]) + 1) + "|"]
        for arm in dpo_arms:
            by_iter = {p["iter"]: p for p in results["points"][arm]}
            lines.append(f"| {arm} | " + " | ".join(
                f"{by_iter[i]['saturated_mean']:.3f} ({', '.join(f'{v:.2f}' for v in by_iter[i]['saturated'])})"
                if "saturated" in by_iter.get(i, {}) else "–" for i in results["eval_iters"]) + " |")
    counts = [r["pair_counts"] for r in results["arms"].get("offline_dpo", {}).values() if r.get("pair_counts")]
    if counts:
        c = counts[0]  # (the same for every seed: pairs.py's fixed seed)
        lines += ["", f"- offline DPO's pairs: {c['train']['verifier']:,} from {c['train_prompts']:,} train prompts; "
                      f"no pair where no sample is right ({c['train']['no_right_sample']:,} prompts) or all are "
                      f"({c['train']['all_correct']:,}); demonstrations as chosen: {c['train']['demo_chosen']:,}"]
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
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for k, (arm, runs) in enumerate(results["arms"].items()):
        colour = colours[k % len(colours)]
        band_line(axes[0], [[(p["iter"], p["heldout_acc"]) for p in r["curve"]] for r in runs.values()],
                  colour, arm, results["eval_problems"], top=1.0, marker="o")
        saturated = [[(p["iter"], p["train_pairs_saturated"]) for p in r["curve"] if "train_pairs_saturated" in p]
                     for r in runs.values()]
        if all(saturated):
            band_line(axes[1], saturated, colour, arm, top=1.0, marker="o")
        if results["rounds"].get(arm):
            band_line(axes[2], [[(p["iter"], p["online_pair_share"]) for p in per_seed]
                                for per_seed in results["rounds"][arm].values()], colour,
                      f"{arm}: prompts with a pair", top=1.0, marker=".")
            band_line(axes[2], [[(p["iter"], p["online_sampled_acc"]) for p in per_seed]
                                for per_seed in results["rounds"][arm].values()], colour,
                      f"{arm}: sampled accuracy", top=1.0, ls="--", marker="x")
    axes[0].set_xlabel(f"iteration ({results['answers_per_iter']} answers sampled per iteration; offline DPO: all before it. 0)",
                       fontsize=8)
    axes[0].set_ylabel(f"greedy held-out accuracy ({results['eval_problems']} problems)")
    axes[0].set_title(f"{len(results['seeds'])} seeds' mean, shaded: "
                      + ("the band" if len(results["seeds"]) >= 3 else "their range"), fontsize=9)
    axes[1].set_xlabel("iteration")
    axes[1].set_ylabel(f"training pairs with σ(z) > {SATURATED}")
    axes[1].set_title("saturated pairs: offline all, online the current round's", fontsize=9)
    axes[2].set_xlabel("iteration (a round's first)")
    axes[2].set_title("online rounds: the current policy's answers", fontsize=9)
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint every arm starts from (required)")
    parser.add_argument("--iters", type=int, default=200, help="iterations per arm")
    parser.add_argument("--answers", type=int, default=128, help="answers sampled per iteration, every arm (GRPO: 16 × 8)")
    parser.add_argument("--group_size", type=int, default=4, help="DPO arms: answers per prompt (dpo.py's group_size)")
    parser.add_argument("--grpo_group_size", type=int, default=8, help="GRPO: answers per prompt")
    parser.add_argument("--online_every", type=int, default=4, help="online DPO: iterations per round")
    parser.add_argument("--labelers", default="verifier", help=f"online DPO's labelers, comma-separated, from {LABELERS}")
    parser.add_argument("--reward_model", default="", help="the labeler of online_dpo_rm: a checkpoint of --algo rm")
    parser.add_argument("--judge", default="", help="the labeler of online_dpo_judge (experiments/judge_agreement.py)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated training seeds of every arm")
    parser.add_argument("--grpo", action="store_true", help="add the GRPO arm (off by default: the study is DPO's)")
    parser.add_argument("--demo_fallback", action="store_true",
                        help="offline DPO's pairs as dpo.py makes them, the demonstration chosen where no sample is "
                             "right (the earlier, confounded comparison; the study's rule is without)")
    parser.add_argument("--eval_every", type=int, default=20, help="iterations between held-out evaluations")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation (greedy)")
    study_flags(parser, "out/online_dpo_direct90", "online_dpo")
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
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint: make the study's start first (`python "
                     f"train.py --algo sft --init_from=out/pretrain --env_direct_frac=0.9 --out_dir=out/sft_direct90`)")
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
                                 online_every=args.online_every, labelers=args.labelers, grpo=args.grpo,
                                 demo_fallback=args.demo_fallback, saturated=SATURATED),
                   arms={name: run_arm(args, common, name, keys) for name, keys in arms(args).items()})
    results["rounds"] = {arm: {seed: r.pop("rounds") for seed, r in runs.items()}
                         for arm, runs in results["arms"].items() if arm.startswith("online_dpo")}
    results["points"], results["final"], results["paired"] = summarise(results, args.eval_problems)
    save_study(args.out, "online_dpo", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
