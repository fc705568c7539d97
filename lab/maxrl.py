"""MaxRL, maximum likelihood RL (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning",
arXiv:2602.02710): with 0/1 rewards a prompt's success probability p = E_π[r] is a likelihood, and RL's
E[p] is only the first term of log p = −Σ_k (1 − p)^k / k. MaxRL's estimator averages ∇log π over the
group's *successes* (1/K, K of them, not 1/G), with the group's mean gradient as a baseline: the advantage
is normalised by the group's mean reward where GRPO divides by its std,

    A_i = (r_i − mean(r_1..G)) / mean(r_1..G)       (0 on a group of equal rewards, all-fail included)

Summed over a response's tokens, its expectation is exactly ∇ of the truncated objective
−Σ_{k=1}^{G−1} (1 − p)^k / k, i.e. ∇p·(1 − (1 − p)^{G−1})/p: up-weighted 1/p on hard prompts, like
∇log p, as G grows (tests/test_menu.py enumerates it). Everything else, the clipped surrogate and its KL term
included, is grpo.py's: one factor changed."""

import torch

import grpo
from grpo import evaluate, loss, on_policy, setup, starts_from  # noqa: F401  (what MaxRL does not change)

base = "grpo"
defaults = dict(grpo.defaults)


def batches(run, state, it):
    """GRPO's groups with the mean-normalised advantage."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    for ro in shards:
        ro.advantages = mean_normalised_advantages(ro.reward, run.cfg["group_size"])
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), grpo.rollout_figures(run, state, shards)


def mean_normalised_advantages(rewards, G):
    """A_i = (r_i − mean(r_1..G)) / mean(r_1..G) within each group, (N,) -> (N,); exactly 0 on a
    degenerate group (whose mean may be 0)."""
    rewards = rewards.view(-1, G)
    degenerate = grpo.degenerate_groups(rewards)
    mean = rewards.mean(1, keepdim=True)
    adv = (rewards - mean) / torch.where(degenerate[:, None], 1.0, mean)
    return torch.where(degenerate[:, None], 0.0, adv).flatten()
