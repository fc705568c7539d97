"""
PPO: classical RLHF with a critic. SPEC §3 "PPO / classical RLHF", §5 (memory), §6; M14 §4, §10, §13;
Ch7 "RLHF".

    python train.py --algo ppo --init_from=out/sft --reward=verifier                   # RLVR
    python train.py --algo ppo --init_from=out/sft --reward=rm --reward_model=out/rm   # RLHF

Objective: max_θ E_{x, y~π_θ}[ r(x, y) ] − β·KL(π_θ(·|x) ‖ π_ref(·|x)).

Four logical roles, four separate copies here (the textbook configuration of M14 §10):
  policy    π_θ  trained; starts as init_from (the SFT model)
  reference π_ref frozen copy of init_from (run.ref_model); its log-probs are taken once per rollout batch
                 when β > 0 (with β = 0 nothing reads them, and only evaluation runs π_ref: heldout_kl_ref)
  reward    r    the environment's verifier (--reward=verifier, RLVR) or a frozen Bradley–Terry reward
                 model from --algo rm (--reward=rm, RLHF), read at the last response token
                 (rollouts.score_responses)
  critic    V_ψ  trained ScalarHeadGPT, one value per prefix. critic_init="policy" (default): a copy of
                 the SFT backbone with a zero head, because it exists for every reward source (the
                 verifier has no network to copy) and sees text the way the policy does;
                 critic_init="reward_model" starts from the RM as InstructGPT did (needs --reward_model).
Policy and critic are one module (PolicyAndCritic) trained by the loop's one optimizer: one forward
gives both, as DDP wants one forward per micro-batch. --lora_rank puts LoRA on both backbones and
keeps the critic's head trainable.

One iteration (batches() does steps 1-3, loss() step 4):
 1. Rollouts of the current policy (π_old) on train prompts: responses y, sequence rewards r(x, y).
 2. The KL sits in the reward, not in the loss [Ch7 "RLHF" (1)]: per response token
        r_t = −β·k_t  (+ r(x, y) at the last token),   k1: k_t = log π_old(y_t) − log π_ref(y_t)   (default)
                                                       k3: k_t = (ρ_t − 1) − log ρ_t,  ρ_t = π_ref/π_old
    β fixed (kl_target=0) or adaptive (Ziegler et al. 2019) towards kl_target, per iteration:
        β ← β·(1 + kl_adapt_rate·clip(KL/kl_target − 1, −0.2, 0.2)),  KL = mean over responses of Σ_t k_t
 3. GAE over response tokens: δ_t = r_t + γ·V(s_{t+1}) − V(s_t),  Â_t = δ_t + γλ·Â_{t+1}, the value after
    the last token is 0; value targets R_t = Â_t + V_old(s_t); Â whitened over the global batch (all ranks).
 4. ppo_epochs passes over `minibatches` optimizer steps (order shuffled per epoch) of
        L_t = −min(ρ_t·Â_t, clip(ρ_t, 1−ε, 1+ε)·Â_t)                     ρ_t = π_θ(y_t)/π_old(y_t)
              + c_v·½·max((V_t − R_t)², (V_old,t + clip(V_t − V_old,t, −ε_v, ε_v) − R_t)²)
    averaged over the response tokens of the global minibatch (token-level aggregation).
    Optional early stop: when a step's KL(π_old‖π_θ) per token (approx_kl, which the loop averages over
    the step's micro-batches on all ranks and sends back into the `batches` generator) exceeds
    early_stop_kl, the rest of the iteration's steps are skipped on every rank alike.
reward_mode (outcome | process | rlvp | path, as in grpo.py; mode_rewards) chooses what lands on the
tokens in step 2: the sequence reward at the end, each verifiable step's reward at its last token, or
the outcome plus the rule engine's β·(−λ | +μ) at each judged action. With a tool environment the
tool's result tokens have mask 0: no policy, value or KL term on them, and GAE passes over them.
Every log-prob (policy, π_old, reference) and the entropy are taken at the sampler's temperature,
with dropout off, so that ρ = 1 exactly before the first update. π_old is the sampler's own log-probs
when they equal a training forward (fp32; old_logprobs=auto on CPU), else one forward of the policy
(auto under bf16 autocast, or old_logprobs=recompute); V_old is always one forward of the critic.

Each micro-batch of rollouts is drawn by its own sampler call seeded by (seed, iteration, micro-batch),
so the global batch is the same for any split over ranks × micro-steps and a resumed run redraws it.

Post-training passport: online, on-policy (each rollout batch is used for ppo_epochs epochs, then
dropped); roles policy, reference, critic, reward (verifier or RM), π_old = the policy at rollout time;
KL to π_ref in the per-token reward; token-level loss; no groups (samples_per_prompt=1 by default),
so no degenerate-group rule is needed; a truncated response simply gets what the reward gives it (the
verifier: 0, it has no answer); generation and training on the same devices, synchronous.
"""

