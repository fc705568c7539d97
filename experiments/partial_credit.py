"""
Partial credit that can rescue (docs/rlvp.md, "Partial credit that can rescue"): where most GRPO groups
fail, does credit for the correct prefix of a response's steps (lab/partial_credit.py, normalised over
the batch) win more than the outcome alone? Its rules were fixed here before any run; its result (a
null on every task, 2026-12-07) is on that page.

    python experiments/partial_credit.py                      # the study: three tasks, two arms, three seeds
    python experiments/partial_credit.py --tasks=treasure --treasure_init=out/treasure_sft   # one task, a given start
    python experiments/partial_credit.py --quick --out=/tmp/partial   # a toy-size smoke test (numbers mean nothing)

The rules:
- tasks: `chains5` and `chains6`, the default task's chains of 5 and 6 steps (env_ops), one-digit
  operands, half the demonstrations bare as in the ladder, block_size 256 and 96 new tokens (a 6-step
  word problem and its worked answer pass 128 tokens); `treasure`, the treasure hunt with half of the
  training maps started mid-map (env_midstart_frac 0.5: after the optimal play's first 1 to 10
  actions, so that the chest-bound actions are sampled; held-out maps always start at the hall).
- the starts, made once per --out (or given): a chain task's is the ladder's first two stages on its
  own chains, from scratch: pretraining for 200 iterations on worked chains of that length, then SFT
  for 1,000 iterations at the ladder's defaults (no checkpoint of the ladder fits: its positions stop
  at 128); the treasure hunt's is docs/rlvp.md's: SFT from scratch for 200 iterations of 8 maps, the
  cosine schedule of a 300-iteration run (or --treasure_init, such a checkpoint).
- two arms, the same file and rollouts, one factor: `outcome`, --algo partial_credit with
  partial_beta = 0 (A = Â(O): grpo.py's advantages exactly, logging the same figures), and `partial`,
  partial_beta = 0.5 (A = Â(O) + β·Φ̃, Φ the correct prefix, centred within its group and scaled by its
  spread over the batch); GRPO's defaults otherwise (lr 1e-4 after 5 warm-up iterations, k3 KL
  term 0.04, temperature 1).
- rollouts: chains 60 iterations of 16 problems × 8 samples, the treasure hunt 150 iterations of 8
  maps × 4 plays (docs/rlvp.md's budget); every run goes to its last iteration, no early stop.
- three seeds, 1337-1339; the problems and the sampler's seed of iteration i depend on (seed, i) alone,
  so the two arms of a seed meet the same problems.
- per iteration (the iteration's own rollouts): the reward (the share won), the share of groups that
  all fail, the share of the advantage mass on them, the share of the advantage mass from the partial
  credit (shaping_adv_share: 0 for outcome by construction) and the mean correct prefix (the treasure
  hunt's reward counts its mid-map plays too: not comparable with docs/rlvp.md's earlier study).
- the endpoint, at the start (once) and after the last iteration: sampled accuracy at temperature 1
  on distinct held-out problems, each problem's mean kept: chains 256 distinct held-out equations ×
  8 samples, the treasure hunt every one of the 87 held-out maps (Treasure.census) × 16 plays; greedy
  accuracy on the same problems beside it.
- the comparison: partial − outcome, paired per seed on the same problems (bands.paired on the
  per-problem means), over the seeds with bands.paired_across_seeds (t·SE and the per-problem bands
  added in variance). The verdict per task: "partial higher" when the band's low end is above 0,
  "partial lower" when its high end is below 0, else "null (within the band)". The premise, checked
  and reported beside it: most groups fail (the outcome arm's all-fail share over the first third of
  its iterations, mean over seeds, at least 0.5); where it does not hold, the task does not test a
  rescue, and the table says so.

It writes results.json, partial_credit.md (the table) and partial_credit.png (the figure) into --out.
Runs already in --out are read, not run again (an interrupted study continues).
"""

import argparse
import json
import os
import sys
from statistics import fmean as mean

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from experiments.study import (band_line, finished, pyplot, rows, run, save_figure, save_study, set_keys,  # noqa: E402
                               study_flags, train_once)
from experiments.ood import answers  # noqa: E402  (one answer per problem)
from experiments.rlvp import smoothed  # noqa: E402  (a trailing mean)

