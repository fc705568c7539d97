"""
The one entry point: the shared training loop.

    python train.py --algo sft                          # laptop CPU, built-in task, no downloads
    python train.py --algo dpo config/dpo.py --beta=0.2 # a config file, then overrides
    torchrun --standalone --nproc_per_node=8 train.py --algo grpo

Configuration is plain Python values (options.py): options.DEFAULTS plus the chosen algorithm
module's own `defaults`. `--key=value` overrides (parsed as a Python literal), a `config/x.py` file
is executed and its top-level names become overrides. An unknown key or a value of the wrong type is
an error; `--help` lists every option.

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

import contextlib
import inspect
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoints import (build_model, check_resumable, load_reference, load_reward_model, load_sharded, load_teacher,
                         read_checkpoint, restore_rng, save_checkpoint)
from data import config_env
from distributed import (all_reduce_sum, gathered, keep_gathered_through_backward, rank0_first, set_gathered,
                         set_gradient_sync, setup_device, shard_model)
from evaluation import plot_metrics
from model import GPT, apply_lora, count_parameters
from options import (DEFAULTS, after_the_ladder, algo_module, check_start, help_text, make_config, optional_dependency,
                     parse_args)
from tokenizer import make_tokenizer

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
            print(help_text(overrides))
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
