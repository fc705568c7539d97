"""DPPO, divergence proximal policy optimisation (Qi et al. 2026, "Rethinking the Trust Region in LLM
Reinforcement Learning", arXiv:2602.04879; prime-rl's default loss, in TRL, SkyRL and others): PPO's ratio
clip is a one-sample estimate of how far the policy moved, harsh on rare tokens (a probability 1e-4 -> 1e-3
is ρ = 10) and lax on common ones (0.99 -> 0.5 is ρ ≈ 0.5). DPPO bounds the move itself: its Binary-TV
trust region is the total variation between π_θ and π_old on {the sampled token, the rest}, |π_θ(y_it) −
π_old(y_it)|, and a token is dropped (not clipped) only where it has left the region in the direction its
advantage pushes:

    ℓ_it = −M_it·ρ_it·A_i      M_it = 0 if A_i > 0 and π_θ(y_it) − π_old(y_it) > δ,
                                       or A_i < 0 and π_old(y_it) − π_θ(y_it) > δ;   1 otherwise

(M is a mask, no gradient; both probabilities at the sampling temperature). The gradient of a kept token
is ρ·A·∇log π_θ: on-policy DPPO is GRPO's REINFORCE with A_i. δ = 0.1 (prime-rl's default; the paper
studies 0.1-0.2), no KL term (prime-rl adds a KL term of its own; not here). clip_frac is the share of
tokens the mask dropped. Everything else, the aggregation included, is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what DPPO does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    tv_delta=0.1,         # δ: how far a token's probability may move from π_old's in its advantage's direction
    kl_coef=0.0,          # β: no KL term in DPPO's recipe
)


def loss(run, state, model, batch):
    """GRPO's loss with the divergence mask in place of the clip."""
    on = batch.mask > 0
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    ratio = grpo.token_ratio(logp, batch.old_logprobs, on)
    per_token, dropped = dppo_surrogate(ratio, grpo.per_token_advantages(batch), logp, batch.old_logprobs, on,
                                        run.cfg["tv_delta"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(grpo.ratio_figures(ratio, dropped, on), **kl_figures, **grpo.sample_figures(batch, entropy))


def dppo_surrogate(ratio, adv, logp, old_logp, on, delta):
    """−M·ρ·A per token (0 off the response and where M = 0), and the tokens the mask dropped."""
    with torch.no_grad():
        moved = torch.where(on, logp.exp() - old_logp.exp(), 0.0)  # π_θ − π_old on the sampled token
        dropped = on & (((adv > 0) & (moved > delta)) | ((adv < 0) & (moved < -delta)))
    return torch.where(on & ~dropped, -ratio * adv, 0.0), dropped
