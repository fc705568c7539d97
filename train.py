"""
The one entry point and the shared training loop.

    python train.py --algo sft                          # laptop CPU, built-in task, no downloads
    python train.py --algo dpo config/dpo.py --beta=0.2 # a config file, then overrides
    torchrun --standalone --nproc_per_node=8 train.py --algo grpo

Configuration is plain Python values: DEFAULTS below plus the chosen algorithm module's own
`defaults`. `--key=value` overrides (parsed as a Python literal), a `config/x.py` file is executed
and its top-level names become overrides. An unknown key or a value of the wrong type is an error.

An algorithm module supplies only what is particular to it:
    defaults                     dict of its own config keys (it may also change common defaults, e.g. the lr)
    setup(run)                   build data, reference models, ... (store on `run`)
    wrap_model(run, model)       optional: turn the loaded model into what it trains (e.g. a scalar head)
    batches(run, it)             -> optimizer steps (a list, or a generator that decides lazily, e.g.
                                    PPO's early stop), each a list of micro-batches; may put
                                    per-iteration figures (rewards, ...) into run.stats
    loss(run, model, batch)      -> (loss_sum, count, metrics): the loop divides the sum by the count
                                    summed over all micro-batches and ranks. Call `model` once per
                                    micro-batch: it is the DDP-wrapped module.
    evaluate(run)                -> dict of held-out figures (all ranks call it)
    state_dict(run) / load_state_dict(run, state)   optional: extra state to checkpoint

The loop owns devices, DDP, gradient accumulation, loss normalisation, AdamW with warmup + cosine,
clipping, evaluation, metrics.jsonl, plots and atomic checkpoints that resume exactly.
"""

import ast
import contextlib
import copy
import dataclasses
import difflib
import importlib
import json
import math
import os
import random
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from envs import make_env
from model import GPT, GPTConfig, ScalarHeadGPT, apply_lora, count_parameters, merge_lora
from tokenizer import Tokenizer

ALGOS = {"pretrain": "sft", "sft": "sft", "rm": "rm", "dpo": "dpo", "ppo": "ppo", "grpo": "grpo", "opd": "opd"}

DEFAULTS = dict(
    algo="sft",
    out_dir="out/{algo}",       # {algo} is filled in
    init_from="scratch",        # scratch | resume | a checkpoint dir | gpt2, gpt2-medium, ... | a HF GPT-2 dir
    tokenizer="byte",           # byte (built in) | gpt2 (with GPT-2 weights) | a dir with GPT-2's vocab.json
    data="",                    # a json/jsonl/parquet file or hub dataset; "" = the built-in environment
    skip_bad_rows=False,        # malformed data rows: False = error naming file/row/field, True = skip and count
    env="arithmetic", env_digits=1, env_ops=3,  # the default task: 3-step chains of 1-digit operands
    # model, when init_from=scratch
    n_layer=4, n_head=4, n_embd=128, block_size=128, dropout=0.0, bias=True,
    # optimisation
    max_iters=600, lr_decay_iters=0,  # 0: decay over max_iters
    batch_size=32, gradient_accumulation_steps=1,
    learning_rate=2e-3, min_lr=2e-4, warmup_iters=30,
    weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
    lora_rank=0, lora_alpha=32.0,    # rank 0 = full fine-tuning; LoRA scale = alpha / rank
    # evaluation and logging
    eval_interval=100, eval_problems=200, eval_batch_size=100, log_interval=10,
    max_new_tokens=64,          # response length limit for sampling (evaluation and rollouts)
    checkpoint=True, plot=True,  # checkpoint / metrics.png at every eval and at the end
    seed=1337, device="auto",
)


# ----------------------------------------------------------------------------------------------
# Configuration

