"""Truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training"): the sampler (a fast inference engine) and the trainer compute different
π_old for the same weights, so π_old is recomputed by a training forward and each token's policy term
is weighted by the capped ratio of the two:

    ℓ_it = w_it · (−min(ρ_it·A_i, clip(ρ_it, 1 − ε, 1 + ε)·A_i)) + β·k3_it      w_it = min(π_old/π_sampler, C)

tis_capped_frac: the share of tokens at the cap. Everything else is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what TIS does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    tis_cap=2.0,                # C: the cap on the weight π_old/π_sampler
    old_logprobs="recompute",   # (TIS needs π_old from the trainer: with the sampler's own both are one number)
)


def loss(run, state, model, batch):
    """GRPO's loss with the policy term weighted token by token."""
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    per_token, figures = grpo.policy_term(run, batch, logp)
    weights, figures["tis_capped_frac"] = tis_weights(batch.old_logprobs, batch.sampler_logprobs, batch.mask,
                                                      run.cfg["tis_cap"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token * weights, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(figures, **kl_figures, **grpo.sample_figures(batch, entropy))


def tis_weights(old_logp, sampler_logp, mask, cap):
    """min(π_old/π_sampler, cap) per token (0 off the response), and the share of tokens at the cap."""
    on = mask > 0
    weight = torch.exp(torch.where(on, old_logp - sampler_logp, 0.0))
    return torch.where(on, weight.clamp(max=cap), 0.0), (on & (weight > cap)).sum() / on.sum().clamp(min=1)
