"""
Configuration and the command line: DEFAULTS (the keys every algorithm shares) plus the chosen
algorithm module's own `defaults`, overridden by `--key=value` (a Python literal, else a string) and
`config/x.py` files (their top-level names). An unknown key or a value of the wrong type is an
error naming the closest valid keys; an old key name still works for one release and says its new
one (RENAMED). `python train.py --algo NAME --help` prints every option with its value and its
description, read from the comments beside the keys (usage.py). After `python ladder.py` the
command line's defaults start from the ladder's checkpoints (after_the_ladder). config_env builds the
environment a configuration names.
"""

import ast
import difflib
import importlib
import json
import math
import os
import sys

from nanopost.checkpoints import is_hf_checkpoint
from nanopost.run_dir import PREVIOUS
from envs import ENVS

DEFAULTS = dict(
    algo="sft",                 # the algorithm: pretrain, sft, rm, dpo, ppo, grpo, opd, rft, or a variant of the lab (lab/NAME.py)
    out_dir="out/{algo}",       # where the run writes; {algo} is filled in
    init_from="scratch",        # scratch | resume | a checkpoint dir | a transformers dir or hub name (GPT-2, Llama, Qwen2, Qwen3) | smollm2 or a .gguf file (docs/smollm2.md)
    tokenizer="byte",           # byte (built in) | gpt2 | a dir with GPT-2's vocab.json | a checkpoint's own (dir or hub name, with its chat template) | smollm2 or a .gguf file
    data="",                    # a json/jsonl/parquet file or hub dataset; "" = the built-in environment
    skip_bad_rows=False,        # malformed data rows: False = error naming file/row/field, True = skip and count
    # the default task: 3-step chains of 1-digit operands; half the SFT demonstrations give only the
    # answer, half the worked steps (envs/arithmetic.py, docs/task.md)
    env="arithmetic",           # the task: arithmetic | generalpoints | calculator | treasure | gsm8k (envs/)
    env_digits=1,               # digits of each operand
    env_ops=3,                  # operations per problem
    env_direct_frac=0.5,        # share of SFT demonstrations that give only the answer; 0.0 = every one worked
    env_train_pool=0,           # 0 = fresh train problems in every draw; N = the training split is N fixed problems (all algorithms)
    env_midstart_frac=0.0,      # --env=treasure under GRPO: the share of train maps whose play starts mid-map (envs/treasure.py)
    env_data="openai/gsm8k:main",  # --env=gsm8k's rows: a hub dataset NAME[:CONFIG], a local file, or "arithmetic" (nanopost/data.gsm8k_env)
    # the model, when init_from=scratch
    n_layer=4,                  # transformer blocks
    n_head=4,                   # attention heads per block
    n_embd=128,                 # width of the residual stream
    block_size=128,             # the longest sequence (prompt + response) in tokens
    dropout=0.0,                # dropout probability in training
    bias=True,                  # biases in the linear layers and layer norms (GPT-2 has them)
    # optimisation
    max_iters=1000,             # training iterations
    lr_decay_iters=0,           # iterations of the cosine decay; 0 = max_iters, recorded at the start (a resume to more iterations keeps it, then holds min_lr)
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
    keep_tokens=4,              # RL and DPO: iterations whose rollouts tokens.jsonl keeps token by token, spread over the run, for report.py; 0 = none
    plot=True,                  # redraw metrics.png at the last evaluation, and at others a minute or more after the last drawing
    seed=1337,                  # seeds torch, numpy and random (each DDP rank adds its rank for dropout)
    device="auto",              # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    compile=False,              # torch.compile the training forward and backward (sampling stays eager)
    fsdp=False,                 # torchrun: shard weights, gradients and AdamW state over the ranks (FSDP2), not DDP copies
    overwrite=False,            # a new run may replace a run already in out_dir (kept in out_dir/previous until the new run's first checkpoint); False = refuse (init_from=resume continues it)
    fsdp_rollouts="gathered",   # --fsdp: gathered = all-gather each model's full weights for sampling and scoring (fast, a full bf16 copy per GPU); sharded = forwards stay sharded, all ranks step together (models whose full weights do not fit one GPU)
)