def _coerce(key, value, default):
    """Accept `value` for `key` only if it has the default's type (an int is fine for a float)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(f"config key {key!r} expects {type(default).__name__}, "
                         f"got {value!r} ({type(value).__name__})")
    return value


def algo_module(name):
    if name not in ALGOS:
        close = difflib.get_close_matches(name, ALGOS, n=3)
        raise ValueError(f"unknown algo {name!r}" + (f"; did you mean {close}?" if close else f"; choose from {sorted(ALGOS)}"))
    return importlib.import_module(ALGOS[name])


def make_config(overrides):
    """DEFAULTS + the algorithm's defaults, overridden by `overrides` (dict), type-checked."""
    algo = overrides.get("algo", DEFAULTS["algo"])
    module = algo_module(algo)
    defaults = dict(DEFAULTS)
    for key, value in module.defaults.items():  # an algorithm may change a common default (e.g. its lr)
        if key in DEFAULTS:
            _coerce(f"{module.__name__}.defaults[{key!r}]", value, DEFAULTS[key])
        defaults[key] = value
    cfg = dict(defaults)
    for key, value in overrides.items():
        if key not in defaults:
            close = difflib.get_close_matches(key, defaults, n=3)
            raise ValueError(f"unknown config key {key!r} for --algo {algo}"
                             + (f"; did you mean {', '.join(close)}?" if close else ""))
        cfg[key] = _coerce(key, value, defaults[key])
    cfg["out_dir"] = cfg["out_dir"].format(algo=algo)
    return cfg


def parse_args(argv):
    """`--key=value` (a Python literal, else a string), `--algo name`, and config files `x.py`."""
    overrides = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.endswith(".py") and not arg.startswith("--"):
            scope = {}
            with open(arg) as f:
                exec(f.read(), scope)
            overrides.update({k: v for k, v in scope.items() if not k.startswith("_")
                              and not callable(v) and not isinstance(v, type(sys))})
        elif arg.startswith("--"):
            if "=" in arg:
                key, raw = arg[2:].split("=", 1)
            elif i + 1 < len(argv):
                key, raw = arg[2:], argv[i + 1]
                i += 1
            else:
                raise ValueError(f"argument {arg!r} has no value: use --key=value")
            try:
                overrides[key] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                overrides[key] = raw
        else:
            raise ValueError(f"cannot parse argument {arg!r}: use --key=value or a config file ending in .py")
        i += 1
    return overrides


# ----------------------------------------------------------------------------------------------
# Devices and DDP

def setup_device(cfg):
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if cfg["device"] == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    else:
        device = cfg["device"]
    rank, world_size, local_rank = 0, 1, 0
    if ddp:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
                else contextlib.nullcontext())
    return SimpleNamespace(device=device, ddp=ddp, rank=rank, world_size=world_size,
                           master=rank == 0, autocast=autocast)


def all_reduce_sum(values, run):
    """Sum a list of floats over ranks (identity in one process)."""
    if not run.ddp:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=run.device)
    dist.all_reduce(t)
    return t.tolist()


def seeded_rng(run, *keys):
    """A numpy RNG that depends only on the seed and `keys` (e.g. the iteration): batches are a pure
    function of the step, so a resumed run draws exactly what the uninterrupted one would."""
    return np.random.default_rng([run.cfg["seed"], *keys])


def shard(items, run, micro_steps, batch_size):
    """Split one global batch (a list) into this rank's micro-batches. The same global batch gives
    the same gradient for any (processes × micro-batches) split, since the loop divides by the
    global count."""
    assert len(items) == run.world_size * micro_steps * batch_size
    return [items[(m * run.world_size + run.rank) * batch_size:][:batch_size] for m in range(micro_steps)]


# ----------------------------------------------------------------------------------------------
# Data files

class RowError(ValueError):
    """A malformed data row: which field, and what is wrong with it."""

    def __init__(self, field, problem):
        super().__init__(f"field {field!r}: {problem}")
        self.field = field


def load_rows(path):
    """The rows (dicts) of a json / jsonl / parquet file, or of a hub dataset when online, via `datasets`."""
    from datasets import load_dataset
    if os.path.isfile(path):
        builder = "parquet" if path.endswith(".parquet") else "json"
        try:
            return list(load_dataset(builder, data_files=path, split="train"))
        except Exception as e:  # datasets wraps parse errors in several types
            raise ValueError(f"{path}: cannot be read as {builder}: {e}") from None
    if os.path.splitext(path)[1] in (".json", ".jsonl", ".parquet"):
        raise FileNotFoundError(f"data file {path} does not exist")
    return list(load_dataset(path, split="train"))


