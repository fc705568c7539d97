"""
Devices and processes: the run's device, DDP process group and autocast (setup_device), with
malloc keeping the host memory a step frees (keep_freed_memory); FSDP2 sharding and the gathered
weights of sampling (shard_model, gathered, the lockstep of --fsdp_rollouts=sharded); collectives
and rank helpers (all_reduce_sum, gather_objects, over_ranks, shard, rank0_first); and the memory
anatomy of the algorithms' model states (SPEC §5, M14 §10, §13).
"""

import contextlib
import ctypes
import ctypes.util
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from model import GPT, Block, ScalarHeadGPT, count_parameters


def cuda_device(local_rank, n_gpus):
    """torchrun's LOCAL_RANK -> "cuda:i", or an error when this machine has fewer GPUs than ranks."""
    if local_rank >= n_gpus:
        raise ValueError(f"LOCAL_RANK={local_rank} but this machine has {n_gpus} CUDA device(s): start at most "
                         f"{n_gpus} processes per node (torchrun --nproc_per_node={max(n_gpus, 1)})")
    return f"cuda:{local_rank}"


def autocast_dtype(device, bf16_supported):
    """The dtype of autocast on `device`: bf16 on a GPU that has it (Ampere and newer); None (fp32, no
    autocast) elsewhere: on an older GPU bf16 is emulated, slowly, and fp16 would need loss scaling."""
    return torch.bfloat16 if device.startswith("cuda") and bf16_supported else None


