"""RLOO, REINFORCE with a leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics",
arXiv:2402.14740): each response is compared with the mean of the other G − 1 of its group, no std:

    A_i = r_i − (Σ_{j≠i} r_j) / (G − 1)

The baseline leaves r_i out, so it does not shrink the gradient by (G − 1)/G as a mean with r_i in it
does; a group of equal rewards gets A = 0. Everything else is grpo.py's."""

import grpo
from grpo import evaluate, loss, on_policy, setup, starts_from  # noqa: F401  (what RLOO does not change)

base = "grpo"
defaults = dict(grpo.defaults)


def batches(run, state, it):
    """GRPO's groups, with the leave-one-out advantage in place of the group's z-score."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    for ro in shards:
        ro.advantages = leave_one_out_advantages(ro.reward, run.cfg["group_size"])
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), grpo.rollout_figures(run, state, shards)


def leave_one_out_advantages(rewards, G):
    """(N,) rewards in groups of G -> A_i = r_i − (Σ_{j≠i} r_j)/(G − 1); exactly 0 on a degenerate group."""
    rewards = rewards.view(-1, G)
    adv = rewards - (rewards.sum(1, keepdim=True) - rewards) / (G - 1)
    return adv.masked_fill(grpo.degenerate_groups(rewards)[:, None], 0.0).flatten()
