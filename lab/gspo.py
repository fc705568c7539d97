"""GSPO, group sequence policy optimisation (Zheng et al. 2025, arXiv:2507.18071): one ratio per response,
the geometric mean of its token ratios, on every token of it:

    s_i = exp((1/|y_i|) Σ_t log(π_θ(y_it)/π_old(y_it)))      ℓ_it = −min(s_i·A_i, clip(s_i, 1 − ε, 1 + ε)·A_i)

taken as sg(s_i)·π_θ(y_it)/sg(π_θ(y_it)): its value is s_i and its gradient s_i·∇log π_θ(y_it). Outside
the band the whole response stops, hence GSPO's narrow band (ε = 3e-4 in its recipe) and several
minibatches. Everything else is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what GSPO does not change)
from model import clipped_surrogate

base = "grpo"
defaults = dict(
    grpo.defaults,
    clip_eps=3e-4,      # ε: the sequence ratio's band [1 − ε, 1 + ε] (a mean of log-ratios moves little)
    kl_coef=0.0,        # β: no KL term in GSPO's recipe
    minibatches=4,      # optimizer steps per rollout batch: at one, s_i = 1 and the ratio does nothing
)


def loss(run, state, model, batch):
    """GRPO's loss on the sequence ratio."""
    on = batch.mask > 0
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    ratio = sequence_ratio(logp, batch.old_logprobs, on)
    eps = run.cfg["clip_eps"]
    per_token, clipped = clipped_surrogate(ratio, grpo.per_token_advantages(batch), on, eps, eps)
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(grpo.ratio_figures(ratio, clipped, on), **kl_figures, **grpo.sample_figures(batch, entropy))


def sequence_ratio(logp, old_logp, on):
    """s_i on every token of response i, as sg(s_i)·π_θ(y_it)/sg(π_θ(y_it)); 1 off the response."""
    log_ratio = torch.where(on, logp - old_logp, 0.0)
    seq = log_ratio.sum(1, keepdim=True) / on.sum(1, keepdim=True).clamp(min=1)
    return torch.exp(torch.where(on, seq.detach() + logp - logp.detach(), 0.0))