READS_DATA = ("pretrain", "sft", "muon", "dft", "rm", "dpo", "ipo", "kto", "simpo", "orpo")  # the algorithms that train on --data (RL reads its env)
# the algorithms (and their variants) whose optimizer step is gradient_accumulation_steps micro-batches; GRPO's
# steps are its rollout batch's minibatches, OPD's one step of micro-batches of its iteration's answers
ACCUMULATES = ("pretrain", "sft", "rm", "dpo", "ppo", "rft")
# The textbook: --algo NAME -> the module that is the algorithm, plain. The lab: every variant is its own
# file lab/NAME.py, chosen by --algo NAME; it names the algorithm it changes (`base`) and imports it.
ALGOS = {"pretrain": "sft", "sft": "sft", "rm": "rm", "dpo": "dpo", "ppo": "ppo", "grpo": "grpo", "opd": "opd", "rft": "rft"}
LAB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lab")
# Options that became a variant of the lab: (key, value) -> the --algo that now is that choice. The old
# spelling still runs for one release (it switches --algo and says so); the plain value is dropped.
MOVED_TO_LAB = {
    ("loss", "dpo"): "dpo", ("loss", "ipo"): "ipo", ("loss", "kto"): "kto", ("loss", "simpo"): "simpo",  # dpo.py's family
    ("loss", "orpo"): "orpo", ("pairs", "online"): "online_dpo",
    # ppo: a reward model (RLHF) and the k3 estimator; k1 is plain PPO's own
    ("reward", "rm"): "ppo_rm", ("kl_estimator", "k3"): "ppo_k3", ("kl_estimator", "k1"): "ppo",
    # opd: the estimators, the teacher's own samples (off-policy), OPSD (the student as its own teacher)
    ("kl_estimator", "sampled"): "opd_sampled", ("kl_estimator", "topk"): "opd_topk",
    ("kl_estimator", "teacher_samples"): "opd_teacher_samples", ("kl_estimator", "full"): "opd",
    ("teacher", "self"): "opsd", ("privileged", "answer"): "opsd",
    # the reward modes grpo and ppo shared: a variant of each
    ("reward_mode", "outcome"): ("grpo", "ppo"), ("reward_mode", "process"): ("process_reward", "ppo_process"),
    ("reward_mode", "rlvp"): ("rlvp", "ppo_rlvp"),
    # the GRPO family (a value that names a textbook algorithm was its plain choice: dropped)
    ("estimator", "grpo"): "grpo", ("estimator", "rloo"): "rloo", ("estimator", "reinforce"): "reinforce",
    ("estimator", "dr_grpo"): "dr_grpo", ("loss_agg", "seq_mean_token_mean"): "grpo", ("loss_agg", "token_mean"): "dapo",
    ("loss_agg", "seq_mean_token_sum_norm"): "dr_grpo", ("policy_loss", "clip"): "grpo", ("policy_loss", "cispo"): "cispo",
    ("ratio_level", "token"): "grpo", ("ratio_level", "sequence"): "gspo", ("kl", "k3_loss"): "grpo",
    ("kl", "k1_reward"): "kl_reward", ("prompt_sampling", "uniform"): "grpo", ("prompt_sampling", "edge"): "edge_prompts",
    ("staleness", 0): "grpo", ("staleness", 1): "one_step_off", ("on_degenerate", "zeros"): "grpo",
    ("adv_scale", "auto"): "grpo",
    ("break_it", "none"): "grpo", ("reward", "judge"): "judge_reward",
}
# Old spellings that no variant is: one line saying what to run instead
GONE = {("kl", "off"): "--kl=off is now --kl_coef=0 (no KL term)",
        ("on_degenerate", "drop"): "--on_degenerate=drop is DAPO's dynamic sampling: --algo dapo",
        ("on_degenerate", "raise"): "--on_degenerate=raise is gone: the degenerate_groups monitor names them",
        **{("adv_scale", v): f"--adv_scale={v} is gone: --algo grpo divides by the group's std, rloo and dr_grpo by "
                             f"nothing" for v in ("group", "batch", "none")},
        **{("break_it", v): f"--break_it={v} is gone: python experiments/failures.py makes each failure by replacing "
                            f"the function it breaks" for v in ("fp8_sampler", "sampler_temperature", "top_p_uncorrected",
                                                                "retokenize", "prompt_format", "kl_twice", "nan_logprob",
                                                                "shifted_advantages", "all_equal", "length_bonus",
                                                                "format_exploit")}}

