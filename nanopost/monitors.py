"""
The monitors (ALARMS): they read any run's logged figures and name the classic failure each caught
(SPEC §6). train.py's loop runs them on every row it logs (flag: a printed line, an `alarms` flag in
metrics.jsonl, a line in the passport), monitors.alarms on a finished run's rows. experiments/failures.py
causes each failure on purpose, by replacing the one function it breaks (docs/failures.md, tested).
"""

import json
import math
import os
from types import SimpleNamespace

from nanopost.bands import binomial


# ----------------------------------------------------------------------------------------------
# The monitors: each reads figures of one logged row (r) and what the run logged before it (h: each
# figure's first value and its best so far); a healthy run fires none of them (docs/failures.md
# runs a control beside every failure). alarm: (the figures it reads, its threshold, the test)

# The reward a policy trains on, as each algorithm logs it: the GRPO family's `reward`, PPO's `rm_score` on a
# reward model and `verifier_acc` on the verifier (PPO, RFT; OPD's, which it only logs)
TRAINED_ON = ("reward", "rm_score", "verifier_acc")

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
    reward_hacking=(TRAINED_ON + ("heldout_acc",),
                    "the training reward (reward, rm_score or verifier_acc) up > 0.05 from its first value while "
                    "heldout_acc fell below its best evaluation so far by more than that evaluation's binomial band "
                    "(at least 0.02): the training reward pays for something the environment's own verifier does not",
                    lambda r, h: "heldout_acc" in r and max(h.best.get(k, -math.inf) - h.first.get(k, math.inf) for k in TRAINED_ON) > 0.05
                    and r["heldout_acc"] < h.best["heldout_acc"] - max(0.02, binomial(h.best["heldout_acc"], h.eval_n) if h.eval_n else 0.0)),
)


def check(h, row):
    """The alarms that hold on `row` (the run's rows before it summed up in h, which it updates)."""
    for key, value in row.items():
        h.first.setdefault(key, value)
        h.best[key] = max(h.best.get(key, value), value) if isinstance(value, (int, float)) else value
    holding = [name for name, (_, _, test) in ALARMS.items() if test(row, h)]
    fresh = [name for name in holding if name not in h.fired]
    h.fired.update({name: row["iter"] for name in fresh})
    return holding, fresh


def history(cfg):
    """A run's monitors before its first row: fired {alarm: the first iteration it did}."""
    on_policy = cfg.get("minibatches", 1) == 1 and cfg.get("inner_epochs", 1) == 1
    return SimpleNamespace(first={}, best={}, eval_n=cfg.get("eval_problems"), fired={}, on_policy=on_policy)


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


def start_monitors(run, metrics_path):
    """The monitors of a run as its loop logs (rank 0): their history (a resumed run replays its
    metrics.jsonl first), with the passport's list of the monitors and their thresholds written now."""
    h = history(run.cfg)
    h.passport = os.path.join(run.cfg["out_dir"], "passport.md")
    note(h, "\n## Monitors\nEach alarm is printed when it first fires, flagged in metrics.jsonl (`alarms`) and noted "
         "below (docs/failures.md):\n" + "".join(f"- `{name}`: {threshold}\n" for name, (_, threshold, _) in ALARMS.items()))
    if os.path.isfile(metrics_path):
        for line in open(metrics_path):
            check(h, json.loads(line))
    note(h, "".join(f"- fired: `{name}` at iteration {it}\n" for name, it in h.fired.items()))
    return h


def flag(h, row):
    """`row` with the alarms that hold on it flagged (row["alarms"], their names); each alarm's first
    firing is printed and noted in the passport."""
    holding, fresh = check(h, row)
    for name in fresh:
        figures = ", ".join(f"{k} {row[k]:.4g}" for k in ALARMS[name][0] if isinstance(row.get(k), (int, float)))
        print(f"monitor {name} fired at iter {row['iter']}: {figures} ({ALARMS[name][1]})", flush=True)
        note(h, f"- fired: `{name}` at iteration {row['iter']} ({figures})\n")
    return {**row, "alarms": holding} if holding else row


def note(h, text):
    """A line for the run's passport (a run that wrote none, e.g. a test's, has nowhere to note it)."""
    if os.path.isfile(h.passport):
        with open(h.passport, "a") as f:
            f.write(text)
