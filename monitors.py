"""
What a GRPO run reports every iteration (SPEC §6: rewards, degenerate groups, lengths, the KL, the
sampler's mismatch, parse errors, the verifier's own error rate, the time split), summed over
ranks; and the monitors that read a run's figures and say which classic failure each caught
(alarms: grpo_family's break-it switches are the failures on purpose, tested).
"""

import torch

from distributed import all_reduce_sum
from paperwork import unparsed
from rollouts import old_logprobs_mode


def shard_counts(run, first, batch, rounds):
    """A shard's sums for the log: of its first round (an unbiased sample of the policy, its reward
    before shaping) and of every round sampled."""
    G, ro, reward = run.cfg["group_size"], first.rollout, first.reward
    counts = dict(
        reward_sum=float(reward.sum()), reward_n=len(reward), all_fail=float((reward.view(-1, G).amax(1) == 0).sum()),
        violations=sum(sign < 0 for p, t in zip(ro.problems, ro.texts)
                       for _, sign in run.env.path_signals(p, t)) if hasattr(run.env, "path_signals") else 0,
        degenerate=float((reward.view(-1, G) == reward.view(-1, G)[..., :1]).all(-1).sum()), groups=len(reward) // G,
        extra_rollouts=(len(rounds) - 1) * len(reward), kept_groups=float(batch.keep.sum()) / G,
        time_decode=sum(r.rollout.decode_time for r in rounds), time_verify=sum(r.rollout.verify_time for r in rounds),
        time_score=sum(r.rollout.score_time for r in rounds), work=sum(map(run.env.shows_work, ro.texts)),
        parse_errors=sum(unparsed(run.env, t) for t in ro.texts),
        group_reward=reward.view(-1, G).mean(1).tolist(),  # edge sampling's running success
        decoded_tokens=sum(float(r.rollout.lengths.sum()) for r in rounds))
    rejected = ro.verified == 0  # reward_len_corr's moments: shaped reward y against length x
    x, y = ro.lengths[rejected].double(), ro.reward[rejected].double()
    counts.update(corr_n=len(x), corr_x=float(x.sum()), corr_y=float(y.sum()), corr_xy=float((x * y).sum()),
                  corr_xx=float((x * x).sum()), corr_yy=float((y * y).sum()))
    return counts


def rollout_figures(run, state, shards, counts):
    """The iteration's figures, summed over ranks: reward (the first rounds'), reward_shaped,
    degenerate_frac, all_fail_frac, kept_groups_frac, extra_rollouts, lengths, truncated_frac,
    work_frac, parse_error_rate, reward_len_corr, verifier_error_rate, kl_ref (with a KL term),
    sampler_logprob_gap (π_old recomputed), violations_per_episode (a rule engine), and this rank's
    time split time_decode / time_verify / time_score and decode_tok_per_s."""
    cfg, G = run.cfg, run.cfg["group_size"]
    rewards = torch.cat([b.reward for b in shards])
    kept = torch.cat([b.mask.sum(1) > 0 for b in shards])
    lengths = torch.cat([b.lengths.float() for b in shards])
    sums = {k: sum(c[k] for c in counts)
            for k in ("reward_sum", "reward_n", "degenerate", "groups", "extra_rollouts", "kept_groups", "work",
                      "all_fail", "violations", "parse_errors", "corr_n", "corr_x", "corr_y", "corr_xy", "corr_xx",
                      "corr_yy")}
    sums.update(len_sum=float(lengths.sum()), len_sq=float((lengths ** 2).sum()), len_n=len(lengths),
                truncated=sum(float(b.truncated.sum()) for b in shards),
                tokens=sum(float(b.mask.sum()) for b in shards), shaped=float((rewards * kept).sum()))
    if cfg["kl"] != "off":
        sums["kl"] = sum(float(((b.old_logprobs - b.ref_logprobs) * b.mask).sum()) for b in shards)
    if old_logprobs_mode(run) == "recompute":  # the sampler against the trainer, same weights
        gaps = [((b.old_logprobs - b.sampler_logprobs).abs() * b.mask) for b in shards]
        sums["gap"] = sum(float(g.sum()) for g in gaps)
        sums.update({f"gap_max_{r}": max(float(g.max()) for g in gaps) if r == run.rank else 0.0
                     for r in range(run.world_size)})  # the max over ranks, through a sum
    sums = all_reduce_sum(sums, run)
    len_mean = sums["len_sum"] / sums["len_n"]
    local_time = {k: sum(c[k] for c in counts) for k in ("time_decode", "time_verify", "time_score")}
    figures = dict(
        reward=sums["reward_sum"] / sums["reward_n"], reward_shaped=sums["shaped"] / max(sums["kept_groups"] * G, 1),
        degenerate_frac=sums["degenerate"] / sums["groups"], all_fail_frac=sums["all_fail"] / sums["groups"],
        kept_groups_frac=sums["kept_groups"] / sums["groups"], extra_rollouts=sums["extra_rollouts"],
        len_mean=len_mean, len_std=max(sums["len_sq"] / sums["len_n"] - len_mean ** 2, 0.0) ** 0.5,
        truncated_frac=sums["truncated"] / sums["len_n"],
        decode_tok_per_s=sum(c["decoded_tokens"] for c in counts) / max(local_time["time_decode"], 1e-9), **local_time,
        work_frac=sums["work"] / sums["reward_n"], parse_error_rate=sums["parse_errors"] / sums["reward_n"],
        reward_len_corr=correlation(sums), verifier_error_rate=state.verifier_check["verifier_error_rate"])
    if "kl" in sums:
        figures["kl_ref"] = sums["kl"] / max(sums["tokens"], 1.0)
    if "gap" in sums:
        figures["sampler_logprob_gap"] = sums["gap"] / max(sums["tokens"], 1.0)
        figures["sampler_logprob_gap_max"] = max(sums[f"gap_max_{r}"] for r in range(run.world_size))
    if hasattr(run.env, "path_signals"):  # RLVP's rule engine, counted whatever the reward_mode
        figures["violations_per_episode"] = sums["violations"] / sums["reward_n"]
    return figures