# The valid range of every numeric option, checked where the configuration is read (check_values):
# "[a, b]", "[a, b)", ">= a" or "> a", then why in parentheses where it is not plain. 0 stays valid where
# it means something (eval_interval=0: never; lora_rank=0: full fine-tuning; ...: the key's comment).
# Every float must also be finite. A new numeric option needs a line here (tests/test_errors.py).
SCORED = "> 0 (its samples are scored: a log-probability at temperature 0 is not defined)"
RANGES = dict(
    env_digits=">= 1", env_ops=">= 1", env_direct_frac="[0, 1]", env_train_pool=">= 0", env_midstart_frac="[0, 1]",
    n_layer=">= 1", n_head=">= 1", n_embd=">= 1", block_size=">= 1", dropout="[0, 1)",
    max_iters=">= 0", lr_decay_iters=">= 0", batch_size=">= 1", gradient_accumulation_steps=">= 1",
    learning_rate=">= 0", min_lr=">= 0", warmup_iters=">= 0", weight_decay=">= 0", beta1="[0, 1)",
    beta2="[0, 1)", grad_clip=">= 0", lora_rank=">= 0", lora_alpha="> 0",
    eval_interval=">= 0", eval_problems=">= 1", eval_batch_size=">= 1", log_interval=">= 1",
    eval_samples=">= 0", keep_tokens="[0, 100] (each is a line of tokens.jsonl, MBs on a large batch)", max_new_tokens=">= 1", max_tool_calls=">= 0", seed=">= 0",
    # the algorithms' own
    train_problems=">= 1", corpus_docs=">= 1", val_examples=">= 1", reader_frac="[0, 1]",  # sft
    muon_momentum="[0, 1)",  # its lab
    train_prompts=">= 1", heldout_prompts=">= 1", group_size=">= 1", pair_temperature=SCORED,  # pairs (rm, dpo)
    beta="> 0", simpo_beta="> 0", simpo_gamma=">= 0", orpo_lambda=">= 0", kto_desirable_weight=">= 0",
    kto_undesirable_weight=">= 0", online_every=">= 1", online_prompts=">= 1",  # dpo
    temperature=SCORED, prompt_pool=">= 1", minibatches=">= 1", clip_eps="[0, 1]",
    value_clip=">= 0", vf_coef=">= 0", gamma="[0, 1]", lam="[0, 1]", kl_coef=">= 0", kl_target="> 0",
    kl_adapt_rate=">= 0", early_stop_kl="> 0", rlvp_beta=">= 0", rlvp_penalty=">= 0", rlvp_bonus=">= 0",  # ppo
    prompts_per_iter=">= 1", rollout_prompts=">= 0", inner_epochs=">= 1", clip_eps_high=">= 0",  # grpo
    dynamic_sampling_rounds=">= 0", overlong_cache=">= 0", tis_cap=">= 0", edge_low="[0, 1]",  # its lab
    edge_high="[0, 1]", top_k=">= 0", top_p="(0, 1]", clip_cov="[0, 1)",
    top_entropy_quantile="(0, 1]", judge_samples=">= 0", judge_temperature="> 0 (greedy: judge_samples=0)",
    sapo_tau_pos="> 0", sapo_tau_neg="> 0", tv_delta="(0, 1]", partial_beta="[0, 1]",
    kl_topk=">= 1", anchor_coef=">= 0",  # opd
    rounds=">= 1", round_prompts=">= 1", per_prompt_cap=">= 1",  # rft
)
# The keys that shape a model built from scratch: a checkpoint or transformers start brings its own
# (a different value given for one cannot apply: train.setup says so), and config.json records its real shape
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "bias")
# The keys of built-in preference pairs, which --data replaces (pairs.PAIR_DEFAULTS)
BUILTIN_PAIR_KEYS = ("pairs", "train_prompts", "group_size", "pair_temperature")


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
RENAMED = dict(eval_pass_k="eval_samples", eval_best_of_n="eval_samples", best_of_n="eval_samples",
               # one name per idea: responses sampled per prompt in training, a pool of train prompts
               samples_per_prompt="group_size", candidates="group_size", prompts_pool="prompt_pool",
               ppo_epochs="inner_epochs",  # passes over a rollout batch: one name in ppo and grpo
               # GRPO's clip range is PPO's symmetric clip_eps; a variant's upper side (DAPO, CISPO) clip_eps_high
               eps_low="clip_eps", eps_high="clip_eps_high")
