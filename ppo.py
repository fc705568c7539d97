"""
PPO: RLHF with a critic (Schulman et al. 2017, arXiv:1707.06347; the RLHF recipe of Ouyang et al. 2022,
arXiv:2203.02155). SPEC §3 "PPO / classical RLHF", §5 (memory), §6; M14 §4, §10, §13; Ch7 "RLHF".

    python train.py --algo ppo --init_from=out/sft                                    # RLVR: the verifier's reward
    python train.py --algo ppo_rm --init_from=out/sft --reward_model=out/rm           # RLHF: lab/ppo_rm.py

Objective: max_θ E_{x, y~π_θ}[ r(x, y) ] − β·KL(π_θ(·|x) ‖ π_ref(·|x)).

Four roles, four separate copies here (the textbook configuration of M14 §10): the policy π_θ
(trained, from init_from, the SFT model); the reference π_ref (a frozen copy of init_from, read once
per rollout batch when β > 0); the reward r (the environment's verifier, 1 or 0 per response); the
critic V_ψ (trained, a scalar head on a copy of the SFT backbone, one value per prefix). Policy and
critic are one module (PolicyAndCritic) trained by the loop's one optimizer: one forward gives both,
as DDP wants.

One iteration (batches() does steps 1-4, loss() step 5):
 1. Sample: rollouts of the current policy (π_old) on train prompts, scored: r(x, y) by the verifier,
    π_old's log-probs, the critic's V_old, π_ref's log-probs.
 2. The KL sits in the reward, not in the loss [Ch7 "RLHF" (1)]: per response token
        r_t = −β·k_t  (+ r(x, y) at the last token),   k_t = log π_old(y_t) − log π_ref(y_t)   (k1)
 3. GAE over response tokens: δ_t = r_t + γ·V(s_{t+1}) − V(s_t),  Â_t = δ_t + γλ·Â_{t+1}, the value after
    the last token is 0; value targets R_t = Â_t + V_old(s_t).
 4. Â whitened over the global batch (all ranks); inner_epochs passes over `minibatches` optimizer
    steps (order shuffled per epoch).
 5. Each step minimises
        L_t = −min(ρ_t·Â_t, clip(ρ_t, 1−ε, 1+ε)·Â_t)                     ρ_t = π_θ(y_t)/π_old(y_t)
              + c_v·½·max((V_t − R_t)², (V_old,t + clip(V_t − V_old,t, −ε_v, ε_v) − R_t)²)
    averaged over the response tokens of the global minibatch (token-level aggregation).
Every log-prob (policy, π_old, reference) and the entropy are taken at the sampler's temperature,
with dropout off (on_policy), so that ρ = 1 exactly before the first update. A tool's result tokens
have mask 0: no policy, value or KL term on them, and GAE passes over them. Each micro-batch of
rollouts is drawn by its own sampler call seeded by (seed, iteration, micro-batch): the global batch
is the same for any split over ranks × micro-steps, and a resumed run redraws it.

The lab changes one piece each (python train.py --algo NAME): ppo_rm (a reward model's score, RLHF),
ppo_k3 (the k3 estimator in the reward), ppo_adaptive_kl (β towards a target KL), ppo_early_stop (an
iteration's steps end once KL(π_old‖π_θ) passes a bound), ppo_process and ppo_rlvp (per-token rewards).
"""

import copy
import dataclasses
import math
from types import SimpleNamespace

import torch
import torch.nn as nn

from nanopost.checkpoints import load_reference
from nanopost.distributed import all_reduce_sum, role_memory_gib, seeded_rng, shard
from nanopost.evaluation import evaluate_policy
from model import GPT, ScalarHeadGPT, clipped_surrogate, kl_estimate, sequence_logprobs, token_logprobs, token_logprobs_and_entropy
from nanopost.passports import ppo_passport, unparsed, verifier_check, write_passport
from nanopost.rollouts import Rollout, last_response_column, old_logprobs_mode, rollouts
from nanopost.token_records import keep_rollouts

