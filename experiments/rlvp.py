"""
RLVP where groups fail (SPEC §3 RLVP, Process vs outcome rewards; Ch7 "RLVP"): on the treasure hunt
(--env=treasure), where most GRPO groups of a short SFT hold no win at all, GRPO with three rewards
from one SFT checkpoint, the same rollouts each (prompts_per_iter × group_size × iters), three seeds:

    outcome   the verifier alone: 1 for opening the chest, else 0 (--algo grpo); an all-fail
              group has zero advantage and teaches nothing
    rlvp      R = O + β·Φ, the outcome and the rule engine's path signal (envs.Treasure.path_signals:
              +μ per step of progress toward the chest, −λ per refused, looping or fatal action)
              normalised separately over the group, then combined (--algo rlvp, β = rlvp_beta)
    process   a reward at every call (+1 progress, −1 refused/wasted/fatal, 0 otherwise) and the
              outcome at the end, normalised over the group's steps (--algo process_reward)
    frozen    the control: outcome at learning rate 0 (the policy never changes), so its rollout
              figures show how far 32 plays per iteration wander on their own (not run by default)

Per iteration (the iteration's rollouts: a fair sample of the policy) it records the rollout win
rate, the share of all-fail groups, the share of the advantage mass they carry and the rule
violations per play; the maps and the sampler's seed of iteration i depend on (seed, i) alone, so
the arms of one seed meet the same maps. At the start (once: greedy decoding is the same for every
run) and after every --iters / --evals iterations, greedy wins on every distinct held-out map and
on --ood_problems OOD maps (rooms named from other roles' names), each map's result kept for paired
comparisons. Each run trains in --evals segments, each resumed from the last one's checkpoint
(init_from=resume continues exactly). It writes results.json, rlvp.md (the tables) and the plot
into --out. Then --plays reads what each arm learnt to do from its greedy plays (plays.md).

    python train.py --algo sft --env=treasure --max_iters=200 --lr_decay_iters=300 --batch_size=8 \
        --train_problems=2000 --eval_interval=100 --eval_problems=100 --out_dir=out/treasure_sft  # the start
    python experiments/rlvp.py --init_from=out/treasure_sft --arms=frozen --iters=25 --evals=1   # the control (~4 min)
    python experiments/rlvp.py --init_from=out/treasure_sft                             # the study (~75 min on 2 cores)
    python experiments/rlvp.py --init_from=out/treasure_sft --plays                     # what the arms' plays do (~3 min)
    python experiments/rlvp.py --quick --out=/tmp/rlvp               # a toy-size smoke test (numbers mean nothing)

--set key=value (repeatable) passes a train.py key to every run.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from experiments.study import (band_line, final_models, init_checkpoint, pyplot, rows, run,  # noqa: E402
                               save_analysis, save_figure, save_study, set_keys, study_flags)
from experiments.ood import answers, responses  # noqa: E402  (one answer per problem)

ARMS = dict(outcome=dict(algo="grpo"), rlvp=dict(algo="rlvp"), process=dict(algo="process_reward"),
            frozen=dict(algo="grpo", learning_rate=0.0, min_lr=0.0))
DEFAULT_ARMS = ("outcome", "rlvp", "process")
SEEDS = (1337, 1338, 1339)
# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, prompts_per_iter=2, group_size=2, eval_batch_size=8,
             max_new_tokens=24, train_problems=32, val_examples=8, device="cpu", plot=False)
PER_ITER = ("reward", "all_fail_frac", "all_fail_adv_share", "violations_per_episode")
PER_EVAL = ("heldout_acc", "ood_acc")


def curve(out_dir, evaluations):
    """{iter: {reward, all_fail_frac, all_fail_adv_share, violations_per_episode (the rollouts sampled
    at that iteration), heldout_acc, ood_acc, heldout_correct, ood_correct (evaluations: {iter:
    figures} of the policy at that iteration)}} of one run. A training row logged as iteration i + 1
    holds the rollouts sampled at iteration i."""
    points = {i: dict(figures) for i, figures in evaluations.items()}
    for row in rows(out_dir):
        if "reward" in row:
            points.setdefault(row["iter"] - 1, {}).update({k: row[k] for k in PER_ITER})
    return {i: points[i] for i in sorted(points)}


def eval_maps(env, args):
    """Every distinct held-out map (the split is small: all of it, each once) and --ood_problems OOD maps."""
    distinct = {p["prompt"]: p for p in env.problems("heldout", 5000, seed=0)}
    return dict(heldout=[distinct[k] for k in sorted(distinct)], ood=env.problems("ood", args.ood_problems, seed=0))


def evaluate(r, maps):
    """Greedy wins on the held-out and OOD maps: the rate and each map's 0/1 (for paired comparisons)."""
    figures = {}
    for split, problems in maps.items():
        correct, _ = answers(r, r.raw_model, problems, 0.0)
        figures.update({f"{split}_acc": sum(correct) / len(correct), f"{split}_correct": correct})
    return figures