# Keys removed in this version: ignored, with a note saying why
REMOVED = dict(eval_best_of_n_problems="Best-of-N by the verifier is pass@k, on the eval_problems held-out problems "
                                       "that every sampled figure uses")
# The keys an old spelling uses (a command line with none of them has nothing to rename)
OLD_KEYS = {*RENAMED, *REMOVED, *(key for key, _ in MOVED_TO_LAB), *(key for key, _ in GONE)}


def renamed(overrides):
    """overrides with renamed keys under their new name and removed ones dropped, a note for each; an
    option that became a variant of the lab (MOVED_TO_LAB) switches --algo to it."""
    given = overrides.get("algo", DEFAULTS["algo"])
    out = {"algo": given} if "algo" in overrides else {}  # (first: a switch below replaces it, whatever the order)
    for key, value in overrides.items():
        spelling = (key, value) if isinstance(value, (str, int, float, bool)) else None
        if key == "algo":
            continue
        if spelling in GONE:
            raise ValueError(GONE[spelling])
        # (a spelling two algorithms shared names a variant of each; another algorithm's value is its own)
        moved = next((name for name in as_tuple(MOVED_TO_LAB.get(spelling)) if base_of(name) == base_of(given)), None)
        if moved is not None:
            if moved not in ALGOS:  # (a plain choice, e.g. --estimator=grpo, is dropped)
                out["algo"] = switched_algo(key, value, moved, given, out.get("algo", given))
        elif key in REMOVED:
            print(f"note: config key {key!r} is gone ({REMOVED[key]}); ignored")
        elif key in RENAMED:
            print(f"note: config key {key!r} is now {RENAMED[key]!r}")
            out[RENAMED[key]] = value
        else:
            out[key] = value
    return out


def as_tuple(names):
    """MOVED_TO_LAB's value as a tuple: one variant's name, or a variant of each algorithm that shared the key."""
    return names if isinstance(names, tuple) else () if names is None else (names,)


def switched_algo(key, value, moved, given, algo):
    """The --algo that runs once the old option key=value, now the variant `moved`, meets --algo
    `given` (`algo`: what earlier keys made of it): moved itself, said in a note; an error where two
    variants meet (no one file runs both)."""
    if moved == algo:
        return algo
    if algo != given or given not in ALGOS:
        raise ValueError(f"--{key}={value!r} (now --algo {moved}) and --algo {algo} are no one variant of the lab: "
                         f"each variant is one file; choose one --algo")
    print(f"note: --{key}={value!r} is now --algo {moved} (lab/{moved}.py); running that")
    return moved

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


def coerce(key, value, default):
    """Accept `value` for `key` only if it has the default's type (an int is fine for a float; a bool is
    not a number)."""
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, type(default)) or isinstance(value, bool) != isinstance(default, bool):
        raise ValueError(f"config key {key!r} expects {type(default).__name__}, got {value!r} ({type(value).__name__})")
    return value


def lab_variants():
    """The variants of the lab: the names of lab/*.py."""
    return sorted(f[:-3] for f in os.listdir(LAB) if f.endswith(".py") and f != "__init__.py") if os.path.isdir(LAB) else []


def available_algos():
    """The --algo names: the textbook's, then the lab's."""
    return sorted(ALGOS) + lab_variants()


def base_of(name):
    """The plain algorithm a variant of the lab changes; an algorithm's own name otherwise."""
    return getattr(algo_module(name), "base", name) if name in available_algos() else name


def variants_with(key, base):
    """The lab's variants of the algorithm `base` that take the option `key`."""
    return [name for name in lab_variants() if getattr(algo_module(name), "base", None) == base
            and key in algo_module(name).defaults]


def algo_module(name):
    """The module of --algo NAME: a textbook algorithm (ALGOS), or a variant of the lab (lab/NAME.py)."""
    if name in ALGOS:
        return importlib.import_module(ALGOS[name])
    choices = available_algos()
    if name not in choices:
        close = difflib.get_close_matches(name, choices, n=3)
        raise ValueError(f"unknown algo {name!r}; " + (f"did you mean {', '.join(close)}? " if close else "")
                         + f"choose from {', '.join(choices)}")
    return importlib.import_module(f"lab.{name}")