def encode_rows(run, path, rows, encode):
    """encode(row) -> example, raising RowError for a bad row. A bad row is an error naming the
    file, row (1-based, the line of a jsonl file) and field, or, with skip_bad_rows, skipped and
    counted (run.stats["skipped_rows"])."""
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
    if init.startswith("gpt2") or os.path.isfile(os.path.join(init, "config.json")):
        model = GPT.from_pretrained(init, dropout=cfg["dropout"])
        if cfg["block_size"] > model.config.block_size:
            raise ValueError(f"block_size={cfg['block_size']} is longer than {init}'s "
                             f"{model.config.block_size} positions")
        model.resize_vocab(tok.n_vocab)
        return model
    raise ValueError(f"init_from={init!r}: not 'scratch', 'resume', a checkpoint directory "
                     f"(with ckpt.pt), a GPT-2 name or a transformers GPT-2 directory")


def load_model(ckpt_dir, device="cpu"):
    """A trained model from a checkpoint directory, LoRA merged, in eval mode; a GPT or a ScalarHeadGPT."""
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    ckpt = torch.load(path, map_location=device, weights_only=False)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model = ScalarHeadGPT(model) if ckpt["kind"] == "scalar" else model
    if ckpt["lora_rank"]:
        apply_lora(model, ckpt["lora_rank"], ckpt["lora_alpha"])
    model.load_state_dict(ckpt["model"])
    return merge_lora(model).to(device).eval()


def frozen(model):
    """A frozen copy (reference policy, teacher, reward model): eval mode, no gradients."""
    model = copy.deepcopy(model).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_reference(run):
    """The frozen starting point of this run (π_ref): what init_from named, before any training."""
    return frozen(build_model(run.cfg, run.tok)).to(run.device)


def save_checkpoint(run, optimizer, it):
    """Atomic: write a temporary file, then rename, so a crash never leaves a half-written ckpt.pt.

    "model" is what load_model() gives later scripts: the trained module itself, or its `policy` when
    the algorithm trains several (PPO's policy + critic); "train_model" then holds all of them."""
    raw = run.raw_model
    export = raw.policy if hasattr(raw, "policy") else raw
    gpt = export.gpt if isinstance(export, ScalarHeadGPT) else export
    ckpt = dict(
        model=export.state_dict(), train_model=raw.state_dict() if export is not raw else None,
        optimizer=optimizer.state_dict(), iter=it, config=run.cfg,
        model_args=dataclasses.asdict(gpt.config), kind="scalar" if isinstance(export, ScalarHeadGPT) else "lm",
        lora_rank=run.cfg["lora_rank"], lora_alpha=run.cfg["lora_alpha"], tokenizer=run.tok.name,
        rng=dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                 cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None),
        algo_state=run.algo.state_dict(run) if hasattr(run.algo, "state_dict") else None,
    )
    path = os.path.join(run.cfg["out_dir"], "ckpt.pt")
    torch.save(ckpt, path + ".tmp")
    os.replace(path + ".tmp", path)


# ----------------------------------------------------------------------------------------------
# Evaluation helpers shared by every algorithm

def generate(run, model, prompts, max_new_tokens=None, temperature=0.0, seed=None, batch_size=None, **kw):
    """Sample responses for a list of prompt-id lists in chunks; returns (tokens, logprobs)."""
    max_new_tokens = max_new_tokens or run.cfg["max_new_tokens"]
    batch_size = batch_size or run.cfg["eval_batch_size"]
    tokens, logprobs = [], []
    with run.autocast:
        for start in range(0, len(prompts), batch_size):
            t, lp = model.generate(prompts[start:start + batch_size], max_new_tokens, temperature=temperature,
                                   stop_tokens=(run.tok.eos,), pad_id=run.tok.pad,
                                   seed=None if seed is None else seed + start, **kw)
            tokens += t
            logprobs += lp
    return tokens, logprobs


