"""
Models in and out of files: the model a run starts from (scratch, a checkpoint, transformers
weights), ckpt.pt read and written atomically with every rank's RNG streams (an exact resume),
FSDP2's sharded states, and the frozen models an algorithm reads (reference, teacher, reward model).
"""

import copy
import dataclasses
import difflib
import hashlib
import json
import os
import pickle
import random
import re
import shutil

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from nanopost import hf
from nanopost.distributed import gather_objects, place
from nanopost.gguf_file import gguf_path, is_gguf, read_model
from nanopost.run_dir import drop_previous
from model import GPT, GPTConfig, ScalarHeadGPT, apply_lora, merge_lora
from nanopost.tokenizer import make_tokenizer


def build_model(cfg, tok):
    """The model a run starts from (before the algorithm wraps it and before LoRA)."""
    init = cfg["init_from"]
    if init == "scratch":
        return from_scratch(cfg, tok)
    if os.path.isfile(os.path.join(init, "ckpt.pt")):
        return load_model(init, dropout=cfg["dropout"])
    if is_gguf(init):
        return from_gguf(cfg, tok)
    return from_transformers(cfg, tok)


def from_scratch(cfg, tok):
    """build_model's fresh model of the config's shape, its vocabulary the tokenizer's rounded up to a
    multiple of 64, initialised the same every time it is built (π_ref == π_0), the RNG untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(cfg["seed"])
        return GPT(GPTConfig(block_size=cfg["block_size"], vocab_size=-(-tok.n_vocab // 64) * 64,
                             n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                             dropout=cfg["dropout"], bias=cfg["bias"]))


def from_gguf(cfg, tok):
    """build_model's start from a GGUF file ('smollm2' or a path ending .gguf), which must also be the
    tokenizer: its weights are trained on its own vocabulary alone."""
    init = cfg["init_from"]
    if not is_gguf(cfg["tokenizer"]) or gguf_path(cfg["tokenizer"]) != gguf_path(init):
        raise ValueError(f"init_from={init} reads its own vocabulary: pass --tokenizer={init} as well "
                         f"(not tokenizer={cfg['tokenizer']})")
    model = read_model(init, dropout=cfg["dropout"])
    if cfg["block_size"] > model.config.block_size:
        raise ValueError(f"block_size={cfg['block_size']} is longer than {init}'s {model.config.block_size} positions")
    return model


def from_transformers(cfg, tok):
    """build_model's start from transformers weights (a directory with config.json, or a hub name)."""
    init = cfg["init_from"]
    if is_run_without_checkpoint(init):
        raise FileNotFoundError(f"init_from={init}: a train.py run's directory (its config.json) without ckpt.pt: "
                                f"that run wrote no checkpoint (--checkpoint=False, or it stopped before its first); "
                                f"pass a directory that has one, or finish that run")
    if hf.looks_local(init) and not os.path.exists(init):  # never a hub lookup for a path
        parent = os.path.dirname(init) or "."
        close = difflib.get_close_matches(os.path.basename(init), os.listdir(parent) if os.path.isdir(parent) else [], 1)
        raise FileNotFoundError(f"init_from={init}: no such directory"
                                + (f"; did you mean {os.path.join(parent, close[0])}?" if close else ""))
    if not is_hf_checkpoint(init):
        raise ValueError(f"init_from={init!r}: not 'scratch', 'resume', a checkpoint directory (with ckpt.pt), "
                         f"a transformers directory (with config.json) or a hub name (owner/name, gpt2)")
    model = hf.from_pretrained(init, dropout=cfg["dropout"])  # its config.json names the architecture
    if cfg["block_size"] > model.config.block_size:
        raise ValueError(f"block_size={cfg['block_size']} is longer than {init}'s "
                         f"{model.config.block_size} positions")
    model.resize_vocab(tok.n_vocab)
    return model


def is_run_without_checkpoint(name):
    """A directory whose config.json is a train.py run's (it names an algo), not transformers'."""
    try:
        with open(os.path.join(name, "config.json")) as f:
            return "algo" in json.load(f)
    except (OSError, ValueError):
        return False


def is_hf_checkpoint(name):
    """A transformers directory (config.json), or a name from_pretrained would look up on the hub:
    GPT-2's names, or owner/name where no such local path exists."""
    if os.path.isfile(os.path.join(name, "config.json")):
        return True
    return name.startswith("gpt2") or (not os.path.exists(name) and name.count("/") == 1 and not hf.looks_local(name))


# The layout of ckpt.pt. 1: before format numbers (one RNG state, numpy's as an array); 2: a format
# number, each rank's RNG state as tensors, nothing but tensors, containers and numbers (weights_only)
CHECKPOINT_FORMAT = 2