def config_env(cfg):
    """The environment a run's configuration names (the task its data, rewards and evaluation use);
    gsm8k is built from the rows of env_data rather than generated (options.make_config has checked the name)."""
    if cfg["env"] == "gsm8k":
        from nanopost.data import gsm8k_env  # (rows, not generated: only this task reads them)
        return gsm8k_env(cfg["env_data"], cfg["env_digits"], cfg["env_ops"])
    # each set only for its task (arithmetic's pool, the treasure hunt's mid-map starts); an old config.json has neither
    own = {key: cfg[f"env_{key}"] for key in ("train_pool", "midstart_frac") if cfg.get(f"env_{key}")}
    return ENVS[cfg["env"]](digits=cfg["env_digits"], n_ops=cfg["env_ops"], direct_frac=cfg["env_direct_frac"], **own)


def make_config(overrides):
    """DEFAULTS + the algorithm's defaults, overridden by `overrides` (dict), type-checked."""
    if OLD_KEYS.intersection(overrides):  # an old spelling: its new one, said
        overrides = renamed(overrides)
    algo = overrides.get("algo", DEFAULTS["algo"])
    module = algo_module(algo)
    defaults = {**DEFAULTS, **module.defaults}  # an algorithm may change a shared default (e.g. its lr), of its type
    env = overrides.get("env", defaults["env"])
    if env not in ENVS:
        raise ValueError(f"unknown env {env!r}; choose from {sorted(ENVS)}")
    # an environment may change common defaults too (the treasure hunt's long transcripts need a longer block_size)
    defaults.update(getattr(ENVS[env], "train_defaults", {}))
    cfg = dict(defaults)
    for key, value in overrides.items():
        if key not in defaults:
            raise unknown_key(key, algo, module, defaults)
        cfg[key] = coerce(key, value, defaults[key])
    cfg["out_dir"] = fill_out_dir(cfg["out_dir"], algo)
    if cfg["data"] and algo not in READS_DATA:  # never ignored silently
        raise ValueError(f"--algo {algo} takes its prompts from the environment, not --data: for a dataset's "
                         f"prompts and reference answers use --env=gsm8k --env_data=NAME_OR_FILE")
    if cfg["env_train_pool"] and cfg["env"] != "arithmetic":
        raise ValueError(f"--env_train_pool cannot apply to --env={cfg['env']}: it fixes the training problems of "
                         f"--env=arithmetic; drop the key")
    if cfg["env_midstart_frac"] and (cfg["env"] != "treasure" or "grpo" not in (algo, getattr(module, "base", None))):
        raise ValueError(f"--env_midstart_frac cannot apply to --env={cfg['env']} --algo {algo}: it starts treasure-hunt "
                         f"plays mid-map in the rollouts of GRPO and its variants (--env=treasure); drop the key")
    if cfg["gradient_accumulation_steps"] != 1 and getattr(module, "base", algo) not in ACCUMULATES:
        raise ValueError(f"--gradient_accumulation_steps cannot apply to --algo {algo}: its optimizer steps are set by "
                         f"its own options (--help); drop the key")
    check_values(cfg, defaults)
    return cfg


def unknown_key(key, algo, module, defaults):
    """The error for a key --algo ALGO does not take: the variants of the lab that take it, else the
    closest keys (a name from another trainer first: ALIASES)."""
    homes = variants_with(key, getattr(module, "base", algo))  # an option that became a variant's
    close = [ALIASES[key]] if ALIASES.get(key) in defaults else []
    close += [k for k in difflib.get_close_matches(key, defaults, n=3) if k not in close]
    return ValueError(f"unknown config key {key!r} for --algo {algo}" + (
        f"; it is an option of {' or '.join(f'--algo {v} (lab/{v}.py)' for v in homes)}" if homes else
        f"; did you mean {', '.join(close)}?" if close else ""))


def fill_out_dir(out_dir, algo):
    """out_dir with {algo} filled in; any other brace is an error (not a KeyError from str.format)."""
    try:
        return out_dir.format(algo=algo)
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"--out_dir={out_dir!r}: a brace may only be part of {{algo}} (the algorithm's name); "
                         f"write {{{{ or }}}} for a brace itself") from None


def in_range(value, spec):
    """Whether value lies in a RANGES spec: "[a, b]", "[a, b)", ">= a" or "> a" (what follows " (" explains)."""
    rule = spec.split(" (")[0]
    if rule.startswith(("[", "(")):
        low, high = (float(x) for x in rule[1:-1].split(","))
        return (low <= value if rule[0] == "[" else low < value) and (value <= high if rule.endswith("]") else value < high)
    op, bound = rule.split()
    return value >= float(bound) if op == ">=" else value > float(bound)


