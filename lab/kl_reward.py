"""The KL in the reward, as in RLHF's PPO (Ouyang et al. 2022; SPEC §3): no KL term in the loss; the
response's summed log-ratio to π_ref is subtracted from its reward before the group advantages (k1, γ = 1):

    r'_i = r_i − β · Σ_t log(π_old(y_it)/π_ref(y_it))

Logged: reward (the verifier's, before the KL), reward_shaped (after it) and kl_reward (β·Σ_t log(π_old/π_ref) per
response, the KL the reward paid). Everything else is grpo.py's."""

import grpo
from nanopost.distributed import all_reduce_sum
from grpo import evaluate, on_policy, setup, starts_from  # noqa: F401  (what the KL in the reward does not change)

base = "grpo"
defaults = dict(
    grpo.defaults,
    kl_coef=0.01,       # β: the weight of the KL in the reward
)


def batches(run, state, it):
    """GRPO's groups with −β·KL in each response's reward."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    paid, n = 0.0, 0
    for ro in shards:
        kl = run.cfg["kl_coef"] * ((ro.old_logprobs - ro.ref_logprobs) * ro.mask).sum(1)
        ro.reward = ro.verified - kl
        ro.advantages = grpo.group_advantages(ro.reward, run.cfg["group_size"])
        paid, n = paid + float(kl.sum()), n + len(kl)
    paid, n = all_reduce_sum([paid, n], run)
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    figures = grpo.rollout_figures(run, state, shards)  # (their reward: the shaped one)
    figures.update(reward_shaped=figures["reward"], reward=figures["reward"] + paid / n, kl_reward=paid / n)
    return grpo.minibatches(run, shards), figures


def loss(run, state, model, batch):
    """GRPO's clipped surrogate, without the KL term (it is in the reward)."""
    logp, entropy = grpo.policy_logprobs(run, model, batch)
    per_token, figures = grpo.policy_term(run, batch, logp)
    loss_sum, count = grpo.seq_mean_token_mean(per_token, batch.mask)
    return loss_sum, count, dict(figures, **grpo.sample_figures(batch, entropy))
