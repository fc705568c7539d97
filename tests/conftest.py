"""Shared test fixtures: a tiny model config and a two-process (gloo) runner for train.train."""

import contextlib
import os
import socket
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)

# A model small enough that a few iterations take well under a second on one core (common keys
# only, so every algorithm accepts it); SFT_DATA shrinks the built-in SFT data to match.
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=128, batch_size=4, eval_interval=0,
            log_interval=1, warmup_iters=2, max_iters=3, eval_problems=8, eval_batch_size=8,
            device="cpu", plot=False)
SFT_DATA = dict(train_problems=256, corpus_docs=256, val_examples=8)


@pytest.fixture
def tiny(tmp_path):
    """TINY plus a fresh out_dir."""
    return dict(TINY, out_dir=str(tmp_path / "run"))


def free_ports(n):
    """n distinct ports free now (held open together while the OS picks them, so none repeats)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _worker(rank, world_size, port, fn, args, results):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    results[rank] = fn(*args)


def random_ids(vocab, batch, length, seed):
    """(batch, length) token ids below vocab, the same for a seed (the checkpoint-import tests)."""
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# The ranks fork from one server process that has imported torch and the project once (forkserver),
# not each from a fresh interpreter (spawn): about 3 s less a launch, and the suite launches some 25.
mp.set_forkserver_preload(["torch", "model", "train"])
DDP_DEADLINE_S = 600  # far above any one run here (seconds on one core); a rank stuck in a collective waits forever


def run_ddp(fn, *args, world_size=2):
    """Run fn(*args) in `world_size` gloo processes set up as torchrun would; returns each rank's
    result (fn must be a module-level function and its result picklable). A run that has not ended
    after DDP_DEADLINE_S fails the test, its processes killed, rather than hang the suite."""
    results = mp.Manager().dict()
    context = mp.start_processes(_worker, args=(world_size, free_ports(1)[0], fn, args, results), nprocs=world_size,
                                 join=False, start_method="forkserver")
    deadline = time.monotonic() + DDP_DEADLINE_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            alive = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
            for process in context.processes:
                process.kill()
            pytest.fail(f"{fn.__name__} on {world_size} gloo processes did not end in {DDP_DEADLINE_S} s "
                        f"(ranks {alive} still running: one waits for another in a collective or a rendezvous)")
    return [results[r] for r in range(world_size)]


@contextlib.contextmanager
def forward_calls(**modules):
    """A list that gets the keyword name of a module at each of its forward passes outside the
    sampler (whose passes carry a KV cache): the scoring, training and evaluation forwards."""
    calls = []

    def hook_for(name):
        return lambda module, args, kwargs: calls.append(name) if kwargs.get("cache") is None else None

    hooks = [m.register_forward_pre_hook(hook_for(name), with_kwargs=True) for name, m in modules.items()]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()
