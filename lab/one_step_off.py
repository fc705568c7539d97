"""One-step-off rollouts (staleness 1; Noukhovitch et al. 2024, "Asynchronous RLHF", arXiv:2410.18252):
the rollouts of iteration k + 1 are sampled by the weights of k in a second thread while the update of k
runs, so sampling and training overlap; the loss's ratio is against the sampler's log-probs, π_old = the
weights one update behind (ρ ≠ 1 from the first step: the clip does its work).

The thread has its own copy of the weights (refreshed between two updates, while it is idle). Torch
releases the GIL inside its ops, so on a CPU the sampler's decode and the update's forward/backward run
on different cores at once. The thread runs the sampling only: no collective (the DDP all-reduces stay
on the main thread, in the same order on every rank) and no global RNG (each shard's sampler has its own
seeded generator), so the rollouts of k depend on (seed, k) and the sampler's weights alone. On a GPU it
shares the default stream: only the host-side work overlaps. The checkpoint holds the sampler's weights,
so a resumed run's first iteration samples what the uninterrupted run sampled in the background.
Logged: staleness (updates behind: 0 on the first iteration, then 1) and time_wait_rollouts (what the
overlap did not hide). Everything else is grpo.py's."""

import time
from concurrent.futures import ThreadPoolExecutor

import grpo
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what the overlap does not change)
from nanopost.checkpoints import frozen
from nanopost.rollouts import old_logprobs_mode

base = "grpo"
defaults = dict(
    grpo.defaults,
    old_logprobs="sampler",  # π_old: the sampler's own log-probs (its weights are one update behind the loop's)
)


def setup(run, saved):
    """GRPO's, with the sampling weights (the checkpoint's when resuming) and the second thread."""
    if run.fsdp:
        raise ValueError("--algo one_step_off samples with a second copy of the weights in a thread: not with --fsdp")
    if old_logprobs_mode(run) == "recompute":
        raise ValueError("--algo one_step_off: π_old is the sampler's weights, one update behind: old_logprobs=sampler")
    state = grpo.setup(run, saved)
    state.sampler, state.sampler_iter, state.pending = frozen(run.raw_model), None, None
    state.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-sampler")
    if saved:
        state.sampler.load_state_dict(saved["sampler"])
        state.sampler_iter = saved["sampler_iter"]
    return state


def state_dict(run, state):
    """What a resumed run needs: the sampling weights and the iteration they were copied at."""
    return dict(sampler=state.sampler.state_dict(), sampler_iter=state.sampler_iter)


def batches(run, state, it):
    """The rollouts of `it`, sampled while the update of it − 1 ran; then start those of it + 1 with the
    weights of it."""
    t0 = time.time()
    shards = grpo.sample_shards(run, state, state.sampler, it) if state.pending is None else state.pending.result()
    lag = 0 if state.sampler_iter is None else it - state.sampler_iter  # updates behind the trained weights
    if not 0 <= lag <= 1:
        raise RuntimeError(f"iteration {it} would train on rollouts of the weights of iteration {state.sampler_iter}: "
                           f"staleness {lag} > 1")
    figures = dict(staleness=lag, time_wait_rollouts=time.time() - t0)
    state.sampler.load_state_dict(run.raw_model.state_dict())
    state.sampler_iter = it
    last = it + 1 >= run.cfg["max_iters"]
    state.pending = None if last else state.thread.submit(grpo.sample_shards, run, state, state.sampler, it + 1)
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), dict(figures, **grpo.rollout_figures(run, state, shards))
