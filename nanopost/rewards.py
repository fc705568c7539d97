"""
The reward modes of the lab's process and RLVP variants of grpo and ppo (SPEC §3 "Process vs outcome
rewards", "RLVP"):
outcome = the verifier's one reward at the end; process = a reward at the last token of each
verifiable step (env.step_rewards); rlvp = R = O + β·Φ with Φ from the environment's rule engine
(env.path_signals: −λ per bad action, +μ per compliant one); path = Φ alone, the inaction trap the
chapter warns of, kept for the experiment. Their check, and signals placed on tokens.

And the rewards beside the verifier (Ch7 "The evolution of reward paradigms": scalar, vector,
generative): a vector reward's named dimensions (DIMENSIONS, reward_weights: lab/vector_reward.py) and a
judge's P(Verdict: correct) (judged_reward: lab/judge_reward.py, lab/online_dpo.py).
"""

import difflib

import numpy as np
import torch

from nanopost.judge import judge_scores, rollout_seed


REWARD_MODES = ("outcome", "process", "rlvp", "path")


def check_reward_mode(cfg, env):
    """The reward keys against the environment. RLVP's second rule, the outcome stays the main driver,
    is checked here: both channels are normalised to the same scale, so β ≤ 1 keeps the path's
    weight at most the outcome's."""
    mode = cfg["reward_mode"]
    if mode not in REWARD_MODES:
        raise ValueError(f"reward_mode={mode!r}: choose from {REWARD_MODES}")
    needs = {"process": "step_rewards", "rlvp": "path_signals", "path": "path_signals"}.get(mode)
    if needs and not hasattr(env, needs):
        raise ValueError(f"reward_mode={mode} needs env.{needs}, which env {env.name!r} does not have")
    if not 0 <= cfg["rlvp_beta"] <= 1 or cfg["rlvp_penalty"] < 0 or cfg["rlvp_bonus"] < 0:
        raise ValueError("need 0 <= rlvp_beta <= 1 (the outcome stays the main driver), rlvp_penalty >= 0 and "
                         "rlvp_bonus >= 0")


def path_signals(run):
    """The environment's rule engine weighted: (problem, text) -> [(offset, −λ or +μ)] per action."""
    penalty, bonus = run.cfg["rlvp_penalty"], run.cfg["rlvp_bonus"]
    return lambda problem, text: [(offset, -penalty if sign < 0 else bonus)
                                  for offset, sign in run.env.path_signals(problem, text)]


def token_rewards(run, roll, signals):
    """Per-step or per-action signals placed on tokens (SPEC §3 Process vs outcome, RLVP).
    signals(problem, response text) -> [(character offset just after the step, value)]. Returns
    (values, marked), both (N, T-1) aligned with roll.mask: each value added at the column of the
    step's last token (the token whose text holds the character before the offset; an offset at the
    end of the text: the row's last response token, the end token when there is one), marked True
    there. A step never ends on a tool token: the model's own text closes every call and answer."""
    values, marked = torch.zeros_like(roll.mask), torch.zeros_like(roll.mask, dtype=torch.bool)
    for i, (problem, text, tokens, start) in enumerate(zip(roll.problems, roll.texts, roll.responses,
                                                            roll.prompt_lens.tolist())):
        # the text's byte offset after each token (response_text drops the end token: 0 bytes)
        ends = np.cumsum([0 if t == run.tok.eos else len(run.tok.decode([t]).encode()) for t in tokens])
        for offset, value in signals(problem, text):
            k = (len(tokens) - 1 if offset >= len(text) else
                 int(np.searchsorted(ends, len(text[:offset].encode()), side="left")))
            values[i, start - 1 + k] += value
            marked[i, start - 1 + k] = True
    return values, marked


# ----------------------------------------------------------------------------------------------
# A vector reward's named dimensions (lab/vector_reward.py) and a judge's reward (lab/judge_reward.py, dpo_online.py)

# The named dimensions of a vector reward, each in [0, 1] per answer: (run, rollout) -> (N,)
# (`correct` is the source's value: the verifier's 0/1 or the judge's P(correct))
DIMENSIONS = dict(
    correct=None,
    worked=lambda run, ro: torch.tensor([float(run.env.shows_work(t)) for t in ro.texts]),  # 1 where it shows its steps
    short=lambda run, ro: (1 - ro.lengths.float() / run.cfg["max_new_tokens"]).clamp(0, 1),  # 1 − length / max_new_tokens
    parses=lambda run, ro: torch.tensor([float(not hasattr(run.env, "parses") or run.env.parses(t))  # 1 where the
                                         for t in ro.texts]),  # answer is in the task's form ("Answer: <integer>")
)


def reward_weights(text):
    """{dimension: weight} of a reward_weights value, "name=w,name=w" ("" = {"correct": 1.0}), checked: known
    names (DIMENSIONS), each once, weights finite and >= 0, at least one > 0."""
    if not text.strip():
        return {"correct": 1.0}
    weights = {}
    for part in text.split(","):
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq:
            raise ValueError(f"reward_weights={text!r}: {part!r} is not name=weight (e.g. correct=1,short=0.5)")
        if name not in DIMENSIONS:
            close = difflib.get_close_matches(name, DIMENSIONS, n=1)
            raise ValueError(f"reward_weights={text!r}: no dimension {name!r}" + (f" (did you mean {close[0]}?)" if close
                             else "") + f"; the dimensions: {', '.join(DIMENSIONS)}")
        if name in weights:
            raise ValueError(f"reward_weights={text!r}: {name!r} given twice")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"reward_weights={text!r}: the weight of {name!r}, {value!r}, is not a number") from None
        if not np.isfinite(weights[name]) or weights[name] < 0:
            raise ValueError(f"reward_weights={text!r}: the weight of {name!r} must be finite and >= 0")
    if not any(weights.values()):
        raise ValueError(f"reward_weights={text!r}: every weight is 0, so every answer would earn the same")
    return weights


def judged_reward(run, judge, ro):
    """The judge's P(Verdict: correct) of each answer of a rollout, the mean over judge_samples judgements
    (judge.py), and its figures per answer: judge_agree (1 where P > 0.5 agrees with the verifier) and
    judge_verdict_written (the share of its judgements that wrote "Verdict:")."""
    p, wrote = judge_scores(run, judge, ro.problems, ro.texts, run.cfg["judge_samples"], run.cfg["judge_temperature"],
                            seed=rollout_seed(ro.ids))
    value = p.mean(1)  # r = (1/k) Σ_i P(correct | x, y, j_i)
    agree = ((value > 0.5).float() == ro.verified).float()
    return value, dict(judge_agree=agree, judge_verdict_written=wrote.float().mean(1))
