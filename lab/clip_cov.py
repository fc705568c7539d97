"""Clip-Cov, an entropy control (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv:2505.22617; verl's clip_cov): under the policy gradient a token's
entropy falls at the rate of the covariance of its log-prob and advantage, so the tokens with the largest

    cov_t = (log π_θ(y_t) − mean log π_θ) · (A_t − mean A)      (means over the micro-batch's response tokens)

(a confident token with a positive advantage, an unlikely one with a negative advantage) have their
policy gradient cut: weight 0 on the clip_cov share of response tokens with the largest positive cov_t,
at least one token (verl draws them at random among the tokens in a band; here the largest). The default
is the paper's ratio, 2e-4: one token in every micro-batch of fewer than 10,000 response tokens (a ratio
of 0.2 cuts a thousand times as many, docs/failures.md's entropy study). clip_cov_frac: the share cut.
Everything else is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what Clip-Cov does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    clip_cov=2e-4,      # the share of response tokens (those of largest positive covariance) whose gradient is cut
)


def loss(run, state, model, batch):
    """GRPO's loss with the policy term cut on the tokens of largest covariance."""
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    per_token, figures = grpo.policy_term(run, batch, logp)
    weights, figures["clip_cov_frac"] = clip_cov_weights(logp, grpo.per_token_advantages(batch), batch.mask,
                                                         run.cfg["clip_cov"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token * weights, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(figures, **kl_figures, **grpo.sample_figures(batch, entropy))


def clip_cov_weights(logp, adv, mask, share):
    """Per token 0 on the `share` of response tokens of largest positive cov_t (at least one token where
    share > 0, as verl counts them), else 1; and the share cut."""
    on = mask > 0
    lp, a = logp.detach()[on], adv.expand_as(logp)[on]
    cov = (lp - lp.mean()) * (a - a.mean())
    largest = cov.topk(min(max(int(share * len(cov)), 1 if share > 0 else 0), len(cov))).indices
    cut, picked = torch.zeros_like(on), torch.zeros_like(cov, dtype=torch.bool)
    picked[largest[cov[largest] > 0]] = True  # (a token of cov ≤ 0 does not lower the entropy)
    cut[on] = picked
    return torch.where(cut, 0.0, 1.0), cut.sum() / on.sum().clamp(min=1)
