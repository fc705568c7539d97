"""Process supervision, as in the GRPO paper (Shao et al. 2024, §4.1.3; SPEC §3 "Process vs outcome
rewards"): a reward at the last token of each verifiable step (env.step_rewards), the step rewards of a
group's G responses normalised together, and a token's advantage the sum of the normalised rewards of
the steps that end at or after it:

    r̃_j = (r_j − mean(R)) / std(R)      R = every step reward of the group
    A_t = Σ_{steps j with end(j) ≥ t} r̃_j

A group whose step rewards are all equal gets A = 0. Everything else is grpo.py's (its loss takes one
advantage per token as it takes one per response)."""

import torch

import grpo
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what process rewards do not change)
from nanopost.rewards import token_rewards

base = "grpo"
defaults = dict(grpo.defaults)


def setup(run, saved):
    """GRPO's, for an environment that rewards steps."""
    if not hasattr(run.env, "step_rewards"):
        raise ValueError(f"--algo process_reward needs env.step_rewards, which env {run.env.name!r} does not have")
    return grpo.setup(run, saved)


def batches(run, state, it):
    """GRPO's groups with one advantage per token from the step rewards."""
    shards, step_rewards = grpo.sample_shards(run, state, run.raw_model, it), []
    for ro in shards:
        steps, ends = token_rewards(run, ro, run.env.step_rewards)
        ro.advantages = process_advantages(steps, ends, ro.mask, run.cfg["group_size"])
        step_rewards.append(steps)
    figures = grpo.rollout_figures(run, state, shards)
    grpo.keep_rollouts(run, it, shards, step_reward=step_rewards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), figures


def process_advantages(step_rewards, step_ends, mask, group_size):
    """step_rewards (N, T) hold each step's reward at its last token, step_ends (N, T) bool mark those
    tokens, mask (N, T) the trained tokens; rows are grouped by prompt (N = P·G). Returns (N, T) A_t."""
    N, T = step_rewards.shape
    r, on = step_rewards.reshape(-1, group_size * T), step_ends.reshape(-1, group_size * T)
    n = on.sum(1, keepdim=True).clamp(min=1)
    degenerate = (torch.where(on, r, float("-inf")).amax(1) == torch.where(on, r, float("inf")).amin(1)) | ~on.any(1)
    centred = torch.where(on, r - torch.where(on, r, 0.0).sum(1, keepdim=True) / n, 0.0)
    std = ((centred ** 2).sum(1, keepdim=True) / n).sqrt()
    normalised = torch.where(degenerate[:, None], 0.0, centred / torch.where(degenerate[:, None], 1.0, std))
    return normalised.reshape(N, T).flip(1).cumsum(1).flip(1) * mask
