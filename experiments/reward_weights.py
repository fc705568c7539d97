"""
A vector reward's weights against what the policy does [Ch7 "The evolution of reward paradigms": a
vector of named scores, combined]: GRPO from one SFT model, once per --weights setting, each a
rewards.py reward_weights value, r = Σ_d w_d·r_d over named dimensions, each in [0, 1]:

    correct   the verifier's 0/1 (or, with --set reward=judge, the judge's P(correct))
    worked    1 where the answer writes its steps (env.shows_work)
    short     1 − length / max_new_tokens
    parses    1 where the answer is in the task's form

The default settings: the verifier alone, then a growing weight on shortness. On the default task a
bare answer ("Answer: 17", 10 tokens) is short and mostly wrong, a worked one (about 36 tokens) long
and mostly right, so the weight on `short` sets which of the two the policy is pushed to. Per setting:
every dimension's mean over the first and over the last --window iterations' rollouts (each logged
per iteration as reward_<name>; reward_worked is their worked share) and their length; at the end
greedy held-out accuracy (its binomial band, bands.py), worked share and length. It writes
results.json, reward_weights.md (the table) and the plot (each dimension against the iteration, one
line per setting) into --out.

    python experiments/reward_weights.py --init_from=out/sft
    python experiments/reward_weights.py --init_from=out/sft --weights=correct=1 --weights=correct=1,worked=1
    python experiments/reward_weights.py --quick --out=/tmp/weights             # a toy-size smoke test

--set key=value (repeatable) passes a train.py key to every run (its --algo grpo keys).
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from nanopost.rewards import DIMENSIONS, reward_weights  # noqa: E402
from experiments.study import (pyplot, rows, run, save_figure, save_study, set_keys, study_flags,  # noqa: E402
                               train_once)

QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, prompts_per_iter=2, group_size=2, eval_batch_size=8,
             max_new_tokens=16, train_problems=64, val_examples=8, device="cpu", plot=False)
SETTINGS = ("correct=1", "correct=1,short=0.5", "correct=1,short=2")


def arm(args, common, weights, k):
    """One GRPO run under `weights` -> {weights, iterations: [{iter, reward_<d>..., work_frac, len_mean}],
    first / last: the means over the first and last --window iterations, heldout: the final evaluation}."""
    out_dir = os.path.join(args.out, f"setting_{k}")
    # every dimension is named (a weight of 0 where the setting has none), so that every one is logged
    named = ",".join(f"{name}={reward_weights(weights).get(name, 0.0):g}" for name in DIMENSIONS)
    run(dict(common, algo="vector_reward", init_from=args.init_from, reward_weights=named, max_iters=args.iters,
             eval_interval=args.iters, eval_at_start=False, overwrite=True, out_dir=out_dir))
    logged = rows(out_dir)
    keys = [f"reward_{name}" for name in DIMENSIONS] + ["len_mean", "reward"]  # (reward_worked: the worked share)
    iterations = [{"iter": r["iter"], **{key: r[key] for key in keys}} for r in logged if "reward" in r]
    mean = lambda part: {key: sum(p[key] for p in part) / len(part) for key in keys}
    final = [r for r in logged if "heldout_acc" in r][-1]
    acc = final["heldout_acc"]
    return dict(weights=weights, out_dir=out_dir, iterations=iterations, first=mean(iterations[:args.window]),
                last=mean(iterations[-args.window:]),
                heldout=dict(acc=acc, band=bands.binomial(acc, args.eval_problems), work=final["heldout_work"],
                             len=final["heldout_len"]))


def table(results):
    lines = [f"GRPO from `{results['init_from']}`, {results['iters']} iterations per setting; rollout figures: the "
             f"mean over the first → the last {results['window']} iterations; held-out: greedy on "
             f"{results['eval_problems']} problems (band 95%, binomial).", "",
             "| weights | " + " | ".join(f"{name} (rollouts)" for name in DIMENSIONS)
             + " | length (rollouts) | held-out accuracy | held-out worked | held-out length |",
             "|---" * (len(DIMENSIONS) + 5) + "|"]
    for a in results["arms"]:
        change = lambda key, fmt=".3f": f"{a['first'][key]:{fmt}} → {a['last'][key]:{fmt}}"
        h = a["heldout"]
        lines.append(f"| `{a['weights']}` | " + " | ".join(change(f"reward_{name}") for name in DIMENSIONS)
                     + f" | {change('len_mean', '.1f')} | {h['acc']:.3f} ± {h['band']:.3f} | "
                     f"{h['work']:.3f} | {h['len']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    keys = [f"reward_{name}" for name in DIMENSIONS]
    fig, axes = pyplot().subplots(1, len(keys), figsize=(3.2 * len(keys), 3.2), sharex=True)
    for ax, key in zip(axes, keys):
        for a in results["arms"]:
            ax.plot([p["iter"] for p in a["iterations"]], [p[key] for p in a["iterations"]], label=a["weights"])
        ax.set_title(f"{key} (rollouts)", fontsize=10)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint GRPO starts from (required)")
    parser.add_argument("--weights", action="append", default=[], metavar="NAME=W,...",
                        help=f"a reward_weights setting, repeatable (default: {' ; '.join(SETTINGS)})")
    parser.add_argument("--iters", type=int, default=20, help="GRPO iterations per setting (grpo.py's default)")
    parser.add_argument("--window", type=int, default=5, help="iterations averaged at the start and at the end")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems of the final evaluation")
    study_flags(parser, "out/reward_weights", "reward_weights")
    args = parser.parse_args()
    settings = args.weights or list(SETTINGS)
    for weights in settings:
        try:
            reward_weights(weights)
        except ValueError as e:
            parser.error(f"--weights={weights}: {e}")
    if args.quick:
        args.iters, args.window, args.eval_problems = 2, 1, 4
        args.init_from = args.init_from or train_once(os.path.join(args.out, "sft"),
                                                      dict(QUICK, algo="sft", max_iters=2, eval_interval=0))
    if args.window < 1 or args.window > args.iters:
        parser.error(f"--window={args.window}: between 1 and --iters={args.iters}")
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint: run the ladder's sft stage first")
    common = {**(QUICK if args.quick else {}), "eval_problems": args.eval_problems, "eval_samples": 0,
              "log_interval": 1, "checkpoint": False, **set_keys(args)}
    os.makedirs(args.out, exist_ok=True)
    results = dict(init_from=args.init_from, iters=args.iters, window=args.window, eval_problems=args.eval_problems,
                   arms=[arm(args, common, weights, k) for k, weights in enumerate(settings)])
    save_study(args.out, "reward_weights", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
