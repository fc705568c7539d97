"""
Distillation where its signal is dense (issue 47, item 2): does on-policy distillation's advantage over
RL grow with the length of the answer? The argument (the chapter's "online + dense signal"): GRPO's
reward is one bit per answer, so the longer the chain of steps, the less it says about which step
was wrong; OPD grades every token. If that is what makes OPD fast, its lead in tokens grows with L.

The teaching regime of docs/distillation.md (every demonstration worked: the student's errors are
arithmetic, not a strategy to select), at answer lengths L = 2, 4, 6 steps (train.py's env_ops). For
each L, made once by this script (train_once: kept in --out, read when the study runs again):

    student   SFT from scratch on worked L-step chains, 600 iterations (docs/task.md's all-worked
              student, at L steps):   python train.py --env_direct_frac=0 --env_ops=L --max_iters=600 \\
                                          --block_size=256 --max_new_tokens=96 --out_dir=OUT/L{L}/student
    teacher   config/teacher.py at L steps (6 × 192, SFT from scratch on worked chains), then 10 GRPO
              iterations, the recipe of distillation.md's teacher:
                                      python train.py config/teacher.py --env_ops=L --block_size=256 \\
                                          --max_new_tokens=96 --out_dir=OUT/L{L}/teacher_sft
                                      python train.py --algo grpo --init_from=OUT/L{L}/teacher_sft --env_ops=L \\
                                          --max_new_tokens=96 --max_iters=10 --eval_interval=5 --out_dir=OUT/L{L}/teacher
              (one teacher per L, not the ladder's GRPO stage: GRPO from this student gains nothing,
              distillation.md, so it would teach nothing; nor distillation.md's 3-step teacher, whose
              position embeddings never saw a 6-step answer)

(block_size 256 and max_new_tokens 96 at every L: a 6-step prompt is up to 112 tokens with the chat
template, its worked answer 64.) Then from each L's student, every arm for each seed, 128 sampled
answers per iteration, no early stop (the same --cap for all):

    opd              OPD (opd.py), 128 prompts × 1, the exact per-token reverse KL to the L-step teacher
    process_reward   GRPO with a reward at the end of every written step (lab/process_reward.py),
                     16 × 8: a dense signal without a teacher
    grpo_lr3e-05     GRPO (config/grpo.py), 16 × 8, the verifier's 0/1 reward, at three learning rates
    grpo_lr0.0001    (constant after 5 warm-up iterations; 1e-4 is the recipe's), so that no one rate
    grpo_lr0.0003    handicaps RL; OPD and process_reward at the recipes' 1e-4

THE RULES, fixed here before any run:
- Evaluation: greedy accuracy on the same --eval_problems held-out problems of each L (the env's
  seeded draw, held-out equations disjoint from training; drawn with replacement as every default-task
  evaluation is, docs/log.md 2026-12-06; the script prints how many are distinct) at the start and at
  iterations 2, 4, 6, 8, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120 (distill.schedule(--cap)).
- Levels (`levels`), computed from the measured greedy accuracy of each L's start s and teacher t:
  level(f) = s + max(f·(t − s), b) for f in FRACTIONS = 10%, 25%, 50% of the gap, b the start's binomial
  band (bands.binomial(s, n)): a level inside the start's own band is no level. Where t − s ≤ b there
  is no gap to close and that L has no levels.
- Endpoint: the student rollout tokens sampled (from each run's metrics.jsonl, distill.progress) until
  a level is reached and holds: the first evaluation at or above it whose next evaluation is at or
  above it too (distill.first_reaching). A run that never holds a level is a miss.
- The best GRPO arm (`best_grpo`), at each L and level: the rate whose seeds take the fewest tokens
  on average, a miss counted at the tokens of its whole run (a lower bound; the rule favours RL).
- The comparison (`speedups`): per seed, the best GRPO rate's tokens over OPD's (the same seed: the
  same problems; > 1: OPD is faster), across the seeds on a log scale by bands.paired_across_seeds
  (t band alone: no per-problem results are kept). Where only one of the two misses, the seed's
  figure is a bound, its miss counted at its run's tokens ("≥" where GRPO misses, "≤" where OPD does);
  where both miss, there is none. process_reward is compared with the best GRPO rate the same way.
- The verdict (`verdict`), at the PRIMARY level (10% of the gap: the only level OPD held within 80
  iterations in distillation.md's teaching regime), OPD's speed-up at L = 6 against L = 2: it GROWS
  with L where L = 6's band lies wholly above L = 2's, SHRINKS where wholly below, otherwise it is
  NOT SHOWN. A bound enters at its value, and only where the true figure lies further in the
  verdict's direction (a "≥" at L = 6 or a "≤" at L = 2 for GROWS, the reverse for SHRINKS; otherwise
  NOT SHOWN); an L with a seed where both miss is NOT MEASURABLE.
- Beside it (no verdict): each arm's end (the mean of its last three evaluations) and OPD's end minus
  the best GRPO rate's end (the rate with the highest mean end), paired per seed.
- Three seeds (1337, 1338, 1339); the students and teachers are trained once (seed 1337).

    python experiments/dense_signal.py                      # the study: see docs/distillation.md for its cost
    python experiments/dense_signal.py --lengths=2          # one L (its results join the others in --out)
    python experiments/dense_signal.py --quick              # tiny models, a few iterations (the test)
    python experiments/dense_signal.py --report             # the table and the figure again from results.json
    python experiments/dense_signal.py --report --join=A/results.json,B/results.json   # runs made elsewhere, joined

A study stopped part-way goes on where it stopped: finished runs are read from --out's results.json, and
a model missing from --out is made again, its start and teacher measured and required to equal the
figures its finished runs started from (on the same kind of CPU the models come out the same).

Writes results.json, dense_signal.md (the tables and the verdict) and dense_signal.png (tokens to
each level against L, one line per arm, the band shaded) into --out, after every run.
"""

