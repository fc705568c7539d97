"""
PPO with a reward model (RLHF, Ouyang et al. 2022, arXiv:2203.02155; Ziegler et al. 2019,
arXiv:1909.08593): r(x, y) is a frozen Bradley–Terry reward model's scalar at the last response
token, r_φ(x, y), in place of the verifier's 0/1 (which is still logged, verifier_acc, beside the
training reward, rm_score). With critic_init=reward_model the critic V_ψ starts as a trained copy
of the reward model, as InstructGPT's did.

    python train.py --algo rm --init_from=out/sft --out_dir=out/rm
    python train.py --algo ppo_rm --init_from=out/sft --reward_model=out/rm
"""

import torch

import ppo
from nanopost.checkpoints import load_reward_model, read_reward_model
from nanopost.distributed import all_reduce_sum
from nanopost.passports import ppo_passport, write_passport
from ppo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what it does not change)
from nanopost.rollouts import old_logprobs_mode, score_responses

base = "ppo"
defaults = dict(
    ppo.defaults,
    reward_model="",            # checkpoint dir written by --algo rm (kind "scalar")
    critic_init="policy",       # the critic starts as: policy (the SFT backbone, a zero head) | reward_model (the RM, as InstructGPT)
)


def wrap_model(run, model):
    """critic_init=reward_model: V_ψ is a trained copy of the reward model (InstructGPT's start)."""
    if run.cfg["critic_init"] not in ("policy", "reward_model"):
        raise ValueError(f"critic_init={run.cfg['critic_init']!r}: choose policy or reward_model")
    if run.cfg["critic_init"] == "policy":
        return ppo.wrap_model(run, model)
    return ppo.PolicyAndCritic(model, read_reward_model(run).requires_grad_(True))


def setup(run, saved):
    state = ppo.new_state(run)
    state.reward_model = load_reward_model(run)  # frozen r_φ
    ppo.print_memory(run, reference=state.reference, reward_model=state.reward_model)
    write_passport(run, ppo_passport(run, state.verifier_check, old_logprobs_mode(run)))
    return state


def batches(run, state, it):
    """ppo.batches with r(x, y) = r_φ(x, y), the reward model's score of each rollout."""
    cfg = run.cfg
    micro = ppo.sample_and_score(run, state, it)
    for mb in micro:
        mb.reward = reward_model_score(run, state, mb)                          # r(x, y) = r_φ(x, y)
        mb.kl = ppo.k1(mb)
        rewards = ppo.shaped_rewards(mb.reward, mb.kl, mb.mask, state.kl_coef)  # r_t = −β·k_t (+ r_φ at the end)
        mb.advantages, mb.returns = ppo.gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])
    steps, figures = ppo.whitened_steps(run, state, it, micro)
    sums = all_reduce_sum(dict(reward=sum(float(mb.reward.double().sum()) for mb in micro),
                               sequences=float(sum(len(mb.reward) for mb in micro))), run)
    figures["rm_score"] = sums["reward"] / sums["sequences"]
    return steps, figures


@torch.no_grad()
def reward_model_score(run, state, mb):
    """r_φ of each row: the frozen reward model's scalar at its last response token."""
    with run.autocast:
        return score_responses(state.reward_model, mb.ids, mb.mask)