def grpo_run(args, common, arm, seed, start, start_figures, maps):
    """One arm and seed: --iters GRPO iterations from `start` in --evals segments, each resumed from
    the last one's checkpoint (an exact continuation) and evaluated at its end. Returns its curve."""
    out_dir, evaluations = os.path.join(args.out, f"{arm}_{seed}"), {0: start_figures}
    for k in range(1, args.evals + 1):
        iters = round(k * args.iters / args.evals)
        r = run(dict(common, **ARMS[arm], init_from=start if k == 1 else "resume", max_iters=iters,
                     seed=seed, eval_interval=0, checkpoint=True, out_dir=out_dir))
        evaluations[iters] = evaluate(r, maps)
        print(f"{arm} seed {seed}, iteration {iters}: held-out {evaluations[iters]['heldout_acc']:.3f}, "
              f"OOD {evaluations[iters]['ood_acc']:.3f}")
    return curve(out_dir, evaluations)


def per_iteration(points, key):
    """[(iteration, value)] of a figure, in iteration order (results.json's keys are strings)."""
    return sorted((int(i), p[key]) for i, p in points.items() if key in p)


def thirds(points, key):
    """The figure's mean over the first and over the last third of the iterations (a run's start and end)."""
    values = [v for _, v in per_iteration(points, key)]
    k = max(1, len(values) // 3)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def mean_all(points, key):
    values = [v for _, v in per_iteration(points, key)]
    return sum(values) / len(values)


def mean_evals(points):
    """Greedy held-out wins averaged over the evaluations after the start: one evaluation of 87 maps
    swings by ± 0.1, the mean of six much less."""
    values = [v for i, v in per_iteration(points, "heldout_acc") if i > 0]
    return sum(values) / len(values)


def last_eval(points):
    return max(((int(i), p) for i, p in points.items() if "heldout_acc" in p), key=lambda ip: ip[0])[1]


def summary(results):
    """Per arm over the seeds, each figure as bands.across_seeds gives it: rollout figures over the
    first and the last third of the iterations and over all of them, greedy wins at the last
    evaluation; and each other arm against outcome, paired per seed (the same maps)."""
    n_plays, n_maps = results["prompts_per_iter"] * results["group_size"], len(results["start"]["heldout_correct"])
    out = {}
    for arm, runs in results["arms"].items():
        seeds = list(runs.values())
        third = max(1, results["iters"] // 3)
        fig = {key: dict(first=bands.across_seeds([thirds(p, key)[0] for p in seeds], third * n_plays if key == "reward" else None),
                         last=bands.across_seeds([thirds(p, key)[1] for p in seeds], third * n_plays if key == "reward" else None),
                         all=bands.across_seeds([mean_all(p, key) for p in seeds],
                                                results["iters"] * n_plays if key == "reward" else None))
               for key in PER_ITER}
        fig.update({key: bands.across_seeds([last_eval(p)[key] for p in seeds], n_maps if key == "heldout_acc" else
                                            results["ood_problems"]) for key in PER_EVAL})
        fig["heldout_mean"] = bands.across_seeds([mean_evals(p) for p in seeds], n_maps)  # (the same maps each time)
        out[arm] = fig
    if "outcome" in results["arms"]:
        base = results["arms"]["outcome"]
        for arm, runs in results["arms"].items():
            if arm in ("outcome", "frozen"):
                continue
            seeds = [s for s in runs if s in base]
            paired = [bands.paired(last_eval(runs[s])["heldout_correct"], last_eval(base[s])["heldout_correct"]) for s in seeds]
            wins = [d for d, _ in paired]
            rollout = [mean_all(runs[s], "reward") - mean_all(base[s], "reward") for s in seeds]
            over_evals = [mean_evals(runs[s]) - mean_evals(base[s]) for s in seeds]
            out[arm]["vs_outcome"] = dict(heldout_acc=bands.paired_across_seeds(wins, [h for _, h in paired]),
                                          reward=bands.paired_across_seeds(rollout, None),  # (fresh rollouts: no shared problems)
                                          heldout_mean=bands.paired_across_seeds(over_evals, None), per_seed_heldout=wins,
                                          per_seed_reward=rollout, per_seed_heldout_mean=over_evals)
    return out


def cell(mean_half, digits=3, sign=""):
    mean, half = mean_half
    return f"{mean:{sign}.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None else "")


def table(results):
    G, P, n_maps = results["group_size"], results["prompts_per_iter"], len(results["start"]["heldout_correct"])
    fig = summary(results)
    lines = ["| arm | rollout win rate: first → last third (all) | all-fail groups | their share of the advantage mass | "
             "violations / play | held-out greedy wins (mean over evaluations) | OOD greedy wins |", "|---|---|---|---|---|---|---|"]
    for arm, f in fig.items():
        per_iter = [f"{cell(f[k]['first'])} → {cell(f[k]['last'])}" + (f" ({cell(f[k]['all'])})" if k == "reward" else "")
                    for k in PER_ITER]
        lines.append(f"| {arm} | " + " | ".join(per_iter) + f" | {results['start']['heldout_acc']:.3f} → {cell(f['heldout_acc'])} "
                     f"({cell(f['heldout_mean'])}) | "
                     f"{results['start']['ood_acc']:.3f} → {cell(f['ood_acc'])} |")
    seeds = sorted({int(s) for runs in results["arms"].values() for s in runs})
    lines += ["", f"Means over {len(seeds)} seeds ({', '.join(map(str, seeds))}) ± the band "
              f"(bands.py: t·SE over the seeds, with the binomial band added in variance for win rates; none for two seeds). "
              f"Rollout figures over the first and the last third of {results['iters']} iterations of {P} maps × {G} "
              f"plays; greedy wins on all {n_maps} held-out and {results['ood_problems']} OOD maps, the start → the last "
              f"evaluation.", ""]
    paired = {arm: f["vs_outcome"] for arm, f in fig.items() if "vs_outcome" in f}
    if paired:
        lines += ["| arm − outcome (paired per seed) | held-out greedy wins at the end | held-out greedy wins, mean over "
                  "evaluations | rollout win rate over all iterations |", "|---|---|---|---|"]
        per_seed = lambda values: "(per seed " + ", ".join(f"{v:+.3f}" for v in values) + ")"
        for arm, d in paired.items():
            lines.append(f"| {arm} | {cell(d['heldout_acc'], sign='+')} {per_seed(d['per_seed_heldout'])} | "
                         f"{cell(d['heldout_mean'], sign='+')} {per_seed(d['per_seed_heldout_mean'])} | "
                         f"{cell(d['reward'], sign='+')} {per_seed(d['per_seed_reward'])} |")
    return "\n".join(lines) + "\n"


COLOURS = dict(outcome="#444444", rlvp="#1f77b4", process="#ff7f0e", frozen="#9467bd")


def smoothed(pairs, window):
    """A trailing mean over `window` iterations: [(iteration, mean of the last `window` values)]."""
    return [(pairs[j][0], sum(v for _, v in pairs[max(0, j - window + 1):j + 1]) / len(pairs[max(0, j - window + 1):j + 1]))
            for j in range(len(pairs))]


def plot(results, path):
    """Five panels, one line per arm (the seeds' mean, its band shaded): the rollout win rate, the
    violations per play, the all-fail share of groups and of the advantage mass (trailing means over
    10 iterations), and greedy wins on every held-out map at each evaluation (OOD: in the table)."""
    plays = results["prompts_per_iter"] * results["group_size"]
    window = min(10, max(1, results["iters"] // 5))
    panels = [("reward", f"rollout win rate (mean of {window} iterations)", plays * window),
              ("violations_per_episode", f"rule violations per play (mean of {window})", None),
              ("all_fail_frac", f"all-fail groups (mean of {window})", None),
              ("all_fail_adv_share", f"their share of the advantage mass Σ|A| (mean of {window})", None),
              ("heldout_acc", f"held-out greedy wins ({len(results['start']['heldout_correct'])} maps)", None)]
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4 * len(panels), 3.4))
    for ax, (key, title, n) in zip(axes, panels):
        for arm, runs in results["arms"].items():
            seeds = list(runs.values())
            if key in PER_EVAL:
                band_line(ax, [per_iteration(pts, key) for pts in seeds], COLOURS[arm], arm,
                          n=len(results["start"]["heldout_correct"]), top=1.0, marker="o", ms=3)
            else:
                band_line(ax, [smoothed(per_iteration(pts, key), window) for pts in seeds], COLOURS[arm], arm, n,
                          top=None if key == "violations_per_episode" else 1.0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.set_ylim(bottom=0)  # from zero: no fall drawn larger than it is
    axes[0].legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def plays(args, common):
    """After a study (--plays, the same --out): what each arm's policy does, from greedy plays of the
    start and of every run's last checkpoint on every distinct held-out map: calls per play, the
    rule engine's judgements per play (+1 progress, −1 refused / wasted / fatal), the share of plays
    that stop short (neither a win nor a violation on their last call: quitting while ahead, which
    no rule penalises) and wins. Means over each arm's seeds; writes plays.md and plays.json."""
    results = json.load(open(os.path.join(args.out, "results.json")))
    plays_of = {}
    for who, r in final_models(args.out, results, results["init_from"], common, "grpo"):
        maps = eval_maps(r.env, args)["heldout"]
        texts = responses(r, r.raw_model, maps, 0.0)
        judged = [r.env.judge_calls(p, t) for p, t in zip(maps, texts)]
        wins = [r.env.verify(p, t) for p, t in zip(maps, texts)]
        stop_short = [not w and (not j or j[-1][1] >= 0) for w, j in zip(wins, judged)]
        n = len(maps)
        plays_of.setdefault(who, []).append(dict(
            calls=sum(map(len, judged)) / n, progress=sum(v > 0 for j in judged for _, v in j) / n,
            violations=sum(v < 0 for j in judged for _, v in j) / n, stop_short=sum(stop_short) / n,
            wins=sum(wins) / n, example=texts[0]))
    lines = [f"Greedy plays on all {len(maps)} held-out maps; each arm the mean over "
             f"its {len(results['seeds'])} seeds' last checkpoints (the optimal play: 11 calls, 11 progress).", "",
             "| policy | calls / play | progress / play | violations / play | stops short | wins |", "|---|---|---|---|---|---|"]
    for who, runs in plays_of.items():
        m = {k: sum(x[k] for x in runs) / len(runs) for k in ("calls", "progress", "violations", "stop_short", "wins")}
        lines.append(f"| {who} | {m['calls']:.2f} | {m['progress']:.2f} | {m['violations']:.2f} | {m['stop_short']:.2f} | "
                     f"{m['wins']:.3f} |")
    save_analysis(args.out, "plays", lines, plays_of)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="an SFT checkpoint of --env=treasure (default: train one)")
    parser.add_argument("--init_iters", type=int, default=200, help="iterations of that SFT run when there is none")
    parser.add_argument("--iters", type=int, default=150, help="GRPO iterations per run")
    parser.add_argument("--prompts_per_iter", type=int, default=8, help="maps per iteration")
    parser.add_argument("--group_size", type=int, default=4, help="plays per map")
    parser.add_argument("--evals", type=int, default=6, help="evaluations per run after the (shared) start")
    parser.add_argument("--ood_problems", type=int, default=64, help="OOD maps per evaluation")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), help="comma-separated, from " + ", ".join(ARMS))
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="runs per arm (seeds 1337, 1338, ...)")
    parser.add_argument("--plays", action="store_true", help="after the study, in the same --out: what each arm's plays do")
    study_flags(parser, "out/rlvp", "rlvp")
    args = parser.parse_args()
    if args.quick:
        args.init_iters, args.iters, args.evals, args.ood_problems = 2, 2, 2, 4
    common = {"batch_size": 8, "train_problems": 2000, "lr_decay_iters": 300, **(QUICK if args.quick else {}), "env": "treasure",
              "eval_problems": 100, "log_interval": 1, "checkpoint": False, **set_keys(args)}
    os.makedirs(args.out, exist_ok=True)
    if args.plays:
        return plays(args, common)
    start = init_checkpoint(args, common)
    common.update(prompts_per_iter=args.prompts_per_iter, group_size=args.group_size, eval_samples=0)
    if args.quick:
        common.update(prompts_per_iter=QUICK["prompts_per_iter"], group_size=QUICK["group_size"])

    seeds = [SEEDS[0] + k for k in range(args.seeds)]
    results = dict(init_from=start, iters=args.iters, ood_problems=args.ood_problems, seeds=seeds,
                   prompts_per_iter=common["prompts_per_iter"], group_size=common["group_size"], arms={})
    r = run(dict(common, algo="grpo", init_from=start, max_iters=0, eval_interval=0, out_dir=os.path.join(args.out, "start")))
    maps = eval_maps(r.env, args)
    results["start"] = evaluate(r, maps)  # greedy: one for all runs
    print(f"start: held-out {results['start']['heldout_acc']:.3f} on {len(maps['heldout'])} maps, "
          f"OOD {results['start']['ood_acc']:.3f} on {len(maps['ood'])}")
    for seed in seeds:  # seed by seed: an interrupted study still holds whole seeds of every arm
        for arm in args.arms.split(","):
            results["arms"].setdefault(arm, {})[seed] = grpo_run(args, common, arm, seed, start, results["start"], maps)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    results["summary"] = summary(results)
    save_study(args.out, "rlvp", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
