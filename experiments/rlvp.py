"""
RLVP where groups fail (SPEC §3 RLVP, Process vs outcome rewards; Ch7 "RLVP"): on the treasure hunt
(--env=treasure), where most GRPO groups of a short SFT hold no win at all, GRPO with three rewards
from one SFT checkpoint, the same rollouts each (prompts_per_iter × group_size × iters), two seeds:

    outcome   the verifier alone: 1 for opening the chest, else 0 (reward_mode=outcome); an all-fail
              group has zero advantage and teaches nothing
    rlvp      R = O + β·Φ, the outcome and the rule engine's path signal (envs.Treasure.path_signals:
              +μ per step of progress toward the chest, −λ per refused, looping or fatal action)
              normalised separately over the group, then combined (reward_mode=rlvp, β = rlvp_beta)
    process   a reward at every call (+1 progress, −1 refused/wasted/fatal, 0 otherwise) and the
              outcome at the end, normalised over the group's steps (reward_mode=process)

Per iteration (the iteration's rollouts: a fair sample of the policy) it records the rollout win
rate, the share of all-fail groups and the rule violations per episode; at the start (once: greedy
decoding is the same for every run) and after every --iters / --evals iterations, greedy wins on
--eval_problems held-out maps and --ood_problems OOD maps (rooms named from other roles' names). The
held-out split is small (73 distinct maps), hence two seeds. Each run trains in --evals segments,
each resumed from the last one's checkpoint (init_from=resume continues exactly). It writes
results.json, rlvp.md (the table) and the plot into --out.

    python train.py --algo sft --env=treasure --max_iters=200 --lr_decay_iters=300 --batch_size=8 \
        --train_problems=2000 --eval_interval=100 --eval_problems=100 --out_dir=out/treasure_sft  # the start
    python experiments/rlvp.py --init_from=out/treasure_sft          # ~55 min on 2 shared cores
    python experiments/rlvp.py --quick --out=/tmp/rlvp               # a toy-size smoke test (numbers mean nothing)

--set key=value (repeatable) passes a train.py key to every run.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bands  # noqa: E402  (after the path: the script runs from anywhere)
import options  # noqa: E402
from experiments.generalpoints import init_checkpoint, run, save_study  # noqa: E402  (an SFT start, train.train by algorithm)
from experiments.ood import accuracy  # noqa: E402  (greedy accuracy on a split, with its band)

ARMS = dict(outcome=dict(reward_mode="outcome"), rlvp=dict(reward_mode="rlvp"), process=dict(reward_mode="process"))
SEEDS = (1337, 1338)
# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, prompts_per_iter=2, group_size=2, eval_batch_size=8,
             max_new_tokens=24, train_problems=32, val_examples=8, device="cpu", plot=False)
PER_ITER = ("reward", "all_fail_frac", "violations_per_episode")
PER_EVAL = ("heldout_acc", "ood_acc")


def curve(out_dir, evaluations):
    """{iter: {reward, all_fail_frac, violations_per_episode (the rollouts sampled at that iteration),
    heldout_acc, ood_acc (evaluations: {iter: figures} of the policy at that iteration)}} of one run.
    A training row logged as iteration i + 1 holds the rollouts sampled at iteration i."""
    points = {i: dict(figures) for i, figures in evaluations.items()}
    for row in map(json.loads, open(os.path.join(out_dir, "metrics.jsonl"))):
        if "reward" in row:
            points.setdefault(row["iter"] - 1, {}).update({k: row[k] for k in PER_ITER})
    return {i: points[i] for i in sorted(points)}


def evaluate(r, args):
    """Greedy wins on --eval_problems held-out maps and --ood_problems OOD maps."""
    return dict(heldout_acc=accuracy(r, r.raw_model, "heldout", args.eval_problems)[0],
                ood_acc=accuracy(r, r.raw_model, "ood", args.ood_problems)[0])


def grpo_run(args, common, arm, seed, start, start_figures):
    """One arm and seed: --iters GRPO iterations from `start` in --evals segments, each resumed from
    the last one's checkpoint (an exact continuation) and evaluated at its end. Returns its curve."""
    out_dir, evaluations = os.path.join(args.out, f"{arm}_{seed}"), {0: start_figures}
    for k in range(1, args.evals + 1):
        iters = round(k * args.iters / args.evals)
        r = run(dict(common, **ARMS[arm], algo="grpo", init_from=start if k == 1 else "resume", max_iters=iters,
                     seed=seed, eval_interval=0, checkpoint=True, out_dir=out_dir))
        evaluations[iters] = evaluate(r, args)
        print(f"{arm} seed {seed}, iteration {iters}: {evaluations[iters]}")
    return curve(out_dir, evaluations)


def mean_band(values):
    """(mean, t·SE over the seeds from 3 seeds; None for 1 or 2): the seeds' spread alone (the binomial
    band of one evaluation is reported beside it). bands.paired_across_seeds is the same rule."""
    return bands.paired_across_seeds(values) if len(values) > 1 else (values[0], None)


