"""
A generative reward model against the verifier and the Bradley–Terry RM [Ch7 "The evolution of reward
paradigms": a judge that writes its reasoning then its verdict, better with more judgements sampled
at inference]; SPEC §3 "Reward model". The judge, its judgements and its reward: judge.py.

    1. data     --answers answers to each of --train_problems train problems, sampled at T = 1 by the
                policy (--init_from), each labelled by the verifier; each row's judgement made by
                judge.py's rule (re-derive each step, mark the written ones, the verifier's verdict),
                written to OUT/judge_data.jsonl
    2. judge    SFT on those rows (train.py --algo sft --data=OUT/judge_data.jsonl) from --judge_init
                (default: the policy itself) for --judge_iters iterations, into OUT/judge
                (--judge=DIR: a trained judge instead of steps 1 and 2)
    3. measure  --heldout_answers answers to each of --heldout_problems held-out problems, sampled the
                same way and labelled by the verifier; the judge's greedy judgement of each, and
                --samples judgements sampled at --temperature. For k = 1, 2, 4, ..., --samples, the
                reward r = the mean of k verdict probabilities, over the disjoint blocks of k of each
                answer's samples (every k uses the same judgements), and:
                  agreement       the share of answers where r > 0.5 agrees with the verifier
                  pair accuracy   over each problem's (correct, incorrect) answer pairs, the share the
                                  reward ranks right (a tie counts 1/2), a problem's pairs averaged
                                  first: the Bradley–Terry RM's figure, on the same pairs
                  AUROC           over every (correct, incorrect) pair of answers, any problems: the share
                                  the reward ranks right (a tie 1/2); free of the 0.5 threshold
                  balanced acc.   the mean of the verdict's accuracy on the correct answers and on the
                                  incorrect ones at r > 0.5: 0.5 for a judge that always gives one
                                  verdict, whatever the base rate (agreement counts that base rate)
                --reward_model=DIR scores the same pairs with that RM (rollouts.score_rollout), and
                its own held-out pair accuracy is read from its metrics.jsonl.

Bands (bands.py): agreement and pair accuracy binomial over the problems (a problem's answers are not
independent, so not over the answers: a wider band); k against k = 1, and the judge against the RM,
paired per problem. Beside agreement: the share of the majority label (what a judge that always says
the more common verdict would agree). It writes results.json, judge.md (the table, and a few of the
judge's judgements) and the plot into --out.

    python experiments/judge_agreement.py --init_from=out/sft                          # the ladder's SFT stage as the policy
    python experiments/judge_agreement.py --init_from=out/sft --reward_model=out/rm    # beside the ladder's Bradley–Terry RM
    python experiments/judge_agreement.py --init_from=out/sft --judge=out/judge_study/judge --samples=16
    python experiments/judge_agreement.py --quick --out=/tmp/judge                     # a toy-size smoke test

Then train with it: python train.py --algo grpo --init_from=out/sft --reward=judge
--judge=out/judge_study/judge --judge_samples=4. --set key=value (repeatable) passes a train.py key to every run.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402  (after the path: the script runs from anywhere)

from nanopost import bands  # noqa: E402
from nanopost.checkpoints import frozen, load_model  # noqa: E402
from nanopost.judge import judge_rows, judge_scores, judge_text  # noqa: E402
from model import ScalarHeadGPT  # noqa: E402
from nanopost.rollouts import rollouts, score_rollout  # noqa: E402
from experiments.study import (last_logged, pyplot, run, save_figure, save_study, set_keys,  # noqa: E402
                               study_flags, train_once)

# --quick: a model and batches small enough that the whole pipeline runs in seconds
QUICK = dict(n_layer=1, n_head=2, n_embd=32, batch_size=4, eval_batch_size=16, max_new_tokens=16, train_problems=64,
             val_examples=8, prompts_per_iter=2, group_size=2, device="cpu", plot=False)
EXAMPLES = 4  # judgements shown in judge.md


def policy_run(args, common):
    """A run holding the policy (--init_from) with nothing trained: its env, tokenizer, device and model."""
    return run(dict(common, algo="grpo", init_from=args.init_from, max_iters=0, eval_interval=0, overwrite=True,
                    out_dir=os.path.join(args.out, "policy")))


def answers(r, split, n_problems, per_problem, seed):
    """per_problem answers sampled at T = 1 by the run's policy to each of n_problems problems of `split`:
    a Rollout (texts, verified: the verifier's 0/1, ids and mask for a reward model)."""
    problems = r.env.problems(split, n_problems, seed=seed)
    return rollouts(r, r.raw_model, problems, per_problem, temperature=1.0, seed=seed,
                    batch_size=r.cfg["eval_batch_size"])


def train_judge(args, common, r):
    """Steps 1 and 2: the judge's rows from the policy's answers, and the judge trained on them -> its dir."""
    roll = answers(r, "train", args.train_problems, args.answers, seed=1)
    data = judge_rows(r, roll.problems, roll.texts)
    path = os.path.join(args.out, "judge_data.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in data)
    out = os.path.join(args.out, "judge")
    run(dict(common, algo="sft", data=path, init_from=args.judge_init or args.init_from, max_iters=args.judge_iters,
             eval_interval=args.judge_iters, learning_rate=args.judge_lr, min_lr=args.judge_lr / 10,
             warmup_iters=min(10, args.judge_iters), checkpoint=True, overwrite=True, out_dir=out))
    return out, dict(rows=len(data), correct_share=sum(row["label"] for row in data) / len(data))


def pair_scores(labels, scores):
    """Per problem, the share of its (correct, incorrect) answer pairs that `scores` ranks right, a tie
    1/2, averaged over the score's columns (blocks): labels (P, A) 0/1, scores (P, A, B). -> a list with
    None for a problem without a pair."""
    out = []
    for label, score in zip(labels, scores):
        right, wrong = score[label > 0], score[label == 0]  # (a, B), (b, B)
        if not len(right) or not len(wrong):
            out.append(None)
            continue
        diff = right[:, None, :] - wrong[None, :, :]  # every pair, every block
        out.append(float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean()))
    return out


def measure(p, labels, problems):
    """The figures of one setting from its verdict probabilities p (N, B): B rewards per answer (a block
    each), labels (N,) the verifier's 0/1, N = problems × answers in problem-major order."""
    N, B = p.shape
    agree = ((p > 0.5).float() == labels[:, None]).float().mean(1).view(problems, -1).mean(1)  # per problem
    pairs = pair_scores(labels.view(problems, -1), p.view(problems, N // problems, B))
    paired = [x for x in pairs if x is not None]
    right, wrong = p[labels > 0], p[labels == 0]
    auroc, balanced = threshold_free(p, labels)
    agreement = float(agree.mean())
    pair_acc = sum(paired) / len(paired) if paired else None  # (no problem with a correct and an incorrect answer)
    return dict(agreement=agreement, agreement_band=bands.binomial(agreement, problems), pair_acc=pair_acc,
                pair_acc_band=bands.binomial(pair_acc, len(paired)) if paired else None, pair_problems=len(paired),
                reward_correct=float(right.mean()) if len(right) else None,
                reward_incorrect=float(wrong.mean()) if len(wrong) else None, auroc=auroc, balanced_acc=balanced,
                per_problem_agreement=agree.tolist(), per_problem_pairs=pairs)


def threshold_free(p, labels):
    """(AUROC, balanced accuracy) of verdict probabilities p (N, B) against the verifier's labels (N,), each
    the mean over the B blocks: AUROC over every (correct, incorrect) pair of answers, a tie 1/2; balanced
    accuracy (share of the correct answers with p > 0.5 + share of the incorrect with p ≤ 0.5) / 2. None
    without both kinds of answer."""
    right, wrong = p[labels > 0], p[labels == 0]
    if not len(right) or not len(wrong):
        return None, None
    diff = right[:, None, :] - wrong[None, :, :]
    auroc = float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())
    return auroc, float(((right > 0.5).float().mean() + (wrong <= 0.5).float().mean()) / 2)


def scaling(p_sampled, labels, problems):
    """For k = 1, 2, 4, ... up to the samples (a power of two): the reward of each disjoint block of k
    judgements (the mean of their verdict probabilities) measured (measure), and the paired change of
    agreement from k = 1 (bands.paired over the problems)."""
    N, K = p_sampled.shape
    points, k = [], 1
    while k <= K:
        blocks = p_sampled[:, :(K // k) * k].reshape(N, K // k, k).mean(2)  # r = (1/k) Σ_i P(correct | j_i)
        point = dict(k=k, **measure(blocks, labels, problems))
        gain, band = bands.paired(point["per_problem_agreement"], points[0]["per_problem_agreement"] if points
                                  else point["per_problem_agreement"])
        point.update(gain_vs_1=gain, gain_vs_1_band=band)
        points.append(point)
        k *= 2
    return points


def reward_model_pairs(r, path, roll, problems):
    """The Bradley–Terry RM's pair accuracy on the same held-out pairs (its score at each answer's last
    token), and its own held-out pair accuracy from its run's metrics.jsonl (None when it has none)."""
    rm = frozen(load_model(path)).to(r.device)
    if not isinstance(rm, ScalarHeadGPT):
        raise ValueError(f"--reward_model={path}: a language-model checkpoint, not a reward model (train one with "
                         f"--algo rm)")
    scores = score_rollout(r, rm, roll)
    labels = roll.verified
    pairs = pair_scores(labels.view(problems, -1), scores.view(problems, -1, 1))
    paired = [x for x in pairs if x is not None]
    acc = sum(paired) / len(paired) if paired else None
    return dict(path=path, pair_acc=acc, pair_acc_band=bands.binomial(acc, len(paired)) if paired else None,
                per_problem_pairs=pairs, own_val_pair_acc=last_logged(path, "val_pair_acc"))


def paired_pair_accuracy(a, b):
    """(mean, band, problems) of pair accuracy a − b, two scorers' per-problem figures (pair_scores') paired
    over the problems where both have a pair; (None, None, 0) where none has."""
    both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if not both:
        return None, None, 0
    return (*bands.paired([x for x, _ in both], [y for _, y in both]), len(both))


def table(results):
    held = results["heldout"]
    lines = [f"Judge `{results['judge']}`" + (f", trained on {results['data']['rows']} rows (share correct "
                                              f"{results['data']['correct_share']:.3f})" if results["data"] else "")
             + f". Held out: {held['problems']} problems × {held['answers']} answers sampled by `{results['init_from']}` "
             f"at T = 1, share correct {held['correct_share']:.3f} (a judge that always gives the majority verdict "
             f"agrees {held['majority']:.3f}); {held['pair_problems']} problems have a (correct, incorrect) pair. "
             "Bands 95% (bands.py): binomial over the problems; changes paired per problem.", "",
             "| judgements | agreement with the verifier | change from k = 1 | pair accuracy | AUROC | balanced accuracy "
             "| mean reward, correct answers | mean reward, incorrect answers | verdict written |", "|---" * 9 + "|"]
    fmt = lambda x: "–" if x is None else f"{x:.3f}"
    rows = [("greedy", results["greedy"])] + [(f"k = {p['k']} sampled", p) for p in results["sampled"]]
    for name, p in rows:
        change = "" if "gain_vs_1" not in p or p["k"] == 1 else f"{p['gain_vs_1']:+.3f} ± {p['gain_vs_1_band']:.3f}"
        band = "" if p["pair_acc_band"] is None else f" ± {p['pair_acc_band']:.3f}"
        lines.append(f"| {name} | {p['agreement']:.3f} ± {p['agreement_band']:.3f} | {change} | {fmt(p['pair_acc'])}"
                     f"{band} | {fmt(p['auroc'])} | {fmt(p['balanced_acc'])} | {fmt(p['reward_correct'])} | "
                     f"{fmt(p['reward_incorrect'])} | {p['verdict_written']:.3f} |")
    rm = results.get("reward_model")
    if rm:
        own = "" if rm["own_val_pair_acc"] is None else f"; on its own held-out pairs {rm['own_val_pair_acc']:.3f}"
        band = "" if rm["pair_acc_band"] is None else f" ± {rm['pair_acc_band']:.3f}"
        lines += ["", f"Bradley–Terry RM `{rm['path']}`: pair accuracy on the same pairs {fmt(rm['pair_acc'])}{band}{own}."]
        if rm["judge_minus_rm"] is not None:
            lines.append(f"The judge at k = {results['sampled'][-1]['k']} minus the RM, paired per problem: "
                         f"{rm['judge_minus_rm']:+.3f} ± {rm['judge_minus_rm_band']:.3f}.")
    lines += ["", "### A few greedy judgements", ""]
    for e in results["examples"]:
        lines.append(f"- {e['prompt']} answered {e['answer']!r} (the verifier: {e['label']:.0f}); the judge wrote "
                     f"{e['judgement']!r}")
    return "\n".join(lines) + "\n"


def plot(results, path):
    sampled, greedy, rm = results["sampled"], results["greedy"], results.get("reward_model")
    ks = [p["k"] for p in sampled]
    fig, axes = pyplot().subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in zip(axes, ("agreement", "pair_acc"), ("agreement with the verifier", "pair accuracy")):
        if greedy[key] is None:  # (pair accuracy: no problem with a correct and an incorrect answer)
            ax.set_title(f"{title}: no pairs", fontsize=10)
            continue
        y = [p[key] for p in sampled]
        half = [p[f"{key}_band"] or 0.0 for p in sampled]
        ax.plot(ks, y, "o-", color="#1b9e77", label="judge, mean of k sampled judgements")
        ax.fill_between(ks, [a - h for a, h in zip(y, half)], [a + h for a, h in zip(y, half)], color="#1b9e77",
                        alpha=0.2, lw=0)
        ax.axhline(greedy[key], color="#1b9e77", ls="--", lw=1, label="judge, greedy judgement")
        if key == "agreement":
            ax.axhline(results["heldout"]["majority"], color="grey", ls=":", lw=1, label="always the majority verdict")
        elif rm and rm["pair_acc"] is not None:
            ax.axhline(rm["pair_acc"], color="#d95f02", lw=1.5, label="Bradley–Terry RM, same pairs")
            if rm["pair_acc_band"]:
                ax.axhspan(rm["pair_acc"] - rm["pair_acc_band"], rm["pair_acc"] + rm["pair_acc_band"], color="#d95f02",
                           alpha=0.1, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("judgements per answer, k")
        ax.set_title(title + " (band 95%)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from", default="", help="the policy whose answers are judged, an SFT checkpoint (required)")
    parser.add_argument("--judge", default="", help="a trained judge (default: make the data and train one)")
    parser.add_argument("--judge_init", default="", help="where the judge's SFT starts (default: --init_from)")
    parser.add_argument("--train_problems", type=int, default=2048, help="train problems of the judge's data")
    parser.add_argument("--answers", type=int, default=2, help="the policy's answers to each train problem")
    parser.add_argument("--judge_iters", type=int, default=500, help="the judge's SFT iterations")
    parser.add_argument("--judge_lr", type=float, default=1e-3, help="the judge's SFT learning rate (cosine to a tenth)")
    parser.add_argument("--heldout_problems", type=int, default=200, help="held-out problems of the measurement")
    parser.add_argument("--heldout_answers", type=int, default=4, help="the policy's answers to each held-out problem")
    parser.add_argument("--samples", type=int, default=8, help="judgements sampled per answer, the largest k (a power of two)")
    parser.add_argument("--temperature", type=float, default=1.0, help="the temperature of sampled judgements")
    parser.add_argument("--reward_model", default="", help="a Bradley–Terry RM checkpoint to score the same pairs")
    study_flags(parser, "out/judge_study", "judge")
    args = parser.parse_args()
    if args.quick:
        args.train_problems, args.answers, args.judge_iters, args.heldout_problems = 8, 2, 2, 4
        args.heldout_answers, args.samples = 4, 4
        args.init_from = args.init_from or train_once(os.path.join(args.out, "sft"),
                                                      dict(QUICK, algo="sft", max_iters=2, eval_interval=0))
    if args.samples < 1 or args.samples & (args.samples - 1):
        parser.error(f"--samples={args.samples}: a power of two (every k's blocks share the judgements)")
    if args.heldout_answers < 2:
        parser.error("--heldout_answers: at least 2 (pairs are made of one problem's answers)")
    for flag, path in (("init_from", args.init_from), ("judge", args.judge), ("reward_model", args.reward_model)):
        if (path or flag == "init_from") and not os.path.isfile(os.path.join(path, "ckpt.pt")):
            parser.error(f"--{flag}={path!r} holds no checkpoint" + (": run the ladder's sft stage first"
                                                                    if flag == "init_from" else ""))
    common = {**(QUICK if args.quick else {}), "log_interval": 1, "checkpoint": False, **set_keys(args)}
    os.makedirs(args.out, exist_ok=True)

    r = policy_run(args, common)
    judge_dir, data = (args.judge, None) if args.judge else train_judge(args, common, r)
    judge = frozen(load_model(judge_dir)).to(r.device)
    roll = answers(r, "heldout", args.heldout_problems, args.heldout_answers, seed=2)
    labels, P = roll.verified.float(), args.heldout_problems
    greedy, greedy_wrote = judge_scores(r, judge, roll.problems, roll.texts, samples=0)
    sampled, sampled_wrote = judge_scores(r, judge, roll.problems, roll.texts, samples=args.samples,
                                          temperature=args.temperature, seed=3)
    share = float(labels.mean())
    results = dict(init_from=args.init_from, judge=judge_dir, data=data, temperature=args.temperature,
                   heldout=dict(problems=P, answers=args.heldout_answers, correct_share=share,
                                majority=max(share, 1 - share)),
                   greedy=dict(measure(greedy, labels, P), verdict_written=float(greedy_wrote.float().mean())),
                   sampled=[dict(p, verdict_written=float(sampled_wrote.float().mean()))
                            for p in scaling(sampled, labels, P)])
    results["heldout"]["pair_problems"] = results["greedy"]["pair_problems"]
    if args.reward_model:
        rm = reward_model_pairs(r, args.reward_model, roll, P)
        rm["judge_minus_rm"], rm["judge_minus_rm_band"], _ = paired_pair_accuracy(
            results["sampled"][-1]["per_problem_pairs"], rm["per_problem_pairs"])
        results["reward_model"] = rm
    with torch.no_grad(), r.autocast:
        results["examples"] = [dict(prompt=p["prompt"], answer=text, label=float(label),
                                    judgement=judge_text(r.tok, judge, p, text, temperature=0.0)[0])
                               for p, text, label in list(zip(roll.problems, roll.texts, labels.tolist()))
                               [::args.heldout_answers][:EXAMPLES]]  # the first answer to each of the first problems
    save_study(args.out, "judge", results, table, plot, args.plot)


if __name__ == "__main__":
    main()