def collate(examples, pad_id, device):
    """[(ids, mask)] -> right-padded (B, T) id and 0/1 mask tensors (padding has mask 0)."""
    T = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), T), dtype=torch.float32)
    for i, (seq, m) in enumerate(examples):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), mask.to(device)


def response_text(run, tokens):
    return run.tok.decode([t for t in tokens if t != run.tok.eos])


def env_accuracy(run, model, split, n, temperature=0.0, samples=1, seed=0):
    """Exact-match accuracy on `n` problems of `split`, sampled with the KV-cache sampler; with
    samples > 1 also pass@samples. Problems are spread over ranks and the counts summed.
    Returns (metrics, transcripts of the first few problems)."""
    problems = run.env.problems(split, n, seed=seed)[run.rank::run.world_size]
    prompts = [run.tok.prompt_ids(p["prompt"]) for p in problems for _ in range(samples)]
    tokens, _ = generate(run, model, prompts, temperature=temperature, seed=seed)
    texts = [response_text(run, t) for t in tokens]
    correct = np.array([run.env.verify(p, texts[i * samples + j]) for i, p in enumerate(problems)
                        for j in range(samples)]).reshape(len(problems), samples)
    lengths = [len(t) for t in tokens]
    sums = all_reduce_sum([correct[:, 0].sum(), correct.max(1).sum(), len(problems),
                           sum(lengths), len(lengths)], run)
    metrics = {f"{split}_acc": sums[0] / sums[2], f"{split}_len": sums[3] / sums[4]}
    if samples > 1:
        metrics[f"{split}_pass@{samples}"] = sums[1] / sums[2]
    transcripts = [f"[{split}] {p['prompt']}\n  -> {texts[i * samples]!r}  (answer {p['answer']}, "
                   f"reward {correct[i, 0]:.0f})" for i, p in enumerate(problems[:4])]
    return metrics, transcripts


def last_response_column(mask):
    """(N,) column t of each row's last response token in a mask aligned with ids[:, 1:] (the
    token is ids[:, t+1]); −1 for a row without one."""
    positions = torch.arange(mask.size(1), device=mask.device)
    return torch.where(mask > 0, positions, -1).amax(1)


def rollouts(run, model, problems, samples_per_prompt, temperature=1.0, max_new_tokens=None, seed=None,
             top_k=None, top_p=None):
    """Sample `samples_per_prompt` responses per problem with the KV-cache sampler and score them
    with the environment's verifier. Tokens in, tokens out: response ids are never decoded and
    re-encoded for training (text is decoded only for the verifier).

    Returns a dict; per-token tensors are aligned with the shifted targets ids[:, 1:], exactly like
    sequence_logprobs(model, ids), so position t scores token ids[:, t+1]:
        ids          (N, T) long   prompt + response, right-padded with <|pad|>; N = P·G, grouped by prompt
        mask         (N, T-1) float 1 on response tokens (stop token included), 0 on prompt and padding
        old_logprobs (N, T-1) float the sampler's log-probs (π_old), 0 where mask is 0
        rewards      (N,) float    verifier reward
        lengths      (N,) long     response lengths in tokens
        truncated    (N,) bool     response hit max_new_tokens without the end token
        group        (N,) long     index of the problem each row answers
        texts, problems            decoded responses (for logs) and the problem of each row
        decode_time, verify_time   seconds
    """
    prompts = [run.tok.prompt_ids(p["prompt"]) for p in problems for _ in range(samples_per_prompt)]
    rows = [p for p in problems for _ in range(samples_per_prompt)]
    t0 = time.time()
    tokens, logprobs = generate(run, model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                seed=seed, batch_size=len(prompts), top_k=top_k, top_p=top_p)
    t1 = time.time()
    texts = [response_text(run, t) for t in tokens]
    rewards = torch.tensor([run.env.verify(p, text) for p, text in zip(rows, texts)], dtype=torch.float32)
    t2 = time.time()
    N, T = len(prompts), max(len(p) + len(t) for p, t in zip(prompts, tokens))
    ids = torch.full((N, T), run.tok.pad, dtype=torch.long)
    mask = torch.zeros(N, T - 1)
    old = torch.zeros(N, T - 1)
    for i, (p, t, lp) in enumerate(zip(prompts, tokens, logprobs)):
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        mask[i, len(p) - 1:len(p) - 1 + len(t)] = 1.0
        old[i, len(p) - 1:len(p) - 1 + len(t)] = torch.tensor(lp)
    device = run.device
    return dict(ids=ids.to(device), mask=mask.to(device), old_logprobs=old.to(device), rewards=rewards.to(device),
                lengths=torch.tensor([len(t) for t in tokens], device=device),
                truncated=torch.tensor([run.tok.eos not in t for t in tokens], device=device),
                group=torch.arange(len(problems), device=device).repeat_interleave(samples_per_prompt),
                texts=texts, problems=rows, decode_time=t1 - t0, verify_time=t2 - t1)


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


