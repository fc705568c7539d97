"""
The one entry point: configuration and the shared training loop.

    python train.py --algo sft                          # laptop CPU, built-in task, no downloads
    python train.py --algo dpo config/dpo.py --beta=0.2 # a config file, then overrides
    torchrun --standalone --nproc_per_node=8 train.py --algo grpo

Configuration is plain Python values: DEFAULTS below plus the chosen algorithm module's own
`defaults`. `--key=value` overrides (parsed as a Python literal), a `config/x.py` file is executed
and its top-level names become overrides. An unknown key or a value of the wrong type is an error.

The helpers every script shares live in modules named for what they hold (distributed.py, data.py,
checkpoints.py, rollouts.py, evaluation.py, paperwork.py, rewards.py), which never import this file
or an algorithm.

An algorithm module (ALGOS below) supplies only what is particular to it:
    defaults                     dict of its own config keys (it may also change common defaults, e.g. the lr)
    starts_from                  optional: the --algo whose checkpoint it must start from (e.g. "sft"),
                                    so init_from=scratch or a DIR without ckpt.pt is an error naming
                                    the command that makes it
    teacher_from                 optional: the --algo whose ladder stage is the default --teacher on the
                                    command line (train.after_the_ladder)
    needs                        optional: the frozen models it reads, a tuple or a function of the config
                                    giving one; the loop builds each once per run (checkpoints.py's loaders):
                                    "reference" π_ref, the starting policy (run.ref_model, before setup),
                                    "teacher" (run.teacher, before setup; --teacher=self is the trained
                                    model itself), "reward_model" (run.reward_model, before wrap_model:
                                    PPO's critic may start from it)
    sharded_rollouts             optional: True when every rank makes the same number of sampler calls
                                    and scoring forwards (equal shards), so --fsdp_rollouts=sharded can run it
    loss_dropout                 optional: False when its loss must see the function that sampled
                                    (on-policy RL): the loop then keeps dropout off in the loss too
    setup(run)                   build data, ... (store on `run`)
    wrap_model(run, model)       optional: turn the loaded model into what it trains (e.g. a scalar head)
    batches(run, it)             -> optimizer steps, each a list of micro-batches: a list, or a
                                    generator that decides lazily; a generator is sent, after each
                                    step, that step's figures ({"loss", and every metric of `loss`},
                                    means over its micro-batches on all ranks), e.g. PPO's early stop
                                    on its KL. May put per-iteration figures (rewards, ...) into run.stats
    loss(run, model, batch)      -> (loss_sum, count, metrics): the loop divides the sum by the count
                                    summed over all micro-batches and ranks. Call `model` once per
                                    micro-batch: it is the DDP-wrapped module. metrics["tokens"], the
                                    micro-batch's target tokens that carry loss weight, is summed (not
                                    averaged) and logged as the running total `train_tokens`.
    evaluate(run, it)            -> dict of held-out figures at iteration `it` (all ranks call it, the
                                    model in eval mode); a policy's are evaluation.evaluate_policy's
    state_dict(run) / load_state_dict(run, state)   optional: extra state to checkpoint

The loop owns devices, DDP, gradient accumulation, loss normalisation, AdamW with warmup + cosine,
clipping, train/eval mode (set_dropout: rollouts, scoring and evaluation never run dropout),
evaluation, metrics.jsonl, plots and atomic checkpoints that resume exactly. train() below is the
loop; setup, resume and the optimizer step are the functions above it.
"""

import ast
import contextlib
import difflib
import importlib
import importlib.util
import inspect
import io
import json
import math
import os
import random
import sys
import time
import tokenize

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoints import (build_model, check_resumable, is_hf_checkpoint, load_reference, load_reward_model,
                         load_sharded, load_teacher, read_checkpoint, restore_rng, save_checkpoint)
from data import config_env
from distributed import (all_reduce_sum, gathered, keep_gathered_through_backward, rank0_first, set_gathered,
                         set_gradient_sync, setup_device, shard_model)
from envs import ENVS
from evaluation import plot_metrics
from model import GPT, apply_lora, count_parameters
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


READS_DATA = ("pretrain", "sft", "rm", "dpo")  # the algorithms that train on --data (RL reads its env)
ALGOS = {"pretrain": "sft", "sft": "sft", "rm": "rm", "dpo": "dpo", "ppo": "ppo", "grpo": "grpo", "opd": "opd", "rft": "rft"}