SEEDS = (1337, 1338, 1339)
ARMS = dict(outcome=dict(algo="partial_credit", partial_beta=0.0), partial=dict(algo="partial_credit", partial_beta=0.5))
CHAINS = dict(env="arithmetic", block_size=256, max_new_tokens=96, prompts_per_iter=16, group_size=8)
TASKS = dict(  # each task's keys for every run, its GRPO iterations, and its endpoint's problems × samples
    chains5=dict(keys=dict(CHAINS, env_ops=5), iters=60, problems=256, samples=8),
    chains6=dict(keys=dict(CHAINS, env_ops=6), iters=60, problems=256, samples=8),
    treasure=dict(keys=dict(env="treasure", prompts_per_iter=8, group_size=4), iters=150, problems=87, samples=16,
                  rl_keys=dict(env_midstart_frac=0.5)),  # (the held-out split: 87 maps, all of them)
)
# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, prompts_per_iter=2, group_size=2, eval_batch_size=16,
             max_new_tokens=24, train_problems=32, corpus_docs=64, val_examples=8, device="cpu", plot=False)
PER_ITER = ("reward", "all_fail_frac", "all_fail_adv_share", "shaping_adv_share", "correct_prefix")
TITLES = dict(reward="rollout reward (share won)", all_fail_frac="all-fail groups",
              all_fail_adv_share="all-fail groups' share of Σ|A|", shaping_adv_share="partial credit's share of Σ|A|",
              correct_prefix="correct prefix Φ (steps)")


def start(args, task, keys):
    """The task's start (the rules above), made once per --out unless given."""
    if task == "treasure":
        if args.treasure_init:
            return args.treasure_init
        return train_once(os.path.join(args.out, "treasure_sft"), dict(
            keys, algo="sft", max_iters=2 if args.quick else 200, lr_decay_iters=300, batch_size=keys.get("batch_size", 8),
            train_problems=keys.get("train_problems", 2000), eval_interval=0))
    pretrain = train_once(os.path.join(args.out, f"{task}_pretrain"), dict(
        keys, algo="pretrain", max_iters=2 if args.quick else 200, eval_interval=0))
    return train_once(os.path.join(args.out, f"{task}_sft"), dict(
        keys, algo="sft", init_from=pretrain, max_iters=2 if args.quick else 1000, eval_interval=0))


def heldout(env, n):
    """n distinct held-out problems: the treasure hunt's census (all 87 maps at n ≥ 87); for the chains
    the first n distinct equations of a seeded draw (the split is drawn with replacement)."""
    if env.name == "treasure":
        return env.problems("heldout", n, seed=0)
    out, seen = [], set()
    for k in range(100):
        for p in env.problems("heldout", 2 * n, seed=k):
            equation = (p["start"], tuple(p["steps"]))
            if equation not in seen and len(out) < n:
                seen.add(equation)
                out.append(p)
        if len(out) == n:
            return out
    raise ValueError(f"fewer than {n} distinct held-out problems")


def endpoint(r, problems, samples):
    """Each problem's sampled accuracy (the mean of `samples` answers at temperature 1, fixed seed) and
    its greedy 0/1."""
    sampled, _ = answers(r, r.raw_model, [p for p in problems for _ in range(samples)], 1.0)
    greedy, _ = answers(r, r.raw_model, problems, 0.0)
    return dict(sampled=[sum(sampled[k * samples:(k + 1) * samples]) / samples for k in range(len(problems))],
                greedy=greedy)


def curve(out_dir):
    """{figure: [value per iteration]} of a run's rollouts (a row logged as iteration i + 1 holds the
    rollouts of iteration i)."""
    logged = sorted((row["iter"], row) for row in rows(out_dir) if "reward" in row)
    return {key: [row[key] for _, row in logged] for key in PER_ITER}


