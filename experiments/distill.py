"""
Distillation to the plateau (SPEC §3 On-policy distillation; the chapter's "online + dense signal"):
RL selects among the behaviours a student already has, distillation teaches what a teacher knows,
token by token. From one SFT student and a larger teacher, four arms, each with 128 sampled answers
per iteration and the same learning rate (1e-4, constant after 5 warm-up iterations):

    grpo         GRPO (config/grpo.py), 16 prompts × 8 answers, the verifier's reward only
    opd_full     OPD, 128 prompts × 1, exact per-token reverse KL to the teacher on the student's samples
    opd_sampled  OPD, the one-sample reverse-KL estimator (one teacher log-prob per token)
    offpolicy    off-policy distillation: the teacher answers the same 128 prompts, the student is
                 trained by cross-entropy on those answers (lab/opd_teacher_samples.py)
    opd_topk     (not a default arm) OPD with the teacher's top 16 tokens, renormalised

Each arm runs --cap iterations, or, with --min_iters M < cap, until it has plateaued: none of its
last three evaluations beats the best evaluation before them by more than the band (2 binomial
standard errors of that best accuracy at --eval_problems problems), from iteration M on. With no
early stop (M ≥ cap) every arm gets the same budget, and the same rule, read at the end, says
whether an arm was still climbing. Greedy held-out accuracy on --eval_problems problems (the same
problems at every point) is measured at iterations 2, 4, ..., 10, then every 5 to 30, every 10 to
60, every 20 after: finer early, where the curves move. Every arm runs for each of --seeds.

A level counts as reached where it holds: at the first evaluation at or above it whose next
evaluation is at or above it too (first_reaching; one noisy crossing does not count). Reported per
arm and seed: the end (the mean of the last three evaluations), whether it still climbs, the student
rollout tokens and the training wall time (rollouts + teacher + update, evaluation excluded) to
10%, 25%, 50%, 75% and 90% of the way from the student's start to the teacher; and the fair comparison with
RL: against GRPO of the same seed, the tokens each arm takes to reach GRPO's own best (the best
accuracy that GRPO run holds, best_held) over the tokens GRPO itself took to get there, and the end
accuracy minus GRPO's, paired per seed (bands.py: t·SE over 3+ seeds; 2 seeds: both values). The
evidence either way: the per-position reverse KL to the teacher on the student's own samples of
--kl_problems held-out prompts, before (the SFT student) and after each arm (its first seed), and
the share of it on each kind of token (the first token, which picks bare or worked; operands,
operators, results of the steps, the final answer, the rest).

The teacher is a one-time preparation (config/teacher.py; about 7 minutes on 2 cores):

    python train.py config/teacher.py --out_dir=out/teacher_sft
    python train.py --algo grpo --init_from=out/teacher_sft --out_dir=out/teacher --max_iters=10 --eval_interval=5

then

    python experiments/distill.py --student=out/sft --teacher=out/teacher
    python experiments/distill.py --student=out/sft --teacher=out/teacher --quick     # a tiny run (tests)
    python experiments/distill.py --out=out/distill --report     # the tables and plot again, no training

--set key=value (repeatable) passes a train.py key to every arm. Writes results.json and
distill.png (accuracy against student rollout tokens; the per-position KL) into --out.
"""

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402  (after the path: the script runs from anywhere)
import torch.nn.functional as F  # noqa: E402

from nanopost import bands  # noqa: E402
from nanopost import options  # noqa: E402
import train as T  # noqa: E402
from nanopost.distributed import chunks  # noqa: E402
from nanopost.evaluation import greedy_accuracy  # noqa: E402
from nanopost.rollouts import rollouts  # noqa: E402

ARMS = dict(
    grpo=dict(options.parse_args([os.path.join(ROOT, "config", "grpo.py")]), algo="grpo", group_size=8),  # 16 × 8 = 128
    opd_full=dict(algo="opd"),
    opd_sampled=dict(algo="opd_sampled"),
    offpolicy=dict(algo="opd_teacher_samples"),
    opd_topk=dict(algo="opd_topk"),  # not a default arm: the teacher's top 16, renormalised
)
DEFAULT_ARMS = ("grpo", "opd_full", "opd_sampled", "offpolicy")
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)  # of the way from the student's start to the teacher
QUICK = dict(cap=4, min_iters=2, eval_problems=16, kl_problems=8, seeds="1",
             set=["prompts_per_iter=4", "max_new_tokens=24", "batch_size=4", "eval_batch_size=16"])