DEFAULTS = dict(
    algo="sft",                 # the algorithm: pretrain, sft, rm, dpo, ppo, grpo, opd, rft
    out_dir="out/{algo}",       # where the run writes; {algo} is filled in
    init_from="scratch",        # scratch | resume | a checkpoint dir | a transformers dir or hub name (GPT-2, Llama, Qwen2, Qwen3)
    tokenizer="byte",           # byte (built in) | gpt2 | a dir with GPT-2's vocab.json | a checkpoint's own (dir or hub name, with its chat template)
    data="",                    # a json/jsonl/parquet file or hub dataset; "" = the built-in environment
    skip_bad_rows=False,        # malformed data rows: False = error naming file/row/field, True = skip and count
    # the default task: 3-step chains of 1-digit operands; half the SFT demonstrations give only the
    # answer, half the worked steps (envs/arithmetic.py, docs/task.md)
    env="arithmetic",           # the task: arithmetic | generalpoints | calculator | treasure | gsm8k (envs/)
    env_digits=1,               # digits of each operand
    env_ops=3,                  # operations per problem
    env_direct_frac=0.5,        # share of SFT demonstrations that give only the answer; 0.0 = every one worked
    env_data="openai/gsm8k:main",  # --env=gsm8k's rows: a hub dataset NAME[:CONFIG] (train/test splits) or a local file (last tenth held out)
    # the model, when init_from=scratch
    n_layer=4,                  # transformer blocks
    n_head=4,                   # attention heads per block
    n_embd=128,                 # width of the residual stream
    block_size=128,             # the longest sequence (prompt + response) in tokens
    dropout=0.0,                # dropout probability in training
    bias=True,                  # biases in the linear layers and layer norms (GPT-2 has them)
    # optimisation
    max_iters=1000,             # training iterations
    lr_decay_iters=0,           # iterations of the cosine decay; 0 = max_iters
    batch_size=32,              # rows per micro-batch
    gradient_accumulation_steps=1,  # micro-batches per optimizer step (per process)
    learning_rate=2e-3,         # peak learning rate, after the warm-up
    min_lr=2e-4,                # learning rate at the end of the cosine decay
    warmup_iters=30,            # iterations of linear warm-up
    weight_decay=0.1,           # AdamW weight decay (matrices only)
    beta1=0.9,                  # AdamW β1
    beta2=0.95,                 # AdamW β2
    grad_clip=1.0,              # clip the gradient's global norm to this; 0 = off
    lora_rank=0,                # rank of LoRA adapters on every attention and MLP matrix; 0 = full fine-tuning
    lora_alpha=32.0,            # LoRA scale = alpha / rank
    # evaluation and logging
    eval_interval=100,          # evaluate (and checkpoint) every this many iterations and at the end; 0 = never (a checkpoint at the end)
    eval_at_start=True,         # evaluate the starting weights too, at iteration 0 (the ladder's stages skip it: its report has their start)
    eval_problems=200,          # held-out problems per evaluation
    eval_batch_size=100,        # rows per sampler call in evaluation
    log_interval=10,            # write a metrics.jsonl row every this many iterations
    eval_samples=0,             # answers sampled per held-out problem at the sampling temperature: their accuracy,
                                # pass@k (= Best-of-k by the verifier) and the KL to the reference; 0 = greedy only
    max_new_tokens=64,          # response length limit for sampling (evaluation and rollouts)
    max_tool_calls=6,           # tool environments (--env=calculator, treasure): calls run per response; later ones get an error back
    checkpoint=True,            # write ckpt.pt at every evaluation and at the end
    plot=True,                  # redraw metrics.png at the last evaluation, and at others a minute or more after the last drawing
    seed=1337,                  # seeds torch, numpy and random (each DDP rank adds its rank for dropout)
    device="auto",              # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    compile=False,              # torch.compile the training forward and backward (sampling stays eager)
    fsdp=False,                 # torchrun: shard weights, gradients and AdamW state over the ranks (FSDP2), not DDP copies
    fsdp_rollouts="gathered",   # --fsdp: gathered = all-gather each model's full weights for sampling and scoring (fast, a full bf16 copy per GPU); sharded = forwards stay sharded, all ranks step together (models whose full weights do not fit one GPU)
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


# Names people often type for a key, from other trainers (HF, nanoGPT, ...): suggested first.
ALIASES = dict(lr="learning_rate", bs="batch_size", batch="batch_size", micro_batch_size="batch_size",
               iters="max_iters", steps="max_iters", max_steps="max_iters", num_iters="max_iters",
               epochs="max_iters", num_train_epochs="max_iters", warmup="warmup_iters",
               warmup_steps="warmup_iters", wd="weight_decay", clip="grad_clip", max_grad_norm="grad_clip",
               grad_accum="gradient_accumulation_steps", gradient_accumulation="gradient_accumulation_steps",
               seq_len="block_size", context_length="block_size", max_seq_len="block_size",
               max_length="block_size", temp="temperature", output_dir="out_dir", dataset="data",
               model="init_from", lora_r="lora_rank", n_layers="n_layer", n_heads="n_head")


# Keys renamed in this version: the old name still works and says the new one (in a resumed run's
# saved config too; where two old names meet, the later one counts)
RENAMED = dict(eval_pass_k="eval_samples", eval_best_of_n="eval_samples", best_of_n="eval_samples")
# Keys removed in this version: ignored, with a note saying why
REMOVED = dict(eval_best_of_n_problems="Best-of-N by the verifier is pass@k, on the eval_problems held-out problems "
                                       "that every sampled figure uses")


def renamed(overrides):
    """overrides with renamed keys under their new name and removed ones dropped, a note for each."""
    out = {}
    for key, value in overrides.items():
        if key in REMOVED:
            print(f"note: config key {key!r} is gone ({REMOVED[key]}); ignored")
        elif key in RENAMED:
            print(f"note: config key {key!r} is now {RENAMED[key]!r}")
            out[RENAMED[key]] = value
        else:
            out[key] = value
    return out


def available_algos():
    """The --algo names whose module exists (ALGOS may name one that is still to be written)."""
    return sorted(name for name, module in ALGOS.items() if importlib.util.find_spec(module) is not None)


def algo_module(name):
    choices = available_algos()
    if name not in ALGOS:
        close = difflib.get_close_matches(name, choices, n=3)
        raise ValueError(f"unknown algo {name!r}; " + (f"did you mean {', '.join(close)}? " if close else "")
                         + f"choose from {', '.join(choices)}")
    if name not in choices:
        raise ValueError(f"--algo {name}: its module {ALGOS[name]}.py does not exist yet; "
                         f"choose from {', '.join(choices)}")
    return importlib.import_module(ALGOS[name])


def make_config(overrides):
    """DEFAULTS + the algorithm's defaults, overridden by `overrides` (dict), type-checked."""
    overrides = renamed(overrides)
    algo = overrides.get("algo", DEFAULTS["algo"])
    module = algo_module(algo)
    defaults = dict(DEFAULTS)
    for key, value in module.defaults.items():  # an algorithm may change a common default (e.g. its lr)
        if key in DEFAULTS:
            _coerce(f"{module.__name__}.defaults[{key!r}]", value, DEFAULTS[key])
        defaults[key] = value
    # an environment may change common defaults too (the treasure hunt's long transcripts need a longer block_size)
    defaults.update(getattr(ENVS.get(overrides.get("env", defaults["env"])), "train_defaults", {}))
    cfg = dict(defaults)
    for key, value in overrides.items():
        if key not in defaults:
            close = [ALIASES[key]] if ALIASES.get(key) in defaults else []
            close += [k for k in difflib.get_close_matches(key, defaults, n=3) if k not in close]
            raise ValueError(f"unknown config key {key!r} for --algo {algo}"
                             + (f"; did you mean {', '.join(close)}?" if close else ""))
        cfg[key] = _coerce(key, value, defaults[key])
    cfg["out_dir"] = cfg["out_dir"].format(algo=algo)
    if cfg["data"] and algo not in READS_DATA:  # never ignored silently
        raise ValueError(f"--algo {algo} takes its prompts from the environment, not --data: for a dataset's "
                         f"prompts and reference answers use --env=gsm8k --env_data=NAME_OR_FILE")
    return cfg


def config_comments(module, name):
    """{key: its one-line description} for `name = dict(...)` in `module`'s source: the comment at
    the end of the key's line, else the comment lines right above it. Keys merged in from another
    module's dict (`dict(pairs.PAIR_DEFAULTS, ...)`, `**X.KEYS`, `name.update(X.KEYS)`, or KEYS imported
    by `from X import KEYS`) take that dict's comments."""
    source = open(module.__file__).read()
    comments = {}  # line -> (text, whether the comment stands alone on its line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string.lstrip("#").strip(), not token.line[:token.start[1]].strip())
    body = ast.parse(source).body
    call = next(node.value for node in body if isinstance(node, ast.Assign)
                and any(getattr(target, "id", None) == name for target in node.targets))
    updates = [node.value.args[0] for node in body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and ast.unparse(node.value.func) == f"{name}.update"]
    merged = call.args + [keyword.value for keyword in call.keywords if keyword.arg is None] + updates
    found = {}
    imported = {alias.asname or alias.name: node.module for node in body if isinstance(node, ast.ImportFrom)
                for alias in node.names}  # `from rewards import REWARD_KEYS`: REWARD_KEYS's module
    for other in merged:
        if isinstance(other, ast.Attribute) and isinstance(other.value, ast.Name):
            found.update(config_comments(getattr(module, other.value.id), other.attr))
        elif isinstance(other, ast.Name) and other.id in imported:
            found.update(config_comments(importlib.import_module(imported[other.id]), other.id))
    for keyword in (keyword for keyword in call.keywords if keyword.arg):
        text, alone = comments.get(keyword.value.end_lineno, ("", True))
        if alone:  # no comment at the end of its line: the comment lines right above
            above, line = [], keyword.lineno - 1
            while line in comments and comments[line][1]:
                above.insert(0, comments[line][0])
                line -= 1
            text = " ".join(above)
        found[keyword.arg] = text
    return found


def help_text(algo):
    """--help: every option of `--algo algo` with its default and its description."""
    cfg, module = make_config(dict(algo=algo)), algo_module(algo)
    # a common key keeps its common description where an algorithm changes its default
    described = {**config_comments(module, "defaults"), **config_comments(sys.modules[__name__], "DEFAULTS")}
    lines = [f"usage: python train.py --algo {algo} [config/FILE.py ...] [--key=value ...]",
             "       (torchrun --standalone --nproc_per_node=N train.py ... on N processes)",
             f"--algo: {', '.join(available_algos())}; `python train.py --algo NAME --help` adds its own options.",
             "A value is a Python literal (--learning_rate=3e-4, --lora_rank=8), else a string."]
    groups = [("common options (train.py DEFAULTS; * = changed by this algorithm or its task)", list(DEFAULTS)),
              (f"--algo {algo}'s own options ({module.__name__}.py defaults)", [k for k in module.defaults if k not in DEFAULTS])]
    for title, keys in groups:
        lines += ["", title + ":"]
        for key in keys:
            mark = "*" if key in DEFAULTS and cfg[key] != DEFAULTS[key] and key != "out_dir" else " "
            lines.append(f"  --{key}={cfg[key]!r}{mark}".ljust(40) + " " + described.get(key, ""))
    return "\n".join(lines)


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


def as_means(sums):
    """Figures summed over micro-batches and ranks -> the loss per counted unit (the loop's
    normalisation), `tokens` as the sum (the step's trained tokens), every other figure as a mean
    over micro-batches."""
    return {k: v if k == "tokens" else v / (sums["count"] if k == "loss" else sums["micro_batches"])
            for k, v in sums.items() if k not in ("count", "micro_batches")}


def check_start(overrides):
    """A missing input checkpoint is a one-line error naming the command that makes it: an algorithm
    that declares `starts_from` (the algo whose checkpoint it usually starts from) never starts from
    a random model, and --init_from=DIR needs DIR/ckpt.pt. Checked for the command line only: the
    tests call train() on purpose with tiny random models for every algorithm."""
    if overrides.get("init_from") == "resume":
        return
    cfg = make_config(overrides)
    init, needs = cfg["init_from"], getattr(algo_module(cfg["algo"]), "starts_from", None)
    if os.path.isfile(os.path.join(init, "ckpt.pt")) or (  # a checkpoint, or transformers weights
            is_hf_checkpoint(init) and os.path.basename(os.path.normpath(init)) not in ALGOS):
        return
    if init == "scratch" and needs:
        out = DEFAULTS["out_dir"].format(algo=needs)
        raise ValueError(f"--algo {cfg['algo']} starts from a trained policy, not init_from=scratch: make one "
                         f"with `python train.py --algo {needs} --out_dir={out}` and pass --init_from={out}, "
                         f"or run `python ladder.py`")
    if init == "scratch":
        return
    maker = needs or os.path.basename(os.path.normpath(init))  # out/pretrain is made by --algo pretrain
    if maker in ALGOS:
        raise ValueError(f"--algo {cfg['algo']} starts from a trained model: --init_from={init} has no ckpt.pt; "
                         f"make it with `python train.py --algo {maker} --out_dir={init}`, or run `python ladder.py`")


def ladder_stage(root, algo, env):
    """The directory of a finished `python ladder.py` stage under root that trained `algo` on `env`
    (root/algo first, e.g. out/sft; else e.g. out/calc_sft for the calculator task), or None."""
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    for name in sorted(names, key=lambda name: name != algo):
        stage = os.path.join(root, name)
        if os.path.isfile(os.path.join(stage, "ladder.json")) and os.path.isfile(os.path.join(stage, "ckpt.pt")):
            cfg = json.load(open(os.path.join(stage, "config.json")))
            if cfg["algo"] == algo and cfg["env"] == env:
                return stage
    return None


def after_the_ladder(overrides):
    """The command line's defaults once `python ladder.py` has run (train() itself keeps the plain
    defaults): with no --init_from, an algorithm that starts from a trained policy (`starts_from`)
    starts from the ladder's checkpoint for its task, and with no --teacher one that distils
    (`teacher_from`) distils the ladder's stage of that algorithm; with no --out_dir, a run never
    writes over a ladder stage (out/dpo is the ladder's: the run goes to out/my_dpo).
    -> (overrides, a line saying what was chosen, or "")."""
    overrides, chosen = dict(overrides), []
    cfg = make_config(overrides)
    module, root = algo_module(cfg["algo"]), os.path.dirname(DEFAULTS["out_dir"])
    resuming = cfg["init_from"] == "resume"  # (its out_dir is chosen as the run's was)
    for key, algo, given in (("init_from", getattr(module, "starts_from", None), cfg["init_from"] != "scratch"),
                             ("teacher", getattr(module, "teacher_from", None), cfg.get("teacher"))):
        stage = algo and not given and not resuming and ladder_stage(root, algo, cfg["env"])
        if stage:
            overrides[key] = stage
            chosen.append(f"--{key}={stage} (the ladder's {os.path.basename(stage)} stage)")
    if "out_dir" not in overrides and os.path.isfile(os.path.join(cfg["out_dir"], "ladder.json")):
        overrides["out_dir"] = os.path.join(os.path.dirname(cfg["out_dir"]), "my_" + os.path.basename(cfg["out_dir"]))
        chosen.append(f"--out_dir={overrides['out_dir']} ({cfg['out_dir']} is a ladder stage)")
    return overrides, (f"{cfg['algo']}: " + ", ".join(chosen) + "; pass these keys to choose others") if chosen else ""


def load_resume(overrides):
    """init_from=resume: (the checkpoint, the overrides it implies): its saved config, changed only by
    what is given again on the command line. Otherwise (None, overrides)."""
    if overrides.get("init_from") != "resume":
        return None, overrides
    out_dir = overrides.get("out_dir", DEFAULTS["out_dir"]).format(algo=overrides.get("algo", DEFAULTS["algo"]))
    if not os.path.isfile(os.path.join(out_dir, "ckpt.pt")):
        raise FileNotFoundError(f"init_from=resume: no checkpoint at {os.path.join(out_dir, 'ckpt.pt')}")
    ckpt = read_checkpoint(out_dir)
    check_resumable(ckpt, out_dir)
    return ckpt, {**ckpt["config"], **{k: v for k, v in overrides.items() if k != "init_from"}}


def setup(overrides, ckpt, algo=None):
    """The run (config, device, tokenizer, environment, models) and its optimizer, seeded; the
    algorithm's setup done. The models an algorithm declares in `needs` are built here, once."""
    cfg = make_config(overrides)
    run = setup_device(cfg)
    run.cfg, run.algo, run.stats, run.train_tokens = cfg, algo or algo_module(cfg["algo"]), {}, 0
    with rank0_first():  # a download (tokenizer, dataset) by rank 0 alone; the others read its cache
        run.tok = make_tokenizer(cfg["tokenizer"])
        run.env = config_env(cfg)
    if run.master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
    torch.manual_seed(cfg["seed"])
    random.seed(cfg["seed"])
    np.random.seed(cfg["seed"])

    needs = run.algo.needs(cfg) if callable(getattr(run.algo, "needs", None)) else getattr(run.algo, "needs", ())
    with rank0_first():  # on resume too: the same construction, then the saved weights
        model = build_model(cfg, run.tok)
    run.reward_model = load_reward_model(run) if "reward_model" in needs else None  # frozen
    if hasattr(run.algo, "wrap_model"):
        model = run.algo.wrap_model(run, model)
    elif not isinstance(model, GPT):
        raise ValueError(f"--algo {cfg['algo']} trains a language model; init_from={cfg['init_from']!r} is not one")
    if cfg["lora_rank"]:
        apply_lora(model, cfg["lora_rank"], cfg["lora_alpha"], trainable=("head",))
    if ckpt is not None and not ckpt.get("sharded"):  # (sharded: loaded in resume)
        model.load_state_dict(ckpt["train_model"] or ckpt["model"])
    model.to(run.device)
    run.raw_model = model
    if run.fsdp:  # one training call per micro-batch, sharded (distributed.shard_model); no DDP
        if cfg["compile"]:
            raise ValueError("--fsdp with --compile is not supported yet: choose one")
        if run.lockstep and not getattr(run.algo, "sharded_rollouts", False):
            raise ValueError(f"--fsdp_rollouts=sharded is not supported for --algo {cfg['algo']} yet (its setup or "
                             f"scoring forwards differ in number between ranks): use gathered")
        run.model = shard_model(run, model)
        if cfg.get("share_prompt"):  # (grpo, dpo) every block runs twice in one forward
            keep_gathered_through_backward(run.model)
    else:  # the sampler's decode steps change shape every token, so only the training calls (run.model) compile
        trained = torch.compile(model) if cfg["compile"] else model
        run.model = DDP(trained, device_ids=[run.device] if run.device.startswith("cuda") else None) if run.ddp else trained
    torch.manual_seed(cfg["seed"] + run.rank)  # same init on every rank (above), own dropout masks (below)
    with gathered(run):  # --fsdp: setup's sampling and scoring on full weights (distributed.gathered)
        run.ref_model = load_reference(run) if "reference" in needs else None  # π_ref: init_from, frozen
        run.teacher = load_teacher(run) if "teacher" in needs else None
        run.algo.setup(run)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=cfg["learning_rate"], betas=(cfg["beta1"], cfg["beta2"]),
                                  fused=True)  # one kernel for all tensors (CUDA, and CPU: 3× faster there)
    return run, optimizer


