"""Truncated sampling, top-k / top-p (nucleus sampling: Holtzman et al. 2020, arXiv:1904.09751): the sampler
draws from the k likeliest tokens, or the smallest set of mass p, renormalised,

    π_trunc(v) = π(v) / Σ_{u kept} π(u)      (v kept; 0 otherwise)

and π_θ is scored on that same cut distribution (model.sampled_logprobs), π_old being the sampler's own
log-probs of it, so that ρ = 1 before an update; π_ref on its whole one (a cut one can leave out the very
token sampled: log 0). Scored on the whole softmax instead, every token's ρ would be the kept mass < 1
(docs/failures.md, top_p_uncorrected). With a KL term it needs one step per rollout batch: a token an
update pushes out of the cut has π_θ = 0 and an infinite k3. Everything else is grpo.py's."""

import grpo
from grpo import evaluate, on_policy, starts_from  # noqa: F401  (what the cut does not change)
from nanopost.rollouts import old_logprobs_mode, rollouts, shard_problems

base = "grpo"
defaults = dict(
    grpo.defaults,
    top_k=0,                 # sample from the k likeliest tokens only (0 = no cut by rank)
    top_p=0.9,               # sample from the nucleus of mass top_p only (1 = no cut by mass)
    old_logprobs="sampler",  # π_old: the sampler's log-probs of the cut distribution (a recompute would score the whole)
)


def setup(run, saved):
    """GRPO's, with the cut's checks."""
    cfg = run.cfg
    if old_logprobs_mode(run) == "recompute":
        raise ValueError("--algo truncated_sampling takes π_old from the sampler (its cut distribution): "
                         "old_logprobs=sampler")
    if cfg["kl_coef"] and cfg["inner_epochs"] * cfg["minibatches"] > 1:
        raise ValueError("top_k / top_p with a KL term and several steps per batch: a sampled token that an update "
                         "pushes out of the cut has π_θ = 0 and k3 infinite (use kl_coef=0 or one step)")
    return grpo.setup(run, saved)


def batches(run, state, it):
    """GRPO's iteration with the cut sampler."""
    shards = [sample_groups(run, state, run.raw_model, it, shard) for shard in grpo.my_shards(run)]
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), grpo.rollout_figures(run, state, shards)


def sample_groups(run, state, model, it, shard):
    """grpo.sample_groups, sampling from the cut distribution."""
    cfg = run.cfg
    problems, seed = shard_problems(run, it, shard, 0)
    ro = rollouts(run, model, problems, cfg["group_size"], temperature=cfg["temperature"],
                  max_new_tokens=cfg["max_new_tokens"], seed=seed, top_k=cfg["top_k"] or None, top_p=cfg["top_p"])
    grpo.score(run, state, model, ro)
    ro.reward = ro.verified
    ro.advantages = grpo.group_advantages(ro.reward, cfg["group_size"])
    return ro


def loss(run, state, model, batch):
    """GRPO's loss with π_θ scored on the cut distribution."""
    logp, entropy = grpo.policy_logprobs(run, model, batch, run.cfg["top_k"] or None, run.cfg["top_p"])
    per_token, figures = grpo.policy_term(run, batch, logp)
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(figures, **kl_figures, **grpo.sample_figures(batch, entropy))
