"""
The reward modes that grpo.py and ppo.py share (SPEC §3 "Process vs outcome rewards", "RLVP"):
outcome = the verifier's one reward at the end; process = a reward at the last token of each
verifiable step (env.step_rewards); rlvp = R = O + β·Φ with Φ from the environment's rule engine
(env.path_signals: −λ per bad action, +μ per compliant one); path = Φ alone, the inaction trap the
chapter warns of, kept for the experiment. Their keys, their check, and signals placed on tokens.
"""

import numpy as np
import torch


# the keys grpo.py and ppo.py take
REWARD_KEYS = dict(
    reward_mode="outcome",  # outcome (the verifier, at the end) | process (each verifiable step) | rlvp (O + β·Φ) | path (Φ alone)
    rlvp_beta=0.5,          # RLVP: weight β of the path signal Φ next to the outcome O
    rlvp_penalty=1.0,       # RLVP: λ, the penalty per action the rule engine flags
    rlvp_bonus=1.0,         # RLVP: μ, the bonus per compliant action
)


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


def token_signals(run):
    """The reward mode's per-token signals of a rollout, a function (rollout) -> (N, T-1): process,
    each verifiable step's reward at its last token; rlvp and path, the rule engine's −λ | +μ at each
    action it judges; outcome, none."""
    mode = run.cfg["reward_mode"]
    if mode == "process":
        return lambda roll: token_rewards(run, roll, run.env.step_rewards)[0]
    if mode in ("rlvp", "path"):
        return lambda roll: token_rewards(run, roll, path_signals(run))[0]
    return lambda roll: None