# ----------------------------------------------------------------------------------------------
# The loop

def lr_at(cfg, it):
    """Linear warmup, then cosine decay to min_lr."""
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / cfg["warmup_iters"]
    if it >= decay_iters:
        return cfg["min_lr"]
    ratio = (it - cfg["warmup_iters"]) / max(1, decay_iters - cfg["warmup_iters"])
    return cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg["learning_rate"] - cfg["min_lr"])


def train(overrides):
    """Run one training job; returns the run (run.raw_model, run.metrics: the last evaluation)."""
    overrides = dict(overrides)
    resume_ckpt = None
    if overrides.get("init_from") == "resume":
        # the checkpoint's config is the run's config; only what is given again on the command line changes
        out_dir = overrides.get("out_dir", DEFAULTS["out_dir"]).format(algo=overrides.get("algo", DEFAULTS["algo"]))
        path = os.path.join(out_dir, "ckpt.pt")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"init_from=resume: no checkpoint at {path}")
        resume_ckpt = torch.load(path, map_location="cpu", weights_only=False)
        overrides = {**resume_ckpt["config"], **{k: v for k, v in overrides.items() if k != "init_from"}}
    cfg = make_config(overrides)
    run = setup_device(cfg)
    run.cfg, run.algo, run.stats = cfg, algo_module(cfg["algo"]), {}
    run.tok = Tokenizer(cfg["tokenizer"])
    run.env = make_env(cfg["env"], digits=cfg["env_digits"], n_ops=cfg["env_ops"])
    if run.master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
    torch.manual_seed(cfg["seed"])
    random.seed(cfg["seed"])
    np.random.seed(cfg["seed"])

    model = build_model(cfg, run.tok)  # on resume too: the same construction, then the saved weights
    if hasattr(run.algo, "wrap_model"):
        model = run.algo.wrap_model(run, model)
    elif not isinstance(model, GPT):
        raise ValueError(f"--algo {cfg['algo']} trains a language model; init_from={cfg['init_from']!r} is not one")
    if cfg["lora_rank"]:
        apply_lora(model, cfg["lora_rank"], cfg["lora_alpha"], trainable=("head",))
    if resume_ckpt is not None:
        model.load_state_dict(resume_ckpt["train_model"] or resume_ckpt["model"])
    model.to(run.device)
    run.raw_model = model
    run.model = DDP(model, device_ids=[run.device] if run.device.startswith("cuda") else None) if run.ddp else model
    n_train, n_total = count_parameters(model)
    torch.manual_seed(cfg["seed"] + run.rank)  # same init on every rank (above), own dropout masks (below)
    run.algo.setup(run)

    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg["learning_rate"], betas=(cfg["beta1"], cfg["beta2"]),
                                  fused=run.device.startswith("cuda"))
    start_iter = 0
    metrics_path = os.path.join(cfg["out_dir"], "metrics.jsonl")
    if resume_ckpt is not None:
        optimizer.load_state_dict(resume_ckpt["optimizer"])
        start_iter = resume_ckpt["iter"]
        rng = resume_ckpt["rng"]
        random.setstate(rng["python"]); np.random.set_state(rng["numpy"]); torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if resume_ckpt["algo_state"] is not None:
            run.algo.load_state_dict(run, resume_ckpt["algo_state"])
        if run.master and os.path.exists(metrics_path):  # drop lines logged after the checkpoint
            rows = [line for line in open(metrics_path) if json.loads(line)["iter"] <= start_iter]
            open(metrics_path, "w").writelines(rows)
    elif run.master:
        open(metrics_path, "w").close()
        with open(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        print(f"{cfg['algo']}: {n_train:,} trainable of {n_total:,} parameters on {run.device}"
              f" x{run.world_size}, out_dir={cfg['out_dir']}")

    def log(row):
        if run.master:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def evaluate(it):
        run.iter = it
        t0 = time.time()
        metrics = run.algo.evaluate(run)
        metrics["eval_time"] = time.time() - t0
        log({"iter": it, **metrics})
        if run.master and cfg["plot"]:
            plot_metrics(cfg["out_dir"])
        return metrics

    from tqdm import tqdm
    bar = tqdm(range(start_iter, cfg["max_iters"]), initial=start_iter, total=cfg["max_iters"],
               disable=not run.master, dynamic_ncols=True, desc=cfg["algo"])
    metrics = {}
    if start_iter == 0 and cfg["eval_interval"] > 0:
        metrics = evaluate(0)
    for it in bar:
        t0 = time.time()
        lr = lr_at(cfg, it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        run.stats = {}
        model.train()
        sums, count, n_micro, grad_norm = {}, 0.0, 0, None
        steps = run.algo.batches(run, it)  # RL: the rollouts happen here
        t_update = time.time()
        for micro_batches in steps:  # one entry per optimizer step
            optimizer.zero_grad(set_to_none=True)
            step_count = 0.0
            for m, batch in enumerate(micro_batches):
                last = m == len(micro_batches) - 1
                sync = contextlib.nullcontext() if (last or not run.ddp) else run.model.no_sync()
                with sync:
                    with run.autocast:
                        loss_sum, n, extra = run.algo.loss(run, run.model, batch)
                    loss_sum.backward()
                step_count += float(n)
                for k, v in {"loss": float(loss_sum.detach()), **extra}.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                n_micro += 1
            # DDP averaged the per-rank sums over ranks; turn that into the sum over the global count
            global_count = all_reduce_sum([step_count], run)[0]
            scale = run.world_size / max(global_count, 1e-8)
            torch._foreach_mul_([p.grad for p in params if p.grad is not None], scale)  # one call, not one per tensor
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"]) if cfg["grad_clip"] > 0 else None
            optimizer.step()
            count += step_count
        run.stats["time_update"] = time.time() - t_update  # forward, backward and optimizer of the iteration
        if (it + 1) % cfg["log_interval"] == 0 or it + 1 == cfg["max_iters"]:
            # loss: sum over micro-batches / their count, summed over ranks; other figures: means
            keys = sorted(sums)
            reduced = all_reduce_sum([sums[k] for k in keys] + [count, n_micro], run)
            row = {k: v / (reduced[-2] if k == "loss" else reduced[-1]) for k, v in zip(keys, reduced)}
            row.update({"iter": it + 1, "lr": lr, "iter_time": time.time() - t0, **run.stats})
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            log(row)
            bar.set_postfix(loss=f"{row['loss']:.4f}")
        if cfg["eval_interval"] > 0 and ((it + 1) % cfg["eval_interval"] == 0 or it + 1 == cfg["max_iters"]):
            metrics = evaluate(it + 1)
            if run.master:
                bar.write(f"iter {it + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        if cfg["checkpoint"] and run.master and (
                (cfg["eval_interval"] > 0 and (it + 1) % cfg["eval_interval"] == 0) or it + 1 == cfg["max_iters"]):
            save_checkpoint(run, optimizer, it + 1)
    bar.close()
    if run.ddp:
        dist.barrier()
        dist.destroy_process_group()
    run.metrics = metrics
    return run


if __name__ == "__main__":
    try:
        train(parse_args(sys.argv[1:]))
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
