"""CISPO (MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the token. The weight
sg(clip(ρ, 1 − ε, 1 + ε_high)) is capped and detached, and every token keeps its REINFORCE gradient:

    ℓ_it = −sg(clip(ρ_it, 1 − ε, 1 + ε_high)) · A_i · log π_θ(y_it)

so a rare token whose ρ ran past the band (the "fork" tokens PPO's clip silences) still learns. Its
recipe: no lower cap (ε = 1), ε_high = 0.28, no KL term. Everything else is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what CISPO does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    clip_eps=1.0,         # ε: the weight's lower cap 1 − ε (1: none)
    clip_eps_high=0.28,   # ε_high: the weight's upper cap 1 + ε_high
    kl_coef=0.0,          # β: no KL term in CISPO's recipe
)


def loss(run, state, model, batch):
    """GRPO's loss with the capped-weight surrogate in place of the clipped one."""
    cfg, on = run.cfg, batch.mask > 0
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    ratio = grpo.token_ratio(logp, batch.old_logprobs, on)
    per_token, capped = cispo_surrogate(ratio, grpo.per_token_advantages(batch), logp, on, cfg["clip_eps"],
                                        cfg["clip_eps_high"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(grpo.ratio_figures(ratio, capped, on), **kl_figures, **grpo.sample_figures(batch, entropy))


def cispo_surrogate(ratio, adv, logp, on, eps_low, eps_high):
    """−sg(clip(ρ, 1 − eps_low, 1 + eps_high))·A·log π_θ per token, and the tokens whose weight it capped."""
    low, high = 1 - eps_low, 1 + eps_high
    per_token = -ratio.clamp(low, high).detach() * adv * torch.where(on, logp, 0.0)
    with torch.no_grad():
        capped = on & ((ratio > high) | (ratio < low))
    return per_token, capped