import argparse
import json
import math
import os
import sys
from statistics import fmean as mean

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))  # distill's helpers, as opsd.py reads them

from distill import end_accuracy, evaluate, first_reaching, schedule, train_arm  # noqa: E402
from experiments.study import pyplot, save_figure, save_study, train_once  # noqa: E402
from nanopost import bands  # noqa: E402
from nanopost import options  # noqa: E402
import train as T  # noqa: E402

LENGTHS = (2, 4, 6)
FRACTIONS = (0.1, 0.25, 0.5)  # of the gap from the start to the teacher
PRIMARY = 0.1  # the level the verdict is read at
RATES = (3e-5, 1e-4, 3e-4)  # GRPO's sweep
TASK = dict(env_direct_frac=0.0, max_new_tokens=96)  # every run; and from scratch block_size=256
GRPO = dict(options.parse_args([os.path.join(ROOT, "config", "grpo.py")]), group_size=8)  # 16 × 8
ARMS = dict(opd=dict(algo="opd"), process_reward=dict(GRPO, algo="process_reward"),
            **{f"grpo_lr{lr:g}": dict(GRPO, learning_rate=lr, min_lr=lr) for lr in RATES})
STUDENT = dict(algo="sft", max_iters=600, block_size=256)
TEACHER = dict(options.parse_args([os.path.join(ROOT, "config", "teacher.py")]), block_size=256)
TEACHER_GRPO = dict(algo="grpo", max_iters=10, eval_interval=5)
QUICK = dict(cap=4, eval_problems=16, seeds="1")
QUICK_KEYS = dict(max_new_tokens=24, eval_batch_size=16, batch_size=4)  # every run, --quick
QUICK_MODEL = dict(n_layer=1, n_head=2, n_embd=32, max_iters=2, train_problems=64, val_examples=8, eval_interval=0)
QUICK_ARM = dict(opd=dict(prompts_per_iter=4), grpo=dict(prompts_per_iter=2, group_size=2))


# ----------------------------------------------------------------------------------------------
# The rules

def levels(start, teacher, n):
    """{fraction: level}: start + max(f·(teacher − start), the start's binomial band), or {} where the
    teacher is not above that band (no gap to close)."""
    floor = bands.binomial(start, n)
    if teacher - start <= floor:
        return {}
    return {f: start + max(f * (teacher - start), floor) for f in FRACTIONS}


def tokens_to(points, level):
    """Rollout tokens to where `level` is reached and holds (first_reaching), or None: a miss."""
    reached = first_reaching(points, level)
    return reached["tokens"] if reached else None


def tokens_or_all(points, level):
    """tokens_to, a miss counted at the tokens of the whole run (a lower bound on its true figure)."""
    reached = tokens_to(points, level)
    return points[-1]["tokens"] if reached is None else reached


