"""
Policy evaluation: the one evaluation behind every algorithm's figures, the ladder's and the
experiments'. Greedy answers to `problems` held-out and `ood_problems` OOD problems (accuracy,
length in tokens, the share that shows its work; in a run the held-out answers go to answers.jsonl,
for report.py); then `samples` answers to each of `sampled_problems` held-out problems at
`temperature`, one rollout that gives their accuracy and length, pass@samples (Best-of-samples by
the verifier: right when any sample is) and, given a reference model, the KL to it. And the plot
of a run's metrics.
"""

import json
import os

import torch

from nanopost.distributed import all_reduce_sum, chunks, lockstep_count
from model import sequence_logprobs
from nanopost.run_dir import write_out
from nanopost.rollouts import rollouts


def greedy_accuracy(run, model, split, n):
    """{split}_acc, {split}_len, {split}_work of greedy answers to n problems of `split` (the first
    seeded n, or the whole split once where it holds fewer: a census, envs/generalpoints.py and
    envs/treasure.py; spread over ranks, counts summed), transcripts of the first few, and this rank's answers
    ({prompt, answer, response, verdict}: answers.jsonl, report.py's before and after)."""
    if split not in getattr(run.env, "splits", ("train", "heldout", "ood")):
        return {}, [], []  # (a dataset has no ood split: no figures for it)
    problems = run.env.problems(split, n, seed=0)[run.rank::run.world_size]
    roll = rollouts(run, model, problems, 1, temperature=0.0, seed=0, batch_size=run.cfg["eval_batch_size"])
    sums = all_reduce_sum(dict(correct=float(roll.verified.sum()), n=len(problems), tokens=float(roll.lengths.sum()),
                               work=sum(map(run.env.shows_work, roll.texts))), run)
    transcripts = [f"[{split}] {p['prompt']}\n  -> {text!r}  (answer {p['answer']}, reward {r:.0f})"
                   for p, text, r in zip(problems[:4], roll.texts, roll.verified.tolist())]
    answers = [dict(prompt=p["prompt"], answer=p.get("answer"), response=text, verdict=r)
               for p, text, r in zip(problems, roll.texts, roll.verified.tolist())]
    return {f"{split}_acc": sums["correct"] / sums["n"], f"{split}_len": sums["tokens"] / sums["n"],
            f"{split}_work": sums["work"] / sums["n"]}, transcripts, answers  # work: answers that write their steps


@torch.no_grad()
def sampled_accuracy(run, model, n, k, temperature, reference=None):
    """heldout_sampled_acc, _len and _work over k answers to each of n held-out problems
    sampled at `temperature`, heldout_pass@k (k >= 2) and with a reference model heldout_kl_ref: the
    KL(π_θ‖π_ref) per response, mean over the samples of Σ_t (log π_θ − log π_ref), the sampler's
    log-probs standing for log π_θ, so only π_ref runs a forward. Transcripts of the first two."""
    problems = run.env.problems("heldout", n, seed=0)[run.rank::run.world_size]
    size = run.cfg["eval_batch_size"]
    roll = rollouts(run, model, problems, k, temperature=temperature, seed=1, batch_size=size)
    correct = roll.verified.view(len(problems), k)
    sums = dict(correct=float(correct.sum()), passed=float(correct.amax(1).sum()), problems=len(problems),
                tokens=float(roll.lengths.sum()), work=sum(map(run.env.shows_work, roll.texts)), kl=0.0)
    if reference is not None:
        parts = list(zip(*(chunks(t, size) for t in (roll.ids, roll.old_logprobs, roll.mask))))
        idle = lockstep_count(run, len(parts)) - len(parts)  # (sharded: dummy forwards match the others')
        with run.autocast:
            for ids, old, mask in parts:
                sums["kl"] += float(((old - sequence_logprobs(reference, ids, temperature)) * mask).sum())
            for _ in range(idle):
                reference(roll.ids.new_zeros(1, 1))
    sums = all_reduce_sum(sums, run)
    responses = sums["problems"] * k
    metrics = dict(heldout_sampled_acc=sums["correct"] / responses, heldout_sampled_len=sums["tokens"] / responses,
                   heldout_sampled_work=sums["work"] / responses)
    if k >= 2:
        metrics[f"heldout_pass@{k}"] = sums["passed"] / sums["problems"]
    if reference is not None:
        metrics["heldout_kl_ref"] = sums["kl"] / responses
    transcripts = [f"[heldout, T={temperature}] {p['prompt']}\n  -> {text!r}  (answer {p['answer']}, reward {r:.0f})"
                   for p, text, r in list(zip(roll.problems, roll.texts, roll.verified.tolist()))[:2 * k:k]]
    return metrics, transcripts


def evaluate_policy(run, model, it=None, reference=None, temperature=1.0, problems=None, ood_problems=None,
                    sampled_problems=None, samples=None):
    """The policy's held-out figures (see above) with the run's settings: eval_problems (greedy
    held-out and OOD, and the sampled problems), eval_samples (answers per problem at `temperature`;
    0: greedy only); the arguments override them (the ladder's own sizes). With `it`, a few
    transcripts go to samples.txt. Call it with the model in eval mode (the loop does)."""
    n = problems or run.cfg["eval_problems"]
    k = run.cfg["eval_samples"] if samples is None else samples
    metrics, transcripts, answers = greedy_accuracy(run, model, "heldout", n)
    metrics.update(greedy_accuracy(run, model, "ood", ood_problems or n)[0])
    if k >= 1:
        sampled, lines = sampled_accuracy(run, model, sampled_problems or n, k, temperature, reference)
        metrics.update(sampled)
        transcripts += lines
    if it is not None:
        write_samples(run, it, transcripts)
        write_out(run, "answers.jsonl", json.dumps(dict(iter=it, split="heldout", answers=answers)) + "\n", "a")
    return metrics, transcripts


def write_samples(run, it, transcripts):
    """Append a few sampled trajectories per eval to samples.txt, for a person to read."""
    if transcripts:
        write_out(run, "samples.txt", f"=== iter {it} ===\n" + "\n".join(transcripts) + "\n", "a")


def read_metrics(path):
    """(the rows of a metrics.jsonl, whether its last line was torn): a run killed mid-write leaves a
    partial last line, which is dropped; a broken line before it is an error naming it."""
    lines = open(path).read().splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not JSON: fix or delete that line") from None
            return rows, True
    return rows, False


def plot_metrics(out_dir):
    """One small panel per logged figure, against the iteration, in out_dir/metrics.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))[0]
    keys = sorted({k for r in rows for k, v in r.items() if k != "iter" and isinstance(v, (int, float))})
    if not keys:
        return
    ncol = min(4, len(keys))
    nrow = -(-len(keys) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 2.6 * nrow), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(r["iter"], r[key]) for r in rows if key in r]
        ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None)
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.subplots_adjust(hspace=0.6, wspace=0.3, left=0.05, right=0.98, top=0.95, bottom=0.05)
    fig.savefig(os.path.join(out_dir, "metrics.png"), dpi=80)
    plt.close(fig)
