"""
SFT vs RL out of distribution, on a split where the start has something to lose or extend (SPEC §2,
§4; Ch7 Exp 7-11; Chu et al. 2025, "SFT memorizes, RL generalizes": RL 11.5% → 15.0% OOD, SFT 11.5% →
3.4%). The built-in OOD splits give the tiny SFT models 0–2%, so there is nothing to measure there.

Step 1, --search: greedy accuracy of a checkpoint on every candidate split of its environment (500
problems each, the binomial band beside it): shifts just outside training that keep the task's
format, so that the start partly solves them.

    arithmetic  ood          the built-in split: a 2-digit start, every operand from 0-99
                steps+1      one step more than training (4 one-digit steps)
                steps+2      two steps more (5)
                steps-1      one step fewer (2)
                reworded     held-out problems in new words: "Compute ...", "found" / "lost" / "How many are left?"
    treasure    ood          the built-in split: every room named from another role's three names
                one_swapped  a held-out map with one room named from another role's names

Step 2, the study: from the checkpoint, more SFT (at the learning rate the SFT recipe ends at, on the
same demonstrations) and GRPO (its default recipe) for equal training time, three seeds. Each
evaluation answers the same --eval_problems problems of the held-out split and of every --split
(comma-separated), once greedily and once sampled at T = 1, every --rl_iters / --evals GRPO
iterations and at the matching SFT training time. Each answer is kept (right or wrong, worked or bare, the question's form: symbols or words), so arms are
compared paired on the same problems and broken down by form. Each arm runs in segments resumed
from its checkpoint (init_from=resume continues exactly: optimizer, schedule, data order); SFT seed
s gets the iterations that fit in GRPO seed s's measured training time up to each evaluation, at
the SFT rate of its own previous segments (the first: the start's metrics.jsonl, or two timed
iterations when the start has none). It writes results.json, ood.md (the tables) and the plot into
--out.

Memorise or generalise (--pool=N): both arms train on the same fixed N training problems
(env_train_pool: SFT's demonstrations and GRPO's prompts are drawn from them), so that more SFT runs for
many epochs over a small set, as in Chu et al.; --split=train scores that set itself, beside the
held-out and OOD splits. The rules, fixed here before the runs: N = 300, the splits train, steps-1 (a
positive control), steps+1 and reworded, 500 problems each, GRPO 20 iterations, 4 evaluations, three
seeds, the same SFT start, the arms compared paired at the end on the same problems:

    python experiments/ood.py --init_from=out/sft --pool=300 --split=train,steps-1,steps+1,reworded --out=out/ood_pool

Step 3, --steps_written: why an arm lost or gained on a longer chain, from each run's last
checkpoint: how many equations its worked answers write against the chain's length, and how many
of them are the solution's own steps.

    python experiments/ood.py --search --init_from=out/sft                   # step 1 (~3 min)
    python experiments/ood.py --init_from=out/sft --split=steps+1,steps+2,reworded --eval_problems=1000  # step 2
    python experiments/ood.py --init_from=out/sft --out=out/ood --steps_written  # step 3: the steps written
    python experiments/ood.py --quick --out=/tmp/ood                         # a toy-size smoke test

--set key=value (repeatable) passes a train.py key to every run (each takes the keys its algorithm knows).
"""

import argparse
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from envs import Arithmetic  # noqa: E402
from envs.treasure import MAP_TEXT, ROOM_NAMES, ROOMS, optimal_episode  # noqa: E402
from nanopost.rollouts import generate, response_text  # noqa: E402
from experiments.study import (band_line, final_models, pyplot, rows, run, save_analysis,  # noqa: E402
                               save_figure, save_study, set_keys, study_flags, train_once)

SEEDS = (1337, 1338, 1339)
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