def best_grpo(runs, level):
    """The GRPO rate (its arm's name) whose seeds take the fewest tokens to `level` on average, a miss
    counted at its run's last tokens. runs: {arm: {seed: points}}."""
    cost = {arm: mean([tokens_or_all(p, level) for p in seeds.values()])
            for arm, seeds in runs.items() if arm.startswith("grpo_")}
    return min(cost, key=cost.get)


def speedups(runs, arm, grpo, level):
    """Per seed, (GRPO's tokens / the arm's, kind): kind "=" where both reach the level, "≥" where GRPO
    misses (counted at its run's tokens), "≤" where the arm misses; (None, "miss") where both do."""
    out = {}
    for seed, points in runs[arm].items():
        ours, theirs = tokens_to(points, level), tokens_to(runs[grpo][seed], level)
        kind = ("=" if theirs is not None else "≥") if ours is not None else ("≤" if theirs is not None else "miss")
        out[seed] = (None if kind == "miss" else tokens_or_all(runs[grpo][seed], level) / tokens_or_all(points, level), kind)
    return out


def log_band(values):
    """(mean, low, high) of per-seed ratios on a log scale, by bands.paired_across_seeds (t band alone);
    low and high None under three seeds."""
    m, half = bands.paired_across_seeds([math.log(v) for v in values], None)
    if half is None:
        return math.exp(m), None, None
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def verdict(short, long):
    """The verdict on a speed-up at the shortest L against the longest: short and long {seed: (ratio, kind)}."""
    for name, figures in (("shortest", short), ("longest", long)):
        if not figures:
            return f"NOT MEASURABLE: no figure at the {name} L (no level, or no finished runs)"
        if any(kind == "miss" for _, kind in figures.values()):
            return f"NOT MEASURABLE: both arms miss in a seed at the {name} L"
    (_, lo_s, hi_s), (_, lo_l, hi_l) = (log_band([r for r, _ in f.values()]) for f in (short, long))
    if lo_s is None or lo_l is None:
        return "NOT SHOWN: fewer than three seeds, no band"
    kinds_s, kinds_l = {k for _, k in short.values()}, {k for _, k in long.values()}
    if lo_l > hi_s and "≤" not in kinds_l and "≥" not in kinds_s:
        return "GROWS with L: the longest L's band lies above the shortest's"
    if hi_l < lo_s and "≥" not in kinds_l and "≤" not in kinds_s:
        return "SHRINKS with L: the longest L's band lies below the shortest's"
    return "NOT SHOWN: the bands overlap, or a bound points the wrong way"


# ----------------------------------------------------------------------------------------------
# The table and the figure

def ratio_cell(figures):
    if not figures:
        return "–"
    values = [r for r, _ in figures.values() if r is not None]
    per_seed = ", ".join("miss" if k == "miss" else f"{k if k != '=' else ''}{r:.2f}×" for r, k in figures.values())
    if len(values) < len(figures):
        return f"both miss in {len(figures) - len(values)} of {len(figures)} ({per_seed})"
    m, lo, hi = log_band(values)
    return f"{m:.2f}×" + (f" ({lo:.2f}–{hi:.2f}×)" if lo is not None else "") + f" ({per_seed})"


def tokens_cell(values):
    if any(v is None for v in values):
        return f"miss in {sum(v is None for v in values)} of {len(values)} (" + ", ".join(
            "miss" if v is None else f"{v:,.0f}" for v in values) + ")"
    m, half = bands.across_seeds(values, None)
    return f"{m:,.0f}" + (f" ± {half:,.0f}" if half is not None else "") + ("" if len(values) > 1 else " (one seed)")


