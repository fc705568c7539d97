"""
The one entry point: the shared training loop.

    python train.py --algo sft                          # laptop CPU, built-in task, no downloads
    python train.py --algo dpo config/dpo.py --beta=0.2 # a config file, then overrides
    torchrun --standalone --nproc_per_node=8 train.py --algo grpo

Configuration is plain Python values (options.py): options.DEFAULTS plus the chosen algorithm
module's own `defaults`, overridden by `--key=value` (a Python literal) and `config/x.py` files;
`--help` lists every option. The helpers every script shares live in modules named for what they
hold (nanopost/: distributed, data, checkpoints, rollouts, evaluation, rewards, passports, monitors), which
never import this file or an algorithm.

The contract: an algorithm module (options.ALGOS) supplies plain values and functions.
    defaults                         its own config keys (it may change shared defaults, e.g. the lr)
    starts_from                      optional {key: --algo}: the ladder stage a key defaults to, e.g.
                                       {"init_from": "sft"}; init_from=scratch is then an error naming its maker
    on_policy                        optional True: its loss scores the very function that sampled (dropout
                                       stays off in the loss) and every rank makes the same sampler and scoring
                                       calls (so --fsdp_rollouts=sharded can run it)
    wrap_model(run, model)           optional: the model it trains, made from the loaded one (a scalar head)
    make_optimizer(run, model)       optional: its optimizer of the model's trainable weights (lab/muon.py), in
                                       place of AdamW; the loop sets every group's lr, and its state_dict is
                                       the checkpoint's
    setup(run, saved) -> state       its checks, data and frozen models; `saved` is what state_dict gave the
                                       checkpoint a run resumes from, else None
    batches(run, state, it)          -> (steps, figures): optimizer steps, each a list of micro-batches, and
                                       the iteration's figures for the log (rewards, lengths, ...)
    loss(run, state, model, batch)   -> (loss_sum, count, metrics): the loop divides the sum by the count
                                       summed over micro-batches and ranks; `model` is the DDP-wrapped module,
                                       called once per micro-batch; metrics["tokens"] is summed, not averaged
    stop_early(run, state, step, figures)  optional, after each optimizer step with its figures (means over
                                       micro-batches and ranks) and the iteration's (to add to): True skips
                                       the iteration's other steps (PPO's stop on its KL)
    evaluate(run, state, it)         -> held-out figures (every rank calls it, dropout off)
    state_dict(run, state)           optional: what of `state` a checkpoint keeps (setup's `saved`)

`run` is what the loop made: run.cfg, run.tok, run.env, run.raw_model (the model) and run.model (what
the loss calls: DDP, FSDP2 or compiled), run.algo, and the device and ranks (distributed.setup_device).
The loop owns them, gradient accumulation, loss normalisation, AdamW (or make_optimizer's) with warmup + cosine, clipping,
train/eval mode (set_dropout), evaluation, metrics.jsonl and its monitors (monitors.flag), plots,
atomic checksummed checkpoints that resume exactly, out_dir's lock and --overwrite's earlier run
(run_dir), and Ctrl-C, which saves at the next step boundary. train() at the bottom is the loop;
setup, resume and the optimizer step are above it.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import shlex
import signal
import sys
import threading
import time

# OpenMP's waiting threads sleep instead of spinning: beside any other process a spinning run on two
# cores slows 3x or more (docs/benchmarks.md, "Beside other work"). Set before torch loads OpenMP;
# OMP_WAIT_POLICY=ACTIVE brings the spinning back, faster for SFT on idle cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from nanopost.checkpoints import build_model, check_resumable, load_sharded, restore_rng, save_checkpoint
from nanopost.options import config_env
from nanopost.distributed import (all_reduce_sum, gathered, keep_gathered_through_backward, rank0_first, set_gathered,
                         set_gradient_sync, setup_device, shard_model)
from nanopost.evaluation import plot_metrics, read_metrics
from model import GPT, apply_lora, count_parameters
from nanopost.monitors import flag, start_monitors
from nanopost.options import (MODEL_KEYS, after_the_ladder, algo_module, check_model_keys, check_out_dir, check_start,
                              make_config, optional_dependency, parse_args)
from nanopost.resume import resumed
from nanopost.run_dir import leave, set_aside, take_lock, write_out
from nanopost.tokenizer import make_tokenizer
from nanopost.usage import help_text


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


def setup(overrides, ckpt, algo=None):
    """The run (config, device, tokenizer, environment, the model it trains), seeded; its optimizer;
    and the algorithm's state (its setup, given the checkpoint's saved state when resuming)."""
    cfg = make_config(overrides)
    if ckpt is None:  # (a resumed run writes into its own out_dir)
        check_out_dir(cfg)
        # the schedule's length, recorded: a resume to more iterations keeps it (then holds min_lr)
        cfg["lr_decay_iters"] = cfg["lr_decay_iters"] or cfg["max_iters"]
    run = setup_device(cfg)
    if ckpt is not None:
        check_resumable(ckpt, cfg["out_dir"], run)
    run.cfg, run.algo = cfg, algo or algo_module(cfg["algo"])
    # the frozen models' fingerprints (reference, teacher, reward model: checkpoints.fingerprint), kept in
    # the checkpoint; a resumed run checks its own against those it started with
    run.frozen, run.started_with = {}, ckpt.get("frozen") if ckpt is not None else None
    run.held = []  # files setup writes (passport.md, samples.txt) wait here until it has succeeded
    with rank0_first():  # a download (tokenizer, dataset) by rank 0 alone; the others read its cache
        run.tok = make_tokenizer(cfg["tokenizer"])
        run.env = config_env(cfg)
    torch.manual_seed(cfg["seed"])
    random.seed(cfg["seed"])
    np.random.seed(cfg["seed"])

    with rank0_first():  # on resume too: the same construction, then the saved weights
        model = build_model(cfg, run.tok)
    if ckpt is None and cfg["init_from"] != "scratch":  # a checkpoint or transformers start brings its shape
        check_model_keys(overrides, dataclasses.asdict(model.config), f"init_from={cfg['init_from']}")
        if cfg["block_size"] > model.config.block_size:  # (shorter sequences than its positions: fine)
            fit_block_size(run, overrides, model.config.block_size)
    cfg.update({key: getattr(model.config, key) for key in MODEL_KEYS})  # config.json: what actually runs
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
        run.model = shard_for_training(run, model)
    else:  # the sampler's decode steps change shape every token, so only the training calls (run.model) compile
        trained = torch.compile(model) if cfg["compile"] else model
        run.model = DDP(trained, device_ids=[run.device] if run.device.startswith("cuda") else None) if run.ddp else trained
    torch.manual_seed(cfg["seed"] + run.rank)  # same init on every rank (above), own dropout masks (below)
    with gathered(run):  # --fsdp: setup's sampling and scoring on full weights (distributed.gathered)
        state = run.algo.setup(run, ckpt["algo_state"] if ckpt is not None else None)

    if hasattr(run.algo, "make_optimizer"):  # (lab/muon.py: Muon for the blocks' matrices)
        return run, run.algo.make_optimizer(run, model), state
    params = [p for p in model.parameters() if p.requires_grad]  # AdamW, fused: one kernel for all tensors (CPU: 3× faster)
    return run, torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=cfg["learning_rate"], betas=(cfg["beta1"], cfg["beta2"]), fused=True), state


def shard_for_training(run, model):
    """--fsdp: the model the loss calls, sharded (distributed.shard_model), where the run allows it."""
    cfg = run.cfg
    if cfg["compile"]:
        raise ValueError("--fsdp with --compile is not supported yet: choose one")
    if run.lockstep and not getattr(run.algo, "on_policy", False):
        raise ValueError(f"--fsdp_rollouts=sharded is not supported for --algo {cfg['algo']} yet (its setup or "
                         f"scoring forwards differ in number between ranks): use gathered")
    sharded = shard_model(run, model)
    if cfg.get("share_prompt"):  # (grpo, dpo) every block runs twice in one forward
        keep_gathered_through_backward(sharded)
    return sharded


def fit_block_size(run, overrides, positions):
    """A block_size longer than the positions of the model a run starts from: asked for, an error; the
    default, it yields to them, said."""
    cfg = run.cfg
    if cfg["block_size"] != make_config({k: overrides[k] for k in ("algo", "env") if k in overrides})["block_size"]:
        raise ValueError(f"--block_size={cfg['block_size']} cannot apply: init_from={cfg['init_from']} has "
                         f"{positions} positions; pass at most that, or drop the key")
    if run.master:
        print(f"note: block_size={cfg['block_size']} -> {positions}, the positions of init_from={cfg['init_from']}")
    cfg["block_size"] = positions


def open_out_dir(run, ckpt, metrics_path):
    """The run's first writes into out_dir, once setup has succeeded (a setup that failed has left it as
    it was): rank 0 takes its lock (run_dir.take_lock: one writer per run directory); a new run starts a
    fresh metrics.jsonl and config.json and says what it trains; then the files setup held back."""
    cfg = run.cfg
    held, run.held = run.held, None  # (what setup wrote: run_dir.write_out)
    if run.master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        run.locked = take_lock(cfg["out_dir"])
        if ckpt is None and os.path.isfile(os.path.join(cfg["out_dir"], "ckpt.pt")):  # --overwrite=True
            set_aside(cfg["out_dir"])  # until this run's first checkpoint (run_dir.PREVIOUS)
        if ckpt is None:
            open(metrics_path, "w").close()
            with open(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
    for name, text, mode in held:
        write_out(run, name, text, mode)
    if ckpt is None and run.master:
        n_train, n_total = count_parameters(run.raw_model)
        print(f"{cfg['algo']}: {n_train:,} trainable of {n_total:,} parameters on {run.device}"
              f" x{run.world_size}, out_dir={cfg['out_dir']}")


def resume(run, optimizer, ckpt, metrics_path):
    """init_from=resume: the optimizer and every rank's RNG restored, metrics.jsonl cut back to the
    checkpoint. Returns (the iteration to start from, the tokens trained so far)."""
    if ckpt.get("sharded"):  # --fsdp: the weights and AdamW state of every rank (checkpoints.save_sharded)
        load_sharded(run, optimizer, os.path.join(run.cfg["out_dir"], ckpt["sharded"]))
    else:
        optimizer.load_state_dict(ckpt["optimizer"])
    restore_rng(run, ckpt["rng"], ckpt["iter"])
    if run.master and os.path.exists(metrics_path):  # drop lines logged after the checkpoint
        rows, torn = read_metrics(metrics_path)
        if torn:
            print(f"note: {metrics_path}: its last line was cut off mid-write (a killed run); dropped")
        with open(metrics_path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows if row["iter"] <= ckpt["iter"])
    return ckpt["iter"], ckpt.get("train_tokens", 0)  # (older checkpoints: uncounted)


def set_dropout(run, in_loss):
    """The one place that sets train/eval mode. Dropout is on only inside the loss, and there only
    for an algorithm that is not `on_policy` (on-policy RL: its loss must score the very function
    that sampled, or the ratio π_θ/π_old is off from the first step). Rollouts, scoring and
    evaluation always run with dropout off."""
    run.raw_model.train(in_loss and not getattr(run.algo, "on_policy", False))


def optimizer_step(run, state, optimizer, micro_batches, it):
    """Backward through every micro-batch (DDP syncs on the last), then the gradient rescaled to the
    loss summed over the global count, clipped, and applied, unless the loss or the gradient norm is
    not finite (an error: nothing is applied or saved). Returns (the step's figures summed over
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
                loss_sum, n, extra = run.algo.loss(run, state, run.model, batch)
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
    for name, value in (("loss", step["loss"] / max(step["count"], 1e-8)), ("gradient norm", grad_norm)):
        if value is not None and not math.isfinite(value):  # (the same on every rank: both are reduced)
            raise not_finite(it, f"the {name} is {float(value)}, so the step was not applied")
    torch._foreach_mul_(grads, scale)
    optimizer.step()
    return step, grad_norm


def not_finite(it, what):
    """The error that stops a run at a non-finite loss, gradient norm or weight: no checkpoint comes of it."""
    return ValueError(f"iteration {it + 1}: {what}: training stopped, and no checkpoint was written from it "
                      f"(out_dir keeps its last good one, or the run --overwrite was to replace); lower "
                      f"--learning_rate, or look for what overflowed")


def check_weights(run, it):
    """Before an evaluation or a checkpoint: every weight finite (an update with a finite gradient can
    still overflow at a huge learning rate). One pass over the weights, at those iterations only."""
    bad = sum(float(not torch.isfinite(p.to_local() if run.fsdp else p).all()) for p in run.raw_model.parameters())
    if all_reduce_sum([bad], run)[0]:
        raise not_finite(it, "the weights are no longer finite after this step")


def evaluate(run, state, it, metrics_path, drawn_at):
    """The algorithm's held-out figures at iteration `it` (dropout off), logged; metrics.png redrawn
    at the last evaluation, and at others a minute or more after the last drawing (drawn_at: when).
    Returns (the figures, when metrics.png was last drawn)."""
    set_dropout(run, False)
    t0 = time.time()
    with gathered(run):  # --fsdp: ranks may hold different numbers of problems
        metrics = run.algo.evaluate(run, state, it)
    metrics["eval_time"] = time.time() - t0
    log(run, metrics_path, {"iter": it, **metrics})
    # a drawing costs about a second: a short run (a ladder stage) draws once, a long one every minute or so
    if run.master and run.cfg["plot"] and (it == run.cfg["max_iters"] or time.time() - drawn_at >= 60):
        plot_metrics(run.cfg["out_dir"])
        drawn_at = time.time()
    return metrics, drawn_at


def log(run, metrics_path, row):
    """One row of metrics.jsonl (rank 0), flagged by the monitors: an alarm's first firing is printed."""
    if run.master:
        row = flag(run.monitors, row)
        with open(metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")


def progress_bar(run, start_iter):
    """In a terminal the bar redraws 10 times a second; into a file or a pipe (a log, the ladder) every
    30 s, so that a log holds a few lines per run rather than thousands of carriage returns."""
    from tqdm import tqdm
    return tqdm(range(start_iter, run.cfg["max_iters"]), initial=start_iter, total=run.cfg["max_iters"],
                disable=not run.master, dynamic_ncols=True, desc=run.cfg["algo"],
                mininterval=0.1 if sys.stderr.isatty() else 30)


class Stopped(Exception):
    """A run stopped by Ctrl-C (SIGINT) or SIGTERM at a step boundary; the text says what was saved."""


def stopped(cfg, asked, it, saved):
    """The Stopped a signal ends the loop with after iteration `it`: what was saved, the command that resumes."""
    out = shlex.quote(cfg["out_dir"])
    return Stopped(f"{asked[0] if asked else 'a signal'} at iteration {it}: " + (
        f"saved {out}/ckpt.pt; resume with: python train.py --init_from=resume --out_dir={out}"
        if saved else "nothing saved (--checkpoint=False)"))


def ask_to_stop(asked, signum, frame):
    """running's signal handler: note the signal, and give it back its default, so a second one acts at once."""
    signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    asked.append(signal.Signals(signum).name)
    print(f"\n{asked[-1]}: stopping after this step, to save (Ctrl-C again: at once)", file=sys.stderr)


@contextlib.contextmanager
def running(run):
    """While the loop runs, a first Ctrl-C (SIGINT) or SIGTERM asks it to stop at the next step boundary
    (ask_to_stop; main thread only). On the way out rank 0 settles the run --overwrite set aside (back
    unless this run has a checkpoint or finished with --checkpoint=False) and releases the lock (run_dir.leave)."""
    asked, main, finished = [], threading.current_thread() is threading.main_thread(), False
    before = {s: signal.signal(s, functools.partial(ask_to_stop, asked)) for s in (signal.SIGINT, signal.SIGTERM) if main}
    try:
        yield asked
        finished = True
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if getattr(run, "locked", False):
            leave(run.cfg["out_dir"], keep_new=finished and not run.cfg["checkpoint"])


def train(overrides, algo=None):
    """Run one training job. Returns the run, with run.state (what the algorithm's setup made) and
    run.metrics (the last evaluation). algo: an object with the algorithm interface to run in place
    of the --algo module (experiments/bench.py times the loop around sft's batches wrapped in its own)."""
    overrides = dict(overrides)  # init_from=resume: the checkpoint, and the overrides it implies (resume.resumed)
    ckpt, overrides = resumed(overrides) if overrides.get("init_from") == "resume" else (None, overrides)
    run, optimizer, state = setup(overrides, ckpt, algo)
    cfg, metrics_path = run.cfg, os.path.join(run.cfg["out_dir"], "metrics.jsonl")
    with running(run) as asked:
        open_out_dir(run, ckpt, metrics_path)
        start_iter, train_tokens = (0, 0) if ckpt is None else resume(run, optimizer, ckpt, metrics_path)
        run.monitors = start_monitors(run, metrics_path) if run.master else None  # (monitors.ALARMS) on every logged row
        stop_early, state_dict = getattr(run.algo, "stop_early", None), getattr(run.algo, "state_dict", None)
        evaluating, bar, metrics, drawn_at = cfg["eval_interval"] > 0, progress_bar(run, start_iter), {}, time.time()
        if start_iter == 0 and evaluating and cfg["eval_at_start"]:
            metrics, drawn_at = evaluate(run, state, 0, metrics_path, drawn_at)
        for it in bar:
            t0, lr = time.time(), lr_at(cfg, it)
            for group in optimizer.param_groups:
                group["lr"] = lr
            set_dropout(run, False)
            with gathered(run):  # --fsdp: rollouts and scoring on full weights (distributed.gathered)
                steps, figures = run.algo.batches(run, state, it)  # RL: the rollouts happen here
            t_update, sums, grad_norm = time.time(), {}, None  # sums: over steps, micro-batches and ranks
            for micro_batches in steps:
                try:
                    step, grad_norm = optimizer_step(run, state, optimizer, micro_batches, it)
                except ValueError:  # a non-finite loss or gradient: the iteration's figures first, so its monitors name the cause
                    log(run, metrics_path, {"iter": it + 1, "lr": lr, "loss": float("nan"), **figures})
                    raise
                for k, v in step.items():
                    sums[k] = sums.get(k, 0.0) + v
                train_tokens += step.get("tokens", 0.0)
                if stop_early and stop_early(run, state, as_means(step), figures):  # (PPO's early stop on its KL)
                    break
            figures["time_update"] = time.time() - t_update  # forward, backward and optimizer of the iteration
            if (it + 1) % cfg["log_interval"] == 0 or it + 1 == cfg["max_iters"]:
                row = {**as_means(sums), "iter": it + 1, "lr": lr, "iter_time": time.time() - t0,
                       "train_tokens": train_tokens, **figures}
                if grad_norm is not None:
                    row["grad_norm"] = float(grad_norm)
                log(run, metrics_path, row)
                bar.set_postfix(loss=f"{row['loss']:.4f}", refresh=False)  # shown at the next redraw
            stopping = all_reduce_sum([len(asked)], run)[0] > 0  # a Ctrl-C or SIGTERM on any rank: every rank stops here
            at_eval = evaluating and ((it + 1) % cfg["eval_interval"] == 0 or it + 1 == cfg["max_iters"])
            saving = cfg["checkpoint"] and (at_eval or stopping or it + 1 == cfg["max_iters"])
            if at_eval or saving:
                check_weights(run, it)
            if at_eval:
                metrics, drawn_at = evaluate(run, state, it + 1, metrics_path, drawn_at)
                if run.master:
                    bar.write(f"iter {it + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
            if saving:  # (every rank: its RNG streams)
                save_checkpoint(run, optimizer, it + 1, train_tokens, state_dict(run, state) if state_dict else None)
            if stopping:
                raise stopped(cfg, asked, it + 1, saving)
        bar.close()
        if run.ddp:
            dist.barrier()
            dist.destroy_process_group()
        run.state, run.metrics = state, metrics  # for the caller (tests, experiments); the loop is done with them
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
        started = check_start(overrides)
        if started and first_process:
            print(started, flush=True)
        train(overrides)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}" if first_process else 1)
    except (Stopped, KeyboardInterrupt) as e:  # Ctrl-C or SIGTERM (exit 130: a shell's "interrupted")
        if first_process:  # (a KeyboardInterrupt: a Ctrl-C before the loop began, or the second one)
            print(e if isinstance(e, Stopped) else "interrupted: stopped at once, nothing saved since the last "
                  "checkpoint", file=sys.stderr)
        sys.exit(130)
    except ImportError as e:  # an optional package (transformers, ...) that is not installed
        sys.exit(f"error: {optional_dependency(e)}" if first_process else 1)