def grpo_run(args, keys, task, spec, arm, seed, init, problems):
    """One arm and seed of a task: its per-iteration curve and its endpoint (read when already run)."""
    out_dir = os.path.join(args.out, f"{task}_{arm}_{seed}")
    saved = os.path.join(out_dir, "endpoint.json")
    overrides = dict(keys, **spec.get("rl_keys", {}), **ARMS[arm], init_from=init, max_iters=spec["iters"], seed=seed,
                     eval_interval=0, checkpoint=True, out_dir=out_dir)
    if finished(out_dir, overrides, "reward") and os.path.isfile(saved):
        return dict(curve=curve(out_dir), **json.load(open(saved)))
    r = run(dict(overrides, overwrite=True))
    figures = endpoint(r, problems, spec["samples"])
    with open(saved, "w") as f:
        json.dump(figures, f)
    print(f"{task} {arm} seed {seed}: sampled {mean(figures['sampled']):.3f}, greedy {mean(figures['greedy']):.3f}")
    return dict(curve=curve(out_dir), **figures)


def first_third(values):
    return mean(values[:max(1, len(values) // 3)])


def summary(task_results):
    """One task's figures: per arm over the seeds (bands.across_seeds), partial − outcome paired per
    seed on the same problems, the verdict and the premise (the rules above)."""
    n, runs = len(task_results["start"]["sampled"]), task_results["arms"]
    out = {arm: {key: bands.across_seeds([mean(r[key]) for r in seeds.values()], n) for key in ("sampled", "greedy")}
           for arm, seeds in runs.items()}
    for arm, seeds in runs.items():
        out[arm].update({key: bands.across_seeds([mean(r["curve"][key]) for r in seeds.values()], None) for key in PER_ITER})
    paired = {key: [bands.paired(runs["partial"][s][key], runs["outcome"][s][key]) for s in runs["outcome"]]
              for key in ("sampled", "greedy")}
    out["partial − outcome"] = {key: dict(band=bands.paired_across_seeds([d for d, _ in p], [h for _, h in p]),
                                          per_seed=[d for d, _ in p]) for key, p in paired.items()}
    diff, half = out["partial − outcome"]["sampled"]["band"]
    out["verdict"] = ("no band (fewer than 3 seeds)" if half is None else "partial higher" if diff - half > 0 else
                      "partial lower" if diff + half < 0 else "null (within the band)")
    all_fail = mean([first_third(r["curve"]["all_fail_frac"]) for r in runs["outcome"].values()])
    out["premise"] = dict(all_fail_first_third=all_fail, holds=all_fail >= 0.5)
    return out


def cell(mean_half, sign=""):
    m, h = mean_half
    return f"{m:{sign}.3f}" + (f" ± {h:.3f}" if h is not None else "")


def table(results):
    lines = ["| task | arm | sampled accuracy at the end | greedy | rollout reward | all-fail groups | their share of Σ|A| | "
             "partial credit's share of Σ|A| | correct prefix |", "|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for task, tr in results["tasks"].items():
        fig, start_ = tr["summary"], tr["start"]
        lines.append(f"| {task} | start | {mean(start_['sampled']):.3f} | {mean(start_['greedy']):.3f} | | | | | |")
        for arm in tr["arms"]:
            lines.append(f"| {task} | {arm} | {cell(fig[arm]['sampled'])} | {cell(fig[arm]['greedy'])} | "
                         + " | ".join(cell(fig[arm][key]) for key in PER_ITER) + " |")
        d = fig["partial − outcome"]
        per_seed = lambda key: ", ".join(f"{v:+.3f}" for v in d[key]["per_seed"])
        premise = fig["premise"]
        verdicts.append(f"- {task}: partial − outcome, sampled {cell(d['sampled']['band'], '+')} (per seed "
                        f"{per_seed('sampled')}), greedy {cell(d['greedy']['band'], '+')} (per seed {per_seed('greedy')}): "
                        f"**{fig['verdict']}**; the premise (most groups fail): the outcome arm's all-fail share over "
                        f"its first third {premise['all_fail_first_third']:.2f}, "
                        + ("holds" if premise["holds"] else "does NOT hold: this task does not test a rescue"))
    spec = "; ".join(f"{task} {TASKS[task]['iters']} iterations, {tr['problems']} held-out problems × "
                     f"{TASKS[task]['samples']} samples" for task, tr in results["tasks"].items())
    seeds = ", ".join(map(str, results["seeds"]))
    lines += ["", f"Means over seeds {seeds} ± the band (bands.py: t·SE over the seeds, the binomial band added in "
              f"variance for accuracies); per-iteration figures are means over all iterations ({spec}). Paired, "
              f"partial − outcome on the same problems, bands.paired_across_seeds:", ""] + verdicts
    return "\n".join(lines) + "\n"


COLOURS = dict(outcome="#444444", partial="#1f77b4")


def plot(results, path):
    """One row per task: the rollout reward, the all-fail share of groups and the partial credit's share of
    Σ|A| per iteration (trailing means of 10, each arm's seed mean and band), and the endpoint: partial
    − outcome in sampled and greedy accuracy, each seed's paired difference and their mean ± the band."""
    tasks = list(results["tasks"])
    panels = ("reward", "all_fail_frac", "shaping_adv_share")
    fig, axes = pyplot().subplots(len(tasks), len(panels) + 1, figsize=(4 * (len(panels) + 1), 3.2 * len(tasks)),
                                  squeeze=False)
    for row, task in zip(axes, tasks):
        tr = results["tasks"][task]
        window = min(10, max(1, TASKS[task]["iters"] // 5))
        for ax, key in zip(row, panels):
            for arm, seeds in tr["arms"].items():
                curves = [smoothed(list(enumerate(r["curve"][key])), window) for r in seeds.values()]
                band_line(ax, curves, COLOURS[arm], arm, top=1.0)
            ax.set_title(f"{task}: {TITLES[key]} (mean of {window})", fontsize=8)
            ax.set_xlabel("iteration", fontsize=8)
            ax.set_ylim(0, 1.05)
        ax, paired = row[-1], tr["summary"]["partial − outcome"]
        for k, key in enumerate(("sampled", "greedy")):
            m, h = paired[key]["band"]
            ax.errorbar([k], [m], yerr=[h or 0.0], fmt="o", color=COLOURS["partial"], capsize=5)
            ax.scatter([k + 0.12] * len(paired[key]["per_seed"]), paired[key]["per_seed"], color="k", s=8)
        ax.axhline(0.0, color="#999999", lw=1)
        ax.set_xticks([0, 1], ["sampled", "greedy"])
        ax.set_xlim(-0.5, 1.5)
        ax.set_title(f"{task}: partial − outcome at the end, paired\n({tr['problems']} problems; dots: seeds): "
                     f"{tr['summary']['verdict']}", fontsize=8)
        row[0].legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, from " + ", ".join(TASKS))
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="runs per arm (seeds 1337, 1338, ...)")
    parser.add_argument("--treasure_init", default="", help="an SFT checkpoint of --env=treasure (default: train one)")
    study_flags(parser, "out/partial_credit", "partial_credit")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    if unknown := [t for t in tasks if t not in TASKS]:
        raise SystemExit(f"--tasks: no task {unknown[0]!r}; choose from {', '.join(TASKS)}")
    if args.quick:
        for spec in TASKS.values():
            spec.update(iters=2, problems=min(spec["problems"], 4), samples=2)
    common = dict(log_interval=1, eval_samples=0, eval_at_start=False, **(QUICK if args.quick else {}), **set_keys(args))
    os.makedirs(args.out, exist_ok=True)
    seeds = [SEEDS[0] + k for k in range(args.seeds)]
    results = dict(seeds=seeds, tasks={})
    for task in tasks:
        spec = TASKS[task]
        keys = dict(spec["keys"], **common)
        init = start(args, task, keys)
        r = run(dict(keys, algo="grpo", init_from=init, max_iters=0, eval_interval=0, overwrite=True,
                     out_dir=os.path.join(args.out, f"{task}_start")))
        problems = heldout(r.env, spec["problems"])
        tr = results["tasks"][task] = dict(init_from=init, problems=len(problems), start=endpoint(r, problems, spec["samples"]),
                                           arms={})
        print(f"{task}: start sampled {mean(tr['start']['sampled']):.3f}, greedy {mean(tr['start']['greedy']):.3f} "
              f"on {len(problems)} distinct held-out problems")
        for seed in seeds:  # seed by seed: an interrupted study still holds whole seeds of both arms
            for arm in ARMS:
                tr["arms"].setdefault(arm, {})[seed] = grpo_run(args, keys, task, spec, arm, seed, init, problems)
        tr["summary"] = summary(tr)
    save_study(args.out, "partial_credit", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