def analyse(record):
    """{L: the figures of the table} from the runs so far."""
    out = {}
    for L, entry in sorted(record["lengths"].items(), key=lambda kv: int(kv[0])):
        runs = {arm: seeds for arm, seeds in entry["arms"].items() if seeds}
        lv = levels(entry["start"], entry["teacher"], record["settings"]["eval_problems"])
        figures = dict(levels=lv, tokens={arm: {f: [tokens_to(p, lv[f]) for p in seeds.values()] for f in lv}
                                          for arm, seeds in runs.items()},
                       ends={arm: [end_accuracy(p) for p in seeds.values()] for arm, seeds in runs.items()},
                       best={}, speedups={})
        done = set.intersection(*(set(seeds) for seeds in runs.values())) if runs else set()  # every arm's seeds
        if "opd" in runs and any(a.startswith("grpo_") for a in runs) and done:
            full = {a: {s: seeds[s] for s in seeds if s in done} for a, seeds in runs.items()}
            for f in lv:
                figures["best"][f] = best_grpo(full, lv[f])
                figures["speedups"][f] = {arm: speedups(full, arm, figures["best"][f], lv[f])
                                          for arm in ("opd", "process_reward") if arm in full}
            end = {a: mean([end_accuracy(p) for p in seeds.values()]) for a, seeds in full.items() if a.startswith("grpo_")}
            best_end = max(end, key=end.get)
            gaps = [end_accuracy(full["opd"][s]) - end_accuracy(full[best_end][s]) for s in full["opd"]]
            figures["end_gap"] = (best_end, gaps)
        out[int(L)] = figures
    return out


def table(record):
    n, cap = record["settings"]["eval_problems"], record["settings"]["cap"]
    figures = analyse(record)
    lines = [f"Greedy held-out accuracy on {n} problems per L; tokens: student rollout tokens to a level held for two "
             f"evaluations, mean ± t band over the seeds (a miss: never held in {cap} iterations).", "",
             "| L | start | teacher | distinct equations among the problems | levels (10% / 25% / 50% of the gap) |",
             "|---|---|---|---|---|"]
    for L, fig in figures.items():
        entry = record["lengths"][str(L)]
        lv = " / ".join(f"{v:.3f}" for v in fig["levels"].values()) or "none: the teacher is within the start's band"
        lines.append(f"| {L} | {entry['start']:.3f} | {entry['teacher']:.3f} | {entry['distinct']} | {lv} |")
    lines += ["", "| L | arm | end (last 3 evaluations) | " + " | ".join(f"tokens to {int(f * 100)}%" for f in FRACTIONS) + " |",
              "|---|---|---|" + "---|" * len(FRACTIONS)]
    for L, fig in figures.items():
        for arm, ends in ((a, fig["ends"][a]) for a in ARMS if a in fig["ends"]):
            cells = [tokens_cell(fig["tokens"][arm][f]) if f in fig["levels"] else "–" for f in FRACTIONS]
            lines.append(f"| {L} | {arm} | {bands.cell(ends, n)} | " + " | ".join(cells) + " |")
    lines += ["", "Speed-up: the best GRPO rate's tokens ÷ the arm's, per seed (> 1: the arm is faster; ≥ / ≤: a bound, "
              "one arm missed and is counted at its run's tokens), mean and band on a log scale.", "",
              "| L | level | best GRPO rate | OPD | process_reward |", "|---|---|---|---|---|"]
    for L, fig in figures.items():
        for f, best in fig["best"].items():
            s = fig["speedups"][f]
            cells = [ratio_cell(s.get(arm)) for arm in ("opd", "process_reward")]
            lines.append(f"| {L} | {int(f * 100)}% | {best} | " + " | ".join(cells) + " |")
    gaps = [(L, fig["end_gap"]) for L, fig in figures.items() if "end_gap" in fig]
    if gaps:
        lines += ["", "OPD's end − the best GRPO rate's end (the rate with the highest mean end), paired per seed:"]
        lines += [f"- L = {L} (against {best}): {bands.paired_cell(g, None)}" for L, (best, g) in gaps]
    short, long = LENGTHS[0], LENGTHS[-1]
    lines += ["", f"**The verdict** at the pre-registered level ({int(PRIMARY * 100)}% of the gap), L = {long} against "
              f"L = {short}:"]
    for arm in ("opd", "process_reward"):
        pick = lambda L: figures[L]["speedups"].get(PRIMARY, {}).get(arm, {}) if L in figures else {}
        lines.append(f"- {arm}'s speed-up over the best GRPO rate: {verdict(pick(short), pick(long))}")
    return "\n".join(lines) + "\n"


COLOURS = dict(opd="tab:blue", process_reward="tab:green", **{f"grpo_lr{lr:g}": c for lr, c in
                                                            zip(RATES, ("#f4a582", "tab:red", "#67001f"))})