def check_values(cfg, defaults):
    """Every numeric option finite and in its range (RANGES), and the combinations that cannot work,
    each a one-line error naming the option, its value and what it must be. Here, where the
    configuration is read, so that nothing (no NaN checkpoint, no ZeroDivisionError mid-run) comes of it."""
    for key, value in cfg.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{key}={value!r} is out of range: it must be finite")
        if key in RANGES and not in_range(value, RANGES[key]):
            where = "lie in " if RANGES[key].startswith(("[", "(")) else "be "
            raise ValueError(f"--{key}={value!r} is out of range: it must {where}{RANGES[key]}")
    if cfg["min_lr"] > cfg["learning_rate"]:
        raise ValueError(f"--min_lr={cfg['min_lr']!r} is out of range: it must be <= learning_rate="
                         f"{cfg['learning_rate']!r} (the cosine decays from the one to the other): pass "
                         f"--min_lr={cfg['learning_rate'] / 10:g}, say")
    if cfg["init_from"] == "scratch" and cfg["n_embd"] % cfg["n_head"]:
        heads = [h for h in range(1, 33) if cfg["n_embd"] % h == 0]
        raise ValueError(f"--n_head={cfg['n_head']} does not divide n_embd={cfg['n_embd']} (each head takes "
                         f"n_embd / n_head dimensions): choose n_head from {', '.join(map(str, heads))}")
    builtin = [key for key in BUILTIN_PAIR_KEYS if key in cfg and cfg[key] != defaults[key]]
    if cfg["data"] and builtin:  # never ignored silently
        raise ValueError(f"--{builtin[0]}={cfg[builtin[0]]!r} cannot apply with --data={cfg['data']}: it shapes the "
                         f"built-in preference pairs, which the file's rows replace; drop it")


def check_model_keys(given, shape, start, keys=MODEL_KEYS):
    """Model-size keys given for a model whose shape comes from elsewhere (a checkpoint, transformers
    weights, the run resumed): an error unless they agree with it (never silently dropped)."""
    for key in keys:
        if key in given and given[key] != shape[key]:
            raise ValueError(f"--{key}={given[key]!r} cannot apply: {start} has {key}={shape[key]!r} (a model's "
                             f"shape comes from where it starts); drop the key, or start from init_from=scratch")


def check_out_dir(cfg):
    """A new run never writes over another by accident: an out_dir that holds a run (its ckpt.pt) is
    refused unless overwrite=True (init_from=resume continues it), and so is an out_dir that is the
    directory of a model the run reads (init_from, teacher, reward_model, judge)."""
    out = cfg["out_dir"]
    for key in ("init_from", "teacher", "reward_model", "judge"):
        if cfg.get(key) and os.path.exists(cfg[key]) and os.path.realpath(cfg[key]) == os.path.realpath(out):
            raise ValueError(f"--out_dir={out} is also --{key}: the run would write over the model it reads; "
                             f"choose another --out_dir")
    if os.path.isfile(os.path.join(out, "ckpt.pt")) and not cfg["overwrite"]:
        raise ValueError(f"--out_dir={out} holds a run (its ckpt.pt): pass --init_from=resume to continue it, "
                         f"--overwrite=True to replace it, or choose another --out_dir")
    if os.path.isfile(os.path.join(out, PREVIOUS, "ckpt.pt")) and not cfg["overwrite"]:
        raise ValueError(f"--out_dir={out} holds a run in {os.path.join(out, PREVIOUS)} (set aside by an --overwrite run killed "
                         f"before its first checkpoint): move it back to keep it, --overwrite=True to replace it")


