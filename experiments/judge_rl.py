"""
A generative reward optimised against, beside the verifier and the scalar RM [Ch7 "The evolution of
reward paradigms"; SPEC §3 "Reward model", "PPO", "GRPO"; Gao et al. 2023, over-optimisation]: from one
SFT checkpoint, at equal sampled answers per iteration, each arm with each of --seeds (1337, 1338, 1339):

    grpo_verifier   grpo.py, rewarded by the environment's verifier (the gold)
    grpo_judge      --algo judge_reward --judge=DIR --judge_samples=k (lab/judge_reward.py): the judge's P(Verdict: correct),
                    the mean over k sampled judgements (judge.py)
    ppo_rm          lab/ppo_rm.py, --algo ppo_rm --reward_model=DIR: the Bradley–Terry reward model's score (RLHF)

Equal rollouts: --answers (128) answers sampled per iteration in every arm. GRPO: --answers / --group_size
prompts × --group_size (16 × 8), one optimizer step, its defaults otherwise (lr 1e-4, k3 KL β = 0.04).
PPO: one answer per prompt, batch_size = --answers / 2 in its 2 minibatches, 2 epochs (4 optimizer steps
per iteration), its defaults otherwise (lr 3e-5, KL β = 0.05 in the reward, GAE λ = 0.95, a critic).

Measured at iteration 0 and every --eval_every iterations, on the same --eval_problems held-out problems:
the policy's greedy answers (the loop's evaluation: evaluation.greedy_accuracy's problems and answers),
each scored three ways by this study's evaluation, which runs after the algorithm's (train.train's algo=):
    heldout_acc                the verifier, the gold (the loop's; heldout_gold: the same, recomputed here)
    heldout_judge_reward       the judge's mean P(correct), ONE GREEDY judgement per answer for every arm and
                               point (a fixed measurement, whatever k trained grpo_judge)
    heldout_judge_false_pass   the share of ALL answers that the judge rates correct (P > 0.5) and the verifier
                               wrong (a share of all answers, not a rate among the wrong ones);
    heldout_judge_false_fail   the other way round
    heldout_rm_score           the reward model's mean score, shown as the change from the run's start (a
                               Bradley–Terry RM's offset is arbitrary)
with the worked share and the length (the loop's heldout_work, heldout_len). Where the judge and the
verifier part, the answers it rates correct that are wrong: up to --examples per run at its last
evaluation, highest P first, kept in results.json and tabled (what the policy learned to exploit).

Bands (bands.py): each figure at each point, the seeds' mean ± t(0.975, k − 1)·SE (accuracies and the
false-pass share with the binomial band over the problems added in variance; the judge's reward and the RM's score
with the t band alone); at the last point each arm minus grpo_verifier paired by seed (the same seed:
the same start and problems; paired_across_seeds) for every figure, and each arm's judge reward − gold,
the judge's over-estimate. It writes results.json, judge_rl.md (the tables) and judge_rl.png (one line
per arm, its seed mean with the band shaded) into --out. Runs already finished in --out with the same
settings are read, not run again.

    python experiments/judge_rl.py --init_from=out/sft --judge=out/judge_study/judge --reward_model=out/rm
    python experiments/judge_rl.py --init_from=out/sft --judge=out/judge_study/judge --reward_model=out/rm --judge_samples=0
    python experiments/judge_rl.py --quick --out=/tmp/judge_rl          # a toy-size smoke test (numbers mean nothing)

The judge: `python experiments/judge_agreement.py --init_from=out/sft` (out/judge_study/judge); the RM:
`python train.py --algo rm --init_from=out/sft --out_dir=out/rm` (or the ladder's out/rm). --set key=value
(repeatable) passes a train.py key to every run (each takes the keys its algorithm knows).
"""

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402  (after the path: the script runs from anywhere)

from nanopost import bands  # noqa: E402
import grpo  # noqa: E402
import lab.judge_reward  # noqa: E402
import ppo  # noqa: E402
from lab import ppo_rm  # noqa: E402
from nanopost.checkpoints import frozen, load_model  # noqa: E402
from nanopost.judge import judge_scores  # noqa: E402
from model import GPT, ScalarHeadGPT  # noqa: E402
from nanopost.rollouts import rollouts, score_rollout  # noqa: E402
from experiments.study import (band_line, finished, pyplot, rows, run, save_figure, save_study,  # noqa: E402
                               set_keys, study_flags, train_once)
from experiments.online_dpo import QUICK, QUICK_SFT  # noqa: E402  (the toy task)