import copy
import dataclasses
import math

import numpy as np
import torch
import torch.nn as nn

from checkpoints import load_model
from distributed import all_reduce_sum, role_memory_gib, seeded_rng, shard
from evaluation import evaluate_policy
from model import GPT, ScalarHeadGPT, kl_estimate, sequence_logprobs, token_logprobs, token_logprobs_and_entropy
from paperwork import unparsed, verification_text, verifier_check, write_passport
from rewards import REWARD_KEYS, check_reward_mode, path_signals, token_rewards
from rollouts import last_response_column, rollouts, score_responses

starts_from = "sft"  # RL selects among what a trained policy does: no random start (train.check_start)
defaults = dict(
    reward="verifier",          # verifier (RLVR) | rm (RLHF: needs reward_model)
    reward_model="",            # checkpoint dir written by --algo rm (kind "scalar")
    critic_init="policy",       # the critic starts as: policy (the SFT backbone, a zero head) | reward_model (the RM, as InstructGPT)
    prompts_pool=20000,         # train-split problems the rollouts draw their prompts from
    samples_per_prompt=1,       # responses per prompt (batch_size must be a multiple)
    minibatches=2,              # optimizer steps per epoch; rollout batch = minibatches × ranks × accum × batch_size
    ppo_epochs=2,               # passes over each rollout batch
    temperature=1.0,            # sampling temperature; every log-prob is taken at it
    clip_eps=0.2,               # ε of the clipped surrogate
    value_clip=0.2,             # ε_v of the clipped value loss
    vf_coef=0.5,                # c_v
    gamma=1.0,                  # GAE's discount γ; 1 is usual for LLMs (the return is the outcome, not its speed)
    lam=0.95,                   # GAE's λ: bias (0, one-step TD) against variance (1, the Monte Carlo return)
    kl_coef=0.05,               # β (the initial β when adaptive)
    kl_estimator="k1",          # k1 | k3
    kl_target=0.0,              # > 0: adaptive β towards this KL per response (nats); 0: fixed β
    kl_adapt_rate=0.1,          # K_β of the adaptive controller
    early_stop_kl=0.0,          # > 0: stop an iteration's PPO steps once KL(π_old‖π_θ) per token exceeds it
    old_logprobs="auto",        # π_old: sampler | recompute | auto (recompute under autocast, else sampler)
    # common keys with RL values: far below SFT's lr, since every Adam step moves all weights of
    # policy and critic (the first ones are sign steps, hence the warmup). On the old all-worked task
    # lr 1e-4 drove the KL to the reference to 1.4 nats per response within 30 iterations and accuracy
    # fell; at 3e-5 the default task's policy switches to worked answers within 20 iterations (README).
    learning_rate=3e-5, min_lr=3e-5, warmup_iters=5, max_iters=40, eval_interval=20, log_interval=1,
    eval_samples=8,             # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
)

defaults.update(REWARD_KEYS)  # reward_mode and RLVP's β, λ, μ: one definition for grpo.py and ppo.py