starts_from = {"init_from": "sft"}  # RL selects among what a trained policy does: no random start
on_policy = True  # the loss sees the function the sampler used for π_old; every rank scores alike
defaults = dict(
    prompt_pool=20000,          # train-split problems the rollouts draw their prompts from
    group_size=1,               # responses per prompt (batch_size must be a multiple)
    minibatches=2,              # optimizer steps per epoch; rollout batch = minibatches × ranks × accum × batch_size
    inner_epochs=2,             # passes over each rollout batch
    temperature=1.0,            # sampling temperature; every log-prob is taken at it
    clip_eps=0.2,               # ε of the clipped surrogate
    value_clip=0.2,             # ε_v of the clipped value loss
    vf_coef=0.5,                # c_v
    gamma=1.0,                  # GAE's discount γ; 1 is usual for LLMs (the return is the outcome, not its speed)
    lam=0.95,                   # GAE's λ: bias (0, one-step TD) against variance (1, the Monte Carlo return)
    kl_coef=0.05,               # β of the KL penalty in the reward
    old_logprobs="auto",        # π_old: sampler | recompute (a training forward) | auto (recompute under autocast, else sampler)
    eval_samples=8,             # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
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
    that V = 0 everywhere at first (no random values in the first advantages); it sees text the way
    the policy does."""
    if not isinstance(model, GPT):
        raise ValueError(f"--algo {run.cfg['algo']} trains a language model; init_from={run.cfg['init_from']!r} "
                         f"is a scalar model")
    critic = ScalarHeadGPT(copy.deepcopy(model))
    nn.init.zeros_(critic.head.weight)
    return PolicyAndCritic(model, critic)


def new_state(run):
    """π_ref, β, the pool of train prompts, and the verifier's own error rate (logged)."""
    cfg = run.cfg
    if cfg["old_logprobs"] not in ("auto", "sampler", "recompute"):
        raise ValueError(f"old_logprobs={cfg['old_logprobs']!r}: choose auto, sampler or recompute")
    if cfg["batch_size"] % cfg["group_size"]:
        raise ValueError(f"batch_size={cfg['batch_size']} must be a multiple of group_size={cfg['group_size']}")
    return SimpleNamespace(reference=load_reference(run), kl_coef=cfg["kl_coef"],
                           train_problems=run.env.problems("train", cfg["prompt_pool"], seed=0),
                           verifier_check=verifier_check(run.env, run.env.verify))


def setup(run, saved):
    state = new_state(run)
    print_memory(run, reference=state.reference)
    write_passport(run, ppo_passport(run, state.verifier_check, old_logprobs_mode(run)))
    return state


def print_memory(run, **frozen):
    """The memory anatomy of this run's roles (M14 §10: 16 B/param trained, 2 B/param frozen bf16)."""
    if not run.master:
        return
    roles = [("policy", role_memory_gib(run.raw_model.policy, True)),
             ("critic", role_memory_gib(run.raw_model.critic, True))]
    roles += [(name.replace("_", " "), role_memory_gib(model, False)) for name, model in frozen.items()]
    total = sum(g for _, g in roles)
    print("ppo memory, persistent states only (M14 §10: 16 B/param trained, 2 B/param frozen bf16): "
          + " + ".join(f"{name} {g:.4g}" for name, g in roles) + f" = {total:.4g} GiB; critic {roles[1][1] / total:.0%}")


# ----------------------------------------------------------------------------------------------
# One iteration: sample and score, the per-token rewards, GAE, whitening, the optimizer steps

def batches(run, state, it):
    """This rank's share of the rollout batch with its advantages; the figures; the inner_epochs ×
    minibatches optimizer steps."""
    cfg = run.cfg
    micro = sample_and_score(run, state, it)                                # 1. rollouts, r(x, y), π_old, V_old, π_ref
    for mb in micro:
        mb.kl = k1(mb)                                                      # k_t = log π_old(y_t) − log π_ref(y_t)
        rewards = shaped_rewards(mb.reward, mb.kl, mb.mask, state.kl_coef)  # 2. r_t = −β·k_t (+ r(x, y) at the end)
        mb.advantages, mb.returns = gae(rewards, mb.old_values, mb.mask, cfg["gamma"], cfg["lam"])  # 3. Â_t, R_t
    return whitened_steps(run, state, it, micro)                            # 4. Â whitened; the steps, the figures


@dataclasses.dataclass
class Batch:
    """One micro-batch of PPO rollouts: what score_micro_batch takes from the networks, then what
    batches() adds. Per-token tensors are (N, T-1), aligned with the targets ids[:, 1:]; per-row (N,).
    The loss reads ids, mask, old_logprobs, old_values, advantages and returns."""
    ids: torch.Tensor                      # (N, T) prompt + response, right-padded
    mask: torch.Tensor                     # (N, T-1) 1 on sampled response tokens
    old_logprobs: torch.Tensor             # π_old: the sampler's, or one policy forward
    old_values: torch.Tensor               # V_old: one critic forward
    reward: torch.Tensor = None            # (N,) r(x, y): the verifier's 1 or 0
    ref_logprobs: torch.Tensor = None      # π_ref's, when the KL penalty reads them (β > 0)
    kl: torch.Tensor = None                # k_t to π_ref, 0 where π_ref is not read (batches)
    advantages: torch.Tensor = None        # GAE, then whitened over the global batch (batches)
    returns: torch.Tensor = None           # the critic's targets (batches)
    rollout: Rollout = None                # what was sampled: its texts, lengths and timings (the figures)


def sample_and_score(run, state, it):
    """This rank's micro-batches of the iteration's rollout batch: prompts drawn by (seed, it) over
    the global batch, each micro-batch sampled by its own seed, then scored (score_micro_batch)."""
    cfg = run.cfg
    n_micro = cfg["minibatches"] * cfg["gradient_accumulation_steps"]  # this rank's; step k takes k·accum ... (k+1)·accum − 1
    per_micro = cfg["batch_size"] // cfg["group_size"]  # prompts per micro-batch
    rng = seeded_rng(run, it)
    picks = rng.integers(0, len(state.train_problems), run.world_size * n_micro * per_micro)
    seeds = rng.integers(0, 2**31, run.world_size * n_micro).tolist()
    problems = shard([state.train_problems[i] for i in picks], run, n_micro, per_micro)
    seeds = [s for [s] in shard(seeds, run, n_micro, 1)]
    return [score_micro_batch(run, state, p, s) for p, s in zip(problems, seeds)]


@torch.no_grad()
def score_micro_batch(run, state, problems, seed):
    """Roll out one micro-batch and score it: the verifier's r(x, y), π_old and V_old, and π_ref's
    log-probs when the KL penalty is on (β > 0)."""
    cfg = run.cfg
    roll = rollouts(run, run.raw_model.policy, problems, cfg["group_size"], temperature=cfg["temperature"], seed=seed)
    with run.autocast:
        old_logprobs, values = old_logprobs_and_values(run, roll)
        ref_logprobs = sequence_logprobs(state.reference, roll.ids, cfg["temperature"]) * roll.mask if state.kl_coef else None
    return Batch(ids=roll.ids, mask=roll.mask, old_logprobs=old_logprobs, old_values=values.float() * roll.mask,
                 reward=roll.verified, ref_logprobs=ref_logprobs, rollout=roll)


def old_logprobs_and_values(run, roll):
    """(π_old, V_old): the sampler's own log-probs (a training forward's, in fp32) and one critic
    forward; with old_logprobs=recompute (auto: under a GPU's autocast, whose bf16 sampler rounds
    differently) one forward of policy and critic, the loss's (the gap: sampler_logprob_gap)."""
    if old_logprobs_mode(run) == "recompute":
        logits, values = run.raw_model(roll.ids[:, :-1])
        return token_logprobs(logits, roll.ids[:, 1:], run.cfg["temperature"]) * roll.mask, values
    return roll.old_logprobs, run.raw_model.critic(roll.ids[:, :-1])


def k1(mb):
    """k_t = log π_old(y_t) − log π_ref(y_t) on response tokens (k1: unbiased, may be negative); 0
    everywhere when β = 0 left π_ref unread."""
    if mb.ref_logprobs is None:
        return torch.zeros_like(mb.mask)
    return (mb.old_logprobs - mb.ref_logprobs) * mb.mask


def shaped_rewards(reward, kl, mask, kl_coef):
    """r_t = −β·k_t on every response token, plus the sequence reward at the last response token."""
    rewards = -kl_coef * kl * mask
    rewards[torch.arange(len(reward), device=mask.device), last_response_column(mask)] += reward
    return rewards


def gae(rewards, values, mask, gamma, lam):
    """Generalised advantage estimation over each row's response tokens (mask 1), right to left:
        δ_t = r_t + γ·V_{t+1} − V_t,    Â_t = δ_t + γλ·Â_{t+1},    V = 0 after the last response token.
    Positions with mask 0 inside a response (a tool's result, forced into it) are not actions: the
    recursion passes over them, so the token before a call sees the rewards after its result.
    Returns (advantages, value targets R_t = Â_t + V_t), zero advantage off the response."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])     # Â_{t+1}
    next_value = torch.zeros_like(rewards[:, 0])  # V_{t+1}
    for t in reversed(range(rewards.size(1))):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(on, delta + gamma * lam * running, running)
        advantages[:, t] = running * mask[:, t]
        next_value = torch.where(on, values[:, t], next_value)
    return advantages, advantages + values


def whitened_steps(run, state, it, micro):
    """Â ← (Â − mean) / std over the global batch (the same shift and scale on every rank); the
    iteration's figures; the optimizer steps: inner_epochs passes over `minibatches` steps of
    gradient_accumulation_steps micro-batches each, in an order shuffled per epoch by (seed, it, epoch)."""
    cfg, accum, K = run.cfg, run.cfg["gradient_accumulation_steps"], run.cfg["minibatches"]
    sums = global_sums(run, micro)
    mean = {key: sums[key] / sums["tokens"] for key in ("adv", "adv2", "ret", "ret2")}  # per response token
    adv_var, return_var = mean["adv2"] - mean["adv"] ** 2, mean["ret2"] - mean["ret"] ** 2
    for mb in micro:
        mb.advantages = (mb.advantages - mean["adv"]) / math.sqrt(max(adv_var, 0.0) + 1e-8) * mb.mask
    n = sums["sequences"]
    figures = dict(kl_coef=state.kl_coef, verifier_acc=sums["verified"] / n, len_mean=sums["length"] / n,
                   truncated_frac=sums["truncated"] / n, sampler_logprob_gap=sums["sampler_gap"] / sums["tokens"],
                   time_decode=sums["time_decode"] / run.world_size, work_frac=sums["work"] / n,
                   parse_error_rate=sums["parse_errors"] / n,
                   verifier_error_rate=state.verifier_check["verifier_error_rate"], ppo_steps=cfg["inner_epochs"] * K)
    if return_var > 0:  # 1 − Var(R − V_old)/Var(R); R − V_old is the raw advantage on response tokens
        figures["explained_var"] = 1 - adv_var / return_var
    if micro[0].ref_logprobs is not None:
        figures["kl_ref"] = sums["kl"] / n  # per response
    keep_rollouts(run, it, [mb.rollout for mb in micro], advantage=[mb.advantages for mb in micro],  # for report.py
                  value=[mb.old_values for mb in micro], value_target=[mb.returns for mb in micro],
                  logp_ref=[mb.ref_logprobs for mb in micro])
    steps = [micro[k * accum:(k + 1) * accum] for k in range(K)]
    order = [k for epoch in range(cfg["inner_epochs"]) for k in seeded_rng(run, it, epoch + 1).permutation(K)]
    return [steps[k] for k in order], figures


def global_sums(run, micro):
    """Sums over every rank's micro-batches of what the whitening and the figures need."""
    def total(tensors):
        return sum(float(t.double().sum()) for t in tensors)
    rolls = [mb.rollout for mb in micro]
    texts = [t for roll in rolls for t in roll.texts]
    local = dict(tokens=total(mb.mask for mb in micro), sequences=float(len(texts)),
                 adv=total(mb.advantages for mb in micro), adv2=total(mb.advantages ** 2 for mb in micro),
                 ret=total(mb.returns * mb.mask for mb in micro), ret2=total(mb.returns ** 2 * mb.mask for mb in micro),
                 kl=total(mb.kl for mb in micro), verified=total(roll.verified for roll in rolls),
                 length=total(roll.lengths for roll in rolls), truncated=total(roll.truncated for roll in rolls),
                 sampler_gap=total((mb.rollout.old_logprobs - mb.old_logprobs).abs() * mb.mask for mb in micro),
                 time_decode=sum(roll.time_decode for roll in rolls), work=float(sum(map(run.env.shows_work, texts))),
                 parse_errors=float(sum(unparsed(run.env, t) for t in texts)))
    return all_reduce_sum(local, run)


# ----------------------------------------------------------------------------------------------
# The loss: the clipped surrogate and the clipped value loss, per token

def clipped_value_loss(values, old_values, returns, value_clip):
    """Per-token ½·max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²): the critic cannot move
    further than ε_v from its rollout-time value per PPO step and profit from it."""
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def loss(run, state, model, batch):
    """L_t = −min(ρ_t·Â_t, clip(ρ_t, 1−ε, 1+ε)·Â_t) + c_v·(the clipped value loss)_t, summed over the
    micro-batch's response tokens (the loop divides by the global minibatch's count)."""
    cfg = run.cfg
    ids, mask = batch.ids, batch.mask
    logits, values = model(ids[:, :-1])
    logprobs, entropy = token_logprobs_and_entropy(logits, ids[:, 1:], cfg["temperature"])
    ratio = torch.exp(logprobs - batch.old_logprobs)  # ρ_t = π_θ/π_old
    policy_loss, clipped = clipped_surrogate(ratio, batch.advantages, mask > 0, cfg["clip_eps"], cfg["clip_eps"])
    value_loss = clipped_value_loss(values.float(), batch.old_values, batch.returns, cfg["value_clip"])
    n = mask.sum()
    loss_sum = ((policy_loss + cfg["vf_coef"] * value_loss) * mask).sum()
    with torch.no_grad():
        approx_kl = (kl_estimate(batch.old_logprobs, logprobs, "k3") * mask).sum()  # KL(π_old‖π_θ)
        # clip_frac: share of tokens where the clipped term is the active one (no gradient from them)
        metrics = dict(policy_loss=(policy_loss * mask).sum(), value_loss=(value_loss * mask).sum(),
                       clip_frac=clipped.sum(), approx_kl=approx_kl,
                       entropy=(entropy * mask).sum())
    return loss_sum, n, {**{k: v / n for k, v in metrics.items()}, "tokens": n}  # tensors: read once per step


def evaluate(run, state, it):
    """The policy's greedy held-out and OOD accuracy (the true task metric, whatever the training
    reward); on sampled held-out answers their accuracy, pass@k and the KL to π_ref."""
    return evaluate_policy(run, run.raw_model.policy, it, state.reference, run.cfg["temperature"])[0]
