"""
The GPU path, smoked and measured in one run of about 5 minutes on one GPU (estimated: it has not
run on a GPU yet, see docs/gpu.md). Random weights at GPT-2's width (12 layers, 12 heads, 768 wide),
nothing downloaded:

  1. algorithms: sft, rm, dpo, grpo, ppo, opd and rft each for 1 iteration, checkpointed, then
     resumed for a 2nd (the resume must reach iteration 2); peak GPU memory of each, and the update's
     tokens per second (SFT's and GRPO's are the step throughputs);
  2. numerics: GRPO's first-step max |ρ − 1| with π_old recomputed under bf16 autocast (bound 1e-6:
     fp32 heads, π_old scored on the loss's own micro-batches) and the mean sampler/trainer log-prob
     gap (bound 0.02 nats per token);
  3. decoding: bf16 KV-cache greedy decoding against one full forward of each finished row, on
     ragged prompts and on repeated (shared) prompts: the share of tokens the full forward also
     ranks first, and the largest log-prob gap (bounds 0.99 and 0.1 nats);
  4. sampling: the KV-cache sampler against transformers' generate on identical weights, batch 1
     and 64, 128 new tokens, tokens/s;
  5. ranks: SFT, GRPO and PPO under torchrun with DDP, --fsdp, and --fsdp_rollouts=sharded, on 2 GPUs over NCCL when there
     are 2 or more, else on 1.

Random weights solve no problem, so the RL rows reward odd-length answers (a test of the machinery,
not of learning). Every row is printed and appended to --out as one JSON line when measured, so a
failure loses nothing before it; a bound missed is marked "ok": false, and the run goes on.

    python experiments/gpu_check.py                        # CUDA
    python experiments/gpu_check.py --device=cpu --quick   # tiny sizes on a CPU: what a CPU can check
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench.py beside it

import torch  # noqa: E402  (after the path: the script runs from anywhere)

import bench  # noqa: E402
import envs  # noqa: E402
from nanopost import options  # noqa: E402
import train as T  # noqa: E402
from nanopost.distributed import setup_device  # noqa: E402
from nanopost.hf import to_transformers  # noqa: E402
from model import GPT, GPTConfig, token_logprobs  # noqa: E402
from sampler import sample  # noqa: E402

GPT2_BODY = dict(n_layer=12, n_head=12, n_embd=768)
TINY_BODY = dict(n_layer=2, n_head=2, n_embd=32)
ALGOS = ("sft", "rm", "dpo", "grpo", "ppo", "opd", "rft")
# each algorithm small at setup (pools, pair sets), its step at its own default size; rm and dpo
# use style pairs (no sampling at setup), opd the policy itself as teacher (OPSD)
ALGO_KEYS = dict(sft=dict(train_problems=4000, val_examples=16), rm=dict(pairs="style", train_prompts=512),
                 dpo=dict(pairs="style", train_prompts=512), grpo=dict(), ppo=dict(prompt_pool=2000),
                 opd=dict(teacher="self"), rft=dict(round_prompts=64))
QUICK_KEYS = dict(batch_size=4, prompts_per_iter=2, group_size=2, max_new_tokens=8, train_problems=64,
                  train_prompts=8, heldout_prompts=4, prompt_pool=64, eval_batch_size=8, round_prompts=4,
                  eval_problems=2)
# RFT keeps only answers that end (a random model rarely writes the end token): room for one
QUICK_ALGO_KEYS = dict(rft=dict(round_prompts=8, group_size=8, max_new_tokens=64))
BOUNDS = dict(ratio_dev=1e-6, sampler_gap=0.02, greedy_agreement=0.99, decode_gap=0.1)


def odd_length_reward(problem, response):
    return float(len(response) % 2)


@contextlib.contextmanager
def odd_length_rewards(on=True):
    """The arithmetic task's verifier replaced by odd_length_reward for the block (RL rows)."""
    verify = envs.Arithmetic.__dict__["verify"]  # the staticmethod itself, not the function it gives
    if on:
        envs.Arithmetic.verify = staticmethod(odd_length_reward)
    try:
        yield
    finally:
        envs.Arithmetic.verify = verify