# ----------------------------------------------------------------------------------------------
# The pieces of the loss, each on (N, T-1) per-token tensors aligned with ids[:, 1:]

def shaped_rewards(score, kl, mask, kl_coef):
    """r_t = −β·k_t on every response token, plus the sequence reward at the last response token."""
    rewards = -kl_coef * kl * mask
    rewards[torch.arange(len(score), device=mask.device), last_response_column(mask)] += score
    return rewards


def mode_rewards(mb, cfg, kl_coef):
    """Per-token rewards r_t for cfg["reward_mode"] (SPEC §3 Process vs outcome, RLVP), −β·k_t in all:
        outcome  + r(x, y) at the last response token (shaped_rewards)
        process  + each verifiable step's reward at its last token (env.step_rewards; the answer is a step)
        rlvp     + r(x, y) at the last token + β_path·(−λ | +μ) at each action the rule engine judges
        path     + the rule engine's signals alone (the inaction trap: an experiment, not a recipe)
    GAE carries each to the tokens before it. PPO has no groups to normalise the channels over; its
    whitening of Â over the batch is the one normaliser, and β_path ≤ 1 keeps the outcome the driver."""
    mode = cfg["reward_mode"]
    outcome = mb.score if mode in ("outcome", "rlvp") else torch.zeros_like(mb.score)
    rewards = shaped_rewards(outcome, mb.kl, mb.mask, kl_coef)  # the KL penalty, built here only
    if mode == "process":
        return rewards + mb.step_rewards
    if mode == "path":
        return rewards + mb.path_rewards
    return rewards + cfg["rlvp_beta"] * mb.path_rewards if mode == "rlvp" else rewards


def gae(rewards, values, mask, gamma, lam):
    """Generalised advantage estimation over each row's response tokens (mask 1):
    Â_t = δ_t + γλ·Â_{t+1}, δ_t = r_t + γ·V_{t+1} − V_t, with V = 0 after the last response token.
    Positions with mask 0 inside a response (a tool's result, forced into it) are not actions: the
    recursion passes over them, so the token before a call sees the rewards after its result.
    Returns (advantages, value targets Â + V), zero advantage off the response."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(on, delta + gamma * lam * running, running)
        advantages[:, t] = running * mask[:, t]
        next_value = torch.where(on, values[:, t], next_value)
    return advantages, advantages + values


def clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps):
    """Per-token −min(ρ·Â, clip(ρ, 1−ε, 1+ε)·Â) and whether the clipped term was the smaller one."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped, clipped = ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    return -torch.min(unclipped, clipped), (clipped < unclipped).float()


def clipped_value_loss(values, old_values, returns, value_clip):
    """Per-token ½·max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²): the critic cannot move
    further than ε_v from its rollout-time value per PPO step and profit from it."""
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


# ----------------------------------------------------------------------------------------------
# Models

class PolicyAndCritic(nn.Module):
    """π_θ and V_ψ as one module: forward(ids) -> (logits, values)."""

    def __init__(self, policy, critic):
        super().__init__()
        self.policy, self.critic = policy, critic

    def forward(self, ids):
        return self.policy(ids), self.critic(ids)


def wrap_model(run, model):
    if not isinstance(model, GPT):
        raise ValueError(f"--algo ppo trains a language model; init_from={run.cfg['init_from']!r} is a scalar model")
    if run.cfg["critic_init"] == "policy":
        critic = ScalarHeadGPT(copy.deepcopy(model))
        nn.init.zeros_(critic.head.weight)  # V = 0 everywhere at first: no random values in the first advantages
    elif run.cfg["critic_init"] == "reward_model":
        # a trained copy of the frozen RM (under --fsdp read again: the frozen one is sharded already)
        rm = load_model(run.cfg["reward_model"]) if run.fsdp else copy.deepcopy(run.reward_model)
        critic = rm.requires_grad_(True)
    else:
        raise ValueError(f"critic_init={run.cfg['critic_init']!r}: choose policy or reward_model")
    return PolicyAndCritic(model, critic)