def plot(record, path):
    """Top row: tokens to each level against L, a panel per level, one line per arm: the seeds' mean where
    every seed holds the level, its band shaded; a miss marked × at its run's tokens (a lower bound).
    Bottom row: each L's held-out accuracy against rollout tokens, per arm the seeds' mean at each
    evaluation, the start, the teacher and the primary level drawn across."""
    figures = analyse(record)
    fig, grid = pyplot().subplots(2, len(FRACTIONS), figsize=(4.4 * len(FRACTIONS), 7.6))
    axes = grid[0]
    for ax, f in zip(axes, FRACTIONS):
        for arm, colour in ((a, c) for a, c in COLOURS.items() if any(a in fig_L["ends"] for fig_L in figures.values())):
            xs, ms, los, his, missed = [], [], [], [], []
            for L, fig_L in figures.items():
                values = fig_L["tokens"].get(arm, {}).get(f)
                if not values:
                    continue
                runs = list(record["lengths"][str(L)]["arms"][arm].values())
                missed += [(L, p[-1]["tokens"] / 1e3) for v, p in zip(values, runs) if v is None]
                if all(v is not None for v in values):
                    m, lo, hi = bands.envelope([v / 1e3 for v in values], None)
                    xs, ms, los, his = xs + [L], ms + [m], los + [max(lo, 0.0)], his + [hi]
            ax.plot(xs, ms, marker="o", color=colour, label=arm)
            ax.fill_between(xs, los, his, color=colour, alpha=0.15, lw=0)
            if missed:
                ax.scatter(*zip(*missed), marker="x", color=colour)
        ax.set_title(f"to {int(f * 100)}% of the gap to the teacher (held)", fontsize=9)
        ax.set_xlabel("answer length L (steps)")
        ax.set_xticks(sorted(figures) or list(LENGTHS))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("student rollout tokens, thousands\n(× a miss, at its run's tokens)")
    axes[0].legend(fontsize=7)
    for ax, L in zip(grid[1], LENGTHS):
        entry = record["lengths"].get(str(L))
        if entry is None:
            ax.set_axis_off()
            continue
        for arm, colour in ((a, c) for a, c in COLOURS.items() if a in entry["arms"]):
            runs = list(entry["arms"][arm].values())
            shared = min(map(len, runs))  # (every run evaluates on the same schedule)
            ax.plot([mean(p[i]["tokens"] for p in runs) / 1e3 for i in range(shared)],
                    [mean(p[i]["acc"] for p in runs) for i in range(shared)], color=colour, label=f"{arm} ({len(runs)})")
        for value, style, name in ((entry["teacher"], "--", "teacher"), (entry["start"], ":", "start"),
                                   (figures[L]["levels"].get(PRIMARY), "-.", "10% level")):
            if value is not None:
                ax.axhline(value, color="grey", ls=style, lw=1)
                ax.annotate(name, (0, value), fontsize=7, color="grey", va="bottom")
        ax.set_title(f"L = {L}: held-out accuracy (mean over seeds)", fontsize=9)
        ax.set_xlabel("student rollout tokens, thousands")
        ax.grid(alpha=0.3)
    grid[1][0].set_ylabel("greedy held-out accuracy")
    grid[1][0].legend(fontsize=7)
    save_figure(fig, path)


# ----------------------------------------------------------------------------------------------
# The runs

def prepare(L, args, common):
    """(student, teacher) checkpoints of L steps, each made once in --out (see the docstring)."""
    quick = QUICK_MODEL if args.quick else {}
    task = dict(common, env_ops=L)
    base = os.path.join(args.out, f"L{L}")
    student = train_once(os.path.join(base, "student"), dict(STUDENT, **task, **quick))
    teacher_sft = train_once(os.path.join(base, "teacher_sft"), dict(TEACHER, **task, **quick))
    teacher = train_once(os.path.join(base, "teacher"), dict(TEACHER_GRPO, **task, init_from=teacher_sft,
                                                            **(dict(max_iters=1, **QUICK_ARM["grpo"]) if args.quick else {})))
    return student, teacher


