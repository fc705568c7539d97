"""
PPO: classical RLHF with a critic. SPEC §3 "PPO / classical RLHF", §5 (memory), §6; M14 §4, §10, §13;
Ch7 "RLHF".

    python train.py --algo ppo --init_from=out/sft --reward=verifier                   # RLVR
    python train.py --algo ppo --init_from=out/sft --reward=rm --reward_model=out/rm   # RLHF

Objective: max_θ E_{x, y~π_θ}[ r(x, y) ] − β·KL(π_θ(·|x) ‖ π_ref(·|x)).

Four roles, four separate copies here (the textbook configuration of M14 §10): the policy π_θ
(trained, from init_from, the SFT model); the reference π_ref (a frozen copy of init_from, read once
per rollout batch when β > 0); the reward r (the environment's verifier, or a reward model: the
options); the critic V_ψ (trained, a scalar head on a copy of the SFT backbone, one value per
prefix). Policy and critic are one module (PolicyAndCritic) trained by the loop's one optimizer: one
forward gives both, as DDP wants.

One iteration (batches() does steps 1-3, loss() step 4):
 1. Rollouts of the current policy (π_old) on train prompts: responses y, sequence rewards r(x, y).
 2. The KL sits in the reward, not in the loss [Ch7 "RLHF" (1)]: per response token
        r_t = −β·k_t  (+ r(x, y) at the last token),   k_t = log π_old(y_t) − log π_ref(y_t)   (k1)
 3. GAE over response tokens: δ_t = r_t + γ·V(s_{t+1}) − V(s_t),  Â_t = δ_t + γλ·Â_{t+1}, the value after
    the last token is 0; value targets R_t = Â_t + V_old(s_t); Â whitened over the global batch (all ranks).
 4. ppo_epochs passes over `minibatches` optimizer steps (order shuffled per epoch) of
        L_t = −min(ρ_t·Â_t, clip(ρ_t, 1−ε, 1+ε)·Â_t)                     ρ_t = π_θ(y_t)/π_old(y_t)
              + c_v·½·max((V_t − R_t)², (V_old,t + clip(V_t − V_old,t, −ε_v, ε_v) − R_t)²)
    averaged over the response tokens of the global minibatch (token-level aggregation).
Every log-prob (policy, π_old, reference) and the entropy are taken at the sampler's temperature,
with dropout off (on_policy), so that ρ = 1 exactly before the first update; π_old is the sampler's
own log-probs, V_old one forward of the critic. A tool's result tokens have mask 0: no policy, value
or KL term on them, and GAE passes over them. Each micro-batch of rollouts is drawn by its own sampler
call seeded by (seed, iteration, micro-batch): the global batch is the same for any split over ranks
× micro-steps, and a resumed run redraws it.

The options (ppo_family.py, chosen once in setup): a reward model (RLHF) and a critic started from
it, the reward modes (process, RLVP), an adaptive β, k3, an early stop on the KL, π_old recomputed.
"""

import copy
import dataclasses
import math
from types import SimpleNamespace

import torch
import torch.nn as nn

import ppo_family as family
from nanopost.checkpoints import load_reference
from nanopost.distributed import all_reduce_sum, role_memory_gib, seeded_rng, shard
from nanopost.evaluation import evaluate_policy
from model import GPT, ScalarHeadGPT, kl_estimate, sequence_logprobs, token_logprobs_and_entropy
from nanopost.passports import ppo_passport, unparsed, verifier_check, write_passport
from nanopost.rollouts import last_response_column, old_logprobs_mode, rollouts

starts_from = {"init_from": "sft"}  # RL selects among what a trained policy does: no random start
on_policy = True  # the loss sees the function the sampler used for π_old; every rank scores alike
defaults = dict(
    prompt_pool=20000,          # train-split problems the rollouts draw their prompts from
    group_size=1,               # responses per prompt (batch_size must be a multiple)
    minibatches=2,              # optimizer steps per epoch; rollout batch = minibatches × ranks × accum × batch_size
    ppo_epochs=2,               # passes over each rollout batch
    temperature=1.0,            # sampling temperature; every log-prob is taken at it
    clip_eps=0.2,               # ε of the clipped surrogate
    value_clip=0.2,             # ε_v of the clipped value loss
    vf_coef=0.5,                # c_v
    gamma=1.0,                  # GAE's discount γ; 1 is usual for LLMs (the return is the outcome, not its speed)
    lam=0.95,                   # GAE's λ: bias (0, one-step TD) against variance (1, the Monte Carlo return)
    kl_coef=0.05,               # β of the KL penalty in the reward (the initial β when adaptive)
    eval_samples=8,             # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
    **family.OPTIONS,
    # shared keys with RL values: far below SFT's lr, since every Adam step moves all weights of
    # policy and critic (the first ones are sign steps, hence the warmup). On the old all-worked task
    # lr 1e-4 drove the KL to the reference to 1.4 nats per response within 30 iterations and accuracy
    # fell; at 3e-5 the default task's policy switches to worked answers within 20 iterations (README).
    learning_rate=3e-5, min_lr=3e-5, warmup_iters=5, max_iters=40, eval_interval=20, log_interval=1,
)


