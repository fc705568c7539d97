"""
The GRPO family's options, beside grpo.py (which is GRPO itself): grpo.setup chooses among them once,
and grpo's core path calls what it chose. This file holds every option's key and its checks, the
reward's shaping, the groups and the loss; beside it, grpo_estimators.py (the advantages),
grpo_rollouts.py (the rollouts' options) and grpo_breaks.py (the break-it switches). The formulas in
full: docs/grpo.md, "The family's options, in detail". SPEC §3 (REINFORCE, RLOO, GRPO, DAPO, process
rewards, RLVP), §6 (the monitors).

  the advantages  estimator: reinforce (a batch-mean baseline) | rloo (leave-one-out) | grpo | dr_grpo
                  (no std); adv_scale: group | batch (REINFORCE++) | none; reward_mode: process (one
                  advantage per token) | rlvp (A = Â(O) + β·Â(Φ)) | path (rewards.py)
  the reward      its source: the verifier, or reward=judge (a generative reward model, judge.py); a vector
                  reward (reward_weights, rewards.py); DAPO's overlong penalty; kl=k1_reward folds
                  −β·Σ_t log(π_old/π_ref) into it
  the groups      on_degenerate: drop | raise (zeros is grpo's own); DAPO's dynamic sampling refills
                  dropped groups with fresh prompts
  the loss        ratio_level=sequence (GSPO), policy_loss=cispo (CISPO), tis_cap (truncated importance
                  sampling), loss_agg token_mean (DAPO) | seq_mean_token_sum_norm (Dr. GRPO), kl=off
  the rollouts    prompt_sampling=edge (a pool, prompts at the edge of competence first); staleness=1
                  (one-step-off rollouts in a second thread); old_logprobs=recompute (π_old from a
                  training forward, not the sampler's numbers); mask_truncated (DAPO's overlong filter)
  entropy         clip_cov (verl's Clip-Cov), top_entropy_quantile (TRL's mask of low-entropy tokens)
  break_it        a classic failure on purpose, each with the monitor that must catch it (grpo_breaks.BREAKS)
The figures every iteration logs and the monitors that read them are monitors.py's.
"""

from types import SimpleNamespace

import torch

from grpo_rollouts import truncation
from nanopost.rewards import REWARD_KEYS, SEQUENCE_REWARD_KEYS, check_reward_mode, check_sequence_reward

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
    **SEQUENCE_REWARD_KEYS,    # the reward's source (the verifier or a judge) and a vector reward's weights
)

CHOICES = dict(estimator=("reinforce", "rloo", "grpo", "dr_grpo"), adv_scale=("auto", "group", "batch", "none"),
               ratio_level=("token", "sequence"), policy_loss=("clip", "cispo"), prompt_sampling=("uniform", "edge"),
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
    check_sequence_reward(cfg)
    if truncation(cfg) and cfg["kl"] == "k3_loss" and cfg["inner_epochs"] * cfg["minibatches"] > 1:
        raise ValueError("top_k / top_p with kl='k3_loss' and several steps per batch: a sampled token that an update "
                         "pushes out of the cut has π_θ = 0 and k3 = π_ref/π_θ − ... infinite (use kl='off' or one step)")


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