def measure_start(L, student, teacher, args, common):
    """The start's and the teacher's greedy held-out accuracy, read by one OPD run of no iterations
    (distill.py's way), and how many of the evaluation's problems are distinct."""
    base = T.train(dict(common, env_ops=L, algo="opd", init_from=student, teacher=teacher, max_iters=0, eval_interval=0,
                        checkpoint=False, plot=False, overwrite=True, out_dir=os.path.join(args.out, f"L{L}", "start")))
    problems = base.env.problems("heldout", args.eval_problems, seed=0)  # greedy_accuracy's problems
    start = evaluate(base, base.raw_model, args.eval_problems)
    return dict(start=start["acc"], start_figures=start, teacher=evaluate(base, base.state.teacher, args.eval_problems)["acc"],
                distinct=len({(p["start"], tuple(p["steps"])) for p in problems}), arms={})


MODELS = ("start", "teacher", "distinct")  # what an L's models measure: runs join only where these agree


def same_models(L, entry, measured, where):
    """Exit unless `measured` (a start and a teacher, measured now or in another results.json) is what
    `entry` holds for L: finished runs are kept only beside runs from the same models."""
    if any(entry[key] != measured[key] for key in MODELS):
        sys.exit(f"error: {where}: L = {L}'s models measure start {measured['start']:.3f}, teacher {measured['teacher']:.3f}, "
                 f"but its finished runs started from start {entry['start']:.3f}, teacher {entry['teacher']:.3f} (other "
                 f"models: another machine's kernels, or other settings); use another --out")


def join(record, path):
    """Another --out's finished runs (its results.json at `path`) read into `record`: a study split across
    processes or machines, each with its own --out, joined. The settings and each L's models must agree."""
    other = json.load(open(path))
    if other["settings"] != record["settings"]:
        sys.exit(f"error: {path} holds a study with {other['settings']}, not {record['settings']}; join only equal settings")
    for L, entry in other["lengths"].items():
        mine = record["lengths"].setdefault(L, dict(entry, arms={}))
        same_models(L, mine, entry, path)
        for arm, seeds in entry["arms"].items():
            for seed, points in seeds.items():
                mine["arms"].setdefault(arm, {}).setdefault(seed, points)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated answer lengths (steps)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, from the list above")
    parser.add_argument("--seeds", default="1337,1338,1339")
    parser.add_argument("--cap", type=int, default=120, help="iterations of every arm (no early stop)")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation")
    parser.add_argument("--out", default="out/dense_signal")
    parser.add_argument("--quick", action="store_true", help="tiny models and runs, for a smoke test (numbers mean nothing)")
    parser.add_argument("--report", action="store_true", help="no training: the table and the figure from --out's results.json")
    parser.add_argument("--join", default="", help="comma-separated results.json of other --out's, their finished runs read in")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    settings = dict(cap=args.cap, eval_problems=args.eval_problems, quick=args.quick)
    record = dict(settings=settings, lengths={})
    if os.path.isfile(path):  # finished runs are read, not run again
        record = json.load(open(path))
        if record["settings"] != settings and not args.report:
            sys.exit(f"error: {path} holds a study with {record['settings']}, not {settings}; use another --out")
    for other in filter(None, args.join.split(",")):
        join(record, other)
    save = lambda: save_study(args.out, "dense_signal", record, table, plot)
    if args.report:
        return save()
    common = dict(TASK, **(QUICK_KEYS if args.quick else {}))
    for L in (int(x) for x in args.lengths.split(",")):
        student, teacher = prepare(L, args, common)
        measured = measure_start(L, student, teacher, args, common)  # every time: models made again must match
        print(f"L = {L}: start {measured['start']:.3f}, teacher {measured['teacher']:.3f}, "
              f"{measured['distinct']} of {args.eval_problems} problems distinct", flush=True)
        entry = record["lengths"].setdefault(str(L), {})
        if "start" in entry:
            same_models(L, entry, measured, path)
        else:
            entry.update(measured)
        for seed in args.seeds.split(","):  # every arm of a seed, then the next seed
            for name in args.arms.split(","):
                if seed in entry["arms"].get(name, {}):
                    continue
                quick = QUICK_ARM["opd" if name == "opd" else "grpo"] if args.quick else {}
                arm = dict(ARMS[name], **common, env_ops=L, seed=int(seed), **quick,
                           **({"teacher": teacher} if name == "opd" else {}))
                points, _ = train_arm(arm, student, os.path.join(args.out, f"L{L}", f"{name}_{seed}"), schedule(args.cap),
                                      args.eval_problems, entry["start_figures"])
                entry["arms"].setdefault(name, {})[seed] = points
                save()


if __name__ == "__main__":
    main()