def safe_load(path, device="cpu", allowed=()):
    """torch.load with weights_only=True (tensors, containers, numbers and the `allowed` globals: no
    pickled code runs), its failures as one-line errors naming the file: a file that would run code,
    and a truncated, empty or foreign one."""
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location=device, weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:  # (torch's text would suggest weights_only=False: never here)
        named = re.search(r"GLOBAL (\S+)", str(e))
        raise ValueError(f"{path}: refused: loading it would run code{f' ({named.group(1)})' if named else ''}, "
                         f"which this project never does; use a file that train.py wrote") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"{path}: cannot be read ({str(e).splitlines()[0][:100]}): it is truncated, empty or not "
                         f"a file torch.save wrote; delete it, or use another") from None


def read_checkpoint(ckpt_dir, device="cpu"):
    """ckpt.pt of a checkpoint directory, loaded with weights_only=True (safe_load). Format 1's numpy
    RNG state (an array) is allowed for its weights to load; a file that is not a checkpoint of this
    code, or of a newer format, is an error."""
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    multiarray = (np._core if hasattr(np, "_core") else np.core).multiarray  # numpy 2 renamed core
    ckpt = safe_load(path, device, [np.dtype, np.ndarray, type(np.dtype(np.uint32)), multiarray._reconstruct])
    if not isinstance(ckpt, dict) or not {"model", "model_args"} <= set(ckpt):
        what = f"a {type(ckpt).__name__}" + (f" of {', '.join(map(repr, list(ckpt)[:3]))}" if isinstance(ckpt, dict) else "")
        raise ValueError(f"{path}: not a checkpoint of train.py ({what}, no model_args): for transformers weights "
                         f"pass a directory with config.json")
    if ckpt.get("format", 1) > CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {ckpt['format']} is newer than this code's "
                         f"{CHECKPOINT_FORMAT}: update the code")
    if "checksum" in ckpt and checksum(ckpt) != ckpt["checksum"]:  # (checkpoints written before checksums: unchecked)
        raise ValueError(f"{path}: its contents do not match the checksum saved with them (a flipped bit, a bad "
                         f"copy or disk): restore the file from a copy, or delete it")
    return ckpt


