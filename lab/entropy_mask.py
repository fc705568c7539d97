"""The top-entropy mask, an entropy control (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy
Minority Tokens Drive Effective RL for LLM Reasoning", arXiv:2506.01939; TRL's top_entropy_quantile):
the policy gradient only on the response tokens whose entropy is in the top ρ share of the micro-batch's
(the forks where the policy chooses); the near-deterministic rest get weight 0:

    ℓ_it = 1[H_it ≥ q_{1−ρ}(H)] · (−min(ρ_it·A_i, clip(ρ_it, 1 − ε, 1 + ε)·A_i)) + β·k3_it

entropy_kept_frac: the share kept. Everything else is grpo.py's."""

import torch

import grpo
from grpo import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what the mask does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    top_entropy_quantile=0.2,  # ρ: the top share of tokens by entropy whose policy gradient counts
)


def loss(run, state, model, batch):
    """GRPO's loss with the policy term on the high-entropy tokens only."""
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    per_token, figures = grpo.policy_term(run, batch, logp)
    weights, figures["entropy_kept_frac"] = top_entropy_mask(entropy, batch.mask, run.cfg["top_entropy_quantile"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token * weights, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(figures, **kl_figures, **grpo.sample_figures(batch, entropy))


def top_entropy_mask(entropy, mask, quantile):
    """1 on the response tokens whose entropy is in the top `quantile` share, else 0; and the share kept."""
    on = mask > 0
    threshold = torch.quantile(entropy[on].float(), 1 - quantile) if on.any() else 0.0
    keep = on & (entropy >= threshold)
    return keep.float(), keep.sum() / on.sum().clamp(min=1)