def needs(cfg):
    """The frozen models the loop builds once: π_ref (run.ref_model) and, when it scores the rollouts
    or seeds the critic, the reward model (run.reward_model: one load serves both)."""
    uses_rm = cfg["reward"] == "rm" or cfg["critic_init"] == "reward_model"
    return ("reference", "reward_model") if uses_rm else ("reference",)


loss_dropout = False    # the loop keeps dropout off in the loss: it sees the function the sampler used for π_old
sharded_rollouts = True  # --fsdp_rollouts=sharded: every rank scores the same number of micro-batches


def setup(run):
    cfg = run.cfg
    if cfg["reward"] not in ("verifier", "rm"):
        raise ValueError(f"reward={cfg['reward']!r}: choose verifier or rm")
    if cfg["kl_estimator"] not in ("k1", "k3"):
        raise ValueError(f"kl_estimator={cfg['kl_estimator']!r}: choose k1 or k3")
    if cfg["old_logprobs"] not in ("auto", "sampler", "recompute"):
        raise ValueError(f"old_logprobs={cfg['old_logprobs']!r}: choose auto, sampler or recompute")
    if cfg["batch_size"] % cfg["samples_per_prompt"]:
        raise ValueError(f"batch_size={cfg['batch_size']} must be a multiple of "
                         f"samples_per_prompt={cfg['samples_per_prompt']}")
    check_reward_mode(cfg, run.env)
    if cfg["reward_mode"] == "process" and cfg["reward"] != "verifier":
        raise ValueError("reward_mode=process scores the environment's steps and answer (env.step_rewards): "
                         "it needs reward=verifier")
    run.policy = run.raw_model.policy
    if cfg["reward"] != "rm":
        run.reward_model = None  # critic_init=reward_model alone: the RM only seeded the critic
    run.kl_coef = cfg["kl_coef"]
    mode = cfg["old_logprobs"]
    run.old_logprobs_mode = mode if mode != "auto" else ("recompute" if run.device.startswith("cuda") else "sampler")
    run.train_problems = run.env.problems("train", cfg["prompts_pool"], seed=0)
    if run.master:
        roles = [("policy", role_memory_gib(run.policy, True)), ("critic", role_memory_gib(run.raw_model.critic, True)),
                 ("reference", role_memory_gib(run.ref_model, False))]
        if run.reward_model is not None:
            roles.append(("reward model", role_memory_gib(run.reward_model, False)))
        total = sum(g for _, g in roles)
        print("ppo memory, persistent states only (M14 §10: 16 B/param trained, 2 B/param frozen bf16): "
              + " + ".join(f"{name} {g:.4g}" for name, g in roles)
              + f" = {total:.4g} GiB; critic {roles[1][1] / total:.0%}")
    run.verifier_check = verifier_check(run.env, run.env.verify)
    write_passport(run, passport(run))


