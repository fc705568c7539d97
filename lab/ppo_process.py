"""
PPO with process rewards (SPEC §3 "Process vs outcome rewards"; Lightman et al. 2023,
arXiv:2305.20050): the environment scores each verifiable step (env.step_rewards; the answer is a
step), and each step's reward sits at its last token in place of the one outcome at the end:

    r_t = −β·k_t + Σ_{steps s ending at t} r_s

GAE carries each to the tokens before it. PPO has no groups to normalise over; its whitening of Â
over the batch is the one normaliser. Needs an environment with step_rewards (arithmetic).

    python train.py --algo ppo_process --init_from=out/sft
"""

import torch

import ppo
from ppo import evaluate, loss, on_policy, starts_from, wrap_model  # noqa: F401  (what it does not change)
from nanopost.rewards import check_reward_mode, token_rewards

base = "ppo"
defaults = dict(ppo.defaults)


def setup(run, saved):
    check_reward_mode(dict(run.cfg, reward_mode="process", rlvp_beta=0.0, rlvp_penalty=0.0, rlvp_bonus=0.0), run.env)
    return ppo.setup(run, saved)


def batches(run, state, it):
    """ppo.batches with each step's reward at its last token, no outcome at the end."""
    cfg = run.cfg
    micro = ppo.sample_and_score(run, state, it)
    for mb in micro:
        mb.kl = ppo.k1(mb)
        steps = token_rewards(run, mb.rollout, run.env.step_rewards)[0]  # r_s at each step's last token
        rewards = ppo.shaped_rewards(torch.zeros_like(mb.reward), mb.kl, mb.mask, state.kl_coef) + steps
        mb.advantages, mb.returns = ppo.gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])
    return ppo.whitened_steps(run, state, it, micro)