def emit(out, row):
    """Print one row and append it to the JSON-lines file at once."""
    print(json.dumps(row), flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def overrides(args, algo, out_dir, **extra):
    cfg = dict(algo=algo, device=args.device, out_dir=out_dir, eval_interval=1, eval_problems=8, log_interval=1,
               plot=False, block_size=128, **ALGO_KEYS[algo], **(TINY_BODY if args.quick else GPT2_BODY))
    if args.quick:
        cfg.update({k: v for k, v in QUICK_KEYS.items() if k in options.make_config(dict(algo=algo))})
        cfg.update(QUICK_ALGO_KEYS.get(algo, {}))
    return {**cfg, **extra}


def peak_gib(device):
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.startswith("cuda") else None


def algorithm_rows(args, out_root):
    """Each algorithm: 1 iteration and a checkpoint, then a resume to iteration 2."""
    for algo in ALGOS:
        out_dir = os.path.join(out_root, algo)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(args.device)
        t0 = time.time()
        with odd_length_rewards(algo in ("grpo", "ppo", "opd", "rft")):
            T.train(overrides(args, algo, out_dir, max_iters=1))
            T.train(dict(init_from="resume", out_dir=out_dir, max_iters=2, device=args.device))
        rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
        steps = [r for r in rows if "loss" in r]
        update_s = sum(r["time_update"] for r in steps)
        emit(args.out, dict(row="algorithm", algo=algo, ok=[r["iter"] for r in steps] == [1, 2],
                            run_s=time.time() - t0, peak_gib=peak_gib(args.device),
                            update_tok_s=steps[-1]["train_tokens"] / max(update_s, 1e-9),
                            loss=steps[-1]["loss"]))


def numerics_row(args, out_root):
    """GRPO under the run's autocast with π_old recomputed: the first step's ratio and the sampler's gap."""
    out_dir = os.path.join(out_root, "grpo_recompute")
    with odd_length_rewards():
        T.train(overrides(args, "grpo", out_dir, max_iters=1, eval_interval=0, old_logprobs="recompute"))
    row = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))][-1]
    emit(args.out, dict(row="numerics", ratio_dev=row["ratio_dev"], sampler_gap=row["sampler_logprob_gap"],
                        ok=row["ratio_dev"] <= BOUNDS["ratio_dev"] and row["sampler_logprob_gap"] <= BOUNDS["sampler_gap"]))


@torch.no_grad()
def decode_rows(args):
    """Greedy KV-cache decoding under the run's autocast against a full forward of each finished row."""
    cfg = GPTConfig(block_size=128, vocab_size=320, **(TINY_BODY if args.quick else GPT2_BODY))
    torch.manual_seed(0)
    model = GPT(cfg).to(args.device).eval()
    run = setup_device(dict(device=args.device))
    g = torch.Generator().manual_seed(1)
    ragged = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 17, 9, 30)]
    for name, prompts in (("ragged", ragged), ("shared", [ragged[1]] * 3 + [ragged[2]] * 2)):
        with run.autocast:
            tokens, logprobs, _ = sample(model, prompts, 48, temperature=0)
        agree, gap, total = 0, 0.0, 0
        for prompt, toks, lps in zip(prompts, tokens, logprobs):
            ids = torch.tensor([prompt + toks], device=args.device)
            with run.autocast:
                logits = model(ids[:, :-1])[0, len(prompt) - 1:]
            agree += int((logits.argmax(-1).cpu() == torch.tensor(toks)).sum())
            full = token_logprobs(logits[None], ids[:, len(prompt):])[0].cpu()
            gap, total = max(gap, float((full - torch.tensor(lps)).abs().max())), total + len(toks)
        emit(args.out, dict(row="decode", prompts=name, greedy_agreement=agree / total, max_logprob_gap=gap,
                            ok=agree / total >= BOUNDS["greedy_agreement"] and gap <= BOUNDS["decode_gap"]))


