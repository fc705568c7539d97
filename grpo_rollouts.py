"""
The GRPO family's rollout options, beside grpo.py: what the trainer scores π_old on (top_k / top_p,
old_logprobs=recompute), DAPO's overlong filter (mask_truncated), prompts at the edge of competence
(prompt_sampling=edge) and one-step-off rollouts (staleness=1), with what a resumed run needs of
them. grpo.setup chooses among them once. SPEC §3 (DAPO).
"""

import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import torch

from nanopost.checkpoints import frozen
from nanopost.distributed import all_reduce_sum, seeded_rng
from nanopost.rollouts import old_logprobs_mode, score_tokens, shard_problems, shard_size


def truncation(cfg):
    """The sampler's cut, top_k / top_p, as keywords for the trainer's scoring ({}: none): π_θ and
    π_old are then scored on the truncated, renormalised distribution the tokens were drawn from
    (model.sampled_logprobs), so that ρ = 1 before an update."""
    return {k: v for k, v in (("top_k", cfg["top_k"]), ("top_p", cfg["top_p"])) if v and v != 1.0}


def masking_truncated(sample):
    """mask_truncated (DAPO's overlong filtering): a response cut by max_new_tokens keeps its reward in
    its group's baseline but gets no loss term (mask 0): its tokens are not a finished answer, and a
    0 for a cut answer would teach that long reasoning is wrong."""
    def sample_then_mask(*args, **kwargs):
        ro = sample(*args, **kwargs)
        ro.mask = ro.mask * ~ro.truncated[:, None]
        return ro
    return sample_then_mask


def old_logprobs(run, truncation):
    """Where π_old comes from: (a function (run, model, rows) for a rollout, one (run, micro_batches)
    for the loss's rows). sampler: the sampler's own log-probs, equal to a training forward in fp32
    (nothing to do). recompute: one no-grad forward of the sampling weights on the distribution
    `truncation` cuts (top_k, top_p: the one sampled, or {} for the whole), the sampler's numbers kept
    for sampler_logprob_gap and TIS; again on the very rows the loss sees, since under bf16 autocast
    the same rows in another batch shape round differently (not with staleness: there π_old is the
    sampler's weights, which the loop's model no longer holds)."""
    if old_logprobs_mode(run) != "recompute":
        return (lambda run, model, ro: None), (lambda run, micro_batches: None)

    def recompute(run, model, ro):
        ro.sampler_logprobs = ro.old_logprobs
        ro.old_logprobs = score_tokens(run, model, ro.ids, ro.prompt_lens, **truncation) * ro.mask

    def rescore(run, micro_batches):
        for micro in micro_batches:
            micro.old_logprobs = score_tokens(run, run.raw_model, micro.ids, micro.prompt_lens, **truncation) * micro.mask
    return recompute, (rescore if not run.cfg["staleness"] else (lambda run, micro_batches: None))


def edge_prompts(run, saved):
    """prompt_sampling=edge (SPEC §3 DAPO, budget at the edge of competence): a fixed pool of
    prompt_pool train problems (seed = the run's seed) and each prompt's running success s (NaN:
    unseen). Each iteration draws prompts_per_iter distinct pool prompts (edge_draw); after the
    rollouts every rank's group rewards, summed over ranks, update s (edge_update). Returns the
    prompt source: draw(run, it), problems(run, it, shard, round), record(run, group_rewards)."""
    cfg = run.cfg
    pool = SimpleNamespace(members=run.env.problems("train", cfg["prompt_pool"], seed=cfg["seed"]), drawn=None)
    pool.success = saved["pool_success"].numpy().copy() if saved else np.full(len(pool.members), np.nan)

    def draw(run, it):  # the same on every rank
        pool.drawn = edge_draw(pool.success, cfg["prompts_per_iter"], seeded_rng(run, it), cfg["edge_low"],
                               cfg["edge_high"]).reshape(-1, shard_size(run))
        before = pool.success[pool.drawn.reshape(-1)]
        in_band = (before >= cfg["edge_low"]) & (before <= cfg["edge_high"])
        return dict(edge_unseen_frac=float(np.isnan(before).mean()), edge_in_band_frac=float(in_band.mean()))

    def problems(run, it, shard, round_):  # this shard's slice of the draw, the sampler's seed as ever
        return [pool.members[i] for i in pool.drawn[shard]], shard_problems(run, it, shard, round_)[1]

    def record(run, group_rewards):
        n, n_shards = shard_size(run), len(pool.drawn)
        mine = np.zeros(n_shards * n)
        for s, rewards in zip(range(run.rank, n_shards, run.world_size), group_rewards):
            mine[s * n:(s + 1) * n] = rewards
        edge_update(pool.success, pool.drawn.reshape(-1), np.array(all_reduce_sum(mine.tolist(), run)))
        return dict(pool_seen_frac=float((~np.isnan(pool.success)).mean()))
    pool.draw, pool.problems, pool.record = draw, problems, record
    return pool


