"""
What a GRPO run reports every iteration (SPEC §6: rewards, degenerate groups, lengths, the KL, the
sampler's mismatch, parse errors, the verifier's own error rate, the time split), summed over
ranks; and the monitors (ALARMS) that read any run's logged figures and name the classic failure
each caught: train.py's loop runs them on every row it logs (watcher: a printed line, an `alarms`
flag in metrics.jsonl, a line in the passport), monitors.alarms on a finished run's rows.
grpo_breaks.py's break-it switches are the failures on purpose (docs/failures.md, tested).
"""

import json
import math
import os
from types import SimpleNamespace

import torch

from nanopost.distributed import all_reduce_sum
from nanopost.passports import unparsed
from nanopost.rollouts import old_logprobs_mode


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
        decoded_tokens=sum(float(r.rollout.lengths.sum()) for r in rounds),
        retokenized=retokenized_rows(ro), misaligned=misaligned_rows(run, ro),
        logged={name: float(values.sum()) for name, values in first.logged.items()})  # the reward's own figures
    rejected = ro.verified == 0  # reward_len_corr's moments: shaped reward y against length x
    x, y = ro.lengths[rejected].double(), ro.reward[rejected].double()
    counts.update(corr_n=len(x), corr_x=float(x.sum()), corr_y=float(y.sum()), corr_xy=float((x * y).sum()),
                  corr_xx=float((x * x).sum()), corr_yy=float((y * y).sum()))
    return counts


def advantage_mass(ro, failed):
    """all_fail_adv (Σ|A| over the rows of all-fail groups) and adv_mass (Σ|A| over all rows): what
    share of the policy gradient's weight the groups without a win carry. A row's |A| is its
    advantage's, or, token by token (process rewards), the mean |A_t| over its response tokens."""
    mass = ro.advantages.abs()
    if mass.dim() == 2:
        mass = (mass * ro.mask).sum(1) / ro.mask.sum(1).clamp(min=1)
    return dict(all_fail_adv=float(mass[failed.to(mass.device)].sum()), adv_mass=float(mass.sum()))


def retokenized_rows(ro):
    """Rows whose trained response ids are not the ids the sampler returned (ro.responses): 0 in a
    token-in, token-out pipeline, by construction."""
    return sum(ids[n:n + k] != t for ids, n, k, t in zip(ro.ids.tolist(), ro.prompt_lens.tolist(),
                                                          ro.lengths.tolist(), ro.responses))


def misaligned_rows(run, ro):
    """Rows whose advantage has the opposite sign to r_i − mean(r of its group): 0 when each group's
    advantages come from its own rewards (grpo, rloo, dr_grpo on the outcome; exactly, whatever the
    scale); about half the informative rows when they come from another group. Not counted where an
    advantage is no function of the row's group alone (reinforce, process and path rewards)."""
    cfg, G = run.cfg, run.cfg["group_size"]
    if cfg["estimator"] == "reinforce" or cfg["reward_mode"] != "outcome" or ro.advantages.dim() != 1:
        return 0
    rewards = ro.reward.view(-1, G)
    centred = rewards - rewards.mean(1, keepdim=True)
    return int((ro.advantages.view(-1, G) * centred < -1e-6).sum())