# ----------------------------------------------------------------------------------------------
# The models and the run's setup

class PolicyAndCritic(nn.Module):
    """π_θ and V_ψ as one module: forward(ids) -> (logits, values)."""

    def __init__(self, policy, critic):
        super().__init__()
        self.policy, self.critic = policy, critic

    def forward(self, ids):
        return self.policy(ids), self.critic(ids)


def wrap_model(run, model):
    """The policy (the loaded model) and the critic: the same backbone, copied, with a zero head, so
    that V = 0 everywhere at first (no random values in the first advantages); it exists for every
    reward source (the verifier has no network to copy) and sees text the way the policy does."""
    if not isinstance(model, GPT):
        raise ValueError(f"--algo ppo trains a language model; init_from={run.cfg['init_from']!r} is a scalar model")
    if run.cfg["critic_init"] == "reward_model":
        return PolicyAndCritic(model, family.reward_model_critic(run))
    critic = ScalarHeadGPT(copy.deepcopy(model))
    nn.init.zeros_(critic.head.weight)
    return PolicyAndCritic(model, critic)


def setup(run, saved):
    """π_ref, the prompts, β (the checkpoint's when resuming: it may adapt) and the options, chosen
    once: each state.X is PPO's own function or the option's from ppo_family.py."""
    cfg = run.cfg
    family.check_config(run)
    state = SimpleNamespace(reference=load_reference(run), reward_model=None,
                            kl_coef=saved["kl_coef"] if saved else cfg["kl_coef"],
                            train_problems=run.env.problems("train", cfg["prompt_pool"], seed=0),
                            verifier_check=verifier_check(run.env, run.env.verify))
    state.reward = lambda roll: roll.verified  # r(x, y): the verifier's 0/1
    if cfg["reward"] == "rm":
        state.reward_model, state.reward = family.reward_model_score(run)
    old_logprobs = old_logprobs_mode(run)
    state.old_logprobs = family.recomputed_old_logprobs if old_logprobs == "recompute" else sampler_old_logprobs
    state.token_rewards, state.signals = ((shaped_rewards_of, lambda roll: None) if cfg["reward_mode"] == "outcome"
                                          else family.mode_rewards(run, shaped_rewards))
    state.next_kl_coef = family.adaptive_kl_coef(cfg) if cfg["kl_target"] > 0 else (lambda kl_coef, kl: kl_coef)
    print_memory(run, state)
    write_passport(run, ppo_passport(run, state.verifier_check, old_logprobs))
    return state


def state_dict(run, state):
    return {"kl_coef": state.kl_coef}  # (β adapts: a resumed run goes on from the interrupted one's)


def print_memory(run, state):
    """The memory anatomy of this run's roles (M14 §10: 16 B/param trained, 2 B/param frozen bf16)."""
    if not run.master:
        return
    roles = [("policy", role_memory_gib(run.raw_model.policy, True)),
             ("critic", role_memory_gib(run.raw_model.critic, True)),
             ("reference", role_memory_gib(state.reference, False))]
    if state.reward_model is not None:
        roles.append(("reward model", role_memory_gib(state.reward_model, False)))
    total = sum(g for _, g in roles)
    print("ppo memory, persistent states only (M14 §10: 16 B/param trained, 2 B/param frozen bf16): "
          + " + ".join(f"{name} {g:.4g}" for name, g in roles) + f" = {total:.4g} GiB; critic {roles[1][1] / total:.0%}")


# ----------------------------------------------------------------------------------------------
# Rollouts -> PPO micro-batches