def edge_draw(success, n, rng, low, high):
    """n distinct pool indices: unseen prompts first (pool order), then those with running success
    in [low, high] at random, then the rest nearest the band's middle. success: (pool,), NaN = unseen."""
    seen = ~np.isnan(success)
    in_band = np.flatnonzero(seen & (success >= low) & (success <= high))
    rest = np.flatnonzero(seen & ((success < low) | (success > high)))
    rest = rest[np.argsort(np.abs(success[rest] - (low + high) / 2), kind="stable")]
    return np.concatenate([np.flatnonzero(~seen), rng.permutation(in_band), rest])[:n]


def edge_update(success, drawn, group_success):
    """The running success of the drawn prompts: the group's mean reward on a first visit, else the
    mean of the old estimate and the new one (recent visits weigh most: the policy moves)."""
    old = success[drawn]
    success[drawn] = np.where(np.isnan(old), group_success, (old + group_success) / 2)


def sampler_copy(run, saved):
    """staleness=1: the sampling weights (a frozen copy, the checkpoint's when resuming), the iteration
    they were copied at, the pending rollouts and the second thread that samples them."""
    sampler = SimpleNamespace(model=frozen(run.raw_model), iter=None, pending=None,
                              thread=ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-sampler"))
    if saved:
        sampler.model.load_state_dict(saved["sampler"])
        sampler.iter = saved["sampler_iter"]
    return sampler


def one_step_off_rollouts(run, state, it, sample_shards):
    """staleness=1: return the rollouts of iteration `it`, sampled by the weights of it − 1 while
    the update of it − 1 ran, and start sampling those of it + 1 with the weights of it, to run
    while the loop updates. -> (rollouts, figures: staleness, time_wait_rollouts).

    A second thread with its own copy of the weights (state.sampler, refreshed here, between two
    updates, while the thread is idle). Torch releases the GIL inside its ops, so on a CPU the
    sampler's decode and the update's forward/backward run on different cores at once. The thread
    runs sample_shards only: no collective (the DDP all-reduces stay on the main thread, in the same
    order on every rank) and no global RNG (each shard's sampler has its own seeded generator), so
    the rollouts of `it` depend on (seed, it) and the sampler's weights alone. On a GPU it shares the
    default stream: only the host-side work overlaps. The checkpoint holds the sampler's weights, so
    a resumed run's first iteration samples what the uninterrupted run sampled in the background."""
    sampler, t0 = state.sampler, time.time()
    rollouts = sample_shards(run, state, sampler.model, it) if sampler.pending is None else sampler.pending.result()
    # how many updates behind the trained weights the rollouts' sampler is (None: it holds them)
    lag = 0 if sampler.iter is None else it - sampler.iter
    if not 0 <= lag <= run.cfg["staleness"]:
        raise RuntimeError(f"iteration {it} would train on rollouts of the weights of iteration {sampler.iter}: "
                           f"staleness {lag} > {run.cfg['staleness']}")
    figures = dict(staleness=lag, time_wait_rollouts=time.time() - t0)  # (the wait: what the overlap did not hide)
    sampler.model.load_state_dict(run.raw_model.state_dict())
    sampler.iter = it
    last = it + 1 >= run.cfg["max_iters"]
    sampler.pending = None if last else sampler.thread.submit(sample_shards, run, state, sampler.model, it + 1)
    return rollouts, figures


def state_dict(state):
    """What a resumed run needs: staleness=1's sampling weights, prompt_sampling=edge's running success."""
    saved = {}
    if state.sampler is not None:
        saved.update(sampler=state.sampler.model.state_dict(), sampler_iter=state.sampler.iter)
    if hasattr(state.prompts, "success"):
        saved["pool_success"] = torch.from_numpy(state.prompts.success.copy())
    return saved