def training_set(env, n):
    """The fixed training pool (--pool, env_train_pool) itself, each problem once, at most n of them:
    accuracy on what the arms train on, beside held-out accuracy (memorisation shows as train >> held-out)."""
    if env.pool is None:
        raise ValueError("--split=train needs --pool=N (a fixed training set to score)")
    return [dict(p) for p in env.pool[:n]]


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
                "reworded": lambda env, n, seed: reworded(env.problems("heldout", n, seed)),
                "train": lambda env, n, seed: training_set(env, n)},
    treasure={"ood": lambda env, n, seed: env.problems("ood", n, seed),
              "one_swapped": lambda env, n, seed: one_swapped(env.problems("heldout", n, seed), seed)},
)


def accuracy(r, model, split, n):
    """(greedy accuracy, binomial band) on the first n problems of `split`: heldout, or a candidate's name."""
    correct, _ = answers(r, model, split_problems(r.env, split, n), 0.0)
    acc = sum(correct) / len(correct)  # (the training pool may hold fewer than n)
    return acc, bands.binomial(acc, len(correct))


def loaded(args, common, algo="sft"):
    """A run of `algo` set up on the --init_from checkpoint, nothing trained (its model, env, tokenizer)."""
    return run(dict(common, algo=algo, init_from=args.init_from, max_iters=0, eval_interval=0,
                    out_dir=os.path.join(args.out, "loaded")))


def search(args, common):
    r = loaded(args, common)
    found = [("heldout (in distribution)", *accuracy(r, r.raw_model, "heldout", args.eval_problems))]
    found += [(name, *accuracy(r, r.raw_model, name, args.eval_problems)) for name in CANDIDATES[r.env.name]
              if name != "train" or r.env.pool]
    lines = [f"Greedy accuracy of {args.init_from} ({r.env.name}) on {args.eval_problems} problems per split:", "",
             "| split | accuracy | band (95%) |", "|---|---|---|"] + [f"| {n} | {a:.3f} | ± {b:.3f} |" for n, a, b in found]
    save_analysis(args.out, "search", lines, dict(init_from=args.init_from, env=r.env.name, rows=found))


def steps_written(args, common):
    """Step 3, after a study (--steps_written, the same --out): for the start and every run's last
    checkpoint, greedy answers to each split's problems: the share that show work, how many
    equations a worked answer writes against the chain's length, how many of them are the
    solution's own steps (Arithmetic.step_rewards), and the accuracy of worked and of bare answers;
    means over each arm's seeds. Writes steps.md and steps.json into --out."""
    results = json.load(open(os.path.join(args.out, "results.json")))
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    by_model, problems = {}, None
    for who, r in final_models(args.out, results, args.init_from, common, "sft"):
        problems = problems or {split: split_problems(r.env, split, results["eval_problems"]) for split in results["splits"]}
        for split, probs in problems.items():
            texts = responses(r, r.raw_model, probs, 0.0)
            right = [r.env.verify(p, t) for p, t in zip(probs, texts)]
            shows = [r.env.shows_work(t) for t in texts]
            worked = [(p, t) for p, t, w in zip(probs, texts, shows) if w]
            own = [sum(v for _, v in r.env.step_rewards(p, t)[:-1]) for p, t in worked]  # the solution's own steps
            by_model.setdefault(who, {}).setdefault(split, []).append(dict(
                acc=mean(right), worked=mean(shows), equations=mean([t.split("Answer:", 1)[0].count("=") for _, t in worked]),
                chain=mean([len(p["steps"]) for p in probs]), own_steps=mean(own),
                every_step=mean([o >= len(p["steps"]) for o, (p, _) in zip(own, worked)]),
                acc_worked=mean([x for x, w in zip(right, shows) if w]),
                acc_bare=mean([x for x, w in zip(right, shows) if not w])))
    lines = [f"Greedy answers to {results['eval_problems']} problems per split; each arm the mean over its "
             f"{len(results['seeds'])} seeds' last checkpoints.", "",
             "| split | model | accuracy | worked share | equations per worked answer (chain) | of them the solution's steps | "
             "worked answers with every step right | accuracy worked / bare |", "|---|---|---|---|---|---|---|---|"]
    for split in results["splits"]:
        for who in by_model:
            m = {k: sum(x[k] for x in by_model[who][split]) / len(by_model[who][split]) for k in by_model[who][split][0]}
            lines.append(f"| {split} | {who} | {m['acc']:.3f} | {m['worked']:.2f} | {m['equations']:.2f} ({m['chain']:.0f}) | "
                         f"{m['own_steps']:.2f} | {m['every_step']:.2f} | {m['acc_worked']:.3f} / {m['acc_bare']:.3f} |")
    save_analysis(args.out, "steps", lines, by_model)


