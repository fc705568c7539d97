"""Prompts at the edge of competence (SPEC §3, DAPO's budget argument; Foster & Foerster 2025, "Learning
to Reason at the Frontier of Learnability", arXiv:2502.12272): a prompt the policy always or never solves
gives a degenerate group, no gradient, so the rollouts go first to prompts whose running success s lies
in a band [edge_low, edge_high]. A fixed pool of prompt_pool train problems (seed = the run's seed), each
with s (NaN: unseen); each iteration draws prompts_per_iter distinct ones, unseen first, then those in
the band at random, then the rest nearest the band's middle; after the rollouts the group rewards,
summed over ranks, update s:

    s ← r̄_group on a first visit, else (s + r̄_group) / 2        (recent visits weigh most: the policy moves)

Logged: edge_unseen_frac, edge_in_band_frac (of the draw), pool_seen_frac. Everything else is grpo.py's."""

import numpy as np
import torch

import grpo
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what the prompts do not change)
from nanopost.distributed import all_reduce_sum, seeded_rng
from nanopost.rollouts import shard_problems, shard_size

base = "grpo"
defaults = dict(
    grpo.defaults,
    prompt_pool=2048,   # the pool's size (prompts come back once it is used up)
    edge_low=0.2,       # the lower end of the band of running success that is drawn first
    edge_high=0.8,      # the upper end of that band
)


def setup(run, saved):
    """GRPO's, with the pool and its running success (the checkpoint's when resuming)."""
    cfg = run.cfg
    if cfg["prompt_pool"] < cfg["prompts_per_iter"] or cfg["edge_low"] > cfg["edge_high"]:
        raise ValueError(f"--algo edge_prompts needs prompt_pool >= prompts_per_iter={cfg['prompts_per_iter']} "
                         f"and edge_low <= edge_high")
    state = grpo.setup(run, saved)
    state.pool = run.env.problems("train", cfg["prompt_pool"], seed=cfg["seed"])
    state.success = saved["pool_success"].numpy().copy() if saved else np.full(len(state.pool), np.nan)
    return state


def state_dict(run, state):
    """What a resumed run needs: the pool's running success."""
    return dict(pool_success=torch.from_numpy(state.success.copy()))


def batches(run, state, it):
    """Draw the iteration's prompts from the pool (the same on every rank), sample their groups, record."""
    cfg = run.cfg
    drawn = edge_draw(state.success, cfg["prompts_per_iter"], seeded_rng(run, it), cfg["edge_low"],
                      cfg["edge_high"]).reshape(-1, shard_size(run))
    before = state.success[drawn.reshape(-1)]
    figures = dict(edge_unseen_frac=float(np.isnan(before).mean()),
                   edge_in_band_frac=float(((before >= cfg["edge_low"]) & (before <= cfg["edge_high"])).mean()))
    shards = []
    for shard in grpo.my_shards(run):  # this shard's slice of the draw, the sampler's seed as ever
        ro = grpo.sample(run, run.raw_model, [state.pool[i] for i in drawn[shard]], shard_problems(run, it, shard, 0)[1])
        grpo.score(run, state, run.raw_model, ro)
        ro.reward = ro.verified
        ro.advantages = grpo.group_advantages(ro.reward, cfg["group_size"])
        shards.append(ro)
    record(run, state, drawn, shards)
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    figures.update(grpo.rollout_figures(run, state, shards), pool_seen_frac=float((~np.isnan(state.success)).mean()))
    return grpo.minibatches(run, shards), figures


def record(run, state, drawn, shards):
    """Every rank's group rewards, summed over ranks, into the drawn prompts' running success."""
    n = shard_size(run)
    mine = np.zeros(drawn.size)
    for shard, ro in zip(grpo.my_shards(run), shards):
        mine[shard * n:(shard + 1) * n] = ro.reward.view(-1, run.cfg["group_size"]).mean(1).tolist()
    edge_update(state.success, drawn.reshape(-1), np.array(all_reduce_sum(mine.tolist(), run)))


def edge_draw(success, n, rng, low, high):
    """n distinct pool indices: unseen prompts first (pool order), then those with running success
    in [low, high] at random, then the rest nearest the band's middle. success: (pool,), NaN = unseen."""
    seen = ~np.isnan(success)
    in_band = np.flatnonzero(seen & (success >= low) & (success <= high))
    rest = np.flatnonzero(seen & ((success < low) | (success > high)))
    rest = rest[np.argsort(np.abs(success[rest] - (low + high) / 2), kind="stable")]
    return np.concatenate([np.flatnonzero(~seen), rng.permutation(in_band), rest])[:n]


def edge_update(success, drawn, group_success):
    """s ← the group's mean reward on a first visit, else the mean of the old estimate and the new one."""
    old = success[drawn]
    success[drawn] = np.where(np.isnan(old), group_success, (old + group_success) / 2)
