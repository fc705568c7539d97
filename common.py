"""
The library every script imports (`import common as C`): devices and DDP, data files, models and
checkpoints, sampling with the environment's tool, the one rollout path (rollouts -> a Rollout:
generate, decode, verify, mask), the one policy evaluation (evaluate_policy), metrics plots.

train.py is the entry point and owns the configuration and the loop; the algorithm files
(sft.py, rm.py, dpo.py, grpo.py, ppo.py) and pairs.py build on this module. The rule that keeps
the layout one-way: this module imports no script and no algorithm file, only model.py,
sampler.py, tokenizer.py and envs.

A `run` (types.SimpleNamespace, made by setup_device and filled by train.train) is what the
helpers take: run.cfg (the configuration dict), run.tok, run.env, run.device, run.rank,
run.world_size, run.master, run.ddp, run.autocast, and the models.
"""

import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import shutil
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import hf
from envs import GSM8K, make_env
from model import GPT, Block, GPTConfig, ScalarHeadGPT, apply_lora, merge_lora, sequence_logprobs
from sampler import Samples, sample
from tokenizer import make_tokenizer


# Optional packages: the features that need them import them lazily, and the scripts turn their
# absence into one line naming the install command
OPTIONAL = dict(transformers="pip install -r requirements-extra.txt", safetensors="pip install -r requirements-extra.txt",
                trl="pip install -r experiments/peer_bench/peers/requirements.txt (in a second environment)")


def optional_dependency(error):
    """An ImportError of an optional package as one line: a missing module of OPTIONAL, or an error
    that already names its install command; any other is raised again."""
    package = (getattr(error, "name", None) or "").split(".")[0]
    if package in OPTIONAL:
        return f"this needs the optional package {package}: {OPTIONAL[package]}"
    if "pip install" in str(error):
        return str(error)
    raise error


# ----------------------------------------------------------------------------------------------
# Devices and DDP

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


def setup_device(cfg):
    """The run's device, process group and autocast: NCCL between GPUs, gloo between CPU processes."""
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if cfg["device"] == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    else:
        device = cfg["device"]
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


# ----------------------------------------------------------------------------------------------
# Memory anatomy [SPEC §5, M14 §10, §13]: persistent model states only (no activations, KV cache, buffers)

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
    1/gpus of them, and with rollouts="gathered", while sampling and scoring (common.gathered), also
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


# ----------------------------------------------------------------------------------------------
# FSDP2 (--fsdp): weights, gradients and optimizer state sharded over the ranks

def shard_model(run, model):
    """FSDP2's fully_shard on every transformer block, then on every language model and scalar head:
    each keeps 1/world_size of its weights (and, if trained, of its gradients and AdamW state) and
    all-gathers the rest for its forward and backward, one block at a time. Frozen models (reference,
    teacher, reward model) too, without optimizer state. On a GPU the gathered weights are in the
    autocast dtype and gradients are reduced in fp32 (MixedPrecisionPolicy). A scalar head's backbone
    is not a unit of its own (the head calls its `hidden`, not its forward, which carries the hooks):
    its embeddings go with the head. A module that holds several models (PPO's policy and critic) is
    not a unit itself: each model is a root of its own, so that one can run without the other (the
    sampler calls the policy alone). Nothing happens without --fsdp."""
    if not run.fsdp:
        return model
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
    any rank has (one all-reduce per decode step); None otherwise (ranks decode independently)."""
    if not run.lockstep:
        return None

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
    return shard_model(run, model.to(run.device))


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


def shard_size(run):
    """Prompts per sampler call in RL's sharded rollouts (grpo, opd): rollout_prompts, or one shard per rank."""
    return run.cfg["rollout_prompts"] or run.cfg["prompts_per_iter"] // run.world_size


def seeded_rng(run, *keys):
    """A numpy RNG that depends only on the seed and `keys` (e.g. the iteration): batches are a pure
    function of the step, so a resumed run draws exactly what the uninterrupted one would."""
    return np.random.default_rng([run.cfg["seed"], *keys])


def shard_problems(run, *keys):
    """A rollout shard's fresh train problems (C.shard_size of them) and its sampler seed, both drawn
    from seeded_rng(run, *keys) (e.g. the iteration and the shard): the same on any world size."""
    rng = seeded_rng(run, *keys)
    problems = run.env.problems("train", shard_size(run), seed=int(rng.integers(2 ** 31)))
    return problems, int(rng.integers(2 ** 31))


def shard(items, run, micro_steps, batch_size):
    """Split one global batch (a list) into this rank's micro-batches. The same global batch gives
    the same gradient for any (processes × micro-batches) split, since the loop divides by the
    global count."""
    assert len(items) == run.world_size * micro_steps * batch_size
    return [items[(m * run.world_size + run.rank) * batch_size:][:batch_size] for m in range(micro_steps)]


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


# ----------------------------------------------------------------------------------------------
# Data files

class RowError(ValueError):
    """A malformed data row: which field, and what is wrong with it."""

    def __init__(self, field, problem):
        super().__init__(f"field {field!r}: {problem}")
        self.field = field


