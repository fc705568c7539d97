"""Partial credit for the correct prefix, normalised over the batch (SPEC §3 "RLVP", "Process vs outcome
rewards"): the outcome O stays z-scored within each group, as in grpo.py; the partial credit Φ, how far a
response got along the right path, is centred within its group but scaled by its spread over the whole
iteration's batch, not its group's:

    Φ_i   = the correct prefix: the steps of response i that are right before its first step that is not
            (env.step_rewards, the outcome at its end left out: equations of the worked solution, or
            the treasure hunt's calls that each bring the chest one action nearer)
    Φ̃_i   = (Φ_i − mean(Φ of i's group)) / σ        σ² = (1/N) Σ_j (Φ_j − mean(Φ of j's group))²
                                                      over the iteration's N responses (every shard, every rank)
    A_i   = Â(O)_i + β·Φ̃_i                          Â(O)_i = (O_i − mean(O_1..G)) / std(O_1..G)

lab/rlvp.py z-scores Φ within each group, so in a group where every sample failed its advantage is
β·Â(Φ), the path signal at unit scale however little the samples differ (docs/rlvp.md). Here β·Φ̃ has
root-mean-square β over the batch: a group whose prefixes barely differ gets little, and a failing
group's credit is on the scale of the other groups', not blown up to its own. Normalising over the
batch rather than the group: REINFORCE++ (Hu et al. 2025, arXiv:2501.03262); partial credit for the
steps before the first error: Lightman et al. 2023 ("Let's verify step by step", arXiv:2305.20050).
It logs shaping_adv_share, Σ|β·Φ̃| / (Σ|Â(O)| + Σ|β·Φ̃|), the share of the advantage mass the
partial credit carries, and correct_prefix, the mean Φ. Everything else is grpo.py's."""

import torch

import grpo
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what partial credit does not change)
from nanopost.distributed import all_reduce_sum

base = "grpo"
defaults = dict(
    grpo.defaults,
    partial_beta=0.5,      # β: the root-mean-square of the partial credit β·Φ̃ over a batch, in [0, 1]
)


def setup(run, saved):
    """GRPO's, for an environment that judges steps."""
    if not hasattr(run.env, "step_rewards"):
        raise ValueError(f"--algo partial_credit needs env.step_rewards, which env {run.env.name!r} does not have")
    return grpo.setup(run, saved)


def batches(run, state, it):
    """GRPO's groups; to each advantage the partial credit β·Φ̃ added, σ taken over all the shards."""
    G, beta = run.cfg["group_size"], run.cfg["partial_beta"]
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    prefixes = [correct_prefixes(run, ro) for ro in shards]
    centred = [within_groups(phi, G) for phi in prefixes]
    sums = all_reduce_sum(dict(squares=sum(float((c ** 2).sum()) for c in centred), n=sum(len(c) for c in centred),
                               phi=sum(float(phi.sum()) for phi in prefixes)), run)
    sigma = (sums["squares"] / sums["n"]) ** 0.5
    outcome = [grpo.group_advantages(ro.reward, G) for ro in shards]
    shaping = [partial_credit(c, sigma, beta) for c in centred]
    for ro, a_outcome, a_shaping in zip(shards, outcome, shaping):
        ro.advantages = a_outcome + a_shaping  # A_i = Â(O)_i + β·Φ̃_i
    figures = grpo.rollout_figures(run, state, shards)
    figures.pop("adv_sign_error_frac", None)  # (the advantage is not the outcome's alone)
    mass = all_reduce_sum(dict(outcome=sum(float(a.abs().sum()) for a in outcome),
                               shaping=sum(float(a.abs().sum()) for a in shaping)), run)
    figures.update(shaping_adv_share=mass["shaping"] / (mass["outcome"] + mass["shaping"]) if mass["shaping"] else 0.0,
                   correct_prefix=sums["phi"] / sums["n"])
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), figures


def correct_prefixes(run, ro):
    """Φ_i of every response: its leading steps judged right (> 0) by env.step_rewards, whose last entry,
    the outcome, is not a step."""
    def prefix(steps):
        return next((k for k, (_, value) in enumerate(steps) if value <= 0), len(steps))
    return torch.tensor([float(prefix(run.env.step_rewards(p, t)[:-1])) for p, t in zip(ro.problems, ro.texts)],
                        device=ro.reward.device)


def within_groups(phi, G):
    """Φ_i − mean(Φ of i's group), (N,) -> (N,)."""
    phi = phi.view(-1, G)
    return (phi - phi.mean(1, keepdim=True)).flatten()


def partial_credit(centred, sigma, beta):
    """β·Φ̃_i = β·(Φ_i − mean(Φ of i's group)) / σ; 0 where no group's prefixes differ (σ = 0)."""
    return beta * centred / sigma if sigma > 0 else torch.zeros_like(centred)