def checksum(ckpt):
    """sha256 of all a checkpoint holds but its checksum (torch checks none: a flipped bit would load)."""
    values, layout = tree_flatten({k: v for k, v in ckpt.items() if k != "checksum"})
    h = hashlib.sha256(str(layout).encode())
    for v in values:
        h.update(str(v.dtype).encode() if torch.is_tensor(v) else repr(v).encode())
        if torch.is_tensor(v):  # (its bytes viewed, not copied: a memory-mapped checkpoint stays on disk)
            h.update(v.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def check_resumable(ckpt, ckpt_dir, run=None):
    """init_from=resume needs this code's layout (an older checkpoint's weights still load: init_from=DIR),
    and under --fsdp a sharded one (a sharded one resumes on any number of ranks, sharded or not: DCP
    reshards it; a whole one has no sharded optimizer state to give FSDP2's)."""
    if ckpt.get("format", 1) != CHECKPOINT_FORMAT:
        raise ValueError(f"{ckpt_dir}/ckpt.pt: checkpoint format {ckpt.get('format', 1)}, written by an older "
                         f"version; this one resumes format {CHECKPOINT_FORMAT} only. Start a new run from its "
                         f"weights with --init_from={ckpt_dir}, or resume it with the version that wrote it")
    if run is not None and run.fsdp and not ckpt.get("sharded"):
        raise ValueError(f"{ckpt_dir}/ckpt.pt was written without --fsdp: resume it with --fsdp=False (one process "
                         f"or DDP), or start a new --fsdp run from its weights with --init_from={ckpt_dir} --out_dir=NEW")


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
    and iteration, and the run goes on correctly but not bit-identically; and where batch_size counts
    rows per rank (all but the algorithms with a global prompts_per_iter), the global batch changes."""
    if len(states) == run.world_size:
        return set_rng_state(run, states[run.rank])
    cfg = run.cfg
    if "prompts_per_iter" in cfg:
        batch = f"the global batch stays prompts_per_iter={cfg['prompts_per_iter']} prompts"
    else:
        rows = cfg["batch_size"] * cfg["gradient_accumulation_steps"]
        batch = (f"the global batch changes from {rows * len(states)} to {rows * run.world_size} rows per step "
                 f"(batch_size x gradient_accumulation_steps x ranks: scale gradient_accumulation_steps by "
                 f"{len(states)}/{run.world_size} to keep it)")
    if run.master:
        print(f"resume: the checkpoint was written by {len(states)} rank(s), this run has {run.world_size}: {batch}; "
              f"the RNG streams are seeded afresh (dropout masks differ from an uninterrupted run)")
    seed = run.cfg["seed"] + 1000 * it + run.rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_model(ckpt_dir, device="cpu", dropout=None):
    """A trained model from a checkpoint directory, LoRA merged, in eval mode; a GPT or a ScalarHeadGPT.
    dropout: the run's (a run starting from it), else the one it was trained with."""
    ckpt = read_checkpoint(ckpt_dir)  # on the CPU, memory-mapped: the optimizer state is never read
    shape = dict(ckpt["model_args"], **({} if dropout is None else {"dropout": dropout}))
    model = GPT(GPTConfig(**shape))
    model = ScalarHeadGPT(model) if ckpt["kind"] == "scalar" else model
    if ckpt["lora_rank"]:
        apply_lora(model, ckpt["lora_rank"], ckpt["lora_alpha"])
    model.load_state_dict(ckpt["model"])
    return (merge_lora(model) if ckpt["lora_rank"] else model).to(device).eval()


def load_tokenizer(ckpt_dir):
    """The tokenizer a checkpoint was trained with."""
    return make_tokenizer(read_checkpoint(ckpt_dir)["tokenizer"])


def weights_fingerprint(model):
    """A hash of a model's weights (names and bytes): what a frozen model is, whatever directory it came from."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # --fsdp: a DTensor's whole
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(run, role, directory, model):
    """Record a frozen model's fingerprint in run.frozen (the checkpoint keeps it); a resumed run's
    must be the one it started with (run.started_with), else the directory changed under it: an error
    (a resumed run on another reference, teacher or reward model would not be the same run)."""
    digest = weights_fingerprint(model)
    before = (getattr(run, "started_with", None) or {}).get(role)
    if before is not None and before["fingerprint"] != digest:
        raise ValueError(f"resume: the {role} in {directory} is not the one this run started with (its weights "
                         f"changed since): restore {before['directory']} as it was, or start a new run")
    if hasattr(run, "frozen"):
        run.frozen[role] = dict(directory=directory, fingerprint=digest)
    return model


def frozen(model):
    """A frozen copy (reference policy, teacher, reward model): eval mode, no gradients."""
    model = copy.deepcopy(model).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_reference(run):
    """The frozen starting point of this run (π_ref): what init_from named, before any training."""
    reference = frozen(build_model(run.cfg, run.tok))
    return place(run, fingerprint(run, "reference", run.cfg["init_from"], reference))


def load_teacher(run):
    """The frozen teacher --teacher names (a checkpoint directory sharing the student's tokenizer), or
    under --teacher=self the trained model itself (read under no_grad by its user)."""
    cfg = run.cfg
    if not cfg["teacher"]:
        raise ValueError(f"--algo {cfg['algo']} needs --teacher=DIR (a checkpoint with the student's tokenizer) "
                         f"or --teacher=self")
    if cfg["teacher"] == "self":
        return run.raw_model
    teacher = place(run, fingerprint(run, "teacher", cfg["teacher"], frozen(load_model(cfg["teacher"]))))
    teacher_vocab, student_vocab = teacher.config.vocab_size, run.raw_model.config.vocab_size
    if teacher_vocab != student_vocab:
        raise ValueError(f"teacher {cfg['teacher']} has a vocabulary of {teacher_vocab} tokens, the student "
                         f"{student_vocab}: distillation compares their distributions token by token, so they "
                         f"must share the tokenizer")
    if load_tokenizer(cfg["teacher"]).name != run.tok.name:
        raise ValueError(f"teacher {cfg['teacher']} uses tokenizer {load_tokenizer(cfg['teacher']).name!r}, "
                         f"the student {run.tok.name!r}: they must share it")
    return teacher


def read_reward_model(run):
    """The Bradley–Terry reward model --reward_model names (a checkpoint of --algo rm), checked, as
    it was trained (PPO's critic may start from it)."""
    cfg = run.cfg
    if not cfg["reward_model"]:
        raise ValueError("--algo ppo_rm (and critic_init=reward_model) needs --reward_model=<checkpoint dir of --algo rm>")
    model = load_model(cfg["reward_model"])
    if not isinstance(model, ScalarHeadGPT):
        raise ValueError(f"reward_model={cfg['reward_model']!r} is a language-model checkpoint, not a reward "
                         f"model (train one with --algo rm)")
    if model.config.vocab_size < run.tok.n_vocab:
        raise ValueError(f"reward_model={cfg['reward_model']!r} has a vocabulary of {model.config.vocab_size}, "
                         f"fewer than the {run.tok.n_vocab} ids of tokenizer {run.tok.name!r}")
    return model


def load_reward_model(run):
    """The frozen reward model --reward_model names, on the run's device."""
    return place(run, fingerprint(run, "reward_model", run.cfg["reward_model"], frozen(read_reward_model(run))))


def load_judge(run):
    """The frozen generative reward model --judge names (judge.py: a language-model checkpoint trained on
    judgements, by experiments/judge_agreement.py), sharing the policy's tokenizer, a whole copy on the run's device."""
    cfg = run.cfg
    judge = load_model(cfg["judge"])
    if not isinstance(judge, GPT):
        raise ValueError(f"judge={cfg['judge']!r} is a scalar model (a Bradley–Terry reward model?), not a judge: "
                         f"a judge writes its judgement (python experiments/judge_agreement.py trains one)")
    if load_tokenizer(cfg["judge"]).name != run.tok.name or judge.config.vocab_size < run.tok.n_vocab:
        raise ValueError(f"judge {cfg['judge']} uses tokenizer {load_tokenizer(cfg['judge']).name!r}, the policy "
                         f"{run.tok.name!r}: they must share it (the judge reads the policy's answers)")
    return fingerprint(run, "judge", cfg["judge"], frozen(judge)).to(run.device)


def save_checkpoint(run, optimizer, it, train_tokens, algo_state):
    """Called by every rank (each adds its RNG streams); rank 0 writes. Atomic: a temporary file, then a
    rename, so a crash never leaves a half-written ckpt.pt. algo_state: the algorithm's state_dict, or None.
    "model" is what load_model() gives later scripts: the trained module itself, or its `policy` when
    the algorithm trains several (PPO's policy + critic); "train_model" then holds all of them."""
    rng = gather_objects(run, rng_state(run))
    raw = run.raw_model
    export = raw.policy if hasattr(raw, "policy") else raw
    sharded, model = save_sharded(run, optimizer, it, export) if run.fsdp else (None, export.state_dict())
    if not run.master:
        return
    gpt = export.gpt if isinstance(export, ScalarHeadGPT) else export
    ckpt = dict(
        format=CHECKPOINT_FORMAT, sharded=sharded,  # --fsdp: the trained state is in out_dir/`sharded`
        model=model,
        train_model=raw.state_dict() if export is not raw and not run.fsdp else None,
        optimizer=None if run.fsdp else optimizer.state_dict(), iter=it, config=run.cfg,
        model_args=dataclasses.asdict(gpt.config), kind="scalar" if isinstance(export, ScalarHeadGPT) else "lm",
        lora_rank=run.cfg["lora_rank"], lora_alpha=run.cfg["lora_alpha"], tokenizer=run.tok.name,
        rng=rng, algo_state=algo_state, train_tokens=train_tokens, frozen=getattr(run, "frozen", {}),
    )
    ckpt["checksum"] = checksum(ckpt)
    path = os.path.join(run.cfg["out_dir"], "ckpt.pt")
    try:
        torch.save(ckpt, path + ".tmp")
    except BaseException as e:  # a full disk, a second Ctrl-C: no partial file stays
        raise not_written(path, it, e) from None
    os.replace(path + ".tmp", path)
    drop_previous(run.cfg["out_dir"])  # this run has a checkpoint of its own: the run --overwrite set aside goes
    if sharded:
        drop_older_shards(run.cfg["out_dir"], sharded)


def drop_older_shards(out_dir, sharded):
    """The sharded states ckpt.pt no longer names (save_sharded's older ones)."""
    for name in os.listdir(out_dir):
        if name.startswith("sharded_") and name != sharded:
            shutil.rmtree(os.path.join(out_dir, name))


def not_written(path, it, error):
    """What save_checkpoint raises when torch.save failed, the partial file removed (it would keep a full
    disk full): a full disk or quota (OSError; torch's zip writer raises RuntimeError) as one line,
    anything else (a KeyboardInterrupt) as it was."""
    if os.path.exists(path + ".tmp"):
        os.remove(path + ".tmp")
    if not isinstance(error, (OSError, RuntimeError)):
        return error
    return ValueError(f"{path}: the checkpoint of iteration {it} could not be written ({str(error).splitlines()[0][:80]}): "
                      f"free space on that disk, then resume with --init_from=resume (the earlier ckpt.pt, if any, is kept)")


def save_sharded(run, optimizer, it, export):
    """--fsdp: every rank writes its shards of the trained weights and AdamW state with
    torch.distributed.checkpoint into out_dir/sharded_ITER (nothing is gathered); ckpt.pt, written
    after it, names it, so a crash midway leaves the last complete pair. Returns (the name, the weights
    of `export` gathered whole to rank 0's CPU, for load_model and later scripts)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    name = f"sharded_{it:07d}"
    model_state, optim_state = get_state_dict(run.raw_model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=os.path.join(run.cfg["out_dir"], name))
    return name, get_model_state_dict(export, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_sharded(run, optimizer, path):
    """The weights and AdamW state save_sharded wrote, into this run's (sharded or not) model and
    optimizer: DCP reshards them to this run's ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_state, optim_state = get_state_dict(run.raw_model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(run.raw_model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
