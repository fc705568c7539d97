"""RLVP, reward the outcome and constrain the process (SPEC §3 "RLVP"): the environment's rule engine
(env.path_signals) judges each action, −λ for a bad one, +μ for a compliant one, and the path signal
Φ = Σ of them is a second channel beside the outcome O, each normalised over the group on its own:

    A_i = Â(O)_i + β · Â(Φ)_i          Â(x)_i = (x_i − mean(x_1..G)) / std(x_1..G)

so a dense path signal cannot drown the sparse outcome however many actions it counts, and β ≤ 1 keeps the
outcome the main driver in a group whose outcomes differ; in a group where every sample failed, Â(O) = 0
and the advantage is β·Â(Φ), the path signal alone at unit scale (docs/rlvp.md). path_only: Φ alone, without the outcome (the inaction trap: an experiment, not
a recipe). Everything else is grpo.py's."""

import torch

import grpo
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what RLVP does not change)
from nanopost.rewards import path_signals, token_rewards

base = "grpo"
defaults = dict(
    grpo.defaults,
    rlvp_beta=0.5,        # β: the weight of the path signal Φ next to the outcome O
    rlvp_penalty=1.0,     # λ: the penalty per action the rule engine flags
    rlvp_bonus=1.0,       # μ: the bonus per compliant action
    path_only=False,      # Φ alone, no outcome channel (the inaction trap)
)


def setup(run, saved):
    """GRPO's, for an environment with a rule engine; β ≤ 1 (the outcome stays the main driver)."""
    cfg = run.cfg
    if not hasattr(run.env, "path_signals"):
        raise ValueError(f"--algo rlvp needs env.path_signals, which env {run.env.name!r} does not have")
    if not 0 <= cfg["rlvp_beta"] <= 1:
        raise ValueError("need 0 <= rlvp_beta <= 1 (the outcome stays the main driver)")
    return grpo.setup(run, saved)


def batches(run, state, it):
    """GRPO's groups with the two channels' advantages combined."""
    G, beta = run.cfg["group_size"], run.cfg["rlvp_beta"]
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    for ro in shards:
        path = path_reward(run, ro)
        if run.cfg["path_only"]:
            ro.advantages = grpo.group_advantages(path, G)
        else:
            ro.advantages = grpo.group_advantages(ro.reward, G) + beta * grpo.group_advantages(path, G)
    figures = grpo.rollout_figures(run, state, shards)
    figures.pop("adv_sign_error_frac", None)  # (the advantage is not the outcome's alone)
    grpo.keep_rollouts(run, it, shards,  # tokens.jsonl, for report.py: Φ on the token that closes each action
                       step_reward=[token_rewards(run, ro, path_signals(run))[0] for ro in shards])
    return grpo.minibatches(run, shards), figures


def path_reward(run, ro):
    """Φ_i = Σ of the rule engine's −λ | +μ over response i's actions."""
    signals = path_signals(run)
    return torch.tensor([sum(v for _, v in signals(p, t)) for p, t in zip(ro.problems, ro.texts)],
                        dtype=torch.float32, device=ro.reward.device)  # float even when no row has a signal