def rollout_figures(run, state, shards, counts):
    """The iteration's figures, summed over ranks: reward (the first rounds'), reward_shaped,
    degenerate_frac, all_fail_frac, all_fail_adv_share (advantage_mass of the trained rows, their
    final advantages), kept_groups_frac, extra_rollouts, lengths, truncated_frac, work_frac,
    parse_error_rate, reward_len_corr, verifier_error_rate, kl_ref (with a KL term), kl_reward (with
    the KL in the reward), sampler_logprob_gap (π_old recomputed), violations_per_episode (a rule
    engine), this rank's time split time_decode / time_verify / time_score and decode_tok_per_s; the
    training reward's own per-answer figures, means over the first rounds' answers (a vector reward's
    reward_<dimension>, a judge's judge_agree and judge_verdict_written: rewards.training_reward); and,
    only in an iteration that has one, retokenized_frac, adv_sign_error_frac and nonfinite_logprob_frac
    (failures a healthy pipeline never has)."""
    cfg, G = run.cfg, run.cfg["group_size"]
    rewards = torch.cat([b.reward for b in shards])
    kept = torch.cat([b.mask.sum(1) > 0 for b in shards])
    lengths = torch.cat([b.lengths.float() for b in shards])
    sums = {k: sum(c[k] for c in counts)
            for k in ("reward_sum", "reward_n", "degenerate", "groups", "extra_rollouts", "kept_groups", "work",
                      "all_fail", "violations", "parse_errors", "corr_n", "corr_x", "corr_y", "corr_xy", "corr_xx",
                      "corr_yy", "retokenized", "misaligned")}
    # the trained rows' final advantages (REINFORCE's batch baseline and adv_scale=batch included)
    masses = [advantage_mass(b, b.verified.view(-1, G).amax(1).repeat_interleave(G) == 0) for b in shards]
    sums.update({k: sum(m[k] for m in masses) for k in ("all_fail_adv", "adv_mass")})
    sums["nonfinite"] = sum(float((~torch.isfinite(lp) & (b.mask > 0)).sum()) for b in shards
                            for lp in (b.old_logprobs, b.ref_logprobs, b.sampler_logprobs) if lp is not None)
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
    sums.update({f"logged_{name}": sum(c["logged"][name] for c in counts) for name in counts[0]["logged"]})
    sums = all_reduce_sum(sums, run)
    len_mean = sums["len_sum"] / sums["len_n"]
    local_time = {k: sum(c[k] for c in counts) for k in ("time_decode", "time_verify", "time_score")}
    figures = dict(
        reward=sums["reward_sum"] / sums["reward_n"], reward_shaped=sums["shaped"] / max(sums["kept_groups"] * G, 1),
        degenerate_frac=sums["degenerate"] / sums["groups"], all_fail_frac=sums["all_fail"] / sums["groups"],
        all_fail_adv_share=sums["all_fail_adv"] / sums["adv_mass"] if sums["adv_mass"] else 0.0,
        kept_groups_frac=sums["kept_groups"] / sums["groups"], extra_rollouts=sums["extra_rollouts"],
        len_mean=len_mean, len_std=max(sums["len_sq"] / sums["len_n"] - len_mean ** 2, 0.0) ** 0.5,
        truncated_frac=sums["truncated"] / sums["len_n"],
        decode_tok_per_s=sum(c["decoded_tokens"] for c in counts) / max(local_time["time_decode"], 1e-9), **local_time,
        work_frac=sums["work"] / sums["reward_n"], parse_error_rate=sums["parse_errors"] / sums["reward_n"],
        reward_len_corr=correlation(sums), verifier_error_rate=state.verifier_check["verifier_error_rate"])
    figures.update({name: sums[f"logged_{name}"] / sums["reward_n"] for name in counts[0]["logged"]})
    if "kl" in sums:
        figures["kl_ref"] = sums["kl"] / max(sums["tokens"], 1.0)
    if state.kl_in_reward:  # β·Σ_t log(π_old/π_ref) per response: the KL the shaped reward subtracted
        figures["kl_reward"] = cfg["kl_coef"] * sums["kl"] / sums["len_n"]
    if "gap" in sums:
        figures["sampler_logprob_gap"] = sums["gap"] / max(sums["tokens"], 1.0)
        figures["sampler_logprob_gap_max"] = max(sums[f"gap_max_{r}"] for r in range(run.world_size))
    # the failures a healthy pipeline never has, logged only in an iteration that has one
    rare = dict(retokenized_frac=("retokenized", "reward_n"), adv_sign_error_frac=("misaligned", "reward_n"),
                nonfinite_logprob_frac=("nonfinite", "tokens"))
    for name, (count, per) in rare.items():
        if sums[count]:
            figures[name] = sums[count] / max(sums[per], 1.0)
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


# ----------------------------------------------------------------------------------------------
# The monitors: each reads figures of one logged row (r) and what the run logged before it (h: each
# figure's first value, the best reward so far); a healthy run fires none of them (docs/failures.md
# runs a control beside every failure). alarm: (the figures it reads, its threshold, the test)