def training_seconds(out_dir):
    return sum(row.get("iter_time", 0.0) for row in rows(out_dir))


def sft_rate(out_dir):
    """Seconds per SFT iteration in a run's metrics.jsonl."""
    times = [row["iter_time"] for row in rows(out_dir) if "loss" in row]
    if not times:
        raise ValueError(f"{out_dir}/metrics.jsonl has no training rows to time SFT by")
    return sum(times) / len(times)


def split_problems(env, split, n):
    """The first seeded n problems of `split`: heldout, or a candidate's name (the same at every evaluation)."""
    return env.problems("heldout", n, seed=0) if split == "heldout" else CANDIDATES[env.name][split](env, n, 0)


def form(problem):
    """How the question is written: "words" (a word problem, "Ann had 7 coins, ...") or "symbols"
    ("What is 7 + 8 - 3?", reworded "Compute ..."); "map" on the treasure hunt."""
    if "names" in problem:
        return "map"
    return "words" if " had " in problem["prompt"] else "symbols"


def responses(r, model, problems, temperature):
    """One response text per problem, greedy (temperature 0) or sampled at a fixed seed."""
    tokens, _, _ = generate(r, model, [r.tok.prompt_ids(p["prompt"]) for p in problems], temperature=temperature, seed=1)
    return [response_text(r, t) for t in tokens]


def answers(r, model, problems, temperature):
    """One answer per problem, greedy (temperature 0) or sampled at a fixed seed: (correct, shows work), 0/1 each."""
    texts = responses(r, model, problems, temperature)
    return ([int(r.env.verify(p, text)) for p, text in zip(problems, texts)],
            [int(bool(r.env.shows_work(text))) for text in texts])


def figures(problems, correct, work):
    """{acc, band, work, forms: {form: accuracy}, form_n: {form: problems}, correct: [0/1 per problem]}."""
    forms = {}
    for p, c in zip(problems, correct):
        forms.setdefault(form(p), []).append(c)
    acc = sum(correct) / len(correct)
    return dict(acc=acc, band=bands.binomial(acc, len(correct)), work=sum(work) / len(work),
                forms={f: sum(v) / len(v) for f, v in sorted(forms.items())},
                form_n={f: len(v) for f, v in sorted(forms.items())}, correct=correct)


def evaluate(r, problems):
    """{"greedy": {split: figures}, "sampled": {split: figures}} on every split's problems, one answer
    each, greedy and sampled at T = 1."""
    return {mode: {split: figures(probs, *answers(r, r.raw_model, probs, temperature))
                   for split, probs in problems.items()} for mode, temperature in (("greedy", 0.0), ("sampled", 1.0))}


def arm_curve(args, common, arm, seed, start, problems):
    """One arm and seed in segments: [{iter, seconds, greedy: {split: figures}, sampled: ...}], the start first."""
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
        points.append(dict(iter=iters, seconds=seconds, **evaluate(r, problems)))
        print(f"{arm} seed {seed}: iteration {iters}, {seconds:.0f} s of training: " +
              ", ".join(f"{s} {f['acc']:.3f}" for s, f in points[-1]["greedy"].items()))
    return points


def ends(results, arm, mode, split, key="acc"):
    """The figure `key` of every seed's last evaluation of `arm` (seed order)."""
    return [points[-1][mode][split][key] for points in results["arms"][arm].values()]


def gap(results, mode, split):
    """GRPO minus more SFT at the end, on the same problems: (per-seed paired differences, the
    across-seed mean and band, each seed's per-problem band)."""
    grpo, sft = results["arms"]["grpo"], results["arms"]["sft"]
    per_seed = [bands.paired(grpo[s][-1][mode][split]["correct"], sft[s][-1][mode][split]["correct"]) for s in grpo]
    return per_seed, bands.paired_across_seeds([d for d, _ in per_seed], [h for _, h in per_seed])


