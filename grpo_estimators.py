"""
The GRPO family's advantages, beside grpo.py (whose own is GRPO's: (r − mean) / std of the group's
outcome rewards): the other estimators' baselines (REINFORCE's batch mean, RLOO's leave-one-out,
Dr. GRPO's mean without the std), the advantage's scale (group, batch as in REINFORCE++, none) and
the reward modes' advantages (process: one per token; RLVP: A = Â(O) + β·Â(Φ)). grpo.setup chooses
among them once. The formulas in full: docs/grpo.md. SPEC §3.
"""

import torch

from nanopost.distributed import all_reduce_sum
from nanopost.rewards import path_signals, token_rewards


def advantage_scale(cfg):
    """adv_scale with auto resolved: the group std for grpo, nothing for the other estimators."""
    if cfg["adv_scale"] != "auto":
        return cfg["adv_scale"]
    return "group" if cfg["estimator"] == "grpo" else "none"


def plain_advantages(cfg):
    """Whether the advantages are GRPO's own: (r − mean) / std of the group's outcome rewards."""
    return cfg["estimator"] == "grpo" and cfg["reward_mode"] == "outcome" and advantage_scale(cfg) == "group"


def group_advantages(rewards, estimator, scale=None):
    """(P, G) rewards -> (advantages (P, G), degenerate (P,)) for a group estimator: its baseline,
        rloo     A_i = r_i − (Σ_{j≠i} r_j) / (G − 1)     (leave-one-out: the baseline ignores r_i)
        grpo, dr_grpo   A_i = r_i − mean(r_1..G)       (a mean with r_i in it shrinks the gradient by (G − 1)/G)
    then the group's population std as divisor when scale is "group" (None: what the estimator
    implies; "batch" comes later, over the whole batch). Degenerate groups get exactly 0."""
    degenerate = (rewards == rewards[..., :1]).all(-1)  # (grpo.degenerate_groups)
    G = rewards.size(1)
    scale = scale or advantage_scale(dict(estimator=estimator, adv_scale="auto"))
    if estimator in ("grpo", "dr_grpo"):
        adv = rewards - rewards.mean(1, keepdim=True)
    elif estimator == "rloo":
        if G < 2:
            raise ValueError("rloo needs group_size >= 2 (the others' mean is the baseline)")
        adv = rewards - (rewards.sum(1, keepdim=True) - rewards) / (G - 1)
    else:
        raise ValueError(f"{estimator!r} is not a group estimator")
    if scale == "group":
        adv = adv / torch.where(degenerate[:, None], 1.0, rewards.std(1, correction=0, keepdim=True))
    return torch.where(degenerate[:, None], 0.0, adv), degenerate


