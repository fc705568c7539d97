"""
The GRPO family's options, beside grpo.py (which is GRPO itself): grpo.setup chooses among them once,
and grpo's core path calls what it chose. The formulas in full: docs/grpo.md, "The family's options,
in detail". SPEC §3 (REINFORCE, RLOO, GRPO, DAPO, process rewards, RLVP), §6 (the monitors).

  the advantages  estimator: reinforce (a batch-mean baseline) | rloo (leave-one-out) | grpo | dr_grpo
                  (no std); adv_scale: group | batch (REINFORCE++) | none; reward_mode: process (one
                  advantage per token) | rlvp (A = Â(O) + β·Â(Φ)) | path (rewards.py)
  the reward      DAPO's overlong penalty; kl=k1_reward folds −β·Σ_t log(π_old/π_ref) into it
  the groups      on_degenerate: drop | raise (zeros is grpo's own); DAPO's dynamic sampling refills
                  dropped groups with fresh prompts
  the loss        ratio_level=sequence (GSPO), policy_loss=cispo (CISPO), tis_cap (truncated importance
                  sampling), loss_agg token_mean (DAPO) | seq_mean_token_sum_norm (Dr. GRPO), kl=off
  the rollouts    prompt_sampling=edge (a pool, prompts at the edge of competence first); staleness=1
                  (one-step-off rollouts in a second thread); old_logprobs=recompute (π_old from a
                  training forward, not the sampler's numbers); mask_truncated (DAPO's overlong filter)
  entropy         clip_cov (verl's Clip-Cov), top_entropy_quantile (TRL's mask of low-entropy tokens)
  break_it        a classic failure on purpose, each with the monitor that must catch it (BREAKS)
The figures every iteration logs and the monitors that read them are monitors.py's.
"""

import dataclasses
import functools
import re
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import torch

from checkpoints import frozen
from distributed import all_reduce_sum, seeded_rng
from rewards import REWARD_KEYS, check_reward_mode, path_signals, token_rewards
from rollouts import layout, old_logprobs_mode, score_tokens, shard_problems, shard_size

# --break_it: a classic failure wired in on purpose (break_it, below), and the monitor (monitors.ALARMS) that names
# it; docs/failures.md has each one's symptom, figure, fix and the public threads where it was met
BREAKS = dict(
    fp8_sampler="ratio_drift",          # the rollouts from an FP8 (e4m3) copy of the weights
    sampler_temperature="ratio_drift",  # the sampler divides the logits by T = 0.7, the trainer scores at T = 1
    top_p_uncorrected="ratio_drift",    # top-p / top-k sampling, the trainer scoring the whole softmax
    retokenize="retokenized",           # each transcript decoded to text and encoded again before training
    prompt_format="parse_errors",       # the RL prompt's template differs from SFT's: it prefills "Answer:"
    kl_twice="kl_twice",                # −β·KL in the reward and +β·k3 in the loss
    nan_logprob="nonfinite",            # −inf on 1% of the sampler's log-probs, unguarded
    shifted_advantages="misaligned_advantages",  # each group given the previous group's advantages
    all_equal="degenerate_groups",      # every reward 0 (a task out of reach)
    length_bonus="length_bias",         # +0.01 reward per response token
    format_exploit="verifier_errors",   # the right number anywhere in the response passes
)
SAMPLER_ONLY_TEMPERATURE = 0.7  # break_it=sampler_temperature's

OPTIONS = dict(
    estimator="grpo",          # reinforce | rloo | grpo | dr_grpo: the baseline the advantage subtracts
    adv_scale="auto",          # auto | group | batch | none: the advantage's divisor (auto: group for grpo, else none)
    loss_agg="seq_mean_token_mean",  # seq_mean_token_mean (GRPO) | token_mean (DAPO) | seq_mean_token_sum_norm (Dr. GRPO)
    ratio_level="token",       # token | sequence (GSPO: one ratio per response, exp of its mean token log-ratio)
    policy_loss="clip",        # clip (PPO's min) | cispo (capped, detached ratio times log π: every token keeps a gradient)
    kl="k3_loss",              # off | k1_reward (−β·KL in the reward) | k3_loss (+β·k3 per token in the loss)
    on_degenerate="zeros",     # a group of equal rewards: drop (out of every sum) | zeros (A = 0, still counted) | raise
    dynamic_sampling_rounds=0, # DAPO: extra rollouts of fresh prompts to refill dropped groups (0 = off)
    overlong_cache=0,          # DAPO: soft length penalty over the last L_cache tokens before the limit (0 = off)
    old_logprobs="auto",       # π_old: sampler (its own log-probs) | recompute (a training forward) | auto (recompute under autocast)
    tis_cap=0.0,               # truncated importance sampling: weight min(π_old/π_sampler, C) per token (needs recompute; 0 = off)
    prompt_sampling="uniform", # uniform (fresh problems) | edge (a fixed pool, prompts with success in the band first)
    prompt_pool=2048,          # edge: the pool's size (prompts come back once it is used up)
    edge_low=0.2,              # edge: the lower end of the band of running success that is drawn first
    edge_high=0.8,             # edge: the upper end of that band
    break_it="none",           # a classic failure on purpose (docs/failures.md): none | fp8_sampler | sampler_temperature |
                               # top_p_uncorrected | retokenize | prompt_format | kl_twice | nan_logprob |
                               # shifted_advantages | all_equal | length_bonus | format_exploit
    mask_truncated=False,      # DAPO's overlong filtering: answers cut by max_new_tokens get no loss term (mask 0)
    clip_cov=0.0,              # Clip-Cov, an entropy control: the share of response tokens with the largest
                               # cov(log π, A) whose policy gradient is cut (0 = off)
    top_entropy_quantile=1.0,  # the policy gradient only on this top share of tokens by entropy (1 = every token)
    share_prompt=True,         # run each prompt once for its G responses, in scoring and in the loss
    staleness=0,               # 0: synchronous; 1: the next rollouts are sampled during the update (one-step-off rollouts)
    **REWARD_KEYS,             # reward_mode and RLVP's β, λ, μ: one definition for grpo and ppo
)