def read_json_rows(path):
    """The rows of a JSON-lines file (or of a .json file holding one array), parsed here rather than
    by `datasets`, so that a broken line is an error naming its line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise ValueError(f"{path}: the file is empty (no rows)")
    if path.endswith(".json") and text.lstrip().startswith("["):
        try:
            rows, lines = json.loads(text), None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None
    else:
        rows, lines = [], []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue  # blank lines (a trailing one, most often) hold no row
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {number}: invalid JSON: {e.msg} (column {e.colno})") from None
            lines.append(number)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            where = f"line {lines[i]}" if lines else f"row {i + 1}"
            raise ValueError(f"{path}: {where}: expected a JSON object, got {type(row).__name__}")
    return rows


def load_rows(path, split="train"):
    """The rows (dicts) of a jsonl / json / parquet file, or of a hub dataset's `split` when online
    (`datasets`; NAME or NAME:CONFIG, e.g. openai/gsm8k:main)."""
    if os.path.isfile(path):
        if not path.endswith(".parquet"):
            return read_json_rows(path)
        from datasets import load_dataset
        try:
            rows = list(load_dataset("parquet", data_files=path, split="train"))
        except Exception as e:  # datasets wraps parse errors in several types
            raise ValueError(f"{path}: cannot be read as parquet: {e}") from None
        if not rows:
            raise ValueError(f"{path}: the file is empty (no rows)")
        return rows
    if os.path.splitext(path)[1] in (".json", ".jsonl", ".parquet"):
        raise FileNotFoundError(f"data file {path} does not exist")
    from datasets import load_dataset
    name, _, config = path.partition(":")
    with rank0_first():
        return list(load_dataset(name, config or None, split=split))


def dataset_splits(path, check):
    """(train, held-out) rows of a dataset environment, each row through check(row) (a ValueError
    naming the field becomes one naming the file and row too): a hub dataset's train and test
    splits, or a local file's rows with the last tenth (at least one) held out."""
    def checked(rows, where):
        out = []
        for i, row in enumerate(rows, start=1):
            try:
                out.append(check(row))
            except ValueError as e:
                raise ValueError(f"{where}: row {i}: {e}") from None
        return out
    if os.path.isfile(path):
        rows = checked(load_rows(path), path)
        held = max(1, len(rows) // 10)
        if len(rows) < 2:
            raise ValueError(f"{path}: needs at least 2 rows (train and held out)")
        return rows[:-held], rows[-held:]
    try:
        train, test = load_rows(path, "train"), load_rows(path, "test")
    except OSError as e:  # (datasets' connection and not-found errors are OSErrors)
        raise ValueError(f"dataset {path!r}: cannot load it ({str(e).splitlines()[0]})") from None
    return checked(train, f"{path} (train)"), checked(test, f"{path} (test)")


def encode_rows(run, path, rows, encode):
    """encode(row) -> example, raising RowError for a bad row. A bad row is an error naming the
    file, row (1-based: the line of a jsonl file without blank lines) and field, or, with
    skip_bad_rows, skipped and counted (run.skipped_rows)."""
    examples, skipped = [], 0
    for i, row in enumerate(rows, start=1):
        try:
            examples.append(encode(row))
        except RowError as e:
            if not run.cfg["skip_bad_rows"]:
                raise ValueError(f"{path}: row {i}: {e} (pass --skip_bad_rows=True to skip such rows)") from None
            skipped += 1
    if not examples:
        raise ValueError(f"{path}: no usable rows ({skipped} skipped)")
    if skipped and run.master:
        print(f"{path}: skipped {skipped} malformed rows of {len(rows)}")
    run.skipped_rows = skipped
    return examples


def require(row, field, kind):
    """row[field], checked to exist and to be a `kind` (str, list, ...), else a RowError."""
    if field not in row or row[field] is None:
        raise RowError(field, "missing")
    if not isinstance(row[field], kind):
        raise RowError(field, f"expected {kind.__name__}, got {type(row[field]).__name__}")
    return row[field]


def render_messages(run, messages, field, add_generation_prompt=False):
    """A row's message list through the chat template -> (ids, mask), or a RowError naming the field."""
    for j, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
            raise RowError(f"{field}[{j}].content", "missing or not a string")
    try:
        return run.tok.render_chat(messages, add_generation_prompt=add_generation_prompt)
    except ValueError as e:
        raise RowError(field, str(e)) from None


# ----------------------------------------------------------------------------------------------
# Models and checkpoints

def build_model(cfg, tok):
    """The model a run starts from (before the algorithm wraps it and before LoRA)."""
    init = cfg["init_from"]
    if init == "scratch":
        vocab = -(-tok.n_vocab // 64) * 64
        with torch.random.fork_rng():  # the same init every time it is built (π_ref == π_0), RNG untouched
            torch.manual_seed(cfg["seed"])
            return GPT(GPTConfig(block_size=cfg["block_size"], vocab_size=vocab, n_layer=cfg["n_layer"],
                                 n_head=cfg["n_head"], n_embd=cfg["n_embd"], dropout=cfg["dropout"],
                                 bias=cfg["bias"]))
    if os.path.isfile(os.path.join(init, "ckpt.pt")):
        return load_model(init)
    if not is_hf_checkpoint(init):
        raise ValueError(f"init_from={init!r}: not 'scratch', 'resume', a checkpoint directory (with ckpt.pt), "
                         f"a transformers directory (with config.json) or a hub name (owner/name, gpt2)")
    model = hf.from_pretrained(init, dropout=cfg["dropout"])  # its config.json names the architecture
    if cfg["block_size"] > model.config.block_size:
        raise ValueError(f"block_size={cfg['block_size']} is longer than {init}'s "
                         f"{model.config.block_size} positions")
    model.resize_vocab(tok.n_vocab)
    return model


def is_hf_checkpoint(name):
    """A transformers directory (config.json), or a name from_pretrained would look up on the hub:
    GPT-2's names, or owner/name where no such local path exists."""
    if os.path.isfile(os.path.join(name, "config.json")):
        return True
    return name.startswith("gpt2") or (not os.path.exists(name) and name.count("/") == 1
                                       and not name.startswith((".", "/")))


def config_env(cfg):
    """The environment a run's configuration names (the task its data, rewards and evaluation use);
    gsm8k is built from the rows of env_data rather than generated."""
    if cfg["env"] == "gsm8k":
        return GSM8K(*dataset_splits(cfg["env_data"], GSM8K.check_row))
    return make_env(cfg["env"], digits=cfg["env_digits"], n_ops=cfg["env_ops"], direct_frac=cfg["env_direct_frac"])


# The layout of ckpt.pt. 1: before format numbers (one RNG state, numpy's as an array); 2: a format
# number, each rank's RNG state as tensors, nothing but tensors, containers and numbers (weights_only)
CHECKPOINT_FORMAT = 2


def read_checkpoint(ckpt_dir, device="cpu"):
    """ckpt.pt of a checkpoint directory, loaded with weights_only=True: tensors, containers and
    numbers only, no pickled code runs. Format 1's numpy RNG state (an array) is allowed for its
    weights to load; a newer format than this code's is an error."""
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    multiarray = (np._core if hasattr(np, "_core") else np.core).multiarray  # numpy 2 renamed core
    numpy_array = [np.dtype, np.ndarray, type(np.dtype(np.uint32)), multiarray._reconstruct]
    with torch.serialization.safe_globals(numpy_array):
        ckpt = torch.load(path, map_location=device, weights_only=True, mmap=True)
    if ckpt.get("format", 1) > CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {ckpt['format']} is newer than this code's "
                         f"{CHECKPOINT_FORMAT}: update the code")
    return ckpt


def check_resumable(ckpt, ckpt_dir):
    """init_from=resume needs this code's layout: an older checkpoint's weights still load (init_from=DIR)."""
    if ckpt.get("format", 1) != CHECKPOINT_FORMAT:
        raise ValueError(f"{ckpt_dir}/ckpt.pt: checkpoint format {ckpt.get('format', 1)}, written by an older "
                         f"version; this one resumes format {CHECKPOINT_FORMAT} only. Start a new run from its "
                         f"weights with --init_from={ckpt_dir}, or resume it with the version that wrote it")


def rng_state(run):
    """This rank's RNG states (Python, numpy, torch CPU, its own CUDA device), as tensors and numbers."""
    version, state, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return dict(python=dict(version=version, state=torch.tensor(state), gauss=gauss),
                numpy=dict(keys=torch.from_numpy(keys.astype(np.int64)), pos=pos, has_gauss=has_gauss, cached=cached),
                torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state(run.device) if run.device.startswith("cuda") else None)


def set_rng_state(run, state):
    python, numpy = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and run.device.startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"], run.device)


def restore_rng(run, states, it):
    """Each rank takes back its own RNG streams (its dropout masks go on as if never stopped). On a
    different number of ranks there is no stream to take back: each rank is seeded afresh, by rank
    and iteration, and the run goes on correctly but not bit-identically."""
    if len(states) == run.world_size:
        return set_rng_state(run, states[run.rank])
    if run.master:
        print(f"resume: the checkpoint holds the RNG streams of {len(states)} rank(s), this run has "
              f"{run.world_size}: streams seeded afresh (dropout masks differ from an uninterrupted run)")
    seed = run.cfg["seed"] + 1000 * it + run.rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_model(ckpt_dir, device="cpu"):
    """A trained model from a checkpoint directory, LoRA merged, in eval mode; a GPT or a ScalarHeadGPT."""
    ckpt = read_checkpoint(ckpt_dir)  # on the CPU, memory-mapped: the optimizer state is never read
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model = ScalarHeadGPT(model) if ckpt["kind"] == "scalar" else model
    if ckpt["lora_rank"]:
        apply_lora(model, ckpt["lora_rank"], ckpt["lora_alpha"])
    model.load_state_dict(ckpt["model"])
    return merge_lora(model).to(device).eval()


def load_tokenizer(ckpt_dir):
    """The tokenizer a checkpoint was trained with."""
    return make_tokenizer(read_checkpoint(ckpt_dir)["tokenizer"])


def frozen(model):
    """A frozen copy (reference policy, teacher, reward model): eval mode, no gradients."""
    model = copy.deepcopy(model).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_reference(run):
    """The frozen starting point of this run (π_ref): what init_from named, before any training."""
    return place(run, frozen(build_model(run.cfg, run.tok)))


def gather_objects(run, obj):
    """Every rank's `obj` (picklable), in rank order, on every rank: [obj] in one process."""
    if not run.ddp:
        return [obj]
    out = [None] * run.world_size
    dist.all_gather_object(out, obj)
    return out


def load_teacher(run):
    """The frozen teacher --teacher names (a checkpoint directory sharing the student's tokenizer), or
    under --teacher=self the trained model itself (read under no_grad by its user)."""
    cfg = run.cfg
    if not cfg["teacher"]:
        raise ValueError(f"--algo {cfg['algo']} needs --teacher=DIR (a checkpoint with the student's tokenizer) "
                         f"or --teacher=self")
    if cfg["teacher"] == "self":
        return run.raw_model
    teacher = place(run, frozen(load_model(cfg["teacher"])))
    teacher_vocab, student_vocab = teacher.config.vocab_size, run.raw_model.config.vocab_size
    if teacher_vocab != student_vocab:
        raise ValueError(f"teacher {cfg['teacher']} has a vocabulary of {teacher_vocab} tokens, the student "
                         f"{student_vocab}: distillation compares their distributions token by token, so they "
                         f"must share the tokenizer")
    if load_tokenizer(cfg["teacher"]).name != run.tok.name:
        raise ValueError(f"teacher {cfg['teacher']} uses tokenizer {load_tokenizer(cfg['teacher']).name!r}, "
                         f"the student {run.tok.name!r}: they must share it")
    return teacher


def load_reward_model(run):
    """The frozen Bradley–Terry reward model --reward_model names (a checkpoint of --algo rm)."""
    cfg = run.cfg
    if not cfg["reward_model"]:
        raise ValueError("reward=rm and critic_init=reward_model need --reward_model=<checkpoint dir of --algo rm>")
    model = load_model(cfg["reward_model"])
    if not isinstance(model, ScalarHeadGPT):
        raise ValueError(f"reward_model={cfg['reward_model']!r} is a language-model checkpoint, not a reward "
                         f"model (train one with --algo rm)")
    if model.config.vocab_size < run.tok.n_vocab:
        raise ValueError(f"reward_model={cfg['reward_model']!r} has a vocabulary of {model.config.vocab_size}, "
                         f"fewer than the {run.tok.n_vocab} ids of tokenizer {run.tok.name!r}")
    return place(run, frozen(model))


def save_checkpoint(run, optimizer, it):
    """Called by every rank (each adds its RNG streams); rank 0 writes. Atomic: a temporary file,
    then a rename, so a crash never leaves a half-written ckpt.pt.

    "model" is what load_model() gives later scripts: the trained module itself, or its `policy` when
    the algorithm trains several (PPO's policy + critic); "train_model" then holds all of them."""
    rng = gather_objects(run, rng_state(run))
    raw = run.raw_model
    export = raw.policy if hasattr(raw, "policy") else raw
    sharded = save_sharded(run, optimizer, it) if run.fsdp else None
    if run.fsdp:  # the export gathered to rank 0's CPU, for load_model and later scripts
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        model = get_model_state_dict(export, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not run.master:
        return
    gpt = export.gpt if isinstance(export, ScalarHeadGPT) else export
    ckpt = dict(
        format=CHECKPOINT_FORMAT, sharded=sharded,  # --fsdp: the trained state is in out_dir/`sharded`
        model=model if run.fsdp else export.state_dict(),
        train_model=raw.state_dict() if export is not raw and not run.fsdp else None,
        optimizer=None if run.fsdp else optimizer.state_dict(), iter=it, config=run.cfg,
        model_args=dataclasses.asdict(gpt.config), kind="scalar" if isinstance(export, ScalarHeadGPT) else "lm",
        lora_rank=run.cfg["lora_rank"], lora_alpha=run.cfg["lora_alpha"], tokenizer=run.tok.name,
        rng=rng, algo_state=run.algo.state_dict(run) if hasattr(run.algo, "state_dict") else None,
        train_tokens=run.train_tokens,
    )
    path = os.path.join(run.cfg["out_dir"], "ckpt.pt")
    torch.save(ckpt, path + ".tmp")
    os.replace(path + ".tmp", path)
    for name in os.listdir(run.cfg["out_dir"]):  # sharded states ckpt.pt no longer names
        if name.startswith("sharded_") and name != sharded:
            shutil.rmtree(os.path.join(run.cfg["out_dir"], name))


def save_sharded(run, optimizer, it):
    """--fsdp: every rank writes its shards of the trained weights and AdamW state with
    torch.distributed.checkpoint into out_dir/sharded_ITER (nothing is gathered); ckpt.pt, written
    after it, names it, so a crash midway leaves the last complete pair. Returns the name."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    name = f"sharded_{it:07d}"
    model_state, optim_state = get_state_dict(run.raw_model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=os.path.join(run.cfg["out_dir"], name))
    return name


def load_sharded(run, optimizer, path):
    """The weights and AdamW state save_sharded wrote, into this run's (sharded or not) model and
    optimizer: DCP reshards them to this run's ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_state, optim_state = get_state_dict(run.raw_model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(run.raw_model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


# ----------------------------------------------------------------------------------------------
# Sampling, rollouts and evaluation

def tool_hook(run, prompts):
    """The sampler's tool hook for the run's environment, or None when it has no tool (SPEC §4,
    multi-turn tool environment). When a row writes the closing call tag, the text between it and
    the opening tag before it is the call: the environment's tool runs it, given the row's prompt
    (`prompts`, the sampler's prompt ids by row) and its earlier calls (a game replays them: its
    state is the transcript), and the result comes back between result tags as ids the sampler feeds
    to that row as forced tokens while the other rows keep sampling. Only the prompt and the calls
    are decoded (to run the call); the trajectory stays token ids. A response's calls past
    max_tool_calls are not run: the result says so. The hook keeps no state, each row is judged by
    its own ids alone, so rows pause and resume independently."""
    tool = getattr(run.env, "tool", None)
    if tool is None:
        return None
    special, limit = run.tok.special, run.cfg["max_tool_calls"]
    if "tool_call" not in special:
        raise ValueError(f"env {run.env.name!r} calls a tool, whose tags are special tokens of the built-in "
                         f"tokenizers (byte, gpt2): tokenizer={run.tok.name!r} has none")

    def hook(row, generated):
        if generated[-1] != special["/tool_call"]:
            return None
        spans, opened = [], None  # (first, end) ids of every call's text that has both tags, in order
        for k, t in enumerate(generated):
            if t == special["tool_call"]:
                opened = k + 1
            elif t == special["/tool_call"] and opened is not None:
                spans.append((opened, k))
                opened = None
        if generated.count(special["/tool_call"]) > limit:
            result = f"error: at most {limit} calls"
        elif not spans or spans[-1][1] != len(generated) - 1:
            result = "error: no opening tag"
        else:
            calls = [run.tok.decode(generated[first:end]) for first, end in spans]
            result = tool(calls[-1], run.tok.decode(prompts[row]), calls[:-1])
        return [special["tool_result"]] + run.tok.encode(result) + [special["/tool_result"]]
    return hook


def generate(run, model, prompts, max_new_tokens=None, temperature=0.0, seed=None, batch_size=None,
             spread=False, **kw):
    """Sample responses for a list of prompt-id lists in chunks, running the environment's tool when
    it has one; returns sampler.Samples(tokens, logprobs, forced), forced = 1 on tool tokens.
    Chunk i is seeded by seed + i·batch_size. spread=True: setup work every rank needs the whole of
    (pair sampling, RFT pools): the chunks are shared out over the ranks and gathered (over_ranks)."""
    max_new_tokens = max_new_tokens or run.cfg["max_new_tokens"]
    batch_size = batch_size or run.cfg["eval_batch_size"]

    def sample_chunk(chunk, i):
        with run.autocast:
            return sample(model, chunk, max_new_tokens, temperature=temperature, stop_tokens=(run.tok.eos,),
                          pad_id=run.tok.pad, seed=None if seed is None else seed + i * batch_size,
                          tool_hook=tool_hook(run, chunk), all_ranks_busy=all_ranks_busy(run), **kw)
    if spread and run.lockstep:
        raise ValueError("--fsdp_rollouts=sharded does not share setup sampling out over ranks yet: use gathered")
    if spread:
        parts = over_ranks(run, prompts, batch_size, sample_chunk)
    else:
        mine = chunks(prompts, batch_size)
        mine += [[]] * (lockstep_count(run, len(mine)) - len(mine))  # (sharded rollouts: an empty chunk idles)
        parts = [sample_chunk(chunk, i) for i, chunk in enumerate(mine)]
    return Samples(*([x for part in parts for x in part[k]] for k in range(3)))


def collate(examples, pad_id, device):
    """[(ids, mask)] -> right-padded (B, T) id and 0/1 mask tensors (padding has mask 0)."""
    T = max(len(ids) for ids, _ in examples)
    # padded lists, then one tensor each: a tensor per row costs more than the rest of collate
    ids = torch.tensor([list(seq) + [pad_id] * (T - len(seq)) for seq, _ in examples], dtype=torch.long)
    mask = torch.tensor([list(m) + [0] * (T - len(m)) for _, m in examples], dtype=torch.float32)
    return ids.to(device), mask.to(device)


def pool_batches(run, it, examples):
    """One optimizer step of gradient_accumulation_steps micro-batches of (ids, mask) examples drawn
    at random from a pool (SFT's data, RFT's kept answers); the global batch depends only on (seed, it)."""
    accum, bs = run.cfg["gradient_accumulation_steps"], run.cfg["batch_size"]
    rng = seeded_rng(run, it)
    picks = [examples[i] for i in rng.integers(0, len(examples), run.world_size * accum * bs)]
    return [[collate(mb, run.tok.pad, run.device) for mb in shard(picks, run, accum, bs)]]


def masked_nll(model, ids, mask):
    """(Σ m·(−log p), Σ m) of the next-token loss (SPEC §3 SFT): position t predicts ids[t+1], weighted
    by mask[t+1] (a mask aligned with ids, 1 on the tokens to learn). SFT and RFT train with it."""
    m = mask[:, 1:]
    return -(sequence_logprobs(model, ids) * m).sum(), m.sum()


def masked_nll_loss(run, model, batch):
    """The `loss` of the algorithm contract for SFT and RFT: masked_nll of a collated (ids, mask)
    micro-batch, and its trained tokens."""
    loss_sum, count = masked_nll(model, *batch)
    return loss_sum, count, {"tokens": count}  # tensors: the loop reads them once per step


def response_text(run, tokens):
    return run.tok.decode([t for t in tokens if t != run.tok.eos])


def write_passport(run, text):
    """The run's post-training passport (SPEC §6: data and mode, reward and verification, optimisation,
    infrastructure) as out_dir/passport.md, written by rank 0 at setup."""
    if run.master:
        with open(os.path.join(run.cfg["out_dir"], "passport.md"), "w") as f:
            f.write(text)


def verification_text(check):
    """The passport's line on the verifier's own error rate (verifier_check's figures)."""
    if not check["verifier_probes"]:
        return "the verifier is unchecked: the environment has no solver to hold it against"
    return (f"the verifier's own error rate against the solver: {check['verifier_error_rate']:.3f} on "
            f"{check['verifier_probes']} probes ({check['verifier_false_negatives']} solver answers rejected, "
            f"{check['verifier_false_positives']} wrong answers accepted)")


def unparsed(env, response):
    """True when the response has no answer in the task's form (env.parses; SPEC §6's parse-error
    rate). An environment that defines no form never counts one."""
    return hasattr(env, "parses") and not env.parses(response)


def verifier_check(env, verify, n=64, seed=0):
    """The verifier's own error rate (SPEC §6, M14 §17), against the environment's solver on n train
    problems: each problem's solver answer must pass, and the solver answer of the next problem (where
    its answer differs) must fail. Returns dict(verifier_error_rate, verifier_false_negatives,
    verifier_false_positives, verifier_probes); NaN for an environment without a solver."""
    if not hasattr(env, "solve"):  # nothing to check against: the rate is unknown, not 0
        return dict(verifier_error_rate=float("nan"), verifier_false_negatives=0, verifier_false_positives=0,
                    verifier_probes=0)
    problems = env.problems("train", n, seed=seed)
    answers = [env.solve(p) for p in problems]
    rejected = sum(verify(p, a) != 1.0 for p, a in zip(problems, answers))
    nxt = [(i + 1) % n for i in range(n)]
    others = [(p, answers[j]) for p, i, j in zip(problems, range(n), nxt)  # a different answer to a different problem
              if answers[j] != answers[i] and problems[j].get("answer", j) != p.get("answer", i)]
    accepted = sum(verify(p, a) != 0.0 for p, a in others)
    probes = len(problems) + len(others)
    return dict(verifier_error_rate=(rejected + accepted) / probes, verifier_false_negatives=rejected,
                verifier_false_positives=accepted, verifier_probes=probes)


def last_response_column(mask):
    """(N,) column t of each row's last response token in a mask aligned with ids[:, 1:] (the
    token is ids[:, t+1]); −1 for a row without one."""
    positions = torch.arange(mask.size(1), device=mask.device)
    return torch.where(mask > 0, positions, -1).amax(1)


def score_responses(scalar_model, ids, mask):
    """r_φ of each row: a ScalarHeadGPT's value at its last response token, where causal attention
    has seen the whole prompt and answer (the reward model's read-out; ppo.py scores rollouts with
    it). ids (N, T) right-padded prompt + response; mask (N, T-1) aligned with ids[:, 1:] (1 on
    response tokens, as from rollouts), so the last t with mask[i, t] = 1 points at token
    ids[i, t+1]. Returns (N,)."""
    has_response = mask.sum(1) > 0
    if not bool(has_response.all()):
        raise ValueError(f"rows {has_response.logical_not().nonzero().flatten().tolist()} have no response token")
    last = last_response_column(mask) + 1  # token index of the last response token
    values = scalar_model(ids)              # (N, T)
    return values.gather(1, last[:, None]).squeeze(1).float()


@dataclasses.dataclass
class Rollout:
    """Responses sampled for problems and verified: N rows, the problems' G samples each side by
    side. Tokens in, tokens out: response ids are never decoded and re-encoded for training (text is
    decoded for the verifier only). With a tool environment a response holds the tool's results too
    (fed in by the sampler): they stay in ids as context and have mask 0, so no loss gives them weight.

    Per-token tensors are (N, T-1) (or (N, T-1, ...)), aligned with the shifted targets ids[:, 1:]
    exactly like sequence_logprobs(model, ids): position t scores token ids[:, t+1]."""
    ids: torch.Tensor            # (N, T) long: prompt + response, right-padded with <|pad|>
    mask: torch.Tensor           # (N, T-1) 1 on sampled response tokens (stop token included); 0 on the
                                 #          prompt, tool tokens and padding
    forced: torch.Tensor         # (N, T-1) 1 on the tool's tokens (response tokens the model did not sample)
    old_logprobs: torch.Tensor   # (N, T-1) the sampler's log-probs (π_old), 0 where mask is 0
    rewards: torch.Tensor        # (N,) the verifier's reward
    lengths: torch.Tensor        # (N,) response lengths in tokens
    truncated: torch.Tensor      # (N,) bool: hit max_new_tokens without the end token
    group: torch.Tensor          # (N,) the index of the problem each row answers
    prompt_lens: torch.Tensor    # (N,) each row's prompt length
    seq_len: torch.Tensor        # (N,) the index of the row's last response token + 1: its own width
    problems: list               # each row's problem
    texts: list                  # each row's decoded response
    responses: list              # each row's response ids
    decode_time: float = 0.0     # seconds sampling, verifying, and scoring (an algorithm's forwards)
    verify_time: float = 0.0
    score_time: float = 0.0
    # what an algorithm adds before it trains on the rows; None until then
    sampler_logprobs: torch.Tensor = None  # (N, T-1) the sampler's own, where old_logprobs are recomputed
    ref_logprobs: torch.Tensor = None      # (N, T-1) π_ref's of the sampled tokens, or (N, T-1, V) its whole
                                           # distributions (opd's anchor)
    teacher_logprobs: torch.Tensor = None  # (N, T-1, V) a teacher's distributions (opd)
    verified: torch.Tensor = None          # (N,) the verifier's reward where `rewards` is another
    reward: torch.Tensor = None            # (N,) the shaped reward the advantages come from
    advantages: torch.Tensor = None        # (N,) one per response
    step_advantages: torch.Tensor = None   # (N, T-1) one per token (process rewards)
    keep: torch.Tensor = None              # (N,) 1 on rows that train, 0 on rows kept only for shape

    def select(self, rows):
        """These rows (indices, in order), every tensor and list cut to them, and to their own width."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.ids.device)
        width = max(int(self.seq_len[rows].max()), 2) if len(rows) else 2
        picked = rows.tolist()
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if torch.is_tensor(value):
                value = value[rows]
                if value.dim() > 1:  # ids (N, T), per-token (N, T-1, ...)
                    value = value[:, :width if field.name == "ids" else width - 1]
            elif isinstance(value, list):
                value = [value[i] for i in picked]
            out[field.name] = value
        return Rollout(**out)

    def response_masks(self):
        """Each row's loss mask over its own response tokens, as lists: 1 on the sampled ones, 0 on
        the tool's."""
        return [[int(m) for m in row[start - 1:start - 1 + len(response)]]
                for row, start, response in zip(self.mask.tolist(), self.prompt_lens.tolist(), self.responses)]

    @staticmethod
    def cat(parts, pad_id):
        """The rows of several rollouts in order, right-padded to the widest (ids with pad_id, per-token
        values with 0); times add up."""
        width = max(p.ids.size(1) for p in parts)
        out = {}
        for field in dataclasses.fields(Rollout):
            values = [getattr(p, field.name) for p in parts]
            if values[0] is None:
                out[field.name] = None
            elif torch.is_tensor(values[0]) and values[0].dim() > 1:
                w, fill = (width, pad_id) if field.name == "ids" else (width - 1, 0.0)
                out[field.name] = torch.cat([F.pad(v, [0, 0] * (v.dim() - 2) + [0, w - v.size(1)], value=fill)
                                             for v in values])
            elif torch.is_tensor(values[0]):
                out[field.name] = torch.cat(values)
            elif isinstance(values[0], list):
                out[field.name] = [x for v in values for x in v]
            else:
                out[field.name] = sum(values)
        return Rollout(**out)


def rollouts(run, model, problems, samples_per_prompt, temperature=1.0, max_new_tokens=None, seed=None,
             top_k=None, top_p=None, batch_size=None, spread=False):
    """The one rollout path: sample `samples_per_prompt` responses per problem with the KV-cache
    sampler (on all prompts at once, or in chunks of `batch_size`), decode them, verify them with the
    environment's verifier and lay them out with their masks: a Rollout."""
    prompts = [run.tok.prompt_ids(p["prompt"]) for p in problems for _ in range(samples_per_prompt)]
    rows = [p for p in problems for _ in range(samples_per_prompt)]
    t0 = time.time()
    tokens, logprobs, forced = generate(run, model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                        seed=seed, batch_size=batch_size or len(prompts), top_k=top_k, top_p=top_p,
                                        spread=spread)  # spread: the sampling shared out over ranks (generate)
    t1 = time.time()
    texts = [response_text(run, t) for t in tokens]
    rewards = torch.tensor([run.env.verify(p, text) for p, text in zip(rows, texts)], dtype=torch.float32)
    t2 = time.time()
    # (a rank can hold no problem: evaluation shards of fewer problems than ranks)
    N, T = len(prompts), max((len(p) + len(t) for p, t in zip(prompts, tokens)), default=2)
    ids = torch.full((N, T), run.tok.pad, dtype=torch.long)
    mask, tool, old = torch.zeros(N, T - 1), torch.zeros(N, T - 1), torch.zeros(N, T - 1)
    for i, (p, t, lp, f) in enumerate(zip(prompts, tokens, logprobs, forced)):
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        tool[i, len(p) - 1:len(p) - 1 + len(t)] = torch.tensor(f, dtype=torch.float32)
        mask[i, len(p) - 1:len(p) - 1 + len(t)] = 1.0 - tool[i, len(p) - 1:len(p) - 1 + len(t)]
        old[i, len(p) - 1:len(p) - 1 + len(t)] = torch.tensor(lp)
    device = run.device
    mask = mask.to(device)
    return Rollout(ids=ids.to(device), mask=mask, forced=tool.to(device), old_logprobs=old.to(device),
                   rewards=rewards.to(device), lengths=torch.tensor([len(t) for t in tokens], device=device),
                   truncated=torch.tensor([run.tok.eos not in t for t in tokens], device=device),
                   group=torch.arange(len(problems), device=device).repeat_interleave(samples_per_prompt),
                   prompt_lens=torch.tensor([len(p) for p in prompts], device=device),
                   seq_len=last_response_column(mask) + 2, problems=rows, texts=texts, responses=tokens,
                   decode_time=t1 - t0, verify_time=t2 - t1)


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


# Process and path rewards (SPEC §3 "Process vs outcome rewards", "RLVP"), shared by grpo.py and ppo.py,
# which take these keys (reward_mode: outcome = the verifier's one reward at the end; process = a
# reward at the last token of each verifiable step, env.step_rewards; rlvp = R = O + β·Φ with
# Φ from the environment's rule engine, env.path_signals: −λ per bad action, +μ per compliant one;
# path = Φ alone, the inaction trap the chapter warns of, kept for the experiment)
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


# ----------------------------------------------------------------------------------------------
# Policy evaluation: the one evaluation behind every algorithm's figures, the ladder's and the experiments'.
# Greedy answers to `problems` held-out and `ood_problems` OOD problems (accuracy, length in tokens, the
# share that shows its work); then `samples` answers to each of `sampled_problems` held-out problems
# at `temperature`, one rollout that gives their accuracy and length, pass@samples (Best-of-samples by
# the verifier: right when any sample is) and, given a reference model, the KL to it.

def greedy_accuracy(run, model, split, n):
    """{split}_acc, {split}_len, {split}_work of greedy answers to n problems of `split` (the first
    seeded n; spread over ranks, counts summed), and transcripts of the first few."""
    if split not in getattr(run.env, "splits", ("train", "heldout", "ood")):
        return {}, []  # (a dataset has no ood split: no figures for it)
    problems = run.env.problems(split, n, seed=0)[run.rank::run.world_size]
    roll = rollouts(run, model, problems, 1, temperature=0.0, seed=0, batch_size=run.cfg["eval_batch_size"])
    sums = all_reduce_sum(dict(correct=float(roll.rewards.sum()), n=len(problems), tokens=float(roll.lengths.sum()),
                               work=sum(map(run.env.shows_work, roll.texts))), run)
    transcripts = [f"[{split}] {p['prompt']}\n  -> {text!r}  (answer {p['answer']}, reward {r:.0f})"
                   for p, text, r in zip(problems[:4], roll.texts, roll.rewards.tolist())]
    return {f"{split}_acc": sums["correct"] / sums["n"], f"{split}_len": sums["tokens"] / sums["n"],
            f"{split}_work": sums["work"] / sums["n"]}, transcripts  # work: answers that write their steps


@torch.no_grad()
def sampled_accuracy(run, model, n, k, temperature, reference=None):
    """heldout_sampled_acc, _len and _work over k answers to each of n held-out problems
    sampled at `temperature`, heldout_pass@k (k >= 2) and with a reference model heldout_kl_ref: the
    KL(π_θ‖π_ref) per response, mean over the samples of Σ_t (log π_θ − log π_ref), the sampler's
    log-probs standing for log π_θ, so only π_ref runs a forward. Transcripts of the first two."""
    problems = run.env.problems("heldout", n, seed=0)[run.rank::run.world_size]
    size = run.cfg["eval_batch_size"]
    roll = rollouts(run, model, problems, k, temperature=temperature, seed=1, batch_size=size)
    correct = roll.rewards.view(len(problems), k)
    sums = dict(correct=float(correct.sum()), passed=float(correct.amax(1).sum()), problems=len(problems),
                tokens=float(roll.lengths.sum()), work=sum(map(run.env.shows_work, roll.texts)), kl=0.0)
    if reference is not None:
        parts = list(zip(*(chunks(t, size) for t in (roll.ids, roll.old_logprobs, roll.mask))))
        idle = lockstep_count(run, len(parts)) - len(parts)  # (sharded: dummy forwards match the others')
        with run.autocast:
            for ids, old, mask in parts:
                sums["kl"] += float(((old - sequence_logprobs(reference, ids, temperature)) * mask).sum())
            for _ in range(idle):
                reference(roll.ids.new_zeros(1, 1))
    sums = all_reduce_sum(sums, run)
    responses = sums["problems"] * k
    metrics = dict(heldout_sampled_acc=sums["correct"] / responses, heldout_sampled_len=sums["tokens"] / responses,
                   heldout_sampled_work=sums["work"] / responses)
    if k >= 2:
        metrics[f"heldout_pass@{k}"] = sums["passed"] / sums["problems"]
    if reference is not None:
        metrics["heldout_kl_ref"] = sums["kl"] / responses
    transcripts = [f"[heldout, T={temperature}] {p['prompt']}\n  -> {text!r}  (answer {p['answer']}, reward {r:.0f})"
                   for p, text, r in list(zip(roll.problems, roll.texts, roll.rewards.tolist()))[:2 * k:k]]
    return metrics, transcripts


def evaluate_policy(run, model, it=None, reference=None, temperature=1.0, problems=None, ood_problems=None,
                    sampled_problems=None, samples=None):
    """The policy's held-out figures (see above) with the run's settings: eval_problems (greedy
    held-out and OOD, and the sampled problems), eval_samples (answers per problem at `temperature`;
    0: greedy only); the arguments override them (the ladder's own sizes). With `it`, a few
    transcripts go to samples.txt. Call it with the model in eval mode (the loop does)."""
    n = problems or run.cfg["eval_problems"]
    k = run.cfg["eval_samples"] if samples is None else samples
    metrics, transcripts = greedy_accuracy(run, model, "heldout", n)
    metrics.update(greedy_accuracy(run, model, "ood", ood_problems or n)[0])
    if k >= 1:
        sampled, lines = sampled_accuracy(run, model, sampled_problems or n, k, temperature, reference)
        metrics.update(sampled)
        transcripts += lines
    if it is not None:
        write_samples(run, it, transcripts)
    return metrics, transcripts


def write_samples(run, it, transcripts):
    """Append a few sampled trajectories per eval to samples.txt, for a person to read."""
    if run.master and transcripts:
        with open(os.path.join(run.cfg["out_dir"], "samples.txt"), "a") as f:
            f.write(f"=== iter {it} ===\n" + "\n".join(transcripts) + "\n")


def plot_metrics(out_dir):
    """One small panel per logged figure, against the iteration, in out_dir/metrics.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    keys = sorted({k for r in rows for k, v in r.items() if k != "iter" and isinstance(v, (int, float))})
    if not keys:
        return
    ncol = min(4, len(keys))
    nrow = -(-len(keys) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 2.6 * nrow), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(r["iter"], r[key]) for r in rows if key in r]
        ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None)
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.subplots_adjust(hspace=0.6, wspace=0.3, left=0.05, right=0.98, top=0.95, bottom=0.05)
    fig.savefig(os.path.join(out_dir, "metrics.png"), dpi=80)
    plt.close(fig)
