"""DAPO, decoupled clip and dynamic sampling policy optimisation (Yu et al. 2025, arXiv:2503.14476):
four changes to GRPO, each for a failure of long-answer RL, and no KL term:

  Clip-Higher        clip(ρ, 1 − ε, 1 + ε_high) with ε_high > ε: a low-probability token may grow further
                     before the clip stops it (entropy does not collapse as fast)
  dynamic sampling   a group of equal rewards carries no gradient: it is dropped, and up to
                     dynamic_sampling_rounds extra rollouts of fresh prompts refill the shard
  token-mean loss    Σ_it ℓ_it / Σ_i |y_i|: every token of the batch weighs the same (a long answer's
                     tokens are not worth less)
  overlong shaping   r_i − 1 at the length limit, linear from 0 over the last overlong_cache tokens
                     before it; mask_truncated (overlong filtering): a cut answer gets no loss term

Logged besides grpo's figures: kept_groups_frac, extra_rollouts, reward_shaped. Everything else is grpo.py's."""

import torch

import grpo
from nanopost.distributed import all_reduce_sum
from grpo import evaluate, on_policy, starts_from  # noqa: F401  (what DAPO does not change)
from nanopost.rollouts import Rollout, shard_problems

base = "grpo"
defaults = dict(
    grpo.defaults,
    clip_eps_high=0.28,         # ε_high: the clip range's upper side 1 + ε_high (Clip-Higher: above clip_eps)
    dynamic_sampling_rounds=3,  # extra rollouts of fresh prompts per shard to refill dropped groups (0 = none)
    overlong_cache=16,          # the soft length penalty over the last L_cache tokens before the limit (0 = none)
    mask_truncated=False,       # overlong filtering: answers cut by max_new_tokens get no loss term (mask 0)
    kl_coef=0.0,                # β: no KL term in DAPO's recipe
)


def setup(run, saved):
    """GRPO's, with DAPO's checks."""
    cfg = run.cfg
    if cfg["overlong_cache"] >= cfg["max_new_tokens"]:
        raise ValueError(f"overlong_cache={cfg['overlong_cache']} must be below max_new_tokens={cfg['max_new_tokens']}")
    if cfg["dynamic_sampling_rounds"] and run.lockstep:  # (a rank's extra rounds would be forwards alone)
        raise ValueError("dynamic_sampling_rounds > 0 samples a different number of rounds on each rank: not with "
                         "--fsdp_rollouts=sharded (use gathered)")
    return grpo.setup(run, saved)


def batches(run, state, it):
    """GRPO's iteration with DAPO's shards: shaped rewards, informative groups only."""
    sampled = [sample_informative_groups(run, state, run.raw_model, it, shard) for shard in grpo.my_shards(run)]
    shards = [rows for rows, _, _ in sampled]
    figures = dict(grpo.rollout_figures(run, state, shards), **kept_figures(run, shards, sampled))
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), figures


def sample_groups(run, state, model, it, shard, round_):
    """One rollout of a shard (round_ > 0: fresh problems) with the shaped reward and its advantages."""
    ro = grpo.sample(run, model, *shard_problems(run, it, shard, round_))
    grpo.score(run, state, model, ro)
    if run.cfg["mask_truncated"]:  # (its reward still counts in the group's baseline)
        ro.mask = ro.mask * ~ro.truncated[:, None]
    ro.reward = ro.verified + overlong_penalty(run, ro)
    ro.advantages = grpo.group_advantages(ro.reward, run.cfg["group_size"])
    return ro


