"""
PPO's options, beside ppo.py (which is PPO with a verifier's reward, a fixed KL penalty and the
sampler's π_old): ppo.setup chooses among them once, and ppo's core path calls what it chose.

  the reward    reward=rm: a frozen Bradley–Terry reward model from --algo rm, read at the last response
                token (RLHF); reward_mode process | rlvp | path: per-token rewards (rewards.py)
  the critic    critic_init=reward_model: V_ψ starts as the reward model, as InstructGPT did
  the KL        kl_target > 0: β adapts towards a target KL per response (Ziegler et al. 2019)
  the steps     early_stop_kl > 0: an iteration's remaining steps are skipped once KL(π_old‖π_θ) per
                token exceeds it
  π_old         old_logprobs=recompute: one forward of policy and critic (a GPU's bf16: the sampler's
                numbers differ from a training forward's)
"""

import numpy as np
import torch

from nanopost.checkpoints import load_reward_model, read_reward_model
from model import token_logprobs
from nanopost.rewards import REWARD_KEYS, check_reward_mode, token_signals
from nanopost.rollouts import score_responses

OPTIONS = dict(
    reward="verifier",          # verifier (RLVR) | rm (RLHF: needs reward_model)
    reward_model="",            # checkpoint dir written by --algo rm (kind "scalar")
    critic_init="policy",       # the critic starts as: policy (the SFT backbone, a zero head) | reward_model (the RM, as InstructGPT)
    kl_estimator="k1",          # k1 (log π_old − log π_ref) | k3 ((ρ − 1) − log ρ, ρ = π_ref/π_old): k_t in the reward
    kl_target=0.0,              # > 0: adaptive β towards this KL per response (nats); 0: fixed β
    kl_adapt_rate=0.1,          # K_β of the adaptive controller
    early_stop_kl=0.0,          # > 0: stop an iteration's PPO steps once KL(π_old‖π_θ) per token exceeds it
    old_logprobs="auto",        # π_old: sampler | recompute | auto (recompute under autocast, else sampler)
    **REWARD_KEYS,              # reward_mode and RLVP's β, λ, μ: one definition for grpo and ppo
)


def check_config(run):
    cfg = run.cfg
    if cfg["reward"] not in ("verifier", "rm"):
        raise ValueError(f"reward={cfg['reward']!r}: choose verifier or rm")
    if cfg["critic_init"] not in ("policy", "reward_model"):
        raise ValueError(f"critic_init={cfg['critic_init']!r}: choose policy or reward_model")
    if cfg["kl_estimator"] not in ("k1", "k3"):
        raise ValueError(f"kl_estimator={cfg['kl_estimator']!r}: choose k1 or k3")
    if cfg["old_logprobs"] not in ("auto", "sampler", "recompute"):
        raise ValueError(f"old_logprobs={cfg['old_logprobs']!r}: choose auto, sampler or recompute")
    if cfg["batch_size"] % cfg["group_size"]:
        raise ValueError(f"batch_size={cfg['batch_size']} must be a multiple of group_size={cfg['group_size']}")
    check_reward_mode(cfg, run.env)
    if cfg["reward_mode"] == "process" and cfg["reward"] != "verifier":
        raise ValueError("reward_mode=process scores the environment's steps and answer (env.step_rewards): "
                         "it needs reward=verifier")


def reward_model_critic(run):
    """critic_init=reward_model: a trained copy of the reward model (InstructGPT's start)."""
    return read_reward_model(run).requires_grad_(True)


def reward_model_score(run):
    """reward=rm: (the frozen reward model, a function (rollout) -> r(x, y), its scalar at each row's
    last response token). The verifier is still logged (verifier_acc)."""
    reward_model = load_reward_model(run)
    return reward_model, lambda roll: score_responses(reward_model, roll.ids, roll.mask)


def recomputed_old_logprobs(run, roll):
    """old_logprobs=recompute: (π_old, V_old) from one forward of policy and critic, the forward the
    loss makes (not the KV-cache sampler's numbers, whose difference is logged as
    sampler_logprob_gap), so that ρ = 1 before the first update."""
    logits, values = run.raw_model(roll.ids[:, :-1])
    return token_logprobs(logits, roll.ids[:, 1:], run.cfg["temperature"]) * roll.mask, values


def mode_rewards(run, shaped_rewards):
    """reward_mode's per-token rewards r_t (SPEC §3 Process vs outcome, RLVP), −β·k_t in all (ppo's
    shaped_rewards, given): a function (micro-batch, β) for
        process  + each verifiable step's reward at its last token (env.step_rewards; the answer is a step)
        rlvp     + r(x, y) at the last token + β_path·(−λ | +μ) at each action the rule engine judges
        path     + the rule engine's signals alone (the inaction trap: an experiment, not a recipe)
    GAE carries each to the tokens before it. PPO has no groups to normalise the channels over; its
    whitening of Â over the batch is the one normaliser, and β_path ≤ 1 keeps the outcome the driver.
    Also the function that puts each rollout's signals on its tokens (rewards.token_signals)."""
    mode, beta_path = run.cfg["reward_mode"], run.cfg["rlvp_beta"]
    no_outcome = lambda mb, kl_coef: shaped_rewards(torch.zeros_like(mb.reward), mb.kl, mb.mask, kl_coef)
    rewards = dict(process=lambda mb, kl_coef: no_outcome(mb, kl_coef) + mb.signals,
                   path=lambda mb, kl_coef: no_outcome(mb, kl_coef) + mb.signals,
                   rlvp=lambda mb, kl_coef: shaped_rewards(mb.reward, mb.kl, mb.mask, kl_coef) + beta_path * mb.signals)
    return rewards[mode], token_signals(run)


def adaptive_kl_coef(cfg):
    """kl_target > 0: β for the next iteration, from this batch's global KL per response,
        β ← β·(1 + K_β·clip(KL/kl_target − 1, −0.2, 0.2))          (Ziegler et al. 2019; K_β = kl_adapt_rate)
    a function (β, KL) -> β."""
    return lambda kl_coef, kl: kl_coef * (1 + cfg["kl_adapt_rate"] * float(np.clip(kl / cfg["kl_target"] - 1, -0.2, 0.2)))


def stop_early(run, state, step, figures):
    """After each optimizer step, with its figures (means over its micro-batches and ranks): counted
    (ppo_steps), and with early_stop_kl > 0 True once the step's KL(π_old‖π_θ) per token (approx_kl)
    exceeds it, which skips the iteration's remaining steps on every rank alike."""
    figures["ppo_steps"] += 1
    return 0 < run.cfg["early_stop_kl"] < step["approx_kl"]
