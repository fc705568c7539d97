"""
SFT vs RL out of distribution, on a split where the start has something to lose or extend (SPEC §2,
§4; Ch7 Exp 7-11; Chu et al. 2025, "SFT memorizes, RL generalizes": RL 11.5% → 15.0% OOD, SFT 11.5% →
3.4%). The built-in OOD splits give the tiny SFT models 0–2%, so there is nothing to measure there.

Step 1, --search: greedy accuracy of a checkpoint on every candidate split of its environment (500
problems each, the binomial band beside it): shifts just outside training that keep the task's
format, so that the start partly solves them.

    arithmetic  ood          the built-in split: a 2-digit start value
                steps+1      one step more than training (4 one-digit steps)
                steps+2      two steps more (5)
                steps-1      one step fewer (2)
                reworded     held-out problems in new words: "Compute ...", "found" / "lost" / "How many are left?"
    treasure    ood          the built-in split: every room named from another role's three names
                one_swapped  a held-out map with one room named from another role's names

Step 2, the study: from the checkpoint, more SFT (at the learning rate the SFT recipe ends at, on the
same demonstrations) and GRPO (its default recipe) for equal training time, two seeds, each
evaluated on --eval_problems held-out problems and as many of the --split candidate split every
--rl_iters / --evals GRPO iterations and at the matching SFT training time. Each arm runs in
segments resumed from its checkpoint (init_from=resume continues exactly: optimizer, schedule, data
order); SFT gets the iterations that fit in GRPO's measured training time up to each evaluation at
the SFT rate of its own previous segments (the first: the start's metrics.jsonl, or two timed
iterations when the start has none). It writes results.json, ood.md
(the table) and the plot into --out.

    python experiments/ood.py --search --init_from=out/sft                   # step 1 (~3 min)
    python experiments/ood.py --init_from=out/sft --split=steps+1            # step 2 (~40 min on 2 cores)
    python experiments/ood.py --quick --out=/tmp/ood                         # a toy-size smoke test

--set key=value (repeatable) passes a train.py key to every run (each takes the keys its algorithm knows).
"""

import argparse
import json
import os
import random
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bands  # noqa: E402  (after the path: the script runs from anywhere)
import options  # noqa: E402
from envs import Arithmetic  # noqa: E402
from envs.treasure import MAP_TEXT, ROOM_NAMES, ROOMS, optimal_episode  # noqa: E402
from evaluation import greedy_accuracy  # noqa: E402
from experiments.generalpoints import run, save_study  # noqa: E402  (train.train with the keys of the run's algorithm)

SEEDS = (1337, 1338)
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, prompts_per_iter=2, group_size=2, eval_batch_size=8,
             max_new_tokens=24, train_problems=64, val_examples=8, device="cpu", plot=False)
# more SFT continues at the learning rate the SFT recipe's cosine ends at (no second warm-up to its peak)
ARMS = dict(grpo=dict(algo="grpo", eval_samples=0), sft=dict(algo="sft", learning_rate=2e-4, min_lr=2e-4))
REWORDS = (("What is ", "Compute "), ("?", "."), ("got ", "found "), ("gave away ", "lost "),
           ("How many now.", "How many are left?"))


def reworded(problems):
    for p in problems:
        for old, new in REWORDS:
            p["prompt"] = p["prompt"].replace(old, new)
    return problems


def one_swapped(problems, seed):
    """Each map with one room renamed from another role's names (a name its map does not use)."""
    rng, out = random.Random(f"one-swapped-{seed}"), []
    for p in problems:
        names = dict(p["names"])
        room = rng.choice(ROOMS)
        names[room] = rng.choice(sorted(n for r in ROOMS if r != room for n in ROOM_NAMES[r]
                                        if n not in names.values()))
        plan = [action for action, _ in optimal_episode(tuple(names[r] for r in ROOMS))]
        out.append({"prompt": MAP_TEXT.format(**names), "names": names, "answer": ", ".join(plan)})
    return out


# candidate splits: name -> (environment, n, seed) -> problems
CANDIDATES = dict(
    arithmetic={"ood": lambda env, n, seed: env.problems("ood", n, seed),
                "steps+1": lambda env, n, seed: Arithmetic(n_ops=env.n_ops + 1).problems("heldout", n, seed),
                "steps+2": lambda env, n, seed: Arithmetic(n_ops=env.n_ops + 2).problems("heldout", n, seed),
                "steps-1": lambda env, n, seed: Arithmetic(n_ops=env.n_ops - 1).problems("heldout", n, seed),
                "reworded": lambda env, n, seed: reworded(env.problems("heldout", n, seed))},
    treasure={"ood": lambda env, n, seed: env.problems("ood", n, seed),
              "one_swapped": lambda env, n, seed: one_swapped(env.problems("heldout", n, seed), seed)},
)


