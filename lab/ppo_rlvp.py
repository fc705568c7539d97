"""
PPO with RLVP's path signal (SPEC §3 "RLVP"): the environment's rule engine judges each action of a
transcript (env.path_signals: −λ per bad action, +μ per compliant one) and its signal Φ sits at the
action's last token beside the outcome O at the end:

    r_t = −β·k_t + O·[t = last] + β_path·Φ_t          (β_path = rlvp_beta ≤ 1: the outcome stays the driver)

With rlvp_outcome=False, Φ alone with weight 1 and no outcome (the inaction trap the chapter warns
of: an experiment, not a recipe). Needs an environment with path_signals (calculator, treasure).

    python train.py --algo ppo_rlvp --init_from=out/calc_sft --env=calculator
"""

import torch

import ppo
from ppo import evaluate, loss, on_policy, starts_from, wrap_model  # noqa: F401  (what it does not change)
from nanopost.rewards import check_reward_mode, path_signals, token_rewards

base = "ppo"
defaults = dict(
    ppo.defaults,
    rlvp_beta=0.5,              # β_path: the weight of the path signal Φ next to the outcome O
    rlvp_penalty=1.0,           # λ, the penalty per action the rule engine flags
    rlvp_bonus=1.0,             # μ, the bonus per compliant action
    rlvp_outcome=True,          # False: Φ alone, weight 1, no outcome (the inaction trap: an experiment)
)


def setup(run, saved):
    check_reward_mode(dict(run.cfg, reward_mode="rlvp" if run.cfg["rlvp_outcome"] else "path"), run.env)
    return ppo.setup(run, saved)


def batches(run, state, it):
    """ppo.batches with the rule engine's Φ at each judged action's last token."""
    cfg = run.cfg
    micro = ppo.sample_and_score(run, state, it)
    for mb in micro:
        mb.kl = ppo.k1(mb)
        path = token_rewards(run, mb.rollout, path_signals(run))[0]  # Φ_t: −λ | +μ at each judged action
        if cfg["rlvp_outcome"]:
            rewards = ppo.shaped_rewards(mb.reward, mb.kl, mb.mask, state.kl_coef) + cfg["rlvp_beta"] * path
        else:
            rewards = ppo.shaped_rewards(torch.zeros_like(mb.reward), mb.kl, mb.mask, state.kl_coef) + path
        mb.advantages, mb.returns = ppo.gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])
    return ppo.whitened_steps(run, state, it, micro)
