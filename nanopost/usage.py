"""
`python train.py --algo NAME --help`: every option the run can use, with the value it takes (the ladder's
stages included) and its whole description, read from the comment beside its key in the source.
"""

import ast
import importlib
import io
import os
import tokenize

from envs import WRITTEN
from nanopost import options
from nanopost.options import ACCUMULATES, DEFAULTS, MODEL_KEYS, READS_DATA, after_the_ladder, algo_module, available_algos, make_config


def config_comments(module, name):
    """{key: its description} for `name = dict(...)` in `module`'s source: the comment at the end of
    the key's line with the comment lines that continue it below (indented past the key), else the
    comment lines right above the key. Keys merged in from another module's dict
    (`dict(pairs.PAIR_DEFAULTS, ...)`, `**X.KEYS`, `name.update(X.KEYS)`, or KEYS imported by
    `from X import KEYS`) take that dict's comments."""
    source = open(module.__file__).read()
    comments = {}  # line -> (text, column of its '#', whether the comment stands alone on its line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string.lstrip("#").strip(), token.start[1],
                                        not token.line[:token.start[1]].strip())
    body = ast.parse(source).body
    call = next(node.value for node in body if isinstance(node, ast.Assign)
                and any(getattr(target, "id", None) == name for target in node.targets))
    updates = [node.value.args[0] for node in body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and ast.unparse(node.value.func) == f"{name}.update"]
    merged = call.args + [keyword.value for keyword in call.keywords if keyword.arg is None] + updates
    imported = {alias.asname or alias.name: node.module for node in body if isinstance(node, ast.ImportFrom)
                for alias in node.names}  # `from judge import JUDGE_KEYS`: JUDGE_KEYS's module
    found = {}
    for other in merged:
        if isinstance(other, ast.Attribute) and isinstance(other.value, ast.Name):
            found.update(config_comments(getattr(module, other.value.id), other.attr))
        elif isinstance(other, ast.Name) and other.id in imported:
            found.update(config_comments(importlib.import_module(imported[other.id]), other.id))
    for keyword in (keyword for keyword in call.keywords if keyword.arg):
        line = keyword.value.end_lineno
        text, _, alone = comments.get(line, ("", 0, True))
        if alone:  # no comment at the end of its line: the comment lines right above, at the key's indent
            above, line = [], keyword.lineno - 1
            while line in comments and comments[line][2] and comments[line][1] <= keyword.col_offset:
                above.insert(0, comments[line][0])
                line -= 1
            text = " ".join(above)
        else:  # the lines below that continue it: alone, and indented past the key (not a heading)
            line += 1
            while line in comments and comments[line][2] and comments[line][1] > keyword.col_offset:
                text += " " + comments[line][0]
                line += 1
        found[keyword.arg] = text
    return found