def passport(run):
    """The run's post-training passport (SPEC §6) as markdown."""
    c = run.cfg
    reward = ("the environment's rule verifier, 1 or 0 per response (RLVR)" if c["reward"] == "verifier" else
              f"the reward model `{c['reward_model']}` at the last response token (RLHF); the verifier is logged")
    beta = f"adaptive towards {c['kl_target']} nats per response" if c["kl_target"] > 0 else "fixed"
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo ppo`, started from `{c['init_from']}`

## Data and mode
- online: prompts from a pool of {c['prompts_pool']} `{c['env']}` *train* problems, {c['samples_per_prompt']} answer(s)
  each, written by the current policy at temperature {c['temperature']}; evaluation on *heldout* and *ood*
- reuse: each rollout batch serves {c['ppo_epochs']} epochs × {c['minibatches']} minibatches, then is dropped

## Reward and verification
- {reward}; reward_mode {c['reward_mode']}; a truncated answer gets what the reward gives it
- {verification_text(run.verifier_check)}; parse_error_rate logged every iteration

## Optimisation
- on-policy clipped surrogate (ε = {c['clip_eps']}) and clipped value loss (ε_v = {c['value_clip']}, c_v = {c['vf_coef']}),
  GAE γ = {c['gamma']}, λ = {c['lam']}, advantages whitened over the global batch; token-level loss
- roles: policy (trained), critic (trained, from `{c['critic_init']}`), reference (frozen), π_old
  ({c['old_logprobs']} → {run.old_logprobs_mode}){", reward model (frozen)" if c['reward'] == 'rm' else ""}
- KL to π_ref: {c['kl_estimator']} per token folded into the reward, β = {c['kl_coef']} ({beta})
- no groups, so no degenerate-group rule

## Infrastructure
- generation and training on the same device(s): {run.device} × {run.world_size}, synchronous
"""


# ----------------------------------------------------------------------------------------------
# Rollouts -> PPO micro-batches

def scores_reference(run):
    """Whether the rollouts need π_ref's log-probs: only the KL penalty reads them (β = 0 stays 0
    under the adaptive controller, which multiplies it)."""
    return run.kl_coef != 0


@dataclasses.dataclass
class Batch:
    """One micro-batch of PPO rollouts: what score_micro_batch takes from the networks, then what
    batches() adds. Per-token tensors are (N, T-1), aligned with the targets ids[:, 1:]; per-row (N,).
    The loss reads ids, mask, old_logprobs, old_values, advantages and returns."""
    ids: torch.Tensor                      # (N, T) prompt + response, right-padded
    mask: torch.Tensor                     # (N, T-1) 1 on sampled response tokens
    old_logprobs: torch.Tensor             # π_old: the sampler's, or one policy forward (old_logprobs mode)
    old_values: torch.Tensor               # V_old: one critic forward
    advantages: torch.Tensor = None        # GAE, then whitened over the global batch (batches)
    returns: torch.Tensor = None           # the critic's targets (batches)
    score: torch.Tensor = None             # (N,) r(x, y): the reward model's, else the verifier's
    ref_logprobs: torch.Tensor = None      # π_ref's, when the KL penalty reads them
    kl: torch.Tensor = None                # k_t to π_ref, 0 where π_ref is not read (batches)
    step_rewards: torch.Tensor = None      # reward_mode=process: each step's reward at its last token
    path_rewards: torch.Tensor = None      # reward_mode=rlvp | path: the rule engine's signals
    # logged only
    verifier: torch.Tensor = None          # (N,) the verifier's reward
    sampler_logprobs: torch.Tensor = None  # the sampler's own log-probs (sampler_logprob_gap)
    lengths: torch.Tensor = None           # (N,) response lengths, float
    truncated: torch.Tensor = None         # (N,) 1.0 where max_new_tokens cut the response
    shows_work: torch.Tensor = None        # (N,) 1.0 where the response shows its work
    parse_error: torch.Tensor = None       # (N,) 1.0 where the answer did not parse
    decode_time: float = 0.0


@torch.no_grad()
def score_micro_batch(run, problems, seed):
    """Roll out one micro-batch and take everything PPO needs from frozen or current networks:
    π_old log-probs (the sampler's, or one policy forward), V_old (one critic forward), π_ref
    log-probs (when the KL penalty is on), sequence rewards."""
    cfg = run.cfg
    roll = rollouts(run, run.policy, problems, cfg["samples_per_prompt"], temperature=cfg["temperature"], seed=seed)
    ids, mask = roll.ids, roll.mask
    mb = Batch(ids=ids, mask=mask, old_logprobs=None, old_values=None, verifier=roll.rewards,
               sampler_logprobs=roll.old_logprobs, lengths=roll.lengths.float(), truncated=roll.truncated.float(),
               decode_time=roll.decode_time)
    mb.shows_work = torch.tensor([float(run.env.shows_work(t)) for t in roll.texts], device=ids.device)
    mb.parse_error = torch.tensor([float(unparsed(run.env, t)) for t in roll.texts], device=ids.device)
    if cfg["reward_mode"] == "process":
        mb.step_rewards = token_rewards(run, roll, run.env.step_rewards)[0]
    elif cfg["reward_mode"] in ("rlvp", "path"):
        mb.path_rewards = token_rewards(run, roll, path_signals(run))[0]
    with run.autocast:
        if run.old_logprobs_mode == "recompute":
            # π_old from the same forward the loss makes (not the KV-cache sampler's numbers, whose
            # difference is logged as sampler_logprob_gap), so that ρ = 1 before the first update
            logits, values = run.raw_model(ids[:, :-1])
            mb.old_logprobs = token_logprobs(logits, ids[:, 1:], cfg["temperature"]) * mask
        else:  # the sampler's log-probs equal a training forward's (fp32): only the critic runs
            values = run.raw_model.critic(ids[:, :-1])
            mb.old_logprobs = roll.old_logprobs
        if scores_reference(run):
            mb.ref_logprobs = sequence_logprobs(run.ref_model, ids, cfg["temperature"]) * mask
        rm_score = score_responses(run.reward_model, ids, mask) if run.reward_model is not None else None
    mb.old_values, mb.score = values.float() * mask, rm_score if rm_score is not None else roll.rewards
    return mb


def global_sums(run, micro):
    """Sums over every rank's micro-batches of the figures whitening and the logs need."""
    figures = dict(
        tokens=lambda mb: mb.mask, sequences=lambda mb: torch.ones_like(mb.score),
        adv=lambda mb: mb.advantages, adv2=lambda mb: mb.advantages ** 2,
        ret=lambda mb: mb.returns * mb.mask, ret2=lambda mb: mb.returns ** 2 * mb.mask,
        kl=lambda mb: mb.kl, score=lambda mb: mb.score, verifier=lambda mb: mb.verifier,
        length=lambda mb: mb.lengths, truncated=lambda mb: mb.truncated,
        sampler_gap=lambda mb: (mb.sampler_logprobs - mb.old_logprobs).abs() * mb.mask,
        decode_time=lambda mb: torch.tensor(mb.decode_time))
    figures["work"] = lambda mb: mb.shows_work
    figures["parse_errors"] = lambda mb: mb.parse_error
    local = {name: sum(float(f(mb).double().sum()) for mb in micro) for name, f in figures.items()}
    return all_reduce_sum(local, run)


def batches(run, it):
    """Roll out this rank's share of the rollout batch, compute advantages, then yield
    ppo_epochs × minibatches optimizer steps (fewer on every rank alike after an early stop). A
    generator: the loop takes one step at a time and sends back the step's figures, reduced over
    ranks, so the early-stop test sees each step's KL."""
    cfg = run.cfg
    accum, bs = cfg["gradient_accumulation_steps"], cfg["batch_size"]
    G, K = cfg["samples_per_prompt"], cfg["minibatches"]
    n_micro = K * accum  # this rank's micro-batches; step k uses micro-batches k·accum ... (k+1)·accum − 1
    rng = seeded_rng(run, it)
    picks = rng.integers(0, len(run.train_problems), run.world_size * n_micro * bs // G)
    seeds = rng.integers(0, 2**31, run.world_size * n_micro).tolist()
    problems = shard([run.train_problems[i] for i in picks], run, n_micro, bs // G)
    seeds = [s for [s] in shard(seeds, run, n_micro, 1)]
    micro = [score_micro_batch(run, p, s) for p, s in zip(problems, seeds)]

    for mb in micro:
        mb.kl = (kl_estimate(mb.old_logprobs, mb.ref_logprobs, cfg["kl_estimator"]) * mb.mask
                 if mb.ref_logprobs is not None else torch.zeros_like(mb.mask))
        rewards = mode_rewards(mb, cfg, run.kl_coef)
        mb.advantages, mb.returns = gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])

    sums = global_sums(run, micro)
    mean = lambda key: sums[key] / sums["tokens"]  # per response token
    per_seq = lambda key: sums[key] / sums["sequences"]
    adv_mean, adv_var, return_var = mean("adv"), mean("adv2") - mean("adv") ** 2, mean("ret2") - mean("ret") ** 2
    for mb in micro:  # whitening over the global batch: the same shift and scale on every rank
        mb.advantages = (mb.advantages - adv_mean) / math.sqrt(max(adv_var, 0.0) + 1e-8) * mb.mask
    run.stats.update(
        kl_coef=run.kl_coef, verifier_acc=per_seq("verifier"), len_mean=per_seq("length"),
        truncated_frac=per_seq("truncated"), sampler_logprob_gap=mean("sampler_gap"),
        decode_time=sums["decode_time"] / run.world_size)
    if micro[0].ref_logprobs is not None:
        run.stats["kl_ref"] = per_seq("kl")
    run.stats.update(work_frac=per_seq("work"), parse_error_rate=per_seq("parse_errors"),
                     verifier_error_rate=run.verifier_check["verifier_error_rate"])
    if return_var > 0:  # 1 − Var(R − V_old)/Var(R); R − V_old is the raw advantage on response tokens
        run.stats["explained_var"] = 1 - adv_var / return_var
    if run.reward_model is not None:
        run.stats["rm_score"] = per_seq("score")
    if cfg["kl_target"] > 0 and "kl_ref" in run.stats:  # adaptive β for the next iteration, from this batch's (global) KL
        error = float(np.clip(run.stats["kl_ref"] / cfg["kl_target"] - 1, -0.2, 0.2))
        run.kl_coef *= 1 + cfg["kl_adapt_rate"] * error

    steps = [micro[k * accum:(k + 1) * accum] for k in range(K)]
    order = [k for epoch in range(cfg["ppo_epochs"]) for k in seeded_rng(run, it, epoch + 1).permutation(K)]
    taken = 0
    for k in order:
        step = yield steps[k]  # the loop trains on it, then sends its figures (None when iterated plainly)
        taken += 1
        if cfg["early_stop_kl"] > 0 and step is not None and step["approx_kl"] > cfg["early_stop_kl"]:
            break
    run.stats["ppo_steps"] = taken


def loss(run, model, batch):
    cfg = run.cfg
    ids, mask = batch.ids, batch.mask
    logits, values = model(ids[:, :-1])
    logprobs, entropy = token_logprobs_and_entropy(logits, ids[:, 1:], cfg["temperature"])
    policy_loss, clipped = clipped_surrogate(logprobs, batch.old_logprobs, batch.advantages, cfg["clip_eps"])
    value_loss = clipped_value_loss(values.float(), batch.old_values, batch.returns, cfg["value_clip"])
    n = mask.sum()
    loss_sum = ((policy_loss + cfg["vf_coef"] * value_loss) * mask).sum()
    with torch.no_grad():
        approx_kl = (kl_estimate(batch.old_logprobs, logprobs, "k3") * mask).sum()  # KL(π_old‖π_θ)
        # clip_frac: share of tokens where the clipped term is the active one (no gradient from them)
        metrics = dict(policy_loss=(policy_loss * mask).sum(), value_loss=(value_loss * mask).sum(),
                       clip_frac=(clipped * mask).sum(), approx_kl=approx_kl,
                       entropy=(entropy * mask).sum())
    return loss_sum, n, {**{k: v / n for k, v in metrics.items()}, "tokens": n}  # tensors: read once per step


def evaluate(run, it):
    """The policy's greedy held-out and OOD accuracy (the true task metric, whatever the training
    reward); on sampled held-out answers their accuracy, pass@k and the KL to π_ref."""
    return evaluate_policy(run, run.raw_model.policy, it, run.ref_model, run.cfg["temperature"])[0]


def state_dict(run):
    return {"kl_coef": run.kl_coef}


def load_state_dict(run, state):
    run.kl_coef = state["kl_coef"]
