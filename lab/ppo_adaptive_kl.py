"""
PPO with an adaptive β (Ziegler et al. 2019, arXiv:1909.08593, §2.2): after each iteration β moves
towards the KL per response the run aims at,

    β ← β·(1 + K_β·clip(KL/kl_target − 1, −0.2, 0.2))          (K_β = kl_adapt_rate)

with KL the rollout batch's global KL to π_ref per response (kl_ref). β = 0 stays 0 (the controller
multiplies it). β is part of the checkpoint: a resumed run goes on from the interrupted one's.

    python train.py --algo ppo_adaptive_kl --init_from=out/sft --kl_target=2.0
"""

import numpy as np

import ppo
from ppo import evaluate, loss, on_policy, starts_from, wrap_model  # noqa: F401  (what it does not change)

base = "ppo"
defaults = dict(
    ppo.defaults,
    kl_target=1.0,              # the KL per response (nats) β adapts towards
    kl_adapt_rate=0.1,          # K_β of the controller
)


def setup(run, saved):
    state = ppo.setup(run, saved)
    if saved:
        state.kl_coef = saved["kl_coef"]
    return state


def state_dict(run, state):
    return {"kl_coef": state.kl_coef}


def batches(run, state, it):
    """ppo.batches, then β for the next iteration from this batch's KL per response."""
    steps, figures = ppo.batches(run, state, it)
    if "kl_ref" in figures:  # (π_ref is read only while β > 0)
        state.kl_coef = next_kl_coef(run.cfg, state.kl_coef, figures["kl_ref"])
    return steps, figures


def next_kl_coef(cfg, kl_coef, kl):
    """β·(1 + K_β·clip(KL/kl_target − 1, −0.2, 0.2))."""
    return kl_coef * (1 + cfg["kl_adapt_rate"] * float(np.clip(kl / cfg["kl_target"] - 1, -0.2, 0.2)))