QUICK_GRPO = dict(prompts_per_iter=2, group_size=2, eval_samples=0)


# ----------------------------------------------------------------------------------------------
# Evaluation points and the plateau rule (shared with experiments/opsd.py)

def schedule(cap):
    """Evaluation iterations: every 2 to 10, every 5 to 30, every 10 to 60, every 20 after; cap last."""
    its = list(range(2, 11, 2)) + list(range(15, 31, 5)) + list(range(40, 61, 10)) + list(range(80, cap + 1, 20))
    return [i for i in its if i < cap] + [cap]


def band(p, n):
    """Two binomial standard errors of an accuracy p measured on n problems."""
    return 2 * math.sqrt(max(p * (1 - p), 1e-12) / n)


def plateaued(points, n, min_iters):
    """No gain beyond the band over the last three evaluations: none of them beats the best before
    them by more than the band of that best; only from min_iters on."""
    accs = [p["acc"] for p in points]
    if len(accs) < 4 or points[-1]["iter"] < min_iters:
        return False
    best = max(accs[:-3])
    return max(accs[-3:]) <= best + band(best, n)


def evaluate(run, model, n):
    """Greedy held-out accuracy, worked-answer share and answer length on the first n held-out problems."""
    was_training = model.training
    model.eval()
    m = greedy_accuracy(run, model, "heldout", n)[0]
    model.train(was_training)
    return dict(acc=m["heldout_acc"], work=m["heldout_work"], len=m["heldout_len"])