def problems_in(results, split):
    """How many problems a split's evaluations answer (the training pool may hold fewer than eval_problems)."""
    return len(results["start"]["greedy"][split]["correct"])


def table(results):
    splits, n, start = results["splits"], results["eval_problems"], results["start"]
    lines = ["| arm | seed | iteration | training time (s) | " + " | ".join(f"{s} greedy" for s in splits) + " |",
             "|---|---|---|---|" + "---|" * len(splits)]
    for arm, runs in results["arms"].items():
        for seed, points in runs.items():
            lines += [f"| {arm} | {seed} | {p['iter']} | {p['seconds']:.0f} | " +
                      " | ".join(f"{p['greedy'][s]['acc']:.3f}" for s in splits) + " |" for p in points]
    fewest = min(problems_in(results, split) for split in splits)
    lines += ["", f"At the end, {len(results['seeds'])} seeds, {n} problems per split or the whole split where it holds "
              f"fewer ({', '.join(f'{s} {problems_in(results, s)}' for s in splits if problems_in(results, s) < n) or 'none'}; "
              f"one evaluation's band at most ± {bands.binomial(0.5, fewest):.3f}); the start, then each arm's mean ± band "
              f"(or both seeds and their range):", "",
              "| split | answer | start | more SFT | GRPO | GRPO − more SFT (paired) | worked share: start / SFT / GRPO |",
              "|---|---|---|---|---|---|---|"]
    for split in splits:
        for mode in ("greedy", "sampled"):
            per_seed, (mean, half) = gap(results, mode, split)
            work = [start[mode][split]["work"]] + [sum(ends(results, a, mode, split, "work")) / len(results["seeds"])
                                                   for a in ("sft", "grpo")]
            lines.append(f"| {split} | {mode} | {start[mode][split]['acc']:.3f} | "
                         f"{bands.cell(ends(results, 'sft', mode, split), problems_in(results, split))} | "
                         f"{bands.cell(ends(results, 'grpo', mode, split), problems_in(results, split))} | "
                         f"{bands.signed(mean, half)} (per seed {', '.join(bands.signed(d, h) for d, h in per_seed)}) | "
                         + " / ".join(f"{w:.2f}" for w in work) + " |")
    forms = sorted({f for split in splits for f in start["greedy"][split]["forms"]})
    lines += ["", "Greedy accuracy by the question's form (start → the seeds' mean at the end):", "",
              "| split | form | start | more SFT | GRPO |", "|---|---|---|---|---|"]
    for split in splits:
        for f in forms:
            if f not in start["greedy"][split]["forms"]:
                continue
            mean = lambda arm: sum(p[-1]["greedy"][split]["forms"][f] for p in results["arms"][arm].values()) / len(results["seeds"])
            lines.append(f"| {split} | {f} | {start['greedy'][split]['forms'][f]:.3f} | {mean('sft'):.3f} | {mean('grpo'):.3f} |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    """Top: greedy accuracy against training time, each arm's seed mean with its band (or both seeds' range),
    one panel per split. Bottom: at the end, greedy accuracy by the question's form, start / SFT / GRPO."""
    splits = results["splits"]
    fig, axes = pyplot().subplots(2, len(splits), figsize=(3.6 * len(splits), 6.2), squeeze=False)
    colours = dict(sft="#d95f02", grpo="#1b9e77", start="#7f7f7f")
    for ax, split in zip(axes[0], splits):
        for arm, runs in results["arms"].items():
            curves = [[(p["seconds"], p["greedy"][split]["acc"]) for p in points] for points in runs.values()]
            band_line(ax, curves, colours[arm], "GRPO" if arm == "grpo" else "more SFT", problems_in(results, split),
                      top=1.0, marker="o")
        ax.set_ylim(bottom=0)  # from zero: no change drawn larger than it is
        ax.set_title(f"{split} greedy" + dict(heldout=" (in distribution)", train=" (the training set)").get(split, " (OOD)"),
                     fontsize=9)
        ax.set_xlabel("training time (s)", fontsize=8)
    axes[0][0].set_ylabel(f"accuracy, {len(results['seeds'])} seeds' mean and band")
    axes[0][0].legend(fontsize=7)
    for ax, split in zip(axes[1], splits):
        forms = list(results["start"]["greedy"][split]["forms"])
        for j, who in enumerate(("start", "sft", "grpo")):
            if who == "start":
                values, halves = [results["start"]["greedy"][split]["forms"][f] for f in forms], None
            else:
                ends_by_form = [[p[-1]["greedy"][split]["forms"][f] for p in results["arms"][who].values()] for f in forms]
                values = [sum(v) / len(v) for v in ends_by_form]
                halves = [bands.across_seeds(v, results["start"]["greedy"][split]["form_n"][f])[1]
                          for v, f in zip(ends_by_form, forms)]
                halves = None if None in halves else halves
            ax.bar([i + (j - 1) * 0.27 for i in range(len(forms))], values, 0.27, yerr=halves, capsize=2, color=colours[who],
                   label=dict(start="start", sft="more SFT", grpo="GRPO")[who])
        ax.set_xticks(range(len(forms)), forms, fontsize=8)
        ax.set_ylim(bottom=0)  # from zero: no change drawn larger than it is
        ax.set_title(f"{split} greedy at the end, by form", fontsize=9)
    axes[1][0].legend(fontsize=7)
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the SFT checkpoint both arms start from")
    parser.add_argument("--search", action="store_true", help="step 1: the start's accuracy on every candidate split")
    parser.add_argument("--steps_written", action="store_true",
                        help="step 3, after step 2 in the same --out: how many steps the answers write, per split")
    parser.add_argument("--split", default="steps+1", help="step 2's OOD splits, comma-separated candidates of the checkpoint's env")
    parser.add_argument("--rl_iters", type=int, default=20, help="GRPO iterations (fixes the training-time budget)")
    parser.add_argument("--evals", type=int, default=4, help="evaluations per arm after its start")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="runs per arm (seeds 1337, 1338, ...)")
    parser.add_argument("--eval_problems", type=int, default=500, help="problems per split and evaluation")
    parser.add_argument("--pool", type=int, default=0, help="train both arms on these many fixed problems (env_train_pool); 0 = fresh ones")
    study_flags(parser, "out/ood", "ood")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.quick:
        args.rl_iters, args.evals, args.eval_problems = 2, 2, 4
        args.init_from = args.init_from or train_once(os.path.join(args.out, "init"),  # a toy start, trained once per --out
                                                      dict(QUICK, algo="sft", max_iters=2, eval_interval=0, log_interval=1))
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint")
    env = json.load(open(os.path.join(args.init_from, "config.json")))["env"]
    common = {**(QUICK if args.quick else {}), "env": env, "log_interval": 1, **set_keys(args)}
    if args.pool:
        common["env_train_pool"] = args.pool
    if args.search:
        return search(args, common)
    if args.steps_written:
        return steps_written(args, common)
    splits = ["heldout"] + args.split.split(",")
    for split in splits[1:]:
        if split not in CANDIDATES.get(env, {}):
            parser.error(f"--split={split!r}: choose from {sorted(CANDIDATES.get(env, {}))} for env {env!r}")

    r = loaded(args, common)
    problems = {split: split_problems(r.env, split, args.eval_problems) for split in splits}
    seeds = [SEEDS[0] + k for k in range(args.seeds)]
    results = dict(init_from=args.init_from, splits=splits, eval_problems=args.eval_problems, seeds=seeds,
                   start=evaluate(r, problems), arms={})
    for arm in ("grpo", "sft"):
        for seed in seeds:
            if arm == "sft":  # the GRPO run of the same seed: its training time at each of its evaluations
                args.budget = [p["seconds"] for p in results["arms"]["grpo"][seed][1:]]
            results["arms"].setdefault(arm, {})[seed] = arm_curve(args, common, arm, seed, results["start"], problems)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    save_study(args.out, "ood", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