def correlation(sums):
    """Pearson's r from summed moments (corr_n, corr_x, corr_y, corr_xy, corr_xx, corr_yy); 0 when
    either side does not vary."""
    n = sums["corr_n"]
    if n < 2:
        return 0.0
    cov = sums["corr_xy"] / n - sums["corr_x"] * sums["corr_y"] / n ** 2
    vx = sums["corr_xx"] / n - (sums["corr_x"] / n) ** 2
    vy = sums["corr_yy"] / n - (sums["corr_y"] / n) ** 2
    return cov / (vx * vy) ** 0.5 if vx > 1e-12 and vy > 1e-12 else 0.0


def alarms(rows, cfg):
    """The monitors (SPEC §6) over a run's logged rows (metrics.jsonl, in order) -> {alarm: the
    first iteration it fired}. Each watches one figure against a bound it must not cross:
        sampler_mismatch   sampler_logprob_gap > 1e-3 or tis_capped_frac > 0.01 (fp32 sampler and
                           trainer agree to ~1e-6)
        ratio_drift        ratio_dev > 1e-3 in a run with one optimizer step per rollout batch,
                           where ρ must be 1 (stale rollouts, or a sampler whose log-probs differ)
        stale_rollouts     staleness > 0
        degenerate_groups  degenerate_frac > 0.75: most groups carry no signal
        entropy_collapse   entropy below a quarter of the first iteration's (or not finite)
        length_bias        reward_len_corr > 0.5 (rejected answers earn more the longer they are)
                           or len_mean above twice the first iteration's
        verifier_errors    verifier_error_rate > 0: the reward's verifier disagrees with the solver
        parse_errors       parse_error_rate > 0.2 (SPEC §6: above ~20% RL fails)
        reward_hacking     the training reward up by > 0.05 from the first iteration while held-out
                           accuracy (the environment's own verifier) fell by > 0.02 from the first
                           evaluation: the reward pays for something other than the task"""
    train = [r for r in rows if "entropy" in r]
    if not train:
        return {}
    on_policy = cfg["minibatches"] == 1 and cfg["inner_epochs"] == 1
    first = train[0]
    tests = dict(
        sampler_mismatch=lambda r: r.get("sampler_logprob_gap", 0) > 1e-3 or r.get("tis_capped_frac", 0) > 0.01,
        ratio_drift=lambda r: on_policy and r["ratio_dev"] > 1e-3,
        stale_rollouts=lambda r: r.get("staleness", 0) > 0,
        degenerate_groups=lambda r: r["degenerate_frac"] > 0.75,
        entropy_collapse=lambda r: not r["entropy"] >= first["entropy"] / 4,  # NaN too
        length_bias=lambda r: r.get("reward_len_corr", 0) > 0.5 or r["len_mean"] > 2 * first["len_mean"],
        verifier_errors=lambda r: r.get("verifier_error_rate", 0) > 0,
        parse_errors=lambda r: r.get("parse_error_rate", 0) > 0.2)
    fired = {}
    for r in train:
        for name, test in tests.items():
            if name not in fired and test(r):
                fired[name] = r["iter"]
    evals = [r for r in rows if "heldout_acc" in r]
    for r in evals[1:]:
        gained = max(t["reward"] for t in train if t["iter"] <= r["iter"]) - first["reward"]
        if gained > 0.05 and r["heldout_acc"] < evals[0]["heldout_acc"] - 0.02 and "reward_hacking" not in fired:
            fired["reward_hacking"] = r["iter"]
    return fired
