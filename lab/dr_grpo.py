"""Dr. GRPO, GRPO done right (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783):
two biases of GRPO removed. No std in the advantage (it up-weights prompts that are nearly always right
or wrong), and no 1/|y_i| in the loss (it makes a long wrong answer cost less per token than a short one):

    A_i = r_i − mean(r_1..G)          loss = (1/N) Σ_i Σ_t ℓ_it / L_max,   L_max = max_new_tokens

Everything else is grpo.py's."""

import torch

import grpo
from grpo import evaluate, on_policy, setup, starts_from  # noqa: F401  (what Dr. GRPO does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    kl_coef=0.0,        # β: no KL term in Dr. GRPO's recipe
)


def batches(run, state, it):
    """GRPO's groups with the mean-only advantage."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    for ro in shards:
        ro.advantages = centred_advantages(ro.reward, run.cfg["group_size"])
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), grpo.rollout_figures(run, state, shards)


def centred_advantages(rewards, G):
    """A_i = r_i − mean(r_1..G); exactly 0 on a degenerate group."""
    rewards = rewards.view(-1, G)
    adv = rewards - rewards.mean(1, keepdim=True)
    return adv.masked_fill(grpo.degenerate_groups(rewards)[:, None], 0.0).flatten()


def loss(run, state, model, batch):
    """GRPO's loss summed over each response's tokens and divided by the constant L_max."""
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    per_token, figures = grpo.policy_term(run, batch, logp)
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = seq_mean_token_sum_norm(per_token, batch.mask, run.cfg["max_new_tokens"])
    return loss_sum, count, dict(figures, **kl_figures, **grpo.sample_figures(batch, entropy))


def seq_mean_token_sum_norm(per_token, mask, max_len):
    """(1/N) Σ_i Σ_t ℓ_it / L_max: a response's weight does not depend on its own length (loss_sum,
    count = responses with a token)."""
    on = mask > 0
    return torch.where(on, per_token, 0.0).sum() / max_len, (on.sum(1) > 0).sum()
