"""SAPO, soft adaptive policy optimisation (the Qwen team 2025, arXiv:2511.20347; TRL's
loss_type="sapo"): the hard clip becomes a soft gate. Per token, with τ chosen by the advantage's sign,

    ℓ_it = −(4/τ_i)·σ(τ_i·(ρ_it − 1))·A_i          τ_i = τ_pos if A_i > 0, else τ_neg

whose gradient is w_it·ρ_it·A_i·∇log π_θ(y_it) with w_it = 4·σ(τ(ρ − 1))·(1 − σ(τ(ρ − 1))): w = 1 at ρ = 1
(on-policy SAPO is GRPO's REINFORCE with A_i), falling smoothly as ρ leaves 1, never cut to zero at a band's
edge. τ_neg > τ_pos makes a negative token's weight fall faster (pushing a token down raises every other
token's logit: the less stable direction). Recipe: τ_pos = 1.0, τ_neg = 1.05, no KL term. clip_frac here is
the share of tokens whose gate weight w fell below 1/2. Everything else, the aggregation included, is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what SAPO does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    sapo_tau_pos=1.0,     # τ_pos: the gate's temperature on tokens of positive advantage
    sapo_tau_neg=1.05,    # τ_neg: on tokens of negative advantage (above τ_pos: their weight falls faster)
    kl_coef=0.0,          # β: no KL term in SAPO's recipe
)


def loss(run, state, model, batch):
    """GRPO's loss with the soft gate in place of the clipped surrogate."""
    cfg, on = run.cfg, batch.mask > 0
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    ratio = grpo.token_ratio(logp, batch.old_logprobs, on)
    per_token, gated = sapo_surrogate(ratio, grpo.per_token_advantages(batch), on, cfg["sapo_tau_pos"],
                                      cfg["sapo_tau_neg"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(grpo.ratio_figures(ratio, gated, on), **kl_figures, **grpo.sample_figures(batch, entropy))


def sapo_surrogate(ratio, adv, on, tau_pos, tau_neg):
    """−(4/τ)·σ(τ(ρ − 1))·A per token (0 off the response), and the tokens whose gate weight
    4σ(1 − σ) fell below 1/2."""
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1))
    per_token = torch.where(on, -(4 / tau) * gate * adv, 0.0)
    with torch.no_grad():
        gated = on & (4 * gate * (1 - gate) < 0.5)
    return per_token, gated