ALARMS = dict(
    sampler_mismatch=(("sampler_logprob_gap", "tis_capped_frac"),
                      "sampler_logprob_gap > 1e-3 or tis_capped_frac > 0.01: an fp32 sampler and trainer agree to ~1e-6",
                      lambda r, h: r.get("sampler_logprob_gap", 0) > 1e-3 or r.get("tis_capped_frac", 0) > 0.01),
    ratio_drift=(("ratio_dev",), "ratio_dev > 1e-3 on an on-policy step: with one optimizer step per rollout batch "
                                 "ρ = π_θ/π_old must be 1; max |ρ − 1| above it means the sampler and the trainer "
                                 "score different distributions",
                 lambda r, h: h.on_policy and r.get("ratio_dev", 0) > 1e-3),
    stale_rollouts=(("staleness",), "staleness > 0", lambda r, h: r.get("staleness", 0) > 0),
    degenerate_groups=(("degenerate_frac",), "degenerate_frac > 0.75: most groups carry no signal",
                       lambda r, h: r.get("degenerate_frac", 0) > 0.75),
    entropy_collapse=(("entropy",), "entropy below a quarter of its first value, or not finite",
                      lambda r, h: "entropy" in r and not r["entropy"] >= h.first["entropy"] / 4),
    length_bias=(("reward_len_corr", "len_mean"), "reward_len_corr > 0.5 or len_mean above twice its first value: "
                                                  "rejected answers earn more the longer they are",
                 lambda r, h: r.get("reward_len_corr", 0) > 0.5 or r.get("len_mean", 0) > 2 * h.first.get("len_mean", 1e9)),
    verifier_errors=(("verifier_error_rate",), "verifier_error_rate > 0: the reward's verifier disagrees with the solver",
                     lambda r, h: r.get("verifier_error_rate", 0) > 0),
    parse_errors=(("parse_error_rate",), "parse_error_rate > 0.2: answers not in the task's form (SPEC §6: above "
                                         "~20% RL fails)", lambda r, h: r.get("parse_error_rate", 0) > 0.2),
    retokenized=(("retokenized_frac",), "retokenized_frac > 0: rows whose trained tokens are not the tokens sampled",
                 lambda r, h: r.get("retokenized_frac", 0) > 0),
    kl_twice=(("kl_reward", "kl_k3"), "kl_reward and kl_k3 in one row: β·KL subtracted in the reward and added in "
                                      "the loss", lambda r, h: "kl_reward" in r and "kl_k3" in r),
    nonfinite=(("nonfinite_logprob_frac", "loss"), "nonfinite_logprob_frac > 0 or a loss that is not finite: a "
                                                   "log-prob of a trained token is −inf or NaN",
               lambda r, h: r.get("nonfinite_logprob_frac", 0) > 0 or not math.isfinite(r.get("loss", 0.0))),
    misaligned_advantages=(("adv_sign_error_frac",), "adv_sign_error_frac > 0.01: advantages whose sign is not "
                                                     "that of r − its group's mean reward",
                           lambda r, h: r.get("adv_sign_error_frac", 0) > 0.01),
    reward_hacking=(("reward", "heldout_acc"), "reward up > 0.05 from its first value while heldout_acc fell > 0.02 "
                                               "from its first evaluation: the training reward pays for something "
                                               "the environment's own verifier does not",
                    lambda r, h: "heldout_acc" in r and h.best_reward - h.first.get("reward", math.inf) > 0.05
                    and r["heldout_acc"] < h.first["heldout_acc"] - 0.02),
)


def check(h, row):
    """The alarms that hold on `row` (the run's rows before it summed up in h, which it updates)."""
    for key, value in row.items():
        h.first.setdefault(key, value)
    h.best_reward = max(h.best_reward, row.get("reward", -math.inf))
    holding = [name for name, (_, _, test) in ALARMS.items() if test(row, h)]
    fresh = [name for name in holding if name not in h.fired]
    h.fired.update({name: row["iter"] for name in fresh})
    return holding, fresh


def history(cfg):
    """A run's monitors before its first row: fired {alarm: the first iteration it did}."""
    on_policy = cfg.get("minibatches", 1) == 1 and cfg.get("inner_epochs", 1) == 1
    return SimpleNamespace(first={}, best_reward=-math.inf, fired={}, on_policy=on_policy)


def alarms(rows, cfg):
    """The monitors over a run's logged rows (metrics.jsonl, in order) -> {alarm: the first iteration
    it fired}; {} for a healthy run."""
    h = history(cfg)
    for row in rows:
        check(h, row)
    return h.fired


def fired_text(fired):
    """{alarm: iteration} as a report's cell: "none", or "ratio_drift (iter 1), ..." in firing order."""
    return ", ".join(f"{name} (iter {it})" for name, it in fired.items()) or "none"


def watcher(run, metrics_path):
    """The monitors as the loop logs (rank 0): a function row -> row that flags the alarms holding on
    it (row["alarms"], a list of their names), prints a line the first time each fires and notes it in the run's passport.
    The passport gets the list of monitors with their thresholds now; a resumed run replays its
    metrics.jsonl first."""
    h = history(run.cfg)
    passport = os.path.join(run.cfg["out_dir"], "passport.md")

    def note(text):
        if run.master and os.path.isfile(passport):
            with open(passport, "a") as f:
                f.write(text)
    note("\n## Monitors\nEach alarm is printed when it first fires, flagged in metrics.jsonl (`alarms`) and noted "
         "below (docs/failures.md):\n" + "".join(f"- `{name}`: {threshold}\n" for name, (_, threshold, _) in ALARMS.items()))
    if os.path.isfile(metrics_path):
        for line in open(metrics_path):
            check(h, json.loads(line))
    note("".join(f"- fired: `{name}` at iteration {it}\n" for name, it in h.fired.items()))

    def watch(row):
        holding, fresh = check(h, row)
        for name in fresh:
            figures = ", ".join(f"{k} {row[k]:.4g}" for k in ALARMS[name][0] if isinstance(row.get(k), (int, float)))
            print(f"monitor {name} fired at iter {row['iter']}: {figures} ({ALARMS[name][1]})", flush=True)
            note(f"- fired: `{name}` at iteration {row['iter']} ({figures})\n")
        return {**row, "alarms": holding} if holding else row
    return watch