def resume(run, optimizer, ckpt, metrics_path):
    """The iteration to start from: the checkpoint's, with the optimizer, RNG and algorithm state
    restored and metrics.jsonl cut back to it; or 0, with a fresh metrics.jsonl and config.json."""
    cfg = run.cfg
    if ckpt is None:
        if run.master:
            open(metrics_path, "w").close()
            with open(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            n_train, n_total = count_parameters(run.raw_model)
            print(f"{cfg['algo']}: {n_train:,} trainable of {n_total:,} parameters on {run.device}"
                  f" x{run.world_size}, out_dir={cfg['out_dir']}")
        return 0
    if ckpt.get("sharded"):  # --fsdp: the weights and AdamW state of every rank (checkpoints.save_sharded)
        load_sharded(run, optimizer, os.path.join(cfg["out_dir"], ckpt["sharded"]))
    else:
        optimizer.load_state_dict(ckpt["optimizer"])
    run.train_tokens = ckpt.get("train_tokens", 0)  # older checkpoints: uncounted
    restore_rng(run, ckpt["rng"], ckpt["iter"])
    if ckpt["algo_state"] is not None:
        run.algo.load_state_dict(run, ckpt["algo_state"])
    if run.master and os.path.exists(metrics_path):  # drop lines logged after the checkpoint
        rows = [line for line in open(metrics_path) if json.loads(line)["iter"] <= ckpt["iter"]]
        open(metrics_path, "w").writelines(rows)
    return ckpt["iter"]


def set_dropout(run, in_loss):
    """The one place that sets train/eval mode. Dropout is on only inside the loss, and there only
    for an algorithm that does not declare `loss_dropout = False` (on-policy RL: its loss must score
    the very function that sampled, or the ratio π_θ/π_old is off from the first step). Rollouts,
    scoring and evaluation always run with dropout off."""
    run.raw_model.train(in_loss and getattr(run.algo, "loss_dropout", True))


def next_step(run, steps, figures):
    """The next optimizer step's micro-batches from the algorithm's `batches`, or None when done. A
    generator is sent the previous step's figures (PPO's early stop on its KL)."""
    set_dropout(run, False)
    try:
        return steps.send(figures) if inspect.isgenerator(steps) else next(steps)
    except StopIteration:
        return None


def optimizer_step(run, optimizer, micro_batches):
    """Backward through every micro-batch (DDP syncs on the last), then the gradient rescaled to the
    loss summed over the global count, clipped, and applied. Returns (the step's figures summed over
    micro-batches and ranks, the gradient norm before clipping or None)."""
    cfg, params = run.cfg, [p for p in run.raw_model.parameters() if p.requires_grad]  # (the order the norm sums in)
    set_dropout(run, True)
    optimizer.zero_grad(set_to_none=True)
    local = {"micro_batches": 0.0}
    for m, batch in enumerate(micro_batches):
        last = m == len(micro_batches) - 1
        if run.fsdp:  # gradients reduce-scattered after the last micro-batch only
            set_gradient_sync(run.model, last)
        with run.model.no_sync() if isinstance(run.model, DDP) and not last else contextlib.nullcontext():
            with run.autocast:
                loss_sum, n, extra = run.algo.loss(run, run.model, batch)
            loss_sum.backward()
        if run.fsdp:  # (shared prompts keep the weights gathered through the backward: free them)
            set_gathered(run.model, False)
        local["micro_batches"] += 1
        # figures stay tensors until the step's end: on a GPU, float() here would wait for
        # the backward pass at every micro-batch instead of once per step
        for k, v in {"count": n, "loss": loss_sum, **extra}.items():
            local[k] = local.get(k, 0.0) + (v.detach() if torch.is_tensor(v) else v)
    step = all_reduce_sum(local, run)  # one all-reduce per step: the global count and figures
    # DDP averaged the per-rank sums over ranks; turn that into the sum over the global count,
    # then clip: one pass to measure the gradient and one to scale it (rescale and clip together)
    # (--fsdp: each rank's shards, DTensor's local tensors, scaled in place; the norm sums over ranks)
    grads = [p.grad.to_local() if run.fsdp else p.grad for p in params if p.grad is not None]
    scale = run.world_size / max(step["count"], 1e-8)
    grad_norm = None
    if cfg["grad_clip"] > 0:
        norm = torch.nn.utils.get_total_norm(grads)
        if run.fsdp:
            norm = norm ** 2
            dist.all_reduce(norm)
            norm = norm.sqrt()
        grad_norm = scale * norm  # the norm of the rescaled gradient
        scale = scale * (cfg["grad_clip"] / (grad_norm + 1e-6)).clamp(max=1.0)  # as clip_grad_norm_
    torch._foreach_mul_(grads, scale)
    optimizer.step()
    return step, grad_norm


def evaluate(run, it, metrics_path):
    """The algorithm's held-out figures at iteration `it` (dropout off), logged and plotted."""
    set_dropout(run, False)
    t0 = time.time()
    with gathered(run):  # --fsdp: ranks may hold different numbers of problems
        metrics = run.algo.evaluate(run, it)
    metrics["eval_time"] = time.time() - t0
    log(run, metrics_path, {"iter": it, **metrics})
    # a drawing costs about a second: a short run (a ladder stage) draws once, a long one every minute or so
    if run.master and run.cfg["plot"] and (it == run.cfg["max_iters"] or time.time() - run.plotted_at >= 60):
        plot_metrics(run.cfg["out_dir"])
        run.plotted_at = time.time()
    return metrics


def log(run, metrics_path, row):
    if run.master:
        with open(metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")


def train(overrides, algo=None):
    """Run one training job; returns the run (run.raw_model, run.metrics: the last evaluation).
    algo: an object with the algorithm interface to run in place of the --algo module (experiments/bench.py
    times the loop around sft's batches wrapped in its own)."""
    ckpt, overrides = load_resume(dict(overrides))
    run, optimizer = setup(overrides, ckpt, algo)
    cfg, metrics_path = run.cfg, os.path.join(run.cfg["out_dir"], "metrics.jsonl")
    start_iter = resume(run, optimizer, ckpt, metrics_path)
    run.plotted_at = time.time()  # (evaluate draws metrics.png a minute after this, and at the end)
    from tqdm import tqdm
    # in a terminal the bar redraws 10 times a second; into a file or a pipe (a log, the ladder) every
    # 30 s, so that a log holds a few lines per run rather than thousands of carriage returns
    bar = tqdm(range(start_iter, cfg["max_iters"]), initial=start_iter, total=cfg["max_iters"],
               disable=not run.master, dynamic_ncols=True, desc=cfg["algo"],
               mininterval=0.1 if sys.stderr.isatty() else 30)
    metrics = evaluate(run, 0, metrics_path) if start_iter == 0 and cfg["eval_interval"] > 0 and cfg["eval_at_start"] else {}
    for it in bar:
        t0 = time.time()
        lr = lr_at(cfg, it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        run.stats, sums, grad_norm = {}, {}, None  # sums: over steps, micro-batches, ranks
        set_dropout(run, False)
        with gathered(run):  # --fsdp: rollouts and scoring on full weights (distributed.gathered)
            steps = iter(run.algo.batches(run, it))  # RL: the rollouts happen here
            micro_batches = next_step(run, steps, None)  # (a generator's: at its first step)
        t_update = time.time()
        while micro_batches is not None:
            step, grad_norm = optimizer_step(run, optimizer, micro_batches)
            for k, v in step.items():
                sums[k] = sums.get(k, 0.0) + v
            run.train_tokens += step.get("tokens", 0.0)
            micro_batches = next_step(run, steps, as_means(step))
        run.stats["time_update"] = time.time() - t_update  # forward, backward and optimizer of the iteration
        if (it + 1) % cfg["log_interval"] == 0 or it + 1 == cfg["max_iters"]:
            row = {**as_means(sums), "iter": it + 1, "lr": lr, "iter_time": time.time() - t0,
                   "train_tokens": run.train_tokens, **run.stats}
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            log(run, metrics_path, row)
            bar.set_postfix(loss=f"{row['loss']:.4f}", refresh=False)  # shown at the next redraw
        at_eval = cfg["eval_interval"] > 0 and (it + 1) % cfg["eval_interval"] == 0
        if at_eval or (cfg["eval_interval"] > 0 and it + 1 == cfg["max_iters"]):
            metrics = evaluate(run, it + 1, metrics_path)
            if run.master:
                bar.write(f"iter {it + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        if cfg["checkpoint"] and (at_eval or it + 1 == cfg["max_iters"]):  # (every rank: its RNG streams)
            save_checkpoint(run, optimizer, it + 1)
    bar.close()
    if run.ddp:
        dist.barrier()
        dist.destroy_process_group()
    run.metrics = metrics
    return run


if __name__ == "__main__":
    first_process = int(os.environ.get("RANK", "0")) == 0  # under torchrun, one process speaks
    try:
        argv = [arg for arg in sys.argv[1:] if arg not in ("--help", "-h")]
        overrides = parse_args(argv)
        if len(argv) < len(sys.argv) - 1:
            print(help_text(make_config(overrides)["algo"]))
            sys.exit(0)
        overrides, chosen = after_the_ladder(overrides)
        if chosen and first_process:
            print(chosen, flush=True)
        check_start(overrides)
        train(overrides)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}" if first_process else 1)
    except ImportError as e:  # an optional package (transformers, ...) that is not installed
        sys.exit(f"error: {optional_dependency(e)}" if first_process else 1)
