"""
What a GRPO run (and every variant of it) reports every iteration about its rollouts (SPEC §6: rewards, degenerate groups,
lengths, the KL, the sampler's mismatch, parse errors, the verifier's own error rate, the time split),
summed over ranks. The alarms that read them (and every run's log) are monitors.py's.
"""

import torch

from nanopost.distributed import all_reduce_sum
from nanopost.passports import unparsed
from nanopost.rollouts import Rollout


def rollout_figures(run, state, shards):
    """The iteration's figures from this rank's shards (Rollouts with reward and advantages), summed over
    ranks: reward, degenerate_frac, all_fail_frac, all_fail_adv_share (the share of Σ|A| on groups
    without a win), lengths, truncated_frac, work_frac, parse_error_rate, reward_len_corr (rejected
    answers' reward against their length), verifier_error_rate, kl_ref (with π_ref's log-probs),
    sampler_logprob_gap (π_old recomputed), violations_per_episode (a rule engine), this rank's time
    split time_decode / time_verify / time_score and decode_tok_per_s; and, only in an iteration that
    has one, retokenized_frac, adv_sign_error_frac and nonfinite_logprob_frac (failures a healthy
    pipeline never has)."""
    G = run.cfg["group_size"]
    ro = Rollout.cat(shards, run.tok.pad)
    rewards, lengths, on = ro.reward.view(-1, G), ro.lengths.double(), ro.mask > 0
    mass = ro.advantages.abs()
    if mass.dim() == 2:  # one advantage per token: a row's mean |A_t|
        mass = (mass * ro.mask).sum(1) / ro.mask.sum(1).clamp(min=1)
    failed = (ro.verified.view(-1, G).amax(1) == 0).repeat_interleave(G)
    rejected = ro.verified == 0
    x, y = lengths[rejected], ro.reward[rejected].double()
    sums = dict(reward=float(ro.reward.sum()), n=len(ro.reward), groups=len(ro.reward) // G,
                degenerate=float((rewards == rewards[..., :1]).all(-1).sum()), all_fail=float((rewards.amax(1) == 0).sum()),
                all_fail_adv=float(mass[failed.to(mass.device)].sum()), adv_mass=float(mass.sum()),
                len_sum=float(lengths.sum()), len_sq=float((lengths ** 2).sum()), truncated=float(ro.truncated.sum()),
                tokens=float(ro.mask.sum()), work=sum(map(run.env.shows_work, ro.texts)),
                parse_errors=sum(unparsed(run.env, t) for t in ro.texts),
                corr_n=len(x), corr_x=float(x.sum()), corr_y=float(y.sum()), corr_xy=float((x * y).sum()),
                corr_xx=float((x * x).sum()), corr_yy=float((y * y).sum()),
                retokenized=retokenized_rows(ro), misaligned=misaligned_rows(ro, G),
                nonfinite=sum(float((~torch.isfinite(lp) & on).sum())
                              for lp in (ro.old_logprobs, ro.ref_logprobs, ro.sampler_logprobs) if lp is not None))
    if hasattr(run.env, "path_signals"):  # RLVP's rule engine, counted whatever the reward
        sums["violations"] = sum(sign < 0 for p, t in zip(ro.problems, ro.texts) for _, sign in run.env.path_signals(p, t))
    if ro.ref_logprobs is not None:
        sums["kl"] = float(((ro.old_logprobs - ro.ref_logprobs) * ro.mask).sum())
    if ro.sampler_logprobs is not None:  # the sampler against the trainer, same weights
        gap = (ro.old_logprobs - ro.sampler_logprobs).abs() * ro.mask
        sums["gap"] = float(gap.sum())
        sums.update({f"gap_max_{r}": float(gap.max()) if r == run.rank else 0.0
                     for r in range(run.world_size)})  # the max over ranks, through a sum
    sums = all_reduce_sum(sums, run)
    n, len_mean = sums["n"], sums["len_sum"] / sums["n"]
    figures = dict(
        reward=sums["reward"] / n, degenerate_frac=sums["degenerate"] / sums["groups"],
        all_fail_frac=sums["all_fail"] / sums["groups"],
        all_fail_adv_share=sums["all_fail_adv"] / sums["adv_mass"] if sums["adv_mass"] else 0.0,
        len_mean=len_mean, len_std=max(sums["len_sq"] / n - len_mean ** 2, 0.0) ** 0.5,
        truncated_frac=sums["truncated"] / n, work_frac=sums["work"] / n, parse_error_rate=sums["parse_errors"] / n,
        reward_len_corr=correlation(sums), verifier_error_rate=state.verifier_check["verifier_error_rate"],
        time_decode=ro.time_decode, time_verify=ro.time_verify, time_score=ro.time_score,
        decode_tok_per_s=float(ro.lengths.sum()) / max(ro.time_decode, 1e-9))
    if "kl" in sums:
        figures["kl_ref"] = sums["kl"] / max(sums["tokens"], 1.0)
    if "gap" in sums:
        figures["sampler_logprob_gap"] = sums["gap"] / max(sums["tokens"], 1.0)
        figures["sampler_logprob_gap_max"] = max(sums[f"gap_max_{r}"] for r in range(run.world_size))
    if "violations" in sums:
        figures["violations_per_episode"] = sums["violations"] / n
    # the failures a healthy pipeline never has, logged only in an iteration that has one
    for name, count, per in (("retokenized_frac", "retokenized", "n"), ("adv_sign_error_frac", "misaligned", "n"),
                             ("nonfinite_logprob_frac", "nonfinite", "tokens")):
        if sums[count]:
            figures[name] = sums[count] / max(sums[per], 1.0)
    return figures


def retokenized_rows(ro):
    """Rows whose trained response ids are not the ids the sampler returned (ro.responses): 0 in a
    token-in, token-out pipeline, by construction."""
    return sum(ids[n:n + k] != t for ids, n, k, t in zip(ro.ids.tolist(), ro.prompt_lens.tolist(),
                                                          ro.lengths.tolist(), ro.responses))


def misaligned_rows(ro, G):
    """Rows whose advantage has the opposite sign to r_i − mean(r of its group): 0 when each group's
    advantages come from its own rewards (whatever the scale); about half the informative rows when
    they come from another group. Not counted for one advantage per token (process rewards)."""
    if ro.advantages.dim() != 1:
        return 0
    rewards = ro.reward.view(-1, G)
    centred = rewards - rewards.mean(1, keepdim=True)
    return int((ro.advantages.view(-1, G) * centred < -1e-6).sum())


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