SEEDS = (1337, 1338, 1339)
EXAMPLES_FILE = "judge_passes.jsonl"  # per run: each evaluation's wrong answers the judge rates correct
FIGURES = dict(  # the figures of an evaluation: (what the table and the plot call it, problems for its band: None = t alone)
    heldout_acc=("gold: the verifier's accuracy", True), heldout_judge_reward=("the judge's reward", None),
    heldout_judge_false_pass=("wrong and passed by the judge (P > 0.5), share of all answers", True), heldout_rm_delta=("RM score − start", None),
    heldout_work=("worked share", None), heldout_len=("length (tokens)", None))


def arms(args):
    """{arm: (its module, its train.py keys)}, every arm sampling --answers answers per iteration."""
    A, G = args.answers, args.group_size
    grpo_keys = dict(algo="grpo", prompts_per_iter=A // G, group_size=G)
    return dict(grpo_verifier=(grpo, grpo_keys),
                grpo_judge=(lab.judge_reward, dict(grpo_keys, algo="judge_reward", judge=args.judge,
                                                   judge_samples=args.judge_samples)),
                ppo_rm=(ppo_rm, dict(algo="ppo_rm", reward_model=args.reward_model, group_size=1, minibatches=2,
                                  batch_size=A // 2, gradient_accumulation_steps=1)))


@torch.no_grad()
def judged_and_scored(run, judge, reward_model, n, keep):
    """The policy's greedy answers to the first n held-out problems (seed 0: evaluation.greedy_accuracy's, so
    the very answers heldout_acc scores), each scored by the verifier, by the judge (P(correct) after one
    greedy judgement) and by the reward model -> (figures, up to `keep` answers the judge rates correct and
    the verifier wrong, highest P first)."""
    policy = run.raw_model.policy if isinstance(run.raw_model, ppo.PolicyAndCritic) else run.raw_model
    problems, size = run.env.problems("heldout", n, seed=0), run.cfg["eval_batch_size"]
    roll = rollouts(run, policy, problems, 1, temperature=0.0, seed=0, batch_size=size)
    p = judge_scores(run, judge.to(run.device), problems, roll.texts)[0][:, 0].float()
    rm = score_rollout(run, reward_model.to(run.device), roll)
    right, rated = roll.verified > 0, p > 0.5
    figures = dict(heldout_gold=float(right.float().mean()), heldout_judge_reward=float(p.mean()),
                   heldout_judge_false_pass=float((rated & ~right).float().mean()),
                   heldout_judge_false_fail=float((~rated & right).float().mean()), heldout_rm_score=float(rm.mean()))
    passes = sorted((i for i in range(len(problems)) if rated[i] and not right[i]), key=lambda i: -float(p[i]))
    examples = [dict(problem=problems[i], answer=roll.texts[i], p_correct=float(p[i]), rm_score=float(rm[i]))
                for i in passes[:keep]]
    return figures, examples


def measured(module, judge, reward_model, args):
    """The algorithm `module` with its evaluation followed by judged_and_scored's (the answers it lists go
    to out_dir/EXAMPLES_FILE): what train.train runs in place of the module."""
    def evaluate(run, state, it):
        figures = module.evaluate(run, state, it)
        extra, examples = judged_and_scored(run, judge, reward_model, run.cfg["eval_problems"], args.examples)
        if run.master:
            with open(os.path.join(run.cfg["out_dir"], EXAMPLES_FILE), "a") as f:
                f.write(json.dumps(dict(iter=it, examples=examples)) + "\n")
        return {**figures, **extra}
    return SimpleNamespace(**{**vars(module), "evaluate": evaluate})


def curve(out_dir):
    """[{iter, each of FIGURES, heldout_gold, heldout_judge_false_fail, heldout_rm_score}] at each evaluation."""
    evals = [r for r in rows(out_dir) if "heldout_judge_reward" in r]
    keys = [k for k in FIGURES if k != "heldout_rm_delta"] + ["heldout_gold", "heldout_judge_false_fail", "heldout_rm_score"]
    return [dict(iter=r["iter"], heldout_rm_delta=r["heldout_rm_score"] - evals[0]["heldout_rm_score"],
                 **{k: r[k] for k in keys}) for r in evals]


def run_arm(args, common, name, module, keys, judge, reward_model):
    """{seed: {out_dir, wall_seconds (None: read, not run), curve, examples (its last evaluation's)}}."""
    runs = {}
    for seed in args.seeds:
        out_dir = os.path.join(args.out, f"{name}_{seed}")
        overrides = dict(common, **keys, seed=seed, out_dir=out_dir, overwrite=True)
        examples_path = os.path.join(out_dir, EXAMPLES_FILE)
        t0, ran = time.time(), not (finished(out_dir, overrides, "heldout_acc") and os.path.isfile(examples_path))
        if ran:  # (an unfinished run starts over, its examples too)
            if os.path.exists(examples_path):
                os.remove(examples_path)
            run(overrides, algo=measured(module, judge, reward_model, args))
        last = [json.loads(line) for line in open(examples_path)][-1]
        runs[str(seed)] = dict(out_dir=out_dir, wall_seconds=time.time() - t0 if ran else None, curve=curve(out_dir),
                               examples=last["examples"])
    return runs


def summarise(results, n):
    """Per arm and figure: the seeds' mean and band at each point, the last point's per seed; each arm
    minus grpo_verifier paired by seed at the last point; each arm's judge reward − gold."""
    points, final, paired, gap = {}, {}, [], {}
    for arm, runs in results["arms"].items():
        curves = [r["curve"] for r in runs.values()]
        points[arm], final[arm] = {}, {}
        for key, (_, accuracy) in FIGURES.items():
            points[arm][key] = [dict(iter=c[0]["iter"], **dict(zip(("mean", "band"), bands.across_seeds(
                [p[key] for p in c], n if accuracy else None)))) for c in zip(*curves)]
            final[arm][key] = dict(points[arm][key][-1], per_seed=[c[-1][key] for c in curves], start=curves[0][0][key])
        per_seed = [c[-1]["heldout_judge_reward"] - c[-1]["heldout_acc"] for c in curves]
        gap[arm] = dict(zip(("mean", "band"), bands.across_seeds(per_seed, None)), per_seed=per_seed)
    base = [r["curve"][-1] for r in results["arms"]["grpo_verifier"].values()]
    for arm in [a for a in results["arms"] if a != "grpo_verifier"]:
        last = [r["curve"][-1] for r in results["arms"][arm].values()]
        for key in FIGURES:
            per_seed = [a[key] - b[key] for a, b in zip(last, base)]
            mean, band = bands.paired_across_seeds(per_seed, None)  # (no per-problem results kept)
            paired.append(dict(figure=key, arms=f"{arm} − grpo_verifier", mean=mean, band=band, per_seed=per_seed))
    return points, final, paired, gap


def table(results):
    iters, n = results["iters"], results["eval_problems"]
    cell = lambda p, d=3: f"{p['mean']:.{d}f}" + ("" if p["band"] is None else f" ± {p['band']:.{d}f}")
    lines = [f"From `{results['init_from']}`, {iters} iterations per arm, {results['answers_per_iter']} answers sampled per "
             f"iteration in every arm, seeds {', '.join(map(str, results['seeds']))}; grpo_judge trained on "
             f"{'one greedy judgement' if not results['judge_samples'] else str(results['judge_samples']) + ' sampled judgements'}"
             f" per answer. Held out: the greedy answers to {n} problems, scored by the verifier, the judge (one greedy "
             "judgement) and the RM; the seeds' mean ± t·SE (accuracies with the binomial band added in variance; bands.py).", "",
             "| arm | " + " | ".join(f"{label} (start → it. {iters})" for label, _ in FIGURES.values())
             + " | judge − gold |", "|---" * (len(FIGURES) + 2) + "|"]
    for arm, figures in results["final"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{f['start']:.3f} → {cell(f)}" for f in figures.values())
                     + f" | {cell(results['gap'][arm])} |")
    lines += ["", "| arm | figure | " + " | ".join(f"it. {i}" for i in results["eval_iters"]) + " |",
              "|---|---" + "|---" * len(results["eval_iters"]) + "|"]
    for arm, per_figure in results["points"].items():
        for key in ("heldout_acc", "heldout_judge_reward", "heldout_judge_false_pass"):
            lines.append(f"| {arm} | {FIGURES[key][0]} | " + " | ".join(map(cell, per_figure[key])) + " |")
    lines += ["", f"Each arm minus grpo_verifier at it. {iters}, paired by seed (t band from 3 seeds; fewer: none claimed):", ""]
    for d in results["paired"]:
        lines.append(f"- {d['arms']}, {FIGURES[d['figure']][0]}: {bands.paired_cell(d['per_seed'], None)}")
    lines += ["", f"### Where they part: wrong answers the judge rates correct (P > 0.5), it. {iters}", "",
              "| arm | seed | problem | the policy's answer | right answer | judge P(correct) | RM score |", "|---|---|---|---|---|---|---|"]
    for arm, runs in results["arms"].items():
        for seed, r in runs.items():
            for e in r["examples"]:
                lines.append(f"| {arm} | {seed} | {e['problem']['prompt']} | `{e['answer']}` | {e['problem']['answer']} | "
                             f"{e['p_correct']:.3f} | {e['rm_score']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    plt = pyplot()
    colours = plt.get_cmap("Dark2").colors
    keys = ("heldout_acc", "heldout_judge_reward", "heldout_rm_delta", "heldout_judge_false_pass")
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.6))
    for ax, key in zip(axes, keys):
        label, accuracy = FIGURES[key]
        for k, (arm, runs) in enumerate(results["arms"].items()):
            band_line(ax, [[(p["iter"], p[key]) for p in r["curve"]] for r in runs.values()], colours[k % len(colours)],
                      arm, results["eval_problems"] if accuracy else None, top=1.0 if key != "heldout_rm_delta" else None,
                      marker="o")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f"iteration ({results['answers_per_iter']} answers each)")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))  # from zero (a score below it keeps its own floor)
    axes[0].set_ylabel(f"greedy answers to {results['eval_problems']} held-out problems")
    axes[0].legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def quick_models(args, common):
    """--quick: a toy SFT model (experiments/online_dpo.py's), the judge it also stands in for (an untrained
    judge: numbers mean nothing) and a toy reward model, each made once into --out."""
    sft = train_once(os.path.join(args.out, "sft"), dict(QUICK, **QUICK_SFT, algo="sft", eval_interval=0))
    rm = train_once(os.path.join(args.out, "rm"), dict(common, algo="rm", init_from=sft, train_prompts=8, max_iters=2,
                                                       eval_interval=0))
    args.init_from, args.judge, args.reward_model = args.init_from or sft, args.judge or sft, args.reward_model or rm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint every arm starts from (required)")
    parser.add_argument("--judge", default="", help="the judge (required): experiments/judge_agreement.py trains one")
    parser.add_argument("--reward_model", default="", help="the Bradley–Terry RM (required): train.py --algo rm")
    parser.add_argument("--judge_samples", type=int, default=4, help="grpo_judge's judgements per answer (0: one greedy)")
    parser.add_argument("--iters", type=int, default=40, help="iterations per arm")
    parser.add_argument("--answers", type=int, default=128, help="answers sampled per iteration, every arm")
    parser.add_argument("--group_size", type=int, default=8, help="GRPO's answers per prompt (--answers / it: prompts)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated training seeds of every arm")
    parser.add_argument("--eval_every", type=int, default=10, help="iterations between held-out evaluations")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation (greedy)")
    parser.add_argument("--examples", type=int, default=5, help="wrong answers the judge rates correct kept per run")
    study_flags(parser, "out/judge_rl", "judge_rl")
    args = parser.parse_args(argv)
    extra = set_keys(args)
    if args.quick:
        args.iters, args.answers, args.group_size, args.judge_samples = 2, 8, 4, 2
        args.eval_every, args.eval_problems = 1, 8
        os.makedirs(args.out, exist_ok=True)
        quick_models(args, {**QUICK, "log_interval": 1, **extra})
    makers = dict(init_from=("an SFT checkpoint", "python train.py --algo sft --out_dir=out/sft", " (or python ladder.py)"),
                  judge=("a judge", "python experiments/judge_agreement.py --init_from=out/sft", " (out/judge_study/judge)"),
                  reward_model=("a Bradley–Terry reward model", "python train.py --algo rm --init_from=out/sft "
                                "--out_dir=out/rm", ""))
    for flag, (what, maker, where) in makers.items():
        if not os.path.isfile(os.path.join(getattr(args, flag), "ckpt.pt")):
            parser.error(f"--{flag}={getattr(args, flag)!r} holds no checkpoint: it needs {what}; make one with "
                         f"`{maker}`{where}")
    judge, reward_model = frozen(load_model(args.judge)), frozen(load_model(args.reward_model))
    if not isinstance(judge, GPT) or not isinstance(reward_model, ScalarHeadGPT):
        parser.error(f"--judge={args.judge} must be a language model (a judge) and --reward_model={args.reward_model} a "
                     f"scalar one (--algo rm): is one given for the other?")
    if args.answers % args.group_size or args.answers % 2 or args.iters % args.eval_every:
        parser.error(f"--answers={args.answers} must be a multiple of --group_size={args.group_size} (GRPO) and of 2 "
                     f"(PPO's minibatches), and --iters={args.iters} of --eval_every={args.eval_every}")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    common = {**(QUICK if args.quick else {}), "init_from": args.init_from, "max_iters": args.iters,
              "eval_interval": args.eval_every, "eval_problems": args.eval_problems, "eval_samples": 0,
              "log_interval": 1, "checkpoint": False, **extra}
    os.makedirs(args.out, exist_ok=True)
    results = dict(init_from=args.init_from, judge=args.judge, reward_model=args.reward_model,
                   judge_samples=args.judge_samples, seeds=args.seeds, iters=args.iters, answers_per_iter=args.answers,
                   eval_problems=args.eval_problems, eval_iters=list(range(0, args.iters + 1, args.eval_every)),
                   settings=common, arms={name: run_arm(args, common, name, module, keys, judge, reward_model)
                                          for name, (module, keys) in arms(args).items()})
    results["points"], results["final"], results["paired"], results["gap"] = summarise(results, args.eval_problems)
    save_study(args.out, "judge_rl", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