@dataclasses.dataclass
class Batch:
    """One micro-batch of PPO rollouts: what score_micro_batch takes from the networks, then what
    batches() adds. Per-token tensors are (N, T-1), aligned with the targets ids[:, 1:]; per-row (N,).
    The loss reads ids, mask, old_logprobs, old_values, advantages and returns."""
    ids: torch.Tensor                      # (N, T) prompt + response, right-padded
    mask: torch.Tensor                     # (N, T-1) 1 on sampled response tokens
    old_logprobs: torch.Tensor             # π_old: the sampler's, or one policy forward
    old_values: torch.Tensor               # V_old: one critic forward
    reward: torch.Tensor = None            # (N,) r(x, y): the training reward (the verifier's, or the reward model's)
    verified: torch.Tensor = None          # (N,) the verifier's reward, 1 or 0
    ref_logprobs: torch.Tensor = None      # π_ref's, when the KL penalty reads them
    signals: torch.Tensor = None           # reward_mode process | rlvp | path: its per-token rewards
    kl: torch.Tensor = None                # k_t to π_ref, 0 where π_ref is not read (batches)
    advantages: torch.Tensor = None        # GAE, then whitened over the global batch (batches)
    returns: torch.Tensor = None           # the critic's targets (batches)
    # logged only
    sampler_logprobs: torch.Tensor = None  # the sampler's own log-probs (sampler_logprob_gap)
    lengths: torch.Tensor = None           # (N,) response lengths, float
    truncated: torch.Tensor = None         # (N,) 1.0 where max_new_tokens cut the response
    shows_work: torch.Tensor = None        # (N,) 1.0 where the response shows its work
    parse_error: torch.Tensor = None       # (N,) 1.0 where the answer did not parse
    decode_time: float = 0.0


def sampler_old_logprobs(run, roll):
    """(π_old, V_old): the sampler's own log-probs, which equal a training forward's (fp32), and one
    forward of the critic alone."""
    return roll.old_logprobs, run.raw_model.critic(roll.ids[:, :-1])


@torch.no_grad()
def score_micro_batch(run, state, problems, seed):
    """Roll out one micro-batch and take everything PPO needs from frozen or current networks:
    π_old log-probs and V_old, π_ref log-probs (when the KL penalty is on), sequence rewards."""
    cfg = run.cfg
    roll = rollouts(run, run.raw_model.policy, problems, cfg["group_size"], temperature=cfg["temperature"], seed=seed)
    ids, mask = roll.ids, roll.mask
    with run.autocast:
        old_logprobs, values = state.old_logprobs(run, roll)
        ref_logprobs = sequence_logprobs(state.reference, ids, cfg["temperature"]) * mask if scores_reference(state) else None
        reward = state.reward(roll)
    return Batch(ids=ids, mask=mask, old_logprobs=old_logprobs, old_values=values.float() * mask, reward=reward,
                 verified=roll.verified, ref_logprobs=ref_logprobs, signals=state.signals(roll),
                 sampler_logprobs=roll.old_logprobs, lengths=roll.lengths.float(), truncated=roll.truncated.float(),
                 shows_work=torch.tensor([float(run.env.shows_work(t)) for t in roll.texts], device=ids.device),
                 parse_error=torch.tensor([float(unparsed(run.env, t)) for t in roll.texts], device=ids.device),
                 decode_time=roll.decode_time)


def scores_reference(state):
    """Whether the rollouts need π_ref's log-probs: only the KL penalty reads them (β = 0 stays 0
    under the adaptive controller, which multiplies it)."""
    return state.kl_coef != 0