def sample_informative_groups(run, state, model, it, shard):
    """A shard of informative groups: the first rollout's, then those of up to dynamic_sampling_rounds
    extra rollouts, in sampling order; if the rounds run out, degenerate groups of the first rollout fill
    the shard with mask 0 (every rank keeps the same number of rows). -> (the shard's rows, the number of
    responses sampled in extra rollouts, the first rollout's verifier rewards: a fair sample of the policy)."""
    G = run.cfg["group_size"]
    rounds = [sample_groups(run, state, model, it, shard, 0)]
    n = len(rounds[0].reward) // G
    while (sum(len(informative_groups(ro, G)) for ro in rounds) < n
           and len(rounds) <= run.cfg["dynamic_sampling_rounds"]):
        rounds.append(sample_groups(run, state, model, it, shard, len(rounds)))
    kept = [ro.select([g * G + j for g in informative_groups(ro, G) for j in range(G)]) for ro in rounds]
    missing = n - sum(len(ro.reward) // G for ro in kept)
    if missing > 0:
        degenerate = [g for g in range(n) if g not in informative_groups(rounds[0], G)][:missing]
        filler = rounds[0].select([g * G + j for g in degenerate for j in range(G)])
        filler.mask = filler.mask * 0
        kept.append(filler)
    rows = Rollout.cat([ro for ro in kept if len(ro.reward)], run.tok.pad).select(range(n * G))  # (the first n groups)
    return rows, (len(rounds) - 1) * n * G, rounds[0].verified


def informative_groups(ro, G):
    """The indices of a rollout's groups whose rewards are not all equal."""
    return (~grpo.degenerate_groups(ro.reward.view(-1, G))).nonzero().flatten().tolist()


def overlong_penalty(run, ro):
    """0 up to limit − L_cache tokens, then linear down to −1 at the limit (the sampler's limit:
    max_new_tokens, or less where the longest prompt leaves less room in the context)."""
    cache = run.cfg["overlong_cache"]
    if cache <= 0:
        return torch.zeros_like(ro.verified)
    limit = min(run.cfg["max_new_tokens"], run.raw_model.config.block_size - int(ro.prompt_lens.max()))
    over = (ro.lengths.float() - (limit - cache)).clamp(min=0)
    return -(over / cache).clamp(max=1.0).to(ro.verified)


def kept_figures(run, shards, sampled):
    """Of the first rollouts (a fair sample of the policy): reward (the verifier's), degenerate_frac and
    all_fail_frac; of the rows trained: reward_shaped, kept_groups_frac; extra_rollouts (responses sampled
    to refill): summed over ranks. grpo's other figures are those of the rows trained."""
    G = run.cfg["group_size"]
    kept = torch.cat([ro.mask.sum(1) > 0 for ro in shards])
    first = torch.cat([verified for _, _, verified in sampled]).view(-1, G)
    sums = all_reduce_sum(dict(kept=float(kept.sum()), n=len(kept), extra=sum(extra for _, extra, _ in sampled),
                               shaped=float(sum((ro.reward * (ro.mask.sum(1) > 0)).sum() for ro in shards)),
                               reward=float(first.sum()), groups=len(first),
                               degenerate=float(grpo.degenerate_groups(first).sum()),
                               all_fail=float((first.amax(1) == 0).sum())), run)
    return dict(reward=sums["reward"] / (sums["groups"] * G), degenerate_frac=sums["degenerate"] / sums["groups"],
                all_fail_frac=sums["all_fail"] / sums["groups"], reward_shaped=sums["shaped"] / max(sums["kept"], 1),
                kept_groups_frac=sums["kept"] / sums["n"], extra_rollouts=sums["extra"])


def loss(run, state, model, batch):
    """GRPO's loss with Clip-Higher and the token mean."""
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    per_token, figures = grpo.policy_term(run, batch, logp, eps_high=run.cfg["clip_eps_high"])
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = token_mean(per_token, batch.mask)
    return loss_sum, count, dict(figures, **kl_figures, **grpo.sample_figures(batch, entropy))


def token_mean(per_token, mask):
    """(loss_sum, count) of Σ_it ℓ_it / Σ_i |y_i|: every token of the batch weighs the same."""
    on = mask > 0
    return torch.where(on, per_token, 0.0).sum(), on.sum(1).sum()