def advantages(run):
    """The advantages of the estimators and reward modes besides GRPO's: a function (run, rows) that
    sets rows.advantages (per response, or per token for process) and returns (P,) degenerate."""
    cfg = run.cfg
    G, estimator, scale, mode = cfg["group_size"], cfg["estimator"], advantage_scale(cfg), cfg["reward_mode"]

    def reinforce(run, ro):  # the batch-mean baseline needs the whole batch: batch_advantages
        ro.advantages = torch.zeros_like(ro.reward)
        return torch.zeros(len(ro.reward) // G, dtype=torch.bool)

    def process(run, ro):  # one advantage per token
        steps, ends = token_rewards(run, ro, run.env.step_rewards)
        ro.advantages, degenerate = process_advantages(steps, ends, ro.mask, G, estimator, scale)
        return degenerate

    def rlvp(run, ro):  # path: Φ alone (no outcome channel), the inaction trap
        signals = path_signals(run)
        path = torch.tensor([sum(v for _, v in signals(p, t)) for p, t in zip(ro.problems, ro.texts)],
                            dtype=torch.float32, device=ro.reward.device)  # float even when no row has a signal
        outcome = ro.reward if mode == "rlvp" else torch.zeros_like(ro.reward)
        beta = cfg["rlvp_beta"] if mode == "rlvp" else 1.0
        adv, degenerate = rlvp_advantages(outcome.view(-1, G), path.view(-1, G), estimator, beta, scale)
        ro.advantages = adv.flatten()
        return degenerate

    def estimated(run, ro):  # another group estimator on the outcome
        adv, degenerate = group_advantages(ro.reward.view(-1, G), estimator, scale)
        ro.advantages = adv.flatten()
        return degenerate
    return reinforce if estimator == "reinforce" else dict(process=process, rlvp=rlvp, path=rlvp).get(mode, estimated)


def batch_advantages(run):
    """The advantages that need the whole global batch (summed over ranks), a function (run, shards):
    estimator=reinforce's batch-mean baseline A = r − mean(r over the batch), then adv_scale=batch's
    one std (REINFORCE++); for the others nothing."""
    cfg = run.cfg

    def global_batch(run, shards):
        rewards = torch.cat([b.reward for b in shards])
        if cfg["estimator"] == "reinforce":
            total, n = all_reduce_sum([float(rewards.sum()), len(rewards)], run)
            for b in shards:
                b.advantages = b.reward - total / n
        if advantage_scale(cfg) == "batch":
            scaled = batch_scale([b.advantages for b in shards], [b.mask.sum(1) > 0 for b in shards], run)
            for b, adv in zip(shards, scaled):
                b.advantages = adv
    return global_batch if cfg["estimator"] == "reinforce" or advantage_scale(cfg) == "batch" else (lambda run, shards: None)


def batch_scale(advantages, kept, run):
    """adv_scale=batch: divide by the population std of the advantages of every kept response of
    the global batch (summed over ranks). advantages, kept: lists of this rank's (N,) tensors."""
    a = torch.cat(advantages)[torch.cat(kept)]
    s, sq, n = all_reduce_sum([float(a.sum()), float((a ** 2).sum()), len(a)], run)
    std = max(sq / max(n, 1) - (s / max(n, 1)) ** 2, 0.0) ** 0.5
    return [adv / std if std > 0 else adv for adv in advantages]


def process_advantages(step_rewards, step_ends, mask, group_size, estimator, scale=None):
    """Process supervision as in the GRPO paper (Shao et al. 2024, §4.1.3; SPEC §3 Process vs
    outcome): the step rewards of a group's G responses are normalised together,
        r̃_j = (r_j − mean(R)) / std(R)      R = every step reward of the group (dr_grpo: r_j − mean(R)),
    and a token's advantage sums the normalised rewards of the steps that end at or after it:
        A_t = Σ_{steps j with end(j) ≥ t} r̃_j.
    step_rewards (N, T) hold each step's reward at its last token, step_ends (N, T) bool mark those
    tokens, mask (N, T) the trained tokens; rows are grouped by prompt (N = P·G). Returns
    (advantages (N, T), degenerate (P,): groups whose step rewards are all equal get A = 0)."""
    N, T = step_rewards.shape
    r, on = step_rewards.reshape(-1, group_size * T), step_ends.reshape(-1, group_size * T)
    n = on.sum(1, keepdim=True).clamp(min=1)
    degenerate = (torch.where(on, r, float("-inf")).amax(1) == torch.where(on, r, float("inf")).amin(1)) | ~on.any(1)
    centred = torch.where(on, r - torch.where(on, r, 0.0).sum(1, keepdim=True) / n, 0.0)
    if (scale or advantage_scale(dict(estimator=estimator, adv_scale="auto"))) == "group":
        std = ((centred ** 2).sum(1, keepdim=True) / n).sqrt()
        centred = centred / torch.where(degenerate[:, None], 1.0, std)
    normalised = torch.where(degenerate[:, None], 0.0, centred).reshape(N, T)
    return normalised.flip(1).cumsum(1).flip(1) * mask, degenerate


def rlvp_advantages(outcome, path, estimator, beta, scale=None):
    """RLVP (SPEC §3, "reward the outcome, constrain the process"): R = O + β·Φ with the two channels
    normalised separately, then combined: each goes through the group estimator on its own (grpo:
    z-scored over the group), A = Â(O) + β·Â(Φ), so a dense path signal cannot drown the sparse
    outcome however many actions it counts. outcome, path (P, G). A channel whose group is all equal
    adds 0; the group is degenerate when both are."""
    outcome_adv, outcome_flat = group_advantages(outcome, estimator, scale)
    path_adv, path_flat = group_advantages(path, estimator, scale)
    return outcome_adv + beta * path_adv, outcome_flat & path_flat


def grpo_advantages(rewards, on_degenerate="raise"):
    """The seed's primitive (M14 §13) in torch, the reference the tests hold the advantages to:
    (r − mean) / std with the population std (ddof = 0), per group along the last dimension ((G,)
    or (P, G)). A degenerate group is an error or zeros."""
    if on_degenerate not in ("raise", "zeros"):
        raise ValueError(f"on_degenerate must be 'raise' or 'zeros', got {on_degenerate!r}")
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.float()
    if r.dim() not in (1, 2) or r.size(-1) < 2:
        raise ValueError(f"rewards must be one group (G,) or groups (P, G) with G >= 2, got shape {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite (got NaN or inf)")
    degenerate = (r == r[..., :1]).all(-1)
    if degenerate.any() and on_degenerate == "raise":
        raise ValueError(f"{int(degenerate.sum())} group(s) with all rewards equal: no relative signal "
                         f"(choose on_degenerate='zeros', or drop such groups)")
    centred = r - r.mean(-1, keepdim=True)
    std = r.std(-1, correction=0, keepdim=True)
    return torch.where(degenerate.unsqueeze(-1), 0.0, centred / torch.where(degenerate.unsqueeze(-1), 1.0, std))
