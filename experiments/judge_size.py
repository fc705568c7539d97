"""
A larger judge beside the same-size one (docs/judge.md): does a judge with more parameters rank right
answers above wrong ones better? experiments/judge_agreement.py once per judge, each judge trained on the
same data (the same policy's answers, the same seeds) and measured on the same held-out answers, then
compared paired per problem:

    python experiments/judge_size.py --init_from=out/sft         # three judges, about 30 min on 2 cores
    python experiments/judge_size.py --quick --out=/tmp/judges    # a toy-size smoke test

THE RULES, fixed here before any run:
- three judges, each SFT for judge_agreement.py's 500 iterations on its data, from three starts:
    policy   the policy itself (--init_from, the ladder's SFT: 4 layers × 128), the judge of docs/judge.md
    worked   4 × 128, config/teacher.py's recipe at the policy's size (SFT from scratch on worked
             demonstrations only, 1,000 iterations)
    large    6 × 192 (2.8 M parameters against 0.85 M), config/teacher.py's recipe as it is
  The ladder has no larger model of its own recipe (pre-training, then SFT on half-bare answers), so
  the larger judge starts from the teacher's; `worked` is the same recipe at the policy's size, so
  that large − worked is the size alone and worked − policy the start's recipe alone.
- the starts are made once per --out (or read: a start with a ckpt.pt in OUT/start_<name> is kept).
- everything else is judge_agreement.py's defaults: 2,048 train problems × 2 answers of the policy as
  the data, 200 held-out problems × 4 answers, greedy and k = 1, 2, 4, 8 sampled judgements at T = 1.
- the primary comparison: large − worked, pair accuracy at k = 8 (the ranking of each problem's right
  answers above its wrong ones; the reward GRPO sees), paired per problem over the problems with a
  pair (bands.paired). The verdict: "the larger judge ranks better" where the band's low end is above
  0, "the larger judge ranks worse" where its high end is below 0, otherwise "null (within the band)".
- beside it, the same way: worked − policy and large − policy; agreement paired per problem; AUROC
  and balanced accuracy (no band) for each judge.
- one run of each judge (the data and the held-out answers are the same for all three: one policy,
  fixed seeds); the figures are of these three judges, not of judges of their size in general.

Writes judge_size.md (the table and the verdict), judge_size.png (pair accuracy against k per judge)
and results.json into --out; each judge's own study is in --out/<name>. A judge whose study has
finished (its results.json) is read, not run again.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands, options  # noqa: E402  (after the path: the script runs from anywhere)
from experiments.judge_agreement import QUICK, paired_pair_accuracy  # noqa: E402
from experiments.study import pyplot, save_figure, save_study, script_once, study_flags, train_once  # noqa: E402

TEACHER = options.parse_args([os.path.join(ROOT, "config", "teacher.py")])
STARTS = dict(worked=dict(TEACHER, n_layer=4, n_head=4, n_embd=128), large=TEACHER)
JUDGES = ("policy", "worked", "large")
COMPARISONS = (("large", "worked"), ("worked", "policy"), ("large", "policy"))  # the first is the primary
QUICK_START = dict(QUICK, algo="sft", max_iters=2, eval_interval=0)  # --quick: every start a toy SFT


def start(args, name):
    """The judge's start: the policy itself, or a start made once (the rules above)."""
    if name == "policy":
        return args.init_from
    return train_once(os.path.join(args.out, f"start_{name}"), QUICK_START if args.quick else dict(STARTS[name], eval_interval=0))


def judge_study(args, name):
    """One judge's judge_agreement.py results (run once: read when its results.json exists)."""
    out = os.path.join(args.out, name)
    finished = os.path.isfile(os.path.join(out, "results.json"))  # (then its start is not needed)
    flags = [] if finished else [f"--init_from={args.init_from}", f"--judge_init={start(args, name)}"]
    return script_once(args, "judge_agreement.py", out, flags)


def compare(studies):
    """The rules above, from {judge: judge_agreement results}."""
    last = {name: s["sampled"][-1] for name, s in studies.items()}
    rows = []
    for a, b in COMPARISONS:
        pair, pair_band, n = paired_pair_accuracy(last[a]["per_problem_pairs"], last[b]["per_problem_pairs"])
        agree, agree_band = bands.paired(last[a]["per_problem_agreement"], last[b]["per_problem_agreement"])
        rows.append(dict(a=a, b=b, pair_acc=pair, pair_acc_band=pair_band, problems=n, agreement=agree,
                         agreement_band=agree_band))
    primary = rows[0]
    if primary["pair_acc"] is None:
        verdict = "not measurable (no problem with a right and a wrong answer)"
    else:
        verdict = {1: "the larger judge ranks better", -1: "the larger judge ranks worse",
                   0: "null (within the band)"}[bands.beyond(primary["pair_acc"], primary["pair_acc_band"])]
    judges = {name: dict(judge=s["judge"], k=last[name]["k"], pair_acc=last[name]["pair_acc"],
                         agreement=last[name]["agreement"], auroc=last[name]["auroc"],
                         balanced_acc=last[name]["balanced_acc"], greedy_pair_acc=s["greedy"]["pair_acc"],
                         curve=[(p["k"], p["pair_acc"]) for p in s["sampled"]])
              for name, s in studies.items()}
    return dict(judges=judges, comparisons=rows, verdict=verdict,
                heldout=studies["policy"]["heldout"])


def table(results):
    k = results["judges"]["policy"]["k"]
    fmt = lambda x: "–" if x is None else f"{x:.3f}"
    lines = [f"| judge | pair accuracy, k = {k} | greedy | agreement, k = {k} | AUROC, k = {k} | balanced accuracy, k = {k} |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, j in results["judges"].items():
        lines.append(f"| {name} | {fmt(j['pair_acc'])} | {fmt(j['greedy_pair_acc'])} | {fmt(j['agreement'])} | "
                     f"{fmt(j['auroc'])} | {fmt(j['balanced_acc'])} |")
    lines += ["", f"| paired per problem, k = {k} | pair accuracy | problems with a pair | agreement |", "|---|---|---:|---|"]
    for c in results["comparisons"]:
        pair = "–" if c["pair_acc"] is None else bands.signed(c["pair_acc"], c["pair_acc_band"])
        lines.append(f"| {c['a']} − {c['b']} | {pair} | {c['problems']} | {bands.signed(c['agreement'], c['agreement_band'])} |")
    return "\n".join(lines + ["", f"**Verdict (large − worked, pair accuracy): {results['verdict']}.**"]) + "\n"


def plot(results, path):
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for (name, j), colour in zip(results["judges"].items(), ("#7570b3", "#1b9e77", "#d95f02")):
        ks, accs = zip(*j["curve"])
        ax.plot(ks, [float("nan") if a is None else a for a in accs], "o-", color=colour, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(0.4, 1.0)
    ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xlabel("judgements per answer, k")
    ax.set_ylabel("pair accuracy (right above wrong)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the policy, the ladder's SFT checkpoint (required unless --quick)")
    study_flags(parser, "out/judge_size", "judge_size")
    args = parser.parse_args()
    if args.quick:
        args.init_from = args.init_from or train_once(os.path.join(args.out, "sft"), QUICK_START)
    if not os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        parser.error(f"--init_from={args.init_from!r} holds no checkpoint: run the ladder's sft stage first")
    os.makedirs(args.out, exist_ok=True)
    results = compare({name: judge_study(args, name) for name in JUDGES})
    save_study(args.out, "judge_size", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