def sampling_rows(args):
    """The KV-cache sampler against transformers' generate on identical weights, tokens/s."""
    cfg = GPTConfig(block_size=256, vocab_size=320 if args.quick else 50304, **(TINY_BODY if args.quick else GPT2_BODY))
    prompt_len, new_tokens = (8, 8) if args.quick else (32, 128)
    torch.manual_seed(0)
    ours = GPT(cfg).to(args.device).eval()
    try:
        hf = to_transformers(ours)
    except ImportError:
        hf = None
        print("transformers is not installed: the sampler runs alone (for the comparison: pip install -r requirements-extra.txt)")
    autocast = setup_device(dict(device=args.device)).autocast
    for batch in (1, 2) if args.quick else (1, 64):
        prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
        ids = prompts.to(args.device)

        def sample_ours():
            with autocast:
                sample(ours, prompts.tolist(), new_tokens, temperature=1.0, seed=0)

        def sample_hf():
            with autocast, torch.no_grad():
                hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        fns = dict(ours=sample_ours, **({"transformers": sample_hf} if hf is not None else {}))
        t = bench.alternating_medians(fns, args.device, 1 if args.quick else 3)
        emit(args.out, dict(row="sampling", batch=batch, ok=True,
                            **{f"{k}_tok_s": batch * new_tokens / wall for k, (wall, _) in t.items()}))


def rank_rows(args, out_root):
    """SFT, GRPO and PPO under torchrun: DDP, --fsdp (rollouts gathered) and, for the RL ones,
    --fsdp_rollouts=sharded; 2 ranks over NCCL with 2+ GPUs, else 1."""
    ranks = 2 if torch.cuda.device_count() > 1 else 1
    modes = dict(ddp=dict(fsdp=False), fsdp=dict(fsdp=True), fsdp_sharded=dict(fsdp=True, fsdp_rollouts="sharded"))
    for algo in ("sft", "grpo", "ppo"):
        for mode, keys in modes.items():
            if algo == "sft" and mode == "fsdp_sharded":
                continue  # SFT samples nothing
            out_dir = os.path.join(out_root, f"{algo}_ranks_{mode}")
            # RL from the SFT row's checkpoint: train.py refuses an RL run from random weights
            rl = dict(init_from=os.path.join(out_root, "sft"), **({"share_prompt": False} if algo == "grpo" else {}))
            cfg = overrides(args, algo, out_dir, max_iters=2, eval_interval=0, **keys, **(rl if algo != "sft" else {}))
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                   os.path.join(ROOT, "train.py"), *[f"--{k}={v}" for k, v in cfg.items()]]
            done = subprocess.run(cmd, cwd=ROOT).returncode == 0
            steps = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))] if done else []
            emit(args.out, dict(row="ranks", algo=algo, mode=mode, ranks=ranks, ok=done and len(steps) == 2,
                                update_tok_s=steps[-1]["train_tokens"] / sum(r["time_update"] for r in steps)
                                if steps else None))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that every part runs (CPU)")
    parser.add_argument("--out", default=os.path.join("out", "gpu_check.jsonl"))
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device=cpu --quick to check the script on a CPU")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    open(args.out, "w").close()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    emit(args.out, dict(row="machine", device=name, torch=torch.__version__, gpus=torch.cuda.device_count(),
                        quick=args.quick))
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as out_root:
        decode_rows(args)
        numerics_row(args, out_root)
        algorithm_rows(args, out_root)
        sampling_rows(args)
        if args.device.startswith("cuda"):
            rank_rows(args, out_root)
    emit(args.out, dict(row="done", minutes=(time.time() - t0) / 60))
    return [json.loads(line) for line in open(args.out)]


if __name__ == "__main__":
    main()