def keep_freed_memory():
    """Let glibc's malloc keep the memory a step frees for the next step, rather than hand large blocks
    to mmap and its heap's top back to the system, so that each step faults in fresh zeroed pages for
    the activations the step before freed: SFT and GRPO steps about 6% faster on one CPU thread
    (docs/benchmarks.md, "The allocator"), the same numbers. Linux with glibc only; idempotent."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        for param in (-1, -3):  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (glibc's malloc.h)
            libc.mallopt(param, 1 << 30)
    except (OSError, AttributeError):  # a libc without mallopt (musl): its own policy
        pass


def setup_device(cfg):
    """The run's device, process group and autocast: NCCL between GPUs, gloo between CPU processes."""
    keep_freed_memory()
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if cfg["device"] == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    else:
        device = cfg["device"]
    if device.startswith("cuda") and not torch.cuda.is_available() or device == "mps" and not torch.backends.mps.is_available():
        build = " (this torch is built without CUDA)" if device.startswith("cuda") and torch.version.cuda is None else ""
        raise ValueError(f"--device={device}: this machine has no such device{build}; use --device=cpu, or auto")
    rank, world_size = 0, 1
    if ddp:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if device.startswith("cuda"):
            device = cuda_device(int(os.environ.get("LOCAL_RANK", rank)), torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    dtype = autocast_dtype(device, device.startswith("cuda") and torch.cuda.is_bf16_supported(including_emulation=False))
    if device.startswith("cuda") and dtype is None and rank == 0:
        print(f"{device}: this GPU has no bf16 (it is emulated before Ampere): training in fp32, without autocast")
    autocast = torch.autocast("cuda", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    # fsdp: shard models over the ranks (FSDP2) rather than copy them (DDP); one process has nothing to shard
    fsdp = bool(cfg.get("fsdp")) and ddp
    if cfg.get("fsdp_rollouts", "gathered") not in ("gathered", "sharded"):
        raise ValueError(f"fsdp_rollouts={cfg['fsdp_rollouts']!r}: choose gathered or sharded")
    # lockstep: under --fsdp_rollouts=sharded sampling and scoring forwards stay sharded, each a collective
    lockstep = fsdp and cfg.get("fsdp_rollouts") == "sharded"
    return SimpleNamespace(device=device, ddp=ddp, rank=rank, world_size=world_size, master=rank == 0,
                           autocast=autocast, dtype=dtype or torch.float32, fsdp=fsdp, sharded=[], gathering=False,
                           lockstep=lockstep)


# Memory anatomy [SPEC §5, M14 §10, §13]: persistent model states only (no activations, KV cache, buffers);
# and the cost of rollouts against training (SPEC §7)
BYTES_PER_PARAM = {"train": 16, "frozen_bf16": 2}  # bf16 w + bf16 grad + fp32 master + 2 fp32 Adam; bf16 w


# the models each algorithm holds: trained ones (AdamW) and frozen ones (reference, teacher, reward model)
ALGO_MODELS = dict(sft=["train"], rm=["train"], rft=["train"], dpo=["train", "frozen_bf16"],
                   grpo=["train", "frozen_bf16"], opd=["train", "frozen_bf16"],  # π_ref; the teacher
                   ppo=["train", "train", "frozen_bf16", "frozen_bf16"])  # policy, critic; π_ref, reward model


def stage_memory_gib(n_params, stack):
    """The seed's teaching estimate of persistent model states (activations, KV cache, buffers,
    sharding excluded), in GiB: one entry of `stack` per model copy, "train" or "frozen_bf16"."""
    if not math.isfinite(n_params) or n_params <= 0:
        raise ValueError("n_params must be finite and positive")
    unknown = sorted(set(stack) - set(BYTES_PER_PARAM))
    if unknown:
        raise ValueError(f"unknown model state kinds {unknown}; expected {sorted(BYTES_PER_PARAM)}")
    return sum(BYTES_PER_PARAM[kind] * n_params for kind in stack) / 2**30


def gpu_memory_gib(n_params, algo, gpus, fsdp, rollouts="gathered"):
    """Persistent states per GPU of `algo` with models of n_params each, on `gpus` GPUs:
    (training, rollouts). DDP: every GPU holds every model state whatever the count. FSDP2: each holds
    1/gpus of them, and with rollouts="gathered", while sampling and scoring (gathered), also
    every model's full weights in bf16, 2 B/param each; with rollouts="sharded" (lockstep) no full
    copy, only one block's weights at a time (transient, not counted, like activations). Past one
    GPU's memory under DDP is where --fsdp starts to pay."""
    if rollouts not in ("gathered", "sharded"):
        raise ValueError(f"rollouts={rollouts!r}: choose gathered or sharded")
    states = stage_memory_gib(n_params, ALGO_MODELS[algo])
    if not fsdp:
        return states, states
    if rollouts == "sharded":
        return states / gpus, states / gpus
    return states / gpus, states / gpus + stage_memory_gib(n_params, ["frozen_bf16"] * len(ALGO_MODELS[algo]))



def rollout_cost(prompts, answers, tokens, gpus, tok_per_s_per_gpu, n_params, flops_per_gpu, mfu):
    """Why rollouts dominate RL's cost (SPEC §7, seed M14 §11): decoding prompts·answers·tokens at
    tok_per_s_per_gpu on each of `gpus` against one training pass over the same tokens by 6·N·D
    FLOPs at flops_per_gpu·mfu. Returns dict(tokens, decode_s, decode_min, train_min, ratio)."""
    n_tokens = prompts * answers * tokens
    decode_s = n_tokens / (gpus * tok_per_s_per_gpu)
    train_s = 6 * n_params * n_tokens / (gpus * flops_per_gpu * mfu)
    return dict(tokens=n_tokens, decode_s=decode_s, decode_min=decode_s / 60, train_min=train_s / 60,
                ratio=decode_s / train_s)


def role_memory_gib(module, trained):
    """stage_memory_gib of one role: a trained role's frozen part (LoRA's base weights) counts as frozen."""
    n_train, n_total = count_parameters(module)
    if not trained or n_train == 0:
        return stage_memory_gib(n_total, ["frozen_bf16"])
    frozen = stage_memory_gib(n_total - n_train, ["frozen_bf16"]) if n_total > n_train else 0.0
    return stage_memory_gib(n_train, ["train"]) + frozen


def shard_model(run, model):
    """FSDP2's fully_shard on every transformer block, then on every language model and scalar head:
    each keeps 1/world_size of its weights (and, if trained, of its gradients and AdamW state) and
    all-gathers the rest for its forward and backward, one block at a time. Frozen models (reference,
    teacher, reward model) too, without optimizer state. On a GPU the gathered weights are in the
    autocast dtype and gradients are reduced in fp32 (MixedPrecisionPolicy). A scalar head's backbone
    is not a unit of its own (the head calls its `hidden`, not its forward, which carries the hooks):
    its embeddings go with the head. A module that holds several models (PPO's policy and critic) is
    not a unit itself: each model is a root of its own, so that one can run without the other (the
    sampler calls the policy alone). Called under --fsdp only."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor
    # inputs are not cast (autocast does it), so that a block's `record` list stays the caller's object
    policy = MixedPrecisionPolicy(param_dtype=run.dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    backbones = {id(m.gpt) for m in model.modules() if isinstance(m, ScalarHeadGPT)}
    for module in reversed(list(model.modules())):  # children before their parents
        unit = isinstance(module, (Block, ScalarHeadGPT)) or (isinstance(module, GPT) and id(module) not in backbones)
        if unit and not isinstance(module, FSDPModule):
            fully_shard(module, mp_policy=policy)
    unsharded = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if unsharded:  # (a weight outside every unit would train unsynchronised on each rank)
        raise ValueError(f"--fsdp: parameters outside every sharded unit: {unsharded[:3]}")
    run.sharded.append(model)
    if run.gathering:  # made inside `gathered`: gathered like the others
        set_gathered(model, True)
    return model


def set_gradient_sync(model, on):
    """--fsdp: whether the next backward reduce-scatters gradients (the last micro-batch of a step),
    on every sharded unit of `model` (PPO's holds two roots: policy and critic)."""
    for unit in fsdp_units(model):
        unit.set_requires_gradient_sync(on, recurse=False)


def keep_gathered_through_backward(model):
    """--fsdp with shared prompts: a shared prompt runs every block twice in one forward (the prompts,
    then the continuations), and FSDP2 would free a block's gathered weights after the first of its
    two backwards, which the second needs. They stay gathered through the backward instead; the loop
    reshards them after it (train.optimizer_step: without that, FSDP2 fails at the next forward)."""
    for unit in fsdp_units(model):
        unit.set_reshard_after_backward(False, recurse=False)


def fsdp_units(model):
    """The FSDP2-sharded modules of `model` (each block, each language model or scalar head)."""
    from torch.distributed.fsdp import FSDPModule
    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def set_gathered(model, on):
    for unit in fsdp_units(model):
        unit.unshard() if on else unit.reshard()
        unit.set_reshard_after_forward(not on, recurse=False)


@contextlib.contextmanager
def gathered(run):
    """--fsdp: the full weights of every sharded model on every rank for the block (one all-gather per
    block of each), so its forwards need no collective. Sampling, scoring, setup and evaluation run
    inside it: there ranks take different numbers of forwards (rows stop at different steps, a rank
    may hold fewer evaluation problems), which sharded forwards, each a collective, could not do. The
    price is a full copy of the weights (in the compute dtype) per GPU meanwhile; the optimizer
    state and gradients stay sharded. Training forwards run outside it, sharded. Nothing under DDP.
    Under --fsdp_rollouts=sharded nothing is gathered: ranks step together instead (all_ranks_busy)."""
    if not run.fsdp or run.gathering:
        yield
        return
    if not run.lockstep:  # (--fsdp_rollouts=sharded: the forwards stay sharded, all_ranks_busy, lockstep_count)
        for model in run.sharded:
            set_gathered(model, True)
        run.gathering = True
    try:
        yield
    finally:  # resharded in lockstep too: FSDP2's root keeps its weights gathered after forwards
        run.gathering = False  # without gradient, and the first training step's gradient came out wrong
        for model in run.sharded:
            set_gathered(model, False)


def all_ranks_busy(run):
    """--fsdp_rollouts=sharded: the sampler's lockstep, busy(this rank has a forward to make) -> whether
    any rank has (one all-reduce per decode step). Otherwise ranks decode independently."""
    def busy(mine):
        flag = torch.tensor([float(mine)], device=run.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    return busy


def lockstep_count(run, n):
    """How many sampling or scoring calls every rank makes when this one has n to make: n, or under
    --fsdp_rollouts=sharded the most any rank has (a rank pads with dummy calls: each forward is a
    collective, and a rank may hold fewer evaluation problems than another)."""
    if not run.lockstep:
        return n
    count = torch.tensor([n], device=run.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def place(run, model):
    """A frozen model on the run's device, sharded under --fsdp."""
    model = model.to(run.device)
    return shard_model(run, model) if run.fsdp else model


def all_reduce_sum(values, run):
    """Sum floats over ranks (identity in one process): a list, or a dict of named values, reduced
    in sorted key order (every rank sends the same layout) and returned as a dict."""
    if isinstance(values, dict):
        keys = sorted(values)
        return dict(zip(keys, all_reduce_sum([values[k] for k in keys], run)))
    if not run.ddp:
        return [float(v) for v in values]
    # one tensor of floats and 0-d tensors, read back to the host once (one sync, not one per value)
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=run.device).detach() for v in values])
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(run, obj):
    """Every rank's `obj` (picklable), in rank order, on every rank: [obj] in one process."""
    if not run.ddp:
        return [obj]
    out = [None] * run.world_size
    dist.all_gather_object(out, obj)
    return out


def over_ranks(run, items, size, fn):
    """[fn(chunk, i) for every chunk i of `items`], chunk i computed by rank i mod world_size alone,
    the results (picklable, on the CPU) gathered to every rank in order: setup work every rank needs
    the whole of is done once, not once per rank, and its result is what one process computes (a
    chunk's result depends only on the chunk and its index, not on the rank that computes it)."""
    parts = chunks(items, size)
    mine = {i: fn(parts[i], i) for i in range(run.rank, len(parts), run.world_size)}
    gathered = gather_objects(run, mine)
    return [gathered[i % run.world_size][i] for i in range(len(parts))]


@contextlib.contextmanager
def rank0_first():
    """Rank 0 runs the block first (a download fills the cache), then the other ranks (from the
    cache): no rank downloads the same files at once. Every rank must enter it."""
    ranked = dist.is_available() and dist.is_initialized()
    if ranked and dist.get_rank() != 0:
        dist.barrier()
    yield
    if ranked and dist.get_rank() == 0:
        dist.barrier()


def chunks(items, size):
    """Consecutive slices of at most `size` items (a list or a tensor): evaluation, scoring and
    sampling run one chunk at a time, so memory does not grow with the number of examples."""
    return [items[start:start + size] for start in range(0, len(items), size)]


def shard(items, run, micro_steps, batch_size):
    """Split one global batch (a list) into this rank's micro-batches. The same global batch gives
    the same gradient for any (processes × micro-batches) split, since the loop divides by the
    global count."""
    assert len(items) == run.world_size * micro_steps * batch_size
    return [items[(m * run.world_size + run.rank) * batch_size:][:batch_size] for m in range(micro_steps)]


def seeded_rng(run, *keys):
    """A numpy RNG that depends only on the seed and `keys` (e.g. the iteration): batches are a pure
    function of the step, so a resumed run draws exactly what the uninterrupted one would."""
    return np.random.default_rng([run.cfg["seed"], *keys])
