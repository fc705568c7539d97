"""REINFORCE with a batch-mean baseline (Williams 1992; SPEC §3): no groups compared, one baseline for the
whole global batch (every rank's responses), so the advantage needs the batch before any row gets it:

    A_i = r_i − mean(r over the global batch)

A group of one response is fine here. Everything else (the clipped loss, the KL term) is grpo.py's."""

import grpo
from grpo import evaluate, loss, on_policy, setup, starts_from  # noqa: F401  (what REINFORCE does not change)
from nanopost.distributed import all_reduce_sum

base = "grpo"
defaults = dict(grpo.defaults)


def batches(run, state, it):
    """GRPO's rollouts, then the batch-mean baseline over every rank's rewards."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    total, n = all_reduce_sum([float(sum(ro.reward.sum() for ro in shards)), sum(len(ro.reward) for ro in shards)], run)
    for ro in shards:
        ro.advantages = ro.reward - total / n
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    figures = grpo.rollout_figures(run, state, shards)
    figures.pop("adv_sign_error_frac", None)  # (the advantage is no function of the row's group)
    return grpo.minibatches(run, shards), figures