def help_text(overrides):
    """--help for the run the command line describes: the algorithm's own options first, then the
    shared ones, each with the value it takes (the ladder's stages included: after_the_ladder) and
    its whole description."""
    overrides, chosen = after_the_ladder(overrides)
    cfg = make_config(overrides)
    module = algo_module(cfg["algo"])
    # a shared key keeps its shared description where an algorithm changes its default
    described = {**config_comments(module, "defaults"), **config_comments(options, "DEFAULTS")}
    lines = [f"usage: python train.py --algo {cfg['algo']} [config/FILE.py ...] [--key=value ...]",
             "       (torchrun --standalone --nproc_per_node=N train.py ... on N processes)",
             f"--algo: {', '.join(available_algos())}; `python train.py --algo NAME --help` shows its options.",
             "A value is a Python literal (--learning_rate=3e-4, --lora_rank=8), else a string."]
    lines += [chosen] if chosen else []
    own = [k for k in module.defaults if k not in DEFAULTS]
    groups = [(f"--algo {cfg['algo']}'s own options ({module.__name__.replace('.', '/')}.py defaults)", own)]
    if hasattr(module, "base"):  # a variant of the lab: what it adds first, then its algorithm's options
        base = algo_module(module.base)
        described = {**config_comments(base, "defaults"), **described}
        changed = [k for k in own if k not in base.defaults or module.defaults[k] != base.defaults[k]]
        groups = [(f"--algo {cfg['algo']}'s own options (lab/{cfg['algo']}.py: what it adds to {module.base} "
                   f"or sets otherwise)", changed),
                  (f"{module.base}'s options ({base.__name__}.py defaults)", [k for k in own if k not in changed])]
    shared = [key for key in DEFAULTS if applies(key, cfg, module)]
    task = [key for key in shared if key in TASK_KEYS]
    groups += [("shared options (options.DEFAULTS; * = not the shared default: set by this algorithm, its task, "
               "the ladder or the command line)", [key for key in shared if key not in task]),
               (f"--env {cfg['env']}'s options (the task's, options.DEFAULTS)", task)]
    for title, keys in groups:
        lines += ["", title + ":"]
        needs = getattr(module, "starts_from", {})  # (a key the algorithm refuses at its default: required)
        for key in keys:
            mark = "*" if key in DEFAULTS and cfg[key] != DEFAULTS[key] and key != "out_dir" else " "
            value = "REQUIRED" if key in needs and cfg[key] == DEFAULTS.get(key) == "scratch" else repr(cfg[key])
            text = described.get(key, "") + (f" (required: a --algo {needs[key]} checkpoint, e.g. out/{needs[key]})"
                                             if value == "REQUIRED" else "")
            lines.append(f"  --{key}={value}{mark}".ljust(40) + " " + text)
    left = [key for key in DEFAULTS if key not in shared]
    if left:
        lines += ["", "not listed, as they cannot apply to this run (another start, task, algorithm or number of processes): "
                  + ", ".join(f"--{key}" for key in left)]
    return "\n".join(lines)


# the keys that shape the task (envs/) rather than the loop: --help lists those of --env's task apart
TASK_KEYS = ("env_digits", "env_ops", "env_direct_frac", "env_train_pool", "env_midstart_frac", "env_data", "max_tool_calls")


def applies(key, cfg, module):
    """Whether a shared key can change this run: a model's shape only for a model built from scratch,
    dropout only off-policy (on-policy RL scores with dropout off), --data and the share of bare
    demonstrations only for the algorithms that read demonstrations, a task's keys only for that task,
    the sharded rollouts only under --fsdp, --fsdp only under torchrun, lora_alpha only with LoRA,
    gradient accumulation only where an optimizer step is a number of micro-batches, the decay's length
    only where the learning rate decays (min_lr below it; RL's is constant after the warm-up)."""
    scratch = cfg["init_from"] == "scratch" and not getattr(module, "starts_from", {}).get("init_from")
    if key in MODEL_KEYS or key == "block_size":
        return scratch
    if key == "dropout":
        return not getattr(module, "on_policy", False)
    reads_demonstrations = cfg["algo"] in READS_DATA or getattr(module, "base", None) in READS_DATA
    if key in ("data", "skip_bad_rows"):
        return reads_demonstrations
    if key in ("env_digits", "env_ops"):
        return cfg["env"] in ("arithmetic", "calculator") or (cfg["env"] == "gsm8k" and cfg["env_data"] == WRITTEN)
    if key == "env_direct_frac":  # (the demonstrations: SFT's data and the preference pairs' gold answer)
        return cfg["env"] in ("arithmetic", "calculator", "generalpoints") and reads_demonstrations
    if key == "env_train_pool":
        return cfg["env"] == "arithmetic"
    if key == "env_data":
        return cfg["env"] == "gsm8k"
    if key == "env_midstart_frac":
        return cfg["env"] == "treasure" and "grpo" in (cfg["algo"], getattr(module, "base", None))
    if key == "max_tool_calls":
        return cfg["env"] in ("calculator", "treasure")
    if key == "fsdp_rollouts":
        return cfg["fsdp"]
    if key == "fsdp":
        return cfg["fsdp"] or int(os.environ.get("WORLD_SIZE", 1)) > 1
    if key == "lora_alpha":
        return cfg["lora_rank"] > 0
    if key == "lr_decay_iters":
        return cfg["min_lr"] < cfg["learning_rate"]
    if key == "gradient_accumulation_steps":
        return getattr(module, "base", cfg["algo"]) in ACCUMULATES
    return True