def parse_args(argv):
    """`--key=value` (a Python literal, else a string), `--algo name`, and config files `x.py`."""
    overrides, args = {}, iter(argv)
    for arg in args:
        if arg.endswith(".py") and not arg.startswith("--"):
            overrides.update(read_config_file(arg))
            continue
        if not arg.startswith("--"):
            raise ValueError(f"cannot parse argument {arg!r}: use --key=value or a config file ending in .py")
        key, is_pair, raw = arg[2:].partition("=")
        raw = raw if is_pair else next(args, None)
        if raw is None:
            raise ValueError(f"argument {arg!r} has no value: use --key=value")
        try:
            overrides[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            overrides[key] = raw
    return overrides


def read_config_file(path):
    """The top-level names of a config file (Python: `name = value` lines); its errors name the file."""
    scope = {}
    with open(path) as f:
        source = f.read()
    try:
        exec(compile(source, path, "exec"), scope)
    except SyntaxError as e:
        raise ValueError(f"{path}, line {e.lineno}: {e.msg}: a config file is Python (name = value lines): "
                         f"fix that line") from None
    except Exception as e:  # it runs as Python: whatever it raised, named with the file
        raise ValueError(f"{path}: {type(e).__name__}: {e}: fix the file") from None
    return {k: v for k, v in scope.items() if not k.startswith("_") and not callable(v) and not isinstance(v, type(sys))}


def check_start(overrides):
    """A missing input checkpoint is a one-line error naming the command that makes it: an algorithm
    whose `starts_from` names an init_from (the algo whose checkpoint it usually starts from) never
    starts from a random model, and --init_from=DIR needs DIR/ckpt.pt. Checked for the command line
    only: the tests call train() on purpose with tiny random models for every algorithm. Returns the
    line that says a run starts from a random model (init_from=scratch), else None."""
    if overrides.get("init_from") == "resume":
        return
    cfg = make_config(overrides)
    init, needs = cfg["init_from"], getattr(algo_module(cfg["algo"]), "starts_from", {}).get("init_from")
    if os.path.isfile(os.path.join(init, "ckpt.pt")) or (  # a checkpoint, or transformers weights
            is_hf_checkpoint(init) and os.path.basename(os.path.normpath(init)) not in ALGOS):
        return
    return start_without_checkpoint(cfg, needs)


def start_without_checkpoint(cfg, needs):
    """check_start where init_from names no checkpoint: scratch (said, or refused where the algorithm
    `needs` a trained start), or a directory a command of this project would make."""
    init = cfg["init_from"]
    if init == "scratch" and needs:
        out = DEFAULTS["out_dir"].format(algo=needs)
        raise ValueError(f"--algo {cfg['algo']} starts from a trained policy, not init_from=scratch: make one "
                         f"with `python train.py --algo {needs} --out_dir={out}` and pass --init_from={out}, "
                         f"or run `python ladder.py`")
    if init == "scratch":
        return (f"{cfg['algo']}: starting from scratch (a randomly initialised {cfg['n_layer']}-layer model); "
                f"pass --init_from=DIR to start from a checkpoint")
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
            try:
                cfg = json.load(open(os.path.join(stage, "config.json")))
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.path.join(stage, 'config.json')}: line {e.lineno}: invalid JSON ({e.msg}): "
                                 f"restore it (train.py wrote it), or delete {stage}") from None
            if cfg["algo"] == algo and cfg["env"] == env:
                return stage
    return None


def after_the_ladder(overrides):
    """The command line's defaults once `python ladder.py` has run (train() itself keeps the plain
    defaults): each key of the algorithm's `starts_from` left at its default takes the ladder's
    stage of the algo it names for the task (--init_from: the SFT checkpoint; OPD's --teacher: the
    GRPO stage); with no --out_dir, a run never writes over a ladder stage (out/dpo is the ladder's:
    the run goes to out/my_dpo). -> (overrides, a line saying what was chosen, or "")."""
    overrides, chosen = dict(overrides), []
    cfg = make_config(overrides)
    module, root = algo_module(cfg["algo"]), os.path.dirname(DEFAULTS["out_dir"])
    resuming = cfg["init_from"] == "resume"  # (its out_dir is chosen as the run's was)
    for key, algo in getattr(module, "starts_from", {}).items():
        given = cfg[key] != {**DEFAULTS, **module.defaults}[key]
        stage = not given and not resuming and ladder_stage(root, algo, cfg["env"])
        if stage:
            overrides[key] = stage
            chosen.append(f"--{key}={stage} (the ladder's {os.path.basename(stage)} stage)")
    if "out_dir" not in overrides and os.path.isfile(os.path.join(cfg["out_dir"], "ladder.json")):
        overrides["out_dir"] = os.path.join(os.path.dirname(cfg["out_dir"]), "my_" + os.path.basename(cfg["out_dir"]))
        chosen.append(f"--out_dir={overrides['out_dir']} ({cfg['out_dir']} is a ladder stage)")
    return overrides, (f"{cfg['algo']}: " + ", ".join(chosen) + "; pass these keys to choose others") if chosen else ""