def batches(run, state, it):
    """Roll out this rank's share of the rollout batch, compute advantages and the figures; the
    ppo_epochs × minibatches optimizer steps (stop_early may end them sooner, on every rank alike)."""
    cfg = run.cfg
    accum, bs = cfg["gradient_accumulation_steps"], cfg["batch_size"]
    G, K = cfg["group_size"], cfg["minibatches"]
    n_micro = K * accum  # this rank's micro-batches; step k uses micro-batches k·accum ... (k+1)·accum − 1
    rng = seeded_rng(run, it)
    picks = rng.integers(0, len(state.train_problems), run.world_size * n_micro * bs // G)
    seeds = rng.integers(0, 2**31, run.world_size * n_micro).tolist()
    problems = shard([state.train_problems[i] for i in picks], run, n_micro, bs // G)
    seeds = [s for [s] in shard(seeds, run, n_micro, 1)]
    micro = [score_micro_batch(run, state, p, s) for p, s in zip(problems, seeds)]

    for mb in micro:
        mb.kl = (kl_estimate(mb.old_logprobs, mb.ref_logprobs, cfg["kl_estimator"]) * mb.mask
                 if mb.ref_logprobs is not None else torch.zeros_like(mb.mask))
        rewards = state.token_rewards(mb, state.kl_coef)  # r_t = −β·k_t (+ r(x, y) at the last token)
        mb.advantages, mb.returns = gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])

    sums = global_sums(run, micro)
    mean = lambda key: sums[key] / sums["tokens"]  # per response token
    per_seq = lambda key: sums[key] / sums["sequences"]
    adv_mean, adv_var, return_var = mean("adv"), mean("adv2") - mean("adv") ** 2, mean("ret2") - mean("ret") ** 2
    for mb in micro:  # whitening over the global batch: the same shift and scale on every rank
        mb.advantages = (mb.advantages - adv_mean) / math.sqrt(max(adv_var, 0.0) + 1e-8) * mb.mask
    figures = dict(kl_coef=state.kl_coef, verifier_acc=per_seq("verified"), len_mean=per_seq("length"),
                   truncated_frac=per_seq("truncated"), sampler_logprob_gap=mean("sampler_gap"),
                   decode_time=sums["decode_time"] / run.world_size, work_frac=per_seq("work"),
                   parse_error_rate=per_seq("parse_errors"),
                   verifier_error_rate=state.verifier_check["verifier_error_rate"], ppo_steps=0)
    if return_var > 0:  # 1 − Var(R − V_old)/Var(R); R − V_old is the raw advantage on response tokens
        figures["explained_var"] = 1 - adv_var / return_var
    if state.reward_model is not None:
        figures["rm_score"] = per_seq("reward")
    if micro[0].ref_logprobs is not None:  # β for the next iteration (adaptive: from this batch's global KL)
        figures["kl_ref"] = per_seq("kl")
        state.kl_coef = state.next_kl_coef(state.kl_coef, figures["kl_ref"])

    steps = [micro[k * accum:(k + 1) * accum] for k in range(K)]
    order = [k for epoch in range(cfg["ppo_epochs"]) for k in seeded_rng(run, it, epoch + 1).permutation(K)]
    return [steps[k] for k in order], figures


stop_early = family.stop_early  # after each optimizer step: counts ppo_steps; early_stop_kl ends the iteration


def global_sums(run, micro):
    """Sums over every rank's micro-batches of the figures whitening and the logs need."""
    figures = dict(
        tokens=lambda mb: mb.mask, sequences=lambda mb: torch.ones_like(mb.reward),
        adv=lambda mb: mb.advantages, adv2=lambda mb: mb.advantages ** 2,
        ret=lambda mb: mb.returns * mb.mask, ret2=lambda mb: mb.returns ** 2 * mb.mask,
        kl=lambda mb: mb.kl, reward=lambda mb: mb.reward, verified=lambda mb: mb.verified,
        length=lambda mb: mb.lengths, truncated=lambda mb: mb.truncated,
        sampler_gap=lambda mb: (mb.sampler_logprobs - mb.old_logprobs).abs() * mb.mask,
        decode_time=lambda mb: torch.tensor(mb.decode_time), work=lambda mb: mb.shows_work,
        parse_errors=lambda mb: mb.parse_error)
    local = {name: sum(float(f(mb).double().sum()) for mb in micro) for name, f in figures.items()}
    return all_reduce_sum(local, run)


# ----------------------------------------------------------------------------------------------
# The pieces of the loss, each on (N, T-1) per-token tensors aligned with ids[:, 1:]

def shaped_rewards(reward, kl, mask, kl_coef):
    """r_t = −β·k_t on every response token, plus the sequence reward at the last response token."""
    rewards = -kl_coef * kl * mask
    rewards[torch.arange(len(reward), device=mask.device), last_response_column(mask)] += reward
    return rewards


def shaped_rewards_of(mb, kl_coef):
    """reward_mode=outcome: shaped_rewards of a micro-batch, r(x, y) at the last token."""
    return shaped_rewards(mb.reward, mb.kl, mb.mask, kl_coef)


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


def loss(run, state, model, batch):
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


def evaluate(run, state, it):
    """The policy's greedy held-out and OOD accuracy (the true task metric, whatever the training
    reward); on sampled held-out answers their accuracy, pass@k and the KL to π_ref."""
    return evaluate_policy(run, run.raw_model.policy, it, state.reference, run.cfg["temperature"])[0]