def progress(out_dir, arm):
    """{iteration: (rollout tokens so far, training seconds so far)} from a run's metrics.jsonl.
    GRPO logs the mean answer length of its P × G rollouts, OPD the total; SFT samples nothing (0)."""
    tokens = seconds = 0.0
    out = {0: (0.0, 0.0)}
    for line in open(os.path.join(out_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "loss" in r:
            tokens += r.get("rollout_tokens", r.get("len_mean", 0.0) * arm.get("prompts_per_iter", 0) * arm.get("group_size", 0))
            seconds += r["iter_time"]
            out[r["iter"]] = (tokens, seconds)
    return out


def train_arm(arm, student, out_dir, its, n, start, min_iters=None):
    """Train one arm from `student`, stopping at each iteration of `its` to evaluate (the run is
    checkpointed and resumed: the learning-rate schedule is constant after warm-up, so this is one
    uninterrupted run), until the plateau rule holds (min_iters=None: never) or its last entry.
    Returns (points, run): points = [{iter, acc, work, len, tokens, seconds}], iteration 0 = start."""
    points, done, run = [dict(start, iter=0, tokens=0.0, seconds=0.0)], 0, None
    for it in its:
        run = T.train(dict(arm, init_from=student if done == 0 else "resume", out_dir=out_dir, max_iters=it,
                           eval_interval=0, checkpoint=True, plot=False, lr_decay_iters=its[-1],
                           **({"overwrite": True} if done == 0 else {})))  # (a rerun replaces the arm)
        cfg = options.make_config(dict(arm, init_from=student))
        tokens, seconds = progress(out_dir, cfg)[it]
        points.append(dict(evaluate(run, run.raw_model, n), iter=it, tokens=tokens, seconds=seconds))
        print(f"[{os.path.basename(out_dir)}] iter {it}: held-out {points[-1]['acc']:.3f}, "
              f"work {points[-1]['work']:.2f}, rollout tokens {tokens:,.0f}", flush=True)
        done = it
        if min_iters is not None and plateaued(points, n, min_iters):
            break
    return points, run


def first_reaching(points, target):
    """Where a level is reached and holds: the first evaluation at or above target whose next
    evaluation is at or above it too (one noisy crossing does not count; the last evaluation, with
    nothing after it to confirm it, does not either). dict(iter, tokens, seconds) there, or None."""
    return next(({k: p[k] for k in ("iter", "tokens", "seconds")} for p, after in zip(points, points[1:])
                 if p["acc"] >= target and after["acc"] >= target), None)


def best_held(points):
    """The highest accuracy a run holds for two evaluations in a row: max over i of min(acc_i, acc_i+1)."""
    return max(min(p["acc"], after["acc"]) for p, after in zip(points, points[1:]))


# ----------------------------------------------------------------------------------------------
# Evidence: where the reverse KL to the teacher sits in the student's answers

ROLES = ("first", "operand", "operator", "result", "answer", "other")


def char_roles(text):
    """The role of each character of an arithmetic answer: operand / operator / result digits of a
    written step ("7+9=16."), the final answer's digits, everything else (format, spaces, the words)."""
    roles, after_answer, in_result = [], False, False
    for i, ch in enumerate(text):
        if text.startswith("Answer:", i):
            after_answer = True
        if after_answer:
            roles.append("answer" if ch.isdigit() or ch == "-" and text[i + 1:i + 2].isdigit() else "other")
            continue
        if ch == "=":
            in_result = True
            roles.append("operator")
        elif ch in "+-":
            roles.append("operator")
        elif ch.isdigit():
            roles.append("result" if in_result else "operand")
        else:
            in_result = False
            roles.append("other")
    return roles


@torch.no_grad()
def kl_profile(run, student, teacher, n, max_positions=48):
    """Reverse KL(π_s‖π_t) at τ = 1 on the student's own samples of n held-out prompts (both read the
    same prompt): the mean KL at each answer position (and its token count), and per token role
    (ROLES; the first answer token is its own role) the share of the summed KL and the mean KL."""
    problems = run.env.problems("heldout", n, seed=3)
    ro = rollouts(run, student, problems, 1, temperature=1.0, seed=5)
    ids, mask = ro.ids, ro.mask
    kl = torch.zeros_like(mask)
    for rows in chunks(range(len(ids)), run.cfg["eval_batch_size"]):
        s = F.log_softmax(student(ids[rows.start:rows.stop, :-1]).float(), dim=-1)
        t = F.log_softmax(teacher(ids[rows.start:rows.stop, :-1]).float(), dim=-1)
        kl[rows.start:rows.stop] = (s.exp() * (s - t)).sum(-1) * mask[rows.start:rows.stop]
    by_position = [[0.0, 0] for _ in range(max_positions)]
    by_role = {r: [0.0, 0] for r in ROLES}
    for i, response in enumerate(ro.responses):
        values = kl[i][mask[i] > 0].tolist()
        offsets, text = [], ""
        for token in response:  # each token's first character, for its role
            offsets.append(len(text))
            text += run.tok.decode([token]) if token != run.tok.eos else ""
        roles = char_roles(text) + ["other"]
        for pos, (value, offset) in enumerate(zip(values, offsets)):
            role = "first" if pos == 0 else roles[min(offset, len(roles) - 1)]
            by_role[role][0] += value
            by_role[role][1] += 1
            if pos < max_positions:
                by_position[pos][0] += value
                by_position[pos][1] += 1
    total = sum(v for v, _ in by_role.values()) or 1.0
    return dict(mean_kl_per_token=total / max(float(mask.sum()), 1.0),
                by_position=[(v / c if c else None, c) for v, c in by_position],
                by_role={r: dict(share=v / total, mean=v / c if c else None, tokens=c) for r, (v, c) in by_role.items()})


# ----------------------------------------------------------------------------------------------
# The study

def end_accuracy(points):
    """A run's end: the mean of its last three evaluations."""
    last = points[-3:]
    return sum(p["acc"] for p in last) / len(last)


def summarise(points, start, teacher, n):
    """One seed's curve: its end (mean of the last three evaluations), whether it still climbs there
    (the plateau rule, from any iteration), its best held accuracy, and where it reaches and holds
    10 / 25 / 50 / 75 / 90% of the way from start to teacher."""
    return dict(end=end_accuracy(points), climbing=not plateaued(points, n, 0), best_held=best_held(points),
                work=points[-1]["work"],
                milestones={f"{f:.2f}": first_reaching(points, start + f * (teacher - start)) for f in FRACTIONS})


def efficiency(results):
    """The fair comparison with RL, per arm and seed against GRPO of the same seed (the same problems
    at every evaluation, the same sampled answers per iteration): the level is GRPO's own best (the
    best accuracy that seed of GRPO holds, best_held); the tokens and training seconds the arm took to
    reach and hold it, and their ratio to what GRPO itself took (None where the arm never holds it);
    and the arm's end accuracy minus GRPO's."""
    if "grpo" not in results:
        return {}
    grpo = {s["seed"]: s["points"] for s in results["grpo"]}
    out = {}
    for name, seeds in results.items():
        rows = []
        for s in (s for s in seeds if s["seed"] in grpo):
            level = best_held(grpo[s["seed"]])
            own, got = first_reaching(grpo[s["seed"]], level), first_reaching(s["points"], level)
            rows.append(dict(seed=s["seed"], level=level, reached=got, grpo_reached=own,
                             # (none where GRPO's best is its start: reached at iteration 0 by every arm)
                             token_ratio=got["tokens"] / own["tokens"] if got and own["tokens"] else None,
                             seconds_ratio=got["seconds"] / own["seconds"] if got and own["seconds"] else None,
                             end_gap=end_accuracy(s["points"]) - end_accuracy(grpo[s["seed"]])))
        out[name] = rows
    return out


def over_seeds(values, digits=2, n=None):
    """'mean ± band' (3+ seeds), both values (2), or 'never in k of K seeds' where a seed has None."""
    missing = sum(v is None for v in values)
    if missing:
        return f"never in {missing} of {len(values)} seeds"
    return bands.cell(values, n, digits)


def print_tables(results, start, teacher, n):
    print(f"\nheld-out accuracy: student {start:.3f}, teacher {teacher:.3f}; targets "
          + ", ".join(f"{int(f * 100)}% {start + f * (teacher - start):.3f}" for f in FRACTIONS))
    print(f"\n{'arm':<12} {'seed':>4} {'end':>6} {'climbing':>8} {'held':>6} {'work':>5} "
          + " ".join(f"{f'to {int(f * 100)}%: it / tokens / s':>28}" for f in FRACTIONS))
    for name, seeds in results.items():
        for s in seeds:
            m = s["summary"]
            cells = [f"{r['iter']} / {r['tokens']:,.0f} / {r['seconds']:.0f}" if r else "never"
                     for r in m["milestones"].values()]
            print(f"{name:<12} {s['seed']:>4} {m['end']:>6.3f} {'yes' if m['climbing'] else 'no':>8} "
                  f"{m['best_held']:>6.3f} {m['work']:>5.2f} " + " ".join(f"{c:>28}" for c in cells))
    print("\nacross seeds (end = mean of the last three evaluations; a level counts where it holds for two evaluations)")
    for name, seeds in results.items():
        tokens = [[s["summary"]["milestones"][f"{f:.2f}"] for s in seeds] for f in FRACTIONS]
        print(f"{name:<12} end {over_seeds([s['summary']['end'] for s in seeds], 3, n)}; tokens to "
              + "; ".join(f"{int(f * 100)}%: {over_seeds([r and r['tokens'] for r in t], 0)}" for f, t in zip(FRACTIONS, tokens)))
    fair = efficiency(results)
    if fair:
        print("\nagainst GRPO of the same seed: its own best (held), the tokens to it, and the end accuracy")
        for name, rows in fair.items():
            cells = [f"{r['seed']}: GRPO held nothing above its start ({r['level']:.3f})" if r["grpo_reached"]["iter"] == 0
                     else f"{r['seed']}: {r['level']:.3f} at {r['reached']['tokens']:,.0f} tokens" if r["reached"]
                     else f"{r['seed']}: {r['level']:.3f} never" for r in rows]
            improved = [r for r in rows if r["grpo_reached"]["iter"] > 0]
            ratios = (f"× GRPO's tokens {over_seeds([r['token_ratio'] for r in improved])}, × its seconds "
                      f"{over_seeds([r['seconds_ratio'] for r in improved])}; " if improved else "")
            gap = bands.paired_across_seeds([r["end_gap"] for r in rows], None)  # (no per-problem results kept)
            gap = f"{gap[0]:+.3f} ± {gap[1]:.3f}" if gap[1] is not None else ", ".join(f"{r['end_gap']:+.3f}" for r in rows)
            print(f"{name:<12} {'; '.join(cells)}; {ratios}end − GRPO {gap}")


def print_profiles(profiles):
    print("\nreverse KL to the teacher on the student's samples: mean per token, and share per token role")
    print(f"{'model':<12} {'KL/token':>8} " + " ".join(f"{r:>9}" for r in ROLES))
    for name, p in profiles.items():
        print(f"{name:<12} {p['mean_kl_per_token']:>8.3f} " + " ".join(f"{p['by_role'][r]['share']:>9.2f}" for r in ROLES))


COLOURS = dict(grpo="tab:red", opd_full="tab:blue", opd_sampled="tab:cyan", offpolicy="tab:green", opd_topk="tab:purple")


def plot(results, start, teacher, profiles, n, path):
    """Left: held-out accuracy against sampled tokens, one line per arm (the seeds' mean, the band
    shaded), the teacher, 10 / 25 / 50 / 75 / 90% of the way to it, and GRPO's own best. Right: the per-position
    reverse KL to the teacher before and after each arm (its first seed)."""
    from experiments.study import band_line, pyplot, save_figure
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(13, 4.8))
    for name, seeds in results.items():
        band_line(left, [[(p["tokens"] / 1e3, p["acc"]) for p in s["points"]] for s in seeds], COLOURS.get(name),
                  f"{name} ({len(seeds)} seed{'s' * (len(seeds) > 1)})", n, top=1.0, marker=".")
    for f in FRACTIONS:
        left.axhline(start + f * (teacher - start), color="grey", linestyle=":", linewidth=0.8)
    left.axhline(teacher, color="black", linewidth=0.8, label=f"teacher {teacher:.3f}")
    if "grpo" in results:
        best = sum(s["summary"]["best_held"] for s in results["grpo"]) / len(results["grpo"])
        left.axhline(best, color=COLOURS["grpo"], linestyle="--", linewidth=0.8, label=f"GRPO's best (held) {best:.3f}")
    left.set_ylim(0, 1)
    left.set_xlim(left=0)
    left.set_xlabel("sampled tokens, thousands (offpolicy: the teacher's; the others: the student's)")
    left.set_ylabel("held-out accuracy (greedy)")
    left.set_title("seed mean, band shaded; dotted: 10 / 25 / 50 / 75 / 90% of the way to the teacher", fontsize=9)
    left.legend(fontsize=7, loc="lower right")
    for name, p in profiles.items():
        xs = [i for i, (v, c) in enumerate(p["by_position"]) if v is not None and c >= 5]
        right.plot(xs, [p["by_position"][i][0] for i in xs], marker=".", label=name, color=COLOURS.get(name, "black"))
    right.set_ylim(bottom=0)
    right.set_xlabel("answer position (token)")
    right.set_ylabel("reverse KL(student ‖ teacher), mean")
    right.set_title("per-position KL on the student's own samples (first seed)", fontsize=9)
    right.legend(fontsize=7)
    save_figure(fig, path)


def study_parser(doc, arms, out):
    """The options both studies share: the student, the arms, the evaluation size, --out, --quick, --set."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", default="out/sft", help="the SFT checkpoint every arm starts from")
    parser.add_argument("--arms", default=",".join(arms), help="comma-separated, from the list above")
    parser.add_argument("--eval_problems", type=int, default=500, help="held-out problems per evaluation")
    parser.add_argument("--out", default=out)
    parser.add_argument("--quick", action="store_true", help="a tiny run of every step (the tests)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every arm")
    return parser


def parse_study(parser, argv, quick):
    """Parsed arguments, --quick's tiny values applied (its --set keys after the user's)."""
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in quick.items():
            setattr(args, key, args.set + value if key == "set" else value)
    return args


def require_checkpoint(what, path, make):
    if not os.path.isfile(os.path.join(path, "ckpt.pt")):
        sys.exit(f"error: no {what} checkpoint at {path}/ckpt.pt; make it once with: {make}")


def parse(argv=None):
    parser = study_parser(__doc__, DEFAULT_ARMS, "out/distill")
    parser.add_argument("--teacher", default="out/teacher", help="the teacher checkpoint (see above to make it)")
    parser.add_argument("--seeds", default="1337,1338,1339", help="comma-separated training seeds")
    parser.add_argument("--cap", type=int, default=120, help="iterations at most per arm")
    parser.add_argument("--min_iters", type=int, default=60, help="no plateau stop before this iteration (its last three "
                        "evaluations are then 10 or more iterations apart: a slow climb can show)")
    parser.add_argument("--kl_problems", type=int, default=200, help="held-out prompts for the KL profiles")
    parser.add_argument("--report", action="store_true", help="no training: the tables and the plot again from "
                        "--out's results.json (the summaries recomputed with this file's rules)")
    args = parse_study(parser, argv, QUICK)
    if args.report:
        return args
    require_checkpoint("student", args.student, f"python train.py --algo sft --out_dir={args.student}")
    require_checkpoint("teacher", args.teacher, f"python train.py config/teacher.py --out_dir={args.teacher}_sft && "
                       f"python train.py --algo grpo --init_from={args.teacher}_sft --out_dir={args.teacher} "
                       f"--max_iters=10 --eval_interval=5")
    return args


def report(out, record):
    """results.json, the plot and the tables of the runs so far (a study stopped early keeps what finished)."""
    results, start, teacher = {n: r for n, r in record["arms"].items() if r}, record["student"]["acc"], record["teacher"]["acc"]
    n = record["args"]["eval_problems"]
    for seeds in results.values():
        for s in seeds:
            s["summary"] = summarise(s["points"], start, teacher, n)
    record["efficiency"] = efficiency(results)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(record, f, indent=1)
    plot(results, start, teacher, record["kl_profiles"], n, os.path.join(out, "distill.png"))
    print_tables(results, start, teacher, n)


def main(argv=None):
    args = parse(argv)
    if args.report:
        record = json.load(open(os.path.join(args.out, "results.json")))
        report(args.out, record)
        print_profiles(record["kl_profiles"])
        return
    common = options.parse_args([f"--{kv}" for kv in args.set])
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    # one run holds the student (raw_model) and the teacher: both evaluated the way every arm is
    base = T.train(dict(common, algo="opd", init_from=args.student, teacher=args.teacher, max_iters=0, eval_interval=0,
                        checkpoint=False, plot=False, out_dir=os.path.join(args.out, "start")))
    start = evaluate(base, base.raw_model, args.eval_problems)
    teacher_eval = evaluate(base, base.state.teacher, args.eval_problems)
    print(f"student {start['acc']:.3f} (work {start['work']:.2f}), teacher {teacher_eval['acc']:.3f}", flush=True)
    profiles = {"student": kl_profile(base, base.raw_model, base.state.teacher, args.kl_problems)}
    results = {name: [] for name in args.arms.split(",")}
    for k, seed in enumerate(int(s) for s in args.seeds.split(",")):  # every arm of a seed, then the next seed
        for name in results:
            arm = ARMS[name] | common | (QUICK_GRPO if args.quick and name == "grpo" else {})
            if arm["algo"].startswith("opd"):  # opd and its lab variants read the teacher
                arm["teacher"] = args.teacher
            points, run = train_arm(dict(arm, seed=seed), args.student, os.path.join(args.out, f"{name}_{seed}"),
                                    schedule(args.cap), args.eval_problems, start, args.min_iters)
            results[name].append(dict(seed=seed, points=points))
            if k == 0:
                profiles[name] = kl_profile(base, run.raw_model.eval(), base.state.teacher, args.kl_problems)
            report(args.out, dict(args=vars(args), student=start, teacher=teacher_eval, arms=results,
                                  kl_profiles=profiles, wall_seconds=time.time() - t0))
    print_profiles(profiles)
    print(f"\nresults.json and distill.png in {args.out} ({time.time() - t0:.0f} s)")

if __name__ == "__main__":
    main()
