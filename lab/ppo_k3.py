"""
PPO with the k3 estimator of the KL in the reward (Schulman 2020, "Approximating KL divergence"):
per response token, with ρ_t = π_ref(y_t)/π_old(y_t),

    k_t = (ρ_t − 1) − log ρ_t          in place of k1's  k_t = log π_old(y_t) − log π_ref(y_t)

Both are unbiased for KL(π_old‖π_ref) on tokens sampled from π_old; k3 is never negative and has
the lower variance, but a single k_t is no longer a log-ratio: −β·k_t rewards no token.

    python train.py --algo ppo_k3 --init_from=out/sft
"""

import torch

import ppo
from model import kl_estimate
from ppo import evaluate, loss, on_policy, setup, starts_from, wrap_model  # noqa: F401  (what it does not change)

base = "ppo"
defaults = dict(ppo.defaults)


def k3(mb):
    """k_t = (ρ − 1) − log ρ, ρ = π_ref(y_t)/π_old(y_t), on response tokens; 0 when β = 0 left π_ref unread."""
    if mb.ref_logprobs is None:
        return torch.zeros_like(mb.mask)
    return kl_estimate(mb.old_logprobs, mb.ref_logprobs, "k3") * mb.mask


def batches(run, state, it):
    """ppo.batches with k3 in the reward."""
    cfg = run.cfg
    micro = ppo.sample_and_score(run, state, it)
    for mb in micro:
        mb.kl = k3(mb)
        rewards = ppo.shaped_rewards(mb.reward, mb.kl, mb.mask, state.kl_coef)  # r_t = −β·k_t (+ r(x, y) at the end)
        mb.advantages, mb.returns = ppo.gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])
    return ppo.whitened_steps(run, state, it, micro)