def summary(results):
    """Per arm, over the seeds: the start and end of every figure (rollout figures averaged over the
    first and the last third of the iterations, evaluations at the first and the last one), the mean
    over seeds with ± 2 SE over seeds, and the binomial band of one evaluation."""
    out = {}
    for arm, runs in results["arms"].items():
        fig = {}
        for key in PER_ITER + PER_EVAL:
            starts, ends = [], []
            for points in runs.values():
                values = [p[key] for p in points.values() if key in p]
                k = max(1, len(values) // 3) if key in PER_ITER else 1
                starts.append(sum(values[:k]) / k)
                ends.append(sum(values[-k:]) / k)
            fig[key] = dict(start=mean_band(starts), end=mean_band(ends))
        out[arm] = fig
    return out


def table(results):
    n, P, G = min(results["eval_problems"], results["ood_problems"]), results["prompts_per_iter"], results["group_size"]
    rows = ["| arm | rollout win rate | all-fail groups | violations / episode | held-out greedy | OOD greedy |",
            "|---|---|---|---|---|---|"]
    for arm, fig in summary(results).items():
        spread = lambda half: f" ± {half:.3f}" if half is not None else ""
        cells = [f"{fig[k]['start'][0]:.3f} → {fig[k]['end'][0]:.3f}{spread(fig[k]['end'][1])}" for k in PER_ITER + PER_EVAL]
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    band = bands.binomial(0.5, n)
    rows += ["", f"Means over {len(results['seeds'])} seeds ({', '.join(map(str, results['seeds']))}); ± 2 standard "
             f"errors over the seeds at the end. Rollout figures: the first → the last third of {results['iters']} "
             f"iterations of {P} maps × {G} plays; evaluations: greedy wins on {results['eval_problems']} held-out and "
             f"{results['ood_problems']} OOD maps, the start → the last evaluation (one evaluation's binomial band is "
             f"at most ± {band:.3f})."]
    return "\n".join(rows) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = PER_ITER[:2] + PER_EVAL
    titles = dict(reward="rollout win rate", all_fail_frac="all-fail groups", heldout_acc="held-out greedy wins",
                  ood_acc="OOD greedy wins")
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, key in zip(axes, keys):
        for (arm, runs), colour in zip(results["arms"].items(), ("C0", "C1", "C2")):
            for j, points in enumerate(runs.values()):
                pts = [(i, p[key]) for i, p in points.items() if key in p]
                ax.plot(*zip(*pts), color=colour, ls="-" if j == 0 else "--", marker="." if key in PER_EVAL else None,
                        label=f"{arm} (seed {j + 1})")
        ax.set_title(titles[key], fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="an SFT checkpoint of --env=treasure (default: train one)")
    parser.add_argument("--init_iters", type=int, default=200, help="iterations of that SFT run when there is none")
    parser.add_argument("--iters", type=int, default=14, help="GRPO iterations per run")
    parser.add_argument("--prompts_per_iter", type=int, default=8, help="maps per iteration")
    parser.add_argument("--group_size", type=int, default=4, help="plays per map")
    parser.add_argument("--evals", type=int, default=1, help="evaluations per run after the (shared) start")
    parser.add_argument("--eval_problems", type=int, default=64, help="held-out maps per evaluation")
    parser.add_argument("--ood_problems", type=int, default=32, help="OOD maps per evaluation")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, from " + ", ".join(ARMS))
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="runs per arm (seeds 1337, 1338, ...)")
    parser.add_argument("--quick", action="store_true", help="toy sizes, for a smoke test (numbers mean nothing)")
    parser.add_argument("--out", default="out/rlvp")
    parser.add_argument("--plot", default="", help="the plot's path (default: OUT/rlvp.png)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every run")
    args = parser.parse_args()
    if args.quick:
        args.init_iters, args.iters, args.evals, args.eval_problems, args.ood_problems = 2, 2, 2, 4, 4
    common = {"batch_size": 8, "train_problems": 2000, "lr_decay_iters": 300, **(QUICK if args.quick else {}), "env": "treasure",
              "eval_problems": args.eval_problems, "log_interval": 1, "checkpoint": False,
              **options.parse_args([f"--{kv}" for kv in args.set])}
    os.makedirs(args.out, exist_ok=True)
    start = init_checkpoint(args, common)
    common.update(prompts_per_iter=args.prompts_per_iter, group_size=args.group_size, eval_samples=0)
    if args.quick:
        common.update(prompts_per_iter=QUICK["prompts_per_iter"], group_size=QUICK["group_size"])

    seeds = [SEEDS[0] + k for k in range(args.seeds)]
    results = dict(init_from=start, iters=args.iters, eval_problems=args.eval_problems, ood_problems=args.ood_problems,
                   seeds=seeds, prompts_per_iter=common["prompts_per_iter"], group_size=common["group_size"], arms={})
    results["start"] = evaluate(run(dict(common, algo="grpo", init_from=start, max_iters=0, eval_interval=0,
                                         out_dir=os.path.join(args.out, "start"))), args)  # greedy: one for all runs
    print(f"start: {results['start']}")
    for arm in args.arms.split(","):
        for seed in seeds:
            results["arms"].setdefault(arm, {})[seed] = grpo_run(args, common, arm, seed, start, results["start"])
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    results["summary"] = summary(results)
    save_study(args.out, "rlvp", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
