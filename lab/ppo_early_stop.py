"""
PPO with an early stop on the KL (as in OpenAI's Spinning Up PPO and the `target_kl` of many PPO
implementations): after each optimizer step, the iteration's remaining steps are skipped once

    approx_kl = mean_t k3(π_old, π_θ)(y_t) > early_stop_kl        (KL(π_old‖π_θ) per response token)

on every rank alike (the step's figures are means over its micro-batches and ranks). ppo_steps logs
the steps taken.

    python train.py --algo ppo_early_stop --init_from=out/sft --early_stop_kl=0.02
"""

import ppo
from ppo import evaluate, loss, on_policy, setup, starts_from, wrap_model  # noqa: F401  (what it does not change)

base = "ppo"
defaults = dict(
    ppo.defaults,
    early_stop_kl=0.02,         # stop an iteration's PPO steps once KL(π_old‖π_θ) per token exceeds it
)


def batches(run, state, it):
    steps, figures = ppo.batches(run, state, it)
    figures["ppo_steps"] = 0  # counted by stop_early
    return steps, figures


def stop_early(run, state, step, figures):
    """After each optimizer step, with its figures: counted, and True once its approx_kl exceeds early_stop_kl."""
    figures["ppo_steps"] += 1
    return step["approx_kl"] > run.cfg["early_stop_kl"]