def accuracy(r, model, split, n):
    """(greedy accuracy, binomial band) on n problems of `split`: heldout, or a candidate's name."""
    if split == "heldout":
        metrics, _ = greedy_accuracy(r, model, "heldout", n)
    else:  # the candidate stands in for the run's "ood" split
        make, env = CANDIDATES[r.env.name][split], r.env
        shifted = types.SimpleNamespace(name=env.name, verify=env.verify, shows_work=env.shows_work,
                                        problems=lambda s, k, seed=0: make(env, k, seed))
        metrics, _ = greedy_accuracy(types.SimpleNamespace(**{**vars(r), "env": shifted}), model, "ood", n)
        metrics = {"heldout_acc": metrics["ood_acc"]}
    acc = metrics["heldout_acc"]
    return acc, bands.binomial(acc, n)


def loaded(args, common, algo="sft"):
    """A run of `algo` set up on the --init_from checkpoint, nothing trained (its model, env, tokenizer)."""
    return run(dict(common, algo=algo, init_from=args.init_from, max_iters=0, eval_interval=0,
                    out_dir=os.path.join(args.out, "loaded")))


def search(args, common):
    r = loaded(args, common)
    rows = [("heldout (in distribution)", *accuracy(r, r.raw_model, "heldout", args.eval_problems))]
    rows += [(name, *accuracy(r, r.raw_model, name, args.eval_problems)) for name in CANDIDATES[r.env.name]]
    lines = [f"Greedy accuracy of {args.init_from} ({r.env.name}) on {args.eval_problems} problems per split:", "",
             "| split | accuracy | band (95%) |", "|---|---|---|"] + [f"| {n} | {a:.3f} | ± {b:.3f} |" for n, a, b in rows]
    with open(os.path.join(args.out, "search.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "search.json"), "w") as f:
        json.dump(dict(init_from=args.init_from, env=r.env.name, rows=rows), f, indent=1)
    print("\n".join(lines))


def training_seconds(out_dir):
    return sum(json.loads(line).get("iter_time", 0.0) for line in open(os.path.join(out_dir, "metrics.jsonl")))


def sft_rate(out_dir):
    """Seconds per SFT iteration in a run's metrics.jsonl."""
    times = [row["iter_time"] for row in map(json.loads, open(os.path.join(out_dir, "metrics.jsonl"))) if "loss" in row]
    if not times:
        raise ValueError(f"{out_dir}/metrics.jsonl has no training rows to time SFT by")
    return sum(times) / len(times)


def arm_curve(args, common, arm, seed, start):
    """One arm and seed in segments: [{iter, seconds, heldout, heldout_band, ood, ood_band}] with the start first."""
    out_dir, points, iters, rate = os.path.join(args.out, f"{arm}_{seed}"), [dict(start, iter=0, seconds=0.0)], 0, None
    segment, begun = max(1, args.rl_iters // args.evals), []

    def advance(max_iters):  # train to max_iters: from the start the first time, then resumed
        r = run(dict(common, **ARMS[arm], seed=seed, max_iters=max_iters, eval_interval=0, checkpoint=True,
                     out_dir=out_dir, init_from="resume" if begun else args.init_from))
        begun.append(max_iters)
        return r

    for k in range(1, args.evals + 1):
        if arm == "grpo":
            iters += segment
        else:  # as many SFT iterations as fit in GRPO's training time up to this evaluation
            if rate is None and os.path.isfile(os.path.join(args.init_from, "metrics.jsonl")):
                rate = sft_rate(args.init_from)
            elif rate is None:  # a start without its log: two iterations time SFT on this machine
                advance(2)
                rate = sft_rate(out_dir)
            iters = max(iters + 1, *begun[-1:], round(args.budget[k - 1] / rate))
        r = advance(iters)
        seconds = training_seconds(out_dir)
        if arm == "sft":
            rate = sft_rate(out_dir)
        h, hb = accuracy(r, r.raw_model, "heldout", args.eval_problems)
        o, ob = accuracy(r, r.raw_model, args.split, args.eval_problems)
        points.append(dict(iter=iters, seconds=seconds, heldout=h, heldout_band=hb, ood=o, ood_band=ob))
        print(f"{arm} seed {seed}: iteration {iters}, {seconds:.0f} s of training: held-out {h:.3f}, {args.split} {o:.3f}")
    return points


def table(results):
    lines = [f"| arm | seed | iteration | training time (s) | held-out | {results['split']} (OOD) |", "|---|---|---|---|---|---|"]
    for arm, runs in results["arms"].items():
        for seed, points in runs.items():
            lines += [f"| {arm} | {seed} | {p['iter']} | {p['seconds']:.0f} | {p['heldout']:.3f} ± {p['heldout_band']:.3f} | "
                      f"{p['ood']:.3f} ± {p['ood_band']:.3f} |" for p in points]
    lines.append("")
    start = results["start"]
    for arm, runs in results["arms"].items():
        ends = [points[-1] for points in runs.values()]
        for key in ("heldout", "ood"):
            cell = bands.cell([p[key] for p in ends], results["eval_problems"])  # seeds' spread, floored by the binomial band
            lines.append(f"- {arm}, {key}: {start[key]:.3f} → {cell} ({len(ends)} seeds)")
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharex=True)
    for ax, key, title in zip(axes, ("heldout", "ood"), ("in distribution (held-out)", f"OOD ({results['split']})")):
        for (arm, runs), colour in zip(results["arms"].items(), ("C0", "C1")):
            for j, points in enumerate(runs.values()):
                ax.errorbar([p["seconds"] for p in points], [p[key] for p in points], yerr=[p[f"{key}_band"] for p in points],
                            color=colour, ls="-" if j == 0 else "--", marker="o", capsize=2, label=f"{arm} (seed {j + 1})")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training time (s)")
    axes[0].set_ylabel("greedy accuracy")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint both arms start from")
    parser.add_argument("--search", action="store_true", help="step 1: the start's accuracy on every candidate split")
    parser.add_argument("--split", default="steps+1", help="step 2's OOD split: a candidate of the checkpoint's env")
    parser.add_argument("--rl_iters", type=int, default=20, help="GRPO iterations (fixes the training-time budget)")
    parser.add_argument("--evals", type=int, default=4, help="evaluations per arm after its start")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="runs per arm (seeds 1337, 1338, ...)")
    parser.add_argument("--eval_problems", type=int, default=500, help="problems per split and evaluation")
    parser.add_argument("--quick", action="store_true", help="toy sizes, for a smoke test (numbers mean nothing)")
    parser.add_argument("--out", default="out/ood")
    parser.add_argument("--plot", default="", help="the plot's path (default: OUT/ood.png)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every run")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.quick:
        args.rl_iters, args.evals, args.eval_problems = 2, 2, 4
        if not args.init_from:
            args.init_from = os.path.join(args.out, "init")
            run(dict(QUICK, algo="sft", max_iters=2, eval_interval=0, log_interval=1, checkpoint=True, out_dir=args.init_from))
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint")
    env = json.load(open(os.path.join(args.init_from, "config.json")))["env"]
    common = {**(QUICK if args.quick else {}), "env": env, "log_interval": 1, **options.parse_args([f"--{kv}" for kv in args.set])}
    if args.search:
        return search(args, common)
    if args.split not in CANDIDATES.get(env, {}):
        parser.error(f"--split={args.split!r}: choose from {sorted(CANDIDATES.get(env, {}))} for env {env!r}")

    r = loaded(args, common)
    start = dict(zip(("heldout", "heldout_band"), accuracy(r, r.raw_model, "heldout", args.eval_problems)))
    start.update(zip(("ood", "ood_band"), accuracy(r, r.raw_model, args.split, args.eval_problems)))
    results = dict(init_from=args.init_from, split=args.split, eval_problems=args.eval_problems, start=start, arms={})
    seeds = [SEEDS[0] + k for k in range(args.seeds)]
    for arm in ("grpo", "sft"):
        for seed in seeds:
            if arm == "sft":  # GRPO's training time at each of its evaluations (the first seed's)
                args.budget = [p["seconds"] for p in results["arms"]["grpo"][seeds[0]][1:]]
            results["arms"].setdefault(arm, {})[seed] = arm_curve(args, common, arm, seed, start)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    save_study(args.out, "ood", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
