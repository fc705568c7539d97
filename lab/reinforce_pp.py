"""REINFORCE++ (Hu 2025, arXiv:2501.03262): REINFORCE's batch-mean baseline, then the advantages divided by
their population std over the whole global batch (every rank's responses), a normalisation that does not
depend on the group a response came from:

    A_i = (r_i − mean(r)) / std(r_1 − mean(r), ..., r_N − mean(r))        (over the global batch)

Everything else (the clipped loss, the KL term) is grpo.py's."""

import grpo
from grpo import evaluate, loss, on_policy, setup, starts_from  # noqa: F401  (what REINFORCE++ does not change)
from nanopost.distributed import all_reduce_sum

base = "grpo"
defaults = dict(grpo.defaults)


def batches(run, state, it):
    """GRPO's rollouts, then the batch-mean baseline and the batch's std over every rank's rewards."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    total, n = all_reduce_sum([float(sum(ro.reward.sum() for ro in shards)), sum(len(ro.reward) for ro in shards)], run)
    centred = [ro.reward - total / n for ro in shards]
    for ro, adv in zip(shards, batch_scale(centred, run)):
        ro.advantages = adv
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    figures = grpo.rollout_figures(run, state, shards)
    figures.pop("adv_sign_error_frac", None)  # (the advantage is no function of the row's group)
    return grpo.minibatches(run, shards), figures


def batch_scale(advantages, run):
    """Each of this rank's (N,) advantages divided by the population std of every rank's."""
    s, sq, n = all_reduce_sum([float(sum(a.sum() for a in advantages)), float(sum((a ** 2).sum() for a in advantages)),
                               sum(len(a) for a in advantages)], run)
    std = max(sq / max(n, 1) - (s / max(n, 1)) ** 2, 0.0) ** 0.5
    return [adv / std if std > 0 else adv for adv in advantages]