CHOICES = dict(estimator=("reinforce", "rloo", "grpo", "dr_grpo"), adv_scale=("auto", "group", "batch", "none"),
               ratio_level=("token", "sequence"), policy_loss=("clip", "cispo"), prompt_sampling=("uniform", "edge"),
               break_it=("none", *BREAKS),
               loss_agg=("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"),
               kl=("off", "k1_reward", "k3_loss"), on_degenerate=("drop", "zeros", "raise"),
               old_logprobs=("auto", "sampler", "recompute"))


def check_config(run):
    """Every option's value, and the combinations that cannot work, as errors that say why."""
    cfg, world_size = run.cfg, run.world_size
    for key, allowed in CHOICES.items():
        if cfg[key] not in allowed:
            raise ValueError(f"config {key}={cfg[key]!r}: choose from {allowed}")
    P, G = cfg["prompts_per_iter"], cfg["group_size"]  # (each option's own range: options.RANGES)
    if G < 2 and cfg["estimator"] != "reinforce":
        raise ValueError(f"estimator={cfg['estimator']!r} compares responses within a group: group_size must be >= 2")
    shard = cfg["rollout_prompts"] or P // world_size
    if shard < 1 or P % shard or (P // shard) % world_size:
        raise ValueError(f"prompts_per_iter={P} must split into shards of rollout_prompts={shard} prompts, "
                         f"a whole number of shards per each of {world_size} ranks")
    if cfg["minibatches"] > shard * G:
        raise ValueError(f"minibatches={cfg['minibatches']} must be <= rollout_prompts*group_size = {shard * G}")
    if cfg["dynamic_sampling_rounds"] and (cfg["on_degenerate"] != "drop" or cfg["estimator"] == "reinforce"):
        raise ValueError("dynamic sampling refills dropped groups: it needs on_degenerate='drop' and a group estimator")
    if cfg["tis_cap"] and cfg["old_logprobs"] != "recompute":
        raise ValueError(f"tis_cap={cfg['tis_cap']} weighs tokens by π_old/π_sampler: it needs old_logprobs='recompute' "
                         f"(got {cfg['old_logprobs']!r}: with the sampler's own log-probs the two are the same numbers)")
    if cfg["adv_scale"] == "group" and cfg["estimator"] == "reinforce":
        raise ValueError("adv_scale=group needs a group estimator (reinforce has no groups: use batch)")
    if cfg["adv_scale"] == "batch" and cfg["reward_mode"] == "process":
        raise ValueError("adv_scale=batch scales one advantage per response; reward_mode=process has one per token")
    if cfg["prompt_sampling"] == "edge":
        if cfg["staleness"] or cfg["dynamic_sampling_rounds"]:
            raise ValueError("prompt_sampling=edge draws each iteration from the success of the last: it needs "
                             "staleness=0 and dynamic_sampling_rounds=0")
        if cfg["prompt_pool"] < P or cfg["edge_low"] > cfg["edge_high"]:
            raise ValueError(f"prompt_sampling=edge needs prompt_pool >= prompts_per_iter={P} and "
                             f"edge_low <= edge_high")
    if cfg["overlong_cache"] >= cfg["max_new_tokens"]:
        raise ValueError(f"overlong_cache={cfg['overlong_cache']} must be below max_new_tokens={cfg['max_new_tokens']}")
    if cfg["reward_mode"] != "outcome" and cfg["estimator"] == "reinforce":
        raise ValueError(f"reward_mode={cfg['reward_mode']} normalises rewards within a group: choose a group estimator")
    if cfg["reward_mode"] == "process" and (cfg["kl"] == "k1_reward" or cfg["overlong_cache"]):
        raise ValueError("reward_mode=process rewards steps: kl=k1_reward and overlong_cache shape one sequence "
                         "reward and do not apply (use kl=k3_loss or off)")
    if cfg["staleness"] and run.fsdp:
        raise ValueError("staleness=1 samples with a second copy of the weights in a thread: not with --fsdp")
    if cfg["dynamic_sampling_rounds"] and run.lockstep:  # (a rank's extra rounds would be forwards alone)
        raise ValueError("dynamic_sampling_rounds > 0 samples a different number of rounds on each rank: not with "
                         "--fsdp_rollouts=sharded (use gathered)")
    check_reward_mode(cfg, run.env)
    if cfg["break_it"] == "format_exploit" and not isinstance(run.env.problems("train", 1)[0].get("answer"), int):
        raise ValueError(f"break_it=format_exploit looks for the answer's number: env={cfg['env']} has no integer answer")
    if truncation(cfg) and cfg["kl"] == "k3_loss" and cfg["inner_epochs"] * cfg["minibatches"] > 1:
        raise ValueError("top_k / top_p with kl='k3_loss' and several steps per batch: a sampled token that an update "
                         "pushes out of the cut has π_θ = 0 and k3 = π_ref/π_θ − ... infinite (use kl='off' or one step)")
    if cfg["break_it"] == "top_p_uncorrected" and not truncation(cfg):
        raise ValueError("break_it=top_p_uncorrected scores the whole softmax of a truncated sampler: set top_p < 1 "
                         "or top_k > 0")
    if cfg["break_it"] == "kl_twice" and cfg["kl"] != "k3_loss":
        raise ValueError("break_it=kl_twice adds the reward's KL to the loss's: it needs kl='k3_loss'")


# ----------------------------------------------------------------------------------------------
# The advantages: other estimators, scales and reward modes

def advantage_scale(cfg):
    """adv_scale with auto resolved: the group std for grpo, nothing for the other estimators."""
    if cfg["adv_scale"] != "auto":
        return cfg["adv_scale"]
    return "group" if cfg["estimator"] == "grpo" else "none"


def plain_advantages(cfg):
    """Whether the advantages are GRPO's own: (r − mean) / std of the group's outcome rewards."""
    return cfg["estimator"] == "grpo" and cfg["reward_mode"] == "outcome" and advantage_scale(cfg) == "group"


def group_advantages(rewards, estimator, scale=None):
    """(P, G) rewards -> (advantages (P, G), degenerate (P,)) for a group estimator: its baseline,
        rloo     A_i = r_i − (Σ_{j≠i} r_j) / (G − 1)     (leave-one-out: the baseline ignores r_i)
        grpo, dr_grpo   A_i = r_i − mean(r_1..G)       (a mean with r_i in it shrinks the gradient by (G − 1)/G)
    then the group's population std as divisor when scale is "group" (None: what the estimator
    implies; "batch" comes later, over the whole batch). Degenerate groups get exactly 0."""
    degenerate = (rewards == rewards[..., :1]).all(-1)  # (grpo.degenerate_groups)
    G = rewards.size(1)
    scale = scale or advantage_scale(dict(estimator=estimator, adv_scale="auto"))
    if estimator in ("grpo", "dr_grpo"):
        adv = rewards - rewards.mean(1, keepdim=True)
    elif estimator == "rloo":
        if G < 2:
            raise ValueError("rloo needs group_size >= 2 (the others' mean is the baseline)")
        adv = rewards - (rewards.sum(1, keepdim=True) - rewards) / (G - 1)
    else:
        raise ValueError(f"{estimator!r} is not a group estimator")
    if scale == "group":
        adv = adv / torch.where(degenerate[:, None], 1.0, rewards.std(1, correction=0, keepdim=True))
    return torch.where(degenerate[:, None], 0.0, adv), degenerate


def advantages(run):
    """The advantages of the estimators and reward modes besides GRPO's: a function (run, rows) that
    sets rows.advantages (per response, or per token for process) and returns (P,) degenerate."""
    cfg = run.cfg
    G, estimator, scale, mode = cfg["group_size"], cfg["estimator"], advantage_scale(cfg), cfg["reward_mode"]

    def reinforce(run, ro):  # the batch-mean baseline needs the whole batch: batch_advantages
        ro.advantages = torch.zeros_like(ro.reward)
        return torch.zeros(len(ro.reward) // G, dtype=torch.bool)

    def process(run, ro):  # one advantage per token
        steps, ends = token_rewards(run, ro, run.env.step_rewards)
        ro.advantages, degenerate = process_advantages(steps, ends, ro.mask, G, estimator, scale)
        return degenerate

    def rlvp(run, ro):  # path: Φ alone (no outcome channel), the inaction trap
        signals = path_signals(run)
        path = torch.tensor([sum(v for _, v in signals(p, t)) for p, t in zip(ro.problems, ro.texts)],
                            dtype=torch.float32, device=ro.reward.device)  # float even when no row has a signal
        outcome = ro.reward if mode == "rlvp" else torch.zeros_like(ro.reward)
        beta = cfg["rlvp_beta"] if mode == "rlvp" else 1.0
        adv, degenerate = rlvp_advantages(outcome.view(-1, G), path.view(-1, G), estimator, beta, scale)
        ro.advantages = adv.flatten()
        return degenerate

    def estimated(run, ro):  # another group estimator on the outcome
        adv, degenerate = group_advantages(ro.reward.view(-1, G), estimator, scale)
        ro.advantages = adv.flatten()
        return degenerate
    return reinforce if estimator == "reinforce" else dict(process=process, rlvp=rlvp, path=rlvp).get(mode, estimated)


def batch_advantages(run):
    """The advantages that need the whole global batch (summed over ranks), a function (run, shards):
    estimator=reinforce's batch-mean baseline A = r − mean(r over the batch), then adv_scale=batch's
    one std (REINFORCE++); for the others nothing."""
    cfg = run.cfg

    def global_batch(run, shards):
        rewards = torch.cat([b.reward for b in shards])
        if cfg["estimator"] == "reinforce":
            total, n = all_reduce_sum([float(rewards.sum()), len(rewards)], run)
            for b in shards:
                b.advantages = b.reward - total / n
        if advantage_scale(cfg) == "batch":
            scaled = batch_scale([b.advantages for b in shards], [b.mask.sum(1) > 0 for b in shards], run)
            for b, adv in zip(shards, scaled):
                b.advantages = adv
    return global_batch if cfg["estimator"] == "reinforce" or advantage_scale(cfg) == "batch" else (lambda run, shards: None)


def batch_scale(advantages, kept, run):
    """adv_scale=batch: divide by the population std of the advantages of every kept response of
    the global batch (summed over ranks). advantages, kept: lists of this rank's (N,) tensors."""
    a = torch.cat(advantages)[torch.cat(kept)]
    s, sq, n = all_reduce_sum([float(a.sum()), float((a ** 2).sum()), len(a)], run)
    std = max(sq / max(n, 1) - (s / max(n, 1)) ** 2, 0.0) ** 0.5
    return [adv / std if std > 0 else adv for adv in advantages]


def process_advantages(step_rewards, step_ends, mask, group_size, estimator, scale=None):
    """Process supervision as in the GRPO paper (Shao et al. 2024, §4.1.3; SPEC §3 Process vs
    outcome): the step rewards of a group's G responses are normalised together,
        r̃_j = (r_j − mean(R)) / std(R)      R = every step reward of the group (dr_grpo: r_j − mean(R)),
    and a token's advantage sums the normalised rewards of the steps that end at or after it:
        A_t = Σ_{steps j with end(j) ≥ t} r̃_j.
    step_rewards (N, T) hold each step's reward at its last token, step_ends (N, T) bool mark those
    tokens, mask (N, T) the trained tokens; rows are grouped by prompt (N = P·G). Returns
    (advantages (N, T), degenerate (P,): groups whose step rewards are all equal get A = 0)."""
    N, T = step_rewards.shape
    r, on = step_rewards.reshape(-1, group_size * T), step_ends.reshape(-1, group_size * T)
    n = on.sum(1, keepdim=True).clamp(min=1)
    degenerate = (torch.where(on, r, float("-inf")).amax(1) == torch.where(on, r, float("inf")).amin(1)) | ~on.any(1)
    centred = torch.where(on, r - torch.where(on, r, 0.0).sum(1, keepdim=True) / n, 0.0)
    if (scale or advantage_scale(dict(estimator=estimator, adv_scale="auto"))) == "group":
        std = ((centred ** 2).sum(1, keepdim=True) / n).sqrt()
        centred = centred / torch.where(degenerate[:, None], 1.0, std)
    normalised = torch.where(degenerate[:, None], 0.0, centred).reshape(N, T)
    return normalised.flip(1).cumsum(1).flip(1) * mask, degenerate


def rlvp_advantages(outcome, path, estimator, beta, scale=None):
    """RLVP (SPEC §3, "reward the outcome, constrain the process"): R = O + β·Φ with the two channels
    normalised separately, then combined: each goes through the group estimator on its own (grpo:
    z-scored over the group), A = Â(O) + β·Â(Φ), so a dense path signal cannot drown the sparse
    outcome however many actions it counts. outcome, path (P, G). A channel whose group is all equal
    adds 0; the group is degenerate when both are."""
    outcome_adv, outcome_flat = group_advantages(outcome, estimator, scale)
    path_adv, path_flat = group_advantages(path, estimator, scale)
    return outcome_adv + beta * path_adv, outcome_flat & path_flat


def grpo_advantages(rewards, on_degenerate="raise"):
    """The seed's primitive (M14 §13) in torch, the reference the tests hold the advantages to:
    (r − mean) / std with the population std (ddof = 0), per group along the last dimension ((G,)
    or (P, G)). A degenerate group is an error or zeros."""
    if on_degenerate not in ("raise", "zeros"):
        raise ValueError(f"on_degenerate must be 'raise' or 'zeros', got {on_degenerate!r}")
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.float()
    if r.dim() not in (1, 2) or r.size(-1) < 2:
        raise ValueError(f"rewards must be one group (G,) or groups (P, G) with G >= 2, got shape {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite (got NaN or inf)")
    degenerate = (r == r[..., :1]).all(-1)
    if degenerate.any() and on_degenerate == "raise":
        raise ValueError(f"{int(degenerate.sum())} group(s) with all rewards equal: no relative signal "
                         f"(choose on_degenerate='zeros', or drop such groups)")
    centred = r - r.mean(-1, keepdim=True)
    std = r.std(-1, correction=0, keepdim=True)
    return torch.where(degenerate.unsqueeze(-1), 0.0, centred / torch.where(degenerate.unsqueeze(-1), 1.0, std))


# ----------------------------------------------------------------------------------------------
# The reward: DAPO's overlong penalty, the KL in the reward

def shaping(run, kl_in_reward):
    """The reward the advantages see, a function (run, rows, reward, problems): the training reward,
    plus DAPO's soft overlong penalty (overlong_cache) and, with kl_in_reward (kl=k1_reward),
    −β·Σ_t log(π_old/π_ref) (the sequence's log-ratio folded into the reward, γ = 1); with neither,
    the reward as it is."""
    cfg = run.cfg

    def shaped(run, ro, reward, problems):
        # the sampler stops earlier than max_new_tokens when the longest prompt leaves less room
        longest_prompt = max(len(run.tok.prompt_ids(p["prompt"])) for p in problems)
        limit = min(cfg["max_new_tokens"], run.raw_model.config.block_size - longest_prompt)
        reward = reward + overlong_penalty(ro.lengths.cpu(), limit, cfg["overlong_cache"]).to(reward.device)
        if kl_in_reward:
            reward = reward - cfg["kl_coef"] * ((ro.old_logprobs - ro.ref_logprobs) * ro.mask).sum(1)
        return reward
    return shaped if cfg["overlong_cache"] or kl_in_reward else (lambda run, ro, reward, problems: reward)


def overlong_penalty(lengths, limit, cache):
    """DAPO's soft overlong penalty: 0 up to limit − cache tokens, then linear down to −1 at limit."""
    if cache <= 0:
        return torch.zeros(lengths.shape)
    over = (lengths.float() - (limit - cache)).clamp(min=0)
    return -(over / cache).clamp(max=1.0)


# ----------------------------------------------------------------------------------------------
# The groups: drop or raise on a degenerate group; DAPO's dynamic sampling

def drops_groups(cfg):
    """Whether a degenerate group is dropped or an error (else it stays, with A = 0: grpo's own)."""
    return cfg["estimator"] != "reinforce" and cfg["on_degenerate"] in ("drop", "raise")


def fill_groups(run):
    """on_degenerate=raise: an error on the first degenerate group. drop: informative groups only,
    the dropped ones refilled by up to dynamic_sampling_rounds extra rollouts of fresh prompts (DAPO);
    if the rounds run out, degenerate groups of the first round fill the shard, masked out (kept =
    False): every rank keeps the same number of rows. A function (run, sample, first) -> (parts, rounds)."""
    cfg = run.cfg

    def fill(run, sample, first):
        n = len(first.degenerate)
        if first.degenerate.any() and cfg["on_degenerate"] == "raise":
            raise ValueError(f"{int(first.degenerate.sum())} of {n} groups have all rewards equal "
                             f"(on_degenerate='raise'); choose drop or zeros")
        informative = lambda r: [g for g in range(n) if not r.degenerate[g]]
        rounds, found = [first], len(informative(first))
        while found < n and len(rounds) <= cfg["dynamic_sampling_rounds"]:
            rounds.append(sample(len(rounds)))
            found += len(informative(rounds[-1]))
        parts, taken = [], 0
        for r in rounds:  # informative groups first, in sampling order
            groups = informative(r)[:n - taken] if cfg["on_degenerate"] == "drop" else list(range(n))
            taken += len(groups)
            if groups:
                parts.append(SimpleNamespace(rollout=r.rollout, groups=groups, kept=True))
            if taken == n:
                break
        if taken < n:
            groups = [g for g in range(n) if first.degenerate[g]][:n - taken]
            parts.append(SimpleNamespace(rollout=first.rollout, groups=groups, kept=False))
        return parts, rounds
    return fill


# ----------------------------------------------------------------------------------------------
# The loss: GSPO's sequence ratio, CISPO, truncated importance sampling, other aggregations

def sequence_ratio(logp, old_logp, on):
    """GSPO (Zheng et al. 2025): one ratio per response, s_i = exp((1/|y_i|) Σ_t log(π_θ/π_old)(y_it)),
    on every token as sg(s_i)·π_θ(y_it)/sg(π_θ(y_it)): its value is s_i and its gradient
    s_i·∇log π_θ(y_it). Outside the clip band the whole response stops (hence GSPO's narrow band)."""
    log_ratio = torch.where(on, logp - old_logp, 0.0)
    seq = log_ratio.sum(1, keepdim=True) / on.sum(1, keepdim=True).clamp(min=1)
    return torch.exp(torch.where(on, seq.detach() + logp - logp.detach(), 0.0))


def cispo_surrogate(ratio, adv, logp, on, low, high):
    """CISPO (MiniMax-M1, 2025): ℓ = −sg(clip(ρ, low, high))·A·log π_θ: the weight is capped, the
    token kept, so a rare token whose ρ ran past the band still learns; the tokens whose weight it capped."""
    per_token = -ratio.clamp(low, high).detach() * adv * torch.where(on, logp, 0.0)
    with torch.no_grad():
        capped = on & ((ratio > high) | (ratio < low))
    return per_token, capped


def weighs_tokens(cfg):
    """Whether the policy term has per-token weights: TIS, Clip-Cov or the top-entropy mask."""
    return bool(cfg["tis_cap"] or cfg["clip_cov"] or cfg["top_entropy_quantile"] < 1)


def token_weights(cfg):
    """The per-token weights on the policy term, a function (batch, logp, entropy) -> (weights,
    figures): the product of the options that are on."""
    parts = [part for key, part in (("tis_cap", truncated_importance_sampling), ("clip_cov", clip_cov))
             if cfg[key]] + ([top_entropy_mask] if cfg["top_entropy_quantile"] < 1 else [])

    def weights(batch, logp, entropy):
        w, figures = 1.0, {}
        for part in parts:
            w_part, figures_part = part(cfg, batch, logp, entropy)
            w, figures = w * w_part, {**figures, **figures_part}
        return w, figures
    return weights


def truncated_importance_sampling(cfg, batch, logp, entropy):
    """tis_cap = C > 0, for the sampler/trainer mismatch: each token's policy term times the constant
    w = min(π_old/π_sampler, C); tis_capped_frac, the share of tokens at the cap."""
    w, capped = tis_weights(batch.old_logprobs, batch.sampler_logprobs, batch.mask, cfg["tis_cap"])
    return w, {"tis_capped_frac": capped / batch.mask.sum().clamp(min=1)}


def clip_cov(cfg, batch, logp, entropy):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models"; verl's clip_cov): under the policy gradient a token's entropy falls at the rate of
    the covariance of its log-prob and advantage, so the tokens with the largest
        cov_t = (log π_θ(y_t) − mean log π_θ) · (A_t − mean A)      (means over the micro-batch's response tokens)
    (a confident token with a positive advantage, or an unlikely one with a negative advantage) have
    their policy gradient cut: weight 0 on the
    clip_cov share of response tokens with the largest positive cov_t (verl draws them at random among
    the tokens whose cov_t lies in a band; here the largest). clip_cov_frac: the share cut."""
    on = batch.mask > 0
    adv = (batch.advantages[:, None] if batch.advantages.dim() == 1 else batch.advantages).expand_as(logp)
    lp, a = logp.detach()[on], adv[on]
    cov = (lp - lp.mean()) * (a - a.mean())
    largest = cov.topk(int(cfg["clip_cov"] * len(cov))).indices
    cut, picked = torch.zeros_like(on), torch.zeros_like(cov, dtype=torch.bool)
    picked[largest[cov[largest] > 0]] = True  # (a token of cov ≤ 0 does not lower the entropy)
    cut[on] = picked
    return torch.where(cut, 0.0, 1.0), {"clip_cov_frac": cut.sum() / on.sum().clamp(min=1)}


def top_entropy_mask(cfg, batch, logp, entropy):
    """TRL's top_entropy_quantile = ρ (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority
    Tokens Drive Effective RL for LLM Reasoning"): the policy gradient only on the response tokens
    whose entropy is in the top ρ share of the micro-batch's (the forks where the policy chooses);
    the near-deterministic rest get weight 0. entropy_kept_frac: the share kept."""
    on = batch.mask > 0
    threshold = torch.quantile(entropy[on].float(), 1 - cfg["top_entropy_quantile"]) if on.any() else 0.0
    keep = on & (entropy >= threshold)
    return keep.float(), {"entropy_kept_frac": keep.sum() / on.sum().clamp(min=1)}


def tis_weights(old_logp, sampler_logp, mask, cap):
    """min(π_old/π_sampler, cap) per token (0 off the response) and the number of tokens at the cap."""
    on = mask > 0
    weight = torch.exp(torch.where(on, old_logp - sampler_logp, 0.0))
    return torch.where(on, weight.clamp(max=cap), 0.0), (on & (weight > cap)).sum()


def token_mean(per_token, mask, max_len):
    """DAPO: Σ_it ℓ_it / Σ_i |y_i|, every token of the batch weighs the same (loss_sum, count)."""
    on = mask > 0
    return torch.where(on, per_token, 0.0).sum(), on.sum(1).sum()


def seq_mean_token_sum_norm(per_token, mask, max_len):
    """Dr. GRPO: (1/N) Σ_i Σ_t ℓ_it / L_max, L_max = max_new_tokens: a response's weight does not depend
    on its own length (loss_sum, count = responses with a token)."""
    on = mask > 0
    return torch.where(on, per_token, 0.0).sum() / max_len, (on.sum(1) > 0).sum()


AGGREGATES = dict(token_mean=token_mean, seq_mean_token_sum_norm=seq_mean_token_sum_norm)


# ----------------------------------------------------------------------------------------------
# The rollouts: π_old recomputed, prompts at the edge of competence, one-step-off rollouts

def truncation(cfg):
    """The sampler's cut, top_k / top_p, as keywords for the trainer's scoring ({}: none): π_θ and
    π_old are then scored on the truncated, renormalised distribution the tokens were drawn from
    (sampler.sampled_logprobs), so that ρ = 1 before an update."""
    return {k: v for k, v in (("top_k", cfg["top_k"]), ("top_p", cfg["top_p"])) if v and v != 1.0}


def masking_truncated(sample):
    """mask_truncated (DAPO's overlong filtering): a response cut by max_new_tokens keeps its reward in
    its group's baseline but gets no loss term (mask 0): its tokens are not a finished answer, and a
    0 for a cut answer would teach that long reasoning is wrong."""
    def sample_then_mask(*args, **kwargs):
        ro = sample(*args, **kwargs)
        ro.mask = ro.mask * ~ro.truncated[:, None]
        return ro
    return sample_then_mask


def old_logprobs(run, truncation):
    """Where π_old comes from: (a function (run, model, rows) for a rollout, one (run, micro_batches)
    for the loss's rows). sampler: the sampler's own log-probs, equal to a training forward in fp32
    (nothing to do). recompute: one no-grad forward of the sampling weights on the distribution
    `truncation` cuts (top_k, top_p: the one sampled, or {} for the whole), the sampler's numbers kept
    for sampler_logprob_gap and TIS; again on the very rows the loss sees, since under bf16 autocast
    the same rows in another batch shape round differently (not with staleness: there π_old is the
    sampler's weights, which the loop's model no longer holds)."""
    if old_logprobs_mode(run) != "recompute":
        return (lambda run, model, ro: None), (lambda run, micro_batches: None)

    def recompute(run, model, ro):
        ro.sampler_logprobs = ro.old_logprobs
        ro.old_logprobs = score_tokens(run, model, ro.ids, ro.prompt_lens, **truncation) * ro.mask

    def rescore(run, micro_batches):
        for micro in micro_batches:
            micro.old_logprobs = score_tokens(run, run.raw_model, micro.ids, micro.prompt_lens, **truncation) * micro.mask
    return recompute, (rescore if not run.cfg["staleness"] else (lambda run, micro_batches: None))


def edge_prompts(run, saved):
    """prompt_sampling=edge (SPEC §3 DAPO, budget at the edge of competence): a fixed pool of
    prompt_pool train problems (seed = the run's seed) and each prompt's running success s (NaN:
    unseen). Each iteration draws prompts_per_iter distinct pool prompts (edge_draw); after the
    rollouts every rank's group rewards, summed over ranks, update s (edge_update). Returns the
    prompt source: draw(run, it), problems(run, it, shard, round), record(run, group_rewards)."""
    cfg = run.cfg
    pool = SimpleNamespace(members=run.env.problems("train", cfg["prompt_pool"], seed=cfg["seed"]), drawn=None)
    pool.success = saved["pool_success"].numpy().copy() if saved else np.full(len(pool.members), np.nan)

    def draw(run, it):  # the same on every rank
        pool.drawn = edge_draw(pool.success, cfg["prompts_per_iter"], seeded_rng(run, it), cfg["edge_low"],
                               cfg["edge_high"]).reshape(-1, shard_size(run))
        before = pool.success[pool.drawn.reshape(-1)]
        in_band = (before >= cfg["edge_low"]) & (before <= cfg["edge_high"])
        return dict(edge_unseen_frac=float(np.isnan(before).mean()), edge_in_band_frac=float(in_band.mean()))

    def problems(run, it, shard, round_):  # this shard's slice of the draw, the sampler's seed as ever
        return [pool.members[i] for i in pool.drawn[shard]], shard_problems(run, it, shard, round_)[1]

    def record(run, group_rewards):
        n, n_shards = shard_size(run), len(pool.drawn)
        mine = np.zeros(n_shards * n)
        for s, rewards in zip(range(run.rank, n_shards, run.world_size), group_rewards):
            mine[s * n:(s + 1) * n] = rewards
        edge_update(pool.success, pool.drawn.reshape(-1), np.array(all_reduce_sum(mine.tolist(), run)))
        return dict(pool_seen_frac=float((~np.isnan(pool.success)).mean()))
    pool.draw, pool.problems, pool.record = draw, problems, record
    return pool


def edge_draw(success, n, rng, low, high):
    """n distinct pool indices: unseen prompts first (pool order), then those with running success
    in [low, high] at random, then the rest nearest the band's middle. success: (pool,), NaN = unseen."""
    seen = ~np.isnan(success)
    in_band = np.flatnonzero(seen & (success >= low) & (success <= high))
    rest = np.flatnonzero(seen & ((success < low) | (success > high)))
    rest = rest[np.argsort(np.abs(success[rest] - (low + high) / 2), kind="stable")]
    return np.concatenate([np.flatnonzero(~seen), rng.permutation(in_band), rest])[:n]


def edge_update(success, drawn, group_success):
    """The running success of the drawn prompts: the group's mean reward on a first visit, else the
    mean of the old estimate and the new one (recent visits weigh most: the policy moves)."""
    old = success[drawn]
    success[drawn] = np.where(np.isnan(old), group_success, (old + group_success) / 2)


def sampler_copy(run, saved):
    """staleness=1: the sampling weights (a frozen copy, the checkpoint's when resuming), the iteration
    they were copied at, the pending rollouts and the second thread that samples them."""
    sampler = SimpleNamespace(model=frozen(run.raw_model), iter=None, pending=None,
                              thread=ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-sampler"))
    if saved:
        sampler.model.load_state_dict(saved["sampler"])
        sampler.iter = saved["sampler_iter"]
    return sampler


def one_step_off_rollouts(run, state, it, sample_shards):
    """staleness=1: return the rollouts of iteration `it`, sampled by the weights of it − 1 while
    the update of it − 1 ran, and start sampling those of it + 1 with the weights of it, to run
    while the loop updates. -> (rollouts, figures: staleness, time_wait_rollouts).

    A second thread with its own copy of the weights (state.sampler, refreshed here, between two
    updates, while the thread is idle). Torch releases the GIL inside its ops, so on a CPU the
    sampler's decode and the update's forward/backward run on different cores at once. The thread
    runs sample_shards only: no collective (the DDP all-reduces stay on the main thread, in the same
    order on every rank) and no global RNG (each shard's sampler has its own seeded generator), so
    the rollouts of `it` depend on (seed, it) and the sampler's weights alone. On a GPU it shares the
    default stream: only the host-side work overlaps. The checkpoint holds the sampler's weights, so
    a resumed run's first iteration samples what the uninterrupted run sampled in the background."""
    sampler, t0 = state.sampler, time.time()
    rollouts = sample_shards(run, state, sampler.model, it) if sampler.pending is None else sampler.pending.result()
    # how many updates behind the trained weights the rollouts' sampler is (None: it holds them)
    lag = 0 if sampler.iter is None else it - sampler.iter
    if not 0 <= lag <= run.cfg["staleness"]:
        raise RuntimeError(f"iteration {it} would train on rollouts of the weights of iteration {sampler.iter}: "
                           f"staleness {lag} > {run.cfg['staleness']}")
    figures = dict(staleness=lag, time_wait_rollouts=time.time() - t0)  # (the wait: what the overlap did not hide)
    sampler.model.load_state_dict(run.raw_model.state_dict())
    sampler.iter = it
    last = it + 1 >= run.cfg["max_iters"]
    sampler.pending = None if last else sampler.thread.submit(sample_shards, run, state, sampler.model, it + 1)
    return rollouts, figures


def state_dict(state):
    """What a resumed run needs: staleness=1's sampling weights, prompt_sampling=edge's running success."""
    saved = {}
    if state.sampler is not None:
        saved.update(sampler=state.sampler.model.state_dict(), sampler_iter=state.sampler.iter)
    if hasattr(state.prompts, "success"):
        saved["pool_success"] = torch.from_numpy(state.prompts.success.copy())
    return saved


# ----------------------------------------------------------------------------------------------
# The break-it switches: a classic failure on purpose, the monitor that catches it in BREAKS

def break_it(run, state):
    """--break_it: one piece of grpo's state replaced by the bug a pipeline gets wrong (setup calls it
    last; grpo's core path runs the same code broken or not)."""
    cfg, kind = run.cfg, run.cfg["break_it"]
    if kind == "fp8_sampler":
        state.sampling_model = fp8_copy
    elif kind == "sampler_temperature":
        state.sampling_model = tempered_copy
    elif kind == "top_p_uncorrected":  # the sampler draws from the nucleus, the trainer scores the whole softmax
        state.truncation = {}
        state.old_logprobs, state.rescore = old_logprobs(run, state.truncation)
    elif kind == "retokenize":
        state.sample = retokenizing(run, state.sample)
    elif kind == "prompt_format":
        state.sample = functools.partial(state.sample, prompt_ids=prefilled_prompt(run))
    elif kind == "kl_twice":  # the loss keeps its +β·k3 (kl=k3_loss)
        state.kl_in_reward = True
        state.shape = shaping(run, kl_in_reward=True)
    elif kind == "nan_logprob":
        state.old_logprobs = with_nonfinite(state.old_logprobs)
    elif kind == "shifted_advantages":
        state.advantages = shifted_advantages(state.advantages, cfg["group_size"])
    elif kind in ("all_equal", "length_bonus", "format_exploit"):
        state.training_reward = broken_reward(kind)


def broken_reward(kind):
    """The training reward from the rows under break_it
        all_equal       0 for every response (a task out of reach) -> degenerate_frac
        length_bonus    + 0.01 per response token -> reward_len_corr (and the length)
        format_exploit  the right number anywhere in the response (several guesses pass) ->
                        verifier_error_rate; held-out accuracy is still the strict verifier's"""
    if kind == "all_equal":
        return lambda ro: torch.zeros_like(ro.verified)
    if kind == "length_bonus":
        return lambda ro: ro.verified + 0.01 * ro.lengths.to(ro.verified)
    return lambda ro: torch.tensor([lax_verify(p, t) for p, t in zip(ro.problems, ro.texts)], device=ro.verified.device)


def training_verifier(run):
    """The verifier the rewards come from (evaluation always uses the environment's own)."""
    return lax_verify if run.cfg["break_it"] == "format_exploit" else run.env.verify


def lax_verify(problem, response):
    """break_it=format_exploit: the right number anywhere in the response passes, so listing
    several guesses (or copying one from the prompt) earns the reward."""
    return 1.0 if str(problem["answer"]) in re.findall(r"-?[0-9]+", response) else 0.0


@torch.no_grad()
def fp8_copy(model):
    """break_it=fp8_sampler: the weights as an FP8 inference engine holds them (e4m3, one scale
    per tensor so that its largest entry maps to e4m3's largest, 448)."""
    copy = frozen(model)
    for p in copy.parameters():
        scale = p.abs().max().clamp(min=1e-12) / 448
        p.copy_((p / scale).to(torch.float8_e4m3fn).float() * scale)
    return copy


@torch.no_grad()
def tempered_copy(model):
    """break_it=sampler_temperature: the sampler's copy has its head divided by T = 0.7, so its logits
    are h·(W/T)ᵀ = z/T: it draws from softmax(z/T) and reports those log-probs, while the trainer
    scores softmax(z) at the run's temperature (a temperature set on the inference engine alone)."""
    copy = frozen(model)
    copy.lm_head.weight = torch.nn.Parameter(copy.lm_head.weight / SAMPLER_ONLY_TEMPERATURE, requires_grad=False)
    return copy  # (a new head parameter: a tied embedding keeps its own weights)


def retokenizing(run, sample):
    """break_it=retokenize: each transcript decoded to text and encoded again before training, as a
    pipeline does that keeps messages rather than token ids. Text does not round-trip to the same
    ids: a tool's tags (special tokens) come back as the bytes of their text, so the tool's result can
    no longer be told apart and is trained on as if the policy wrote it (mask 1), and the sampler's
    log-probs, laid over the new tokens in order, belong to other tokens. The rows keep the sampled
    ids in `responses` (what the retokenized monitor compares)."""
    def sample_then_retokenize(*args, **kwargs):
        ro = sample(*args, **kwargs)
        prompts = [ids[:n] for ids, n in zip(ro.ids.tolist(), ro.prompt_lens.tolist())]
        room = [run.raw_model.config.block_size + 1 - len(p) for p in prompts]  # (cut to the context, as a pipeline does)
        tokens = [(run.tok.encode(text) + ([] if cut else [run.tok.eos]))[:n]
                  for text, cut, n in zip(ro.texts, ro.truncated.tolist(), room)]
        sampled = [lp[n - 1:n - 1 + len(t)] for lp, n, t in zip(ro.old_logprobs.tolist(), ro.prompt_lens.tolist(),
                                                                 ro.responses)]
        logprobs = [(lp + [0.0] * len(t))[:len(t)] for lp, t in zip(sampled, tokens)]
        rows = layout(run, prompts, tokens, logprobs, [[0] * len(t) for t in tokens])
        return dataclasses.replace(ro, **{**rows, "responses": ro.responses})
    return sample_then_retokenize


def prefilled_prompt(run):
    """break_it=prompt_format: the RL prompts' template differs from SFT's: it opens the assistant's turn
    with the answer's marker already written ("<|assistant|>Answer:", as a chat template that opens a
    reasoning block for the model does), so the policy, which writes the marker itself, answers
    " 17": the response lacks the form the verifier asks for and every reward is 0. A function
    problem -> prompt ids."""
    marker = run.tok.encode("Answer:")
    return lambda problem: run.tok.prompt_ids(problem["prompt"]) + marker


def with_nonfinite(old_logprobs, share=0.01):
    """break_it=nan_logprob: −inf on 1% of the response tokens' π_old (a fixed pattern; an engine's
    log 0 for a token it should not have drawn, an fp16 underflow), unguarded: ρ = exp(log π_θ + inf)
    is inf, the loss NaN, and after one optimizer step every weight NaN."""
    def broken(run, model, ro):
        old_logprobs(run, model, ro)
        hit = torch.rand(ro.mask.shape, generator=torch.Generator().manual_seed(0)).to(ro.mask.device) < share
        ro.old_logprobs = ro.old_logprobs.masked_fill(hit & (ro.mask > 0), float("-inf"))
    return broken


def shifted_advantages(advantages, G):
    """break_it=shifted_advantages: each group gets the previous group's advantages (an off-by-one in
    the row -> group index): every response is pushed up or down for another prompt's outcome."""
    def shifted(run, ro):
        degenerate = advantages(run, ro)
        ro.advantages = ro.advantages.roll(G, 0)
        return degenerate
    return shifted
