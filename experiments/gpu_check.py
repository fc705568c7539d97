"""
The GPU path in one prepared run, on a GPT-2-sized model (124M body: 12 layers,
12 heads, 768 wide) with random weights, so nothing is downloaded:

  1. sampling: the KV-cache sampler against transformers' `generate` on identical weights (GPT-2's
     50,304-entry vocabulary, 32-token prompts, exactly 128 new tokens, temperature 1), batch 1, 64
     and 256, both under bf16 autocast, alternating calls, median of the repeats: tokens/s;
  2. training: a bf16 iteration of each algorithm through train.py (sft, rm, dpo, grpo, ppo, opd;
     the byte tokenizer, so the vocabulary is small): median iteration time and update time over
     the iterations after the first, and tokens trained per second of update (PPO samples inside
     its step generator, so its update time holds its rollouts too); on CUDA SFT again with
     --compile=True (the median leaves out the first iterations' compiles);
  3. with more than one GPU: SFT under `torchrun --nproc_per_node=2` (NCCL) against one process.

    python experiments/gpu_check.py                      # CUDA, full size: about 5 minutes on one H200 (estimated)
    python experiments/gpu_check.py --device=cpu --tiny  # a tiny model on the CPU: checks that it runs

It prints a table and writes every figure to --out (default out/gpu_check.json).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402  (after the path: the script runs from anywhere)

import bench  # noqa: E402
import common as C  # noqa: E402
import train as T  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

GPT2_BODY = dict(n_layer=12, n_head=12, n_embd=768)
TINY_BODY = dict(n_layer=2, n_head=2, n_embd=32)
ALGOS = ("sft", "rm", "dpo", "grpo", "ppo", "opd")
# each algorithm's setup kept small (pools, pair sets), its step at its own default size, except
# where a default would be a long setup; rm and dpo use style pairs (no sampling at setup), opd the
# policy itself as teacher (OPSD: no teacher checkpoint)
ALGO_KEYS = dict(sft=dict(train_problems=4000, val_examples=16),
                 rm=dict(pairs="style", train_prompts=512, heldout_prompts=16),
                 dpo=dict(pairs="style", train_prompts=512, heldout_prompts=16),
                 grpo=dict(), ppo=dict(prompts_pool=2000), opd=dict(teacher="self"))
TINY_KEYS = dict(batch_size=4, prompts_per_iter=2, group_size=2, max_new_tokens=8, train_problems=64,
                 train_prompts=8, heldout_prompts=4, prompts_pool=64, eval_batch_size=8)


def sampler_vs_generate(device, tiny, repeats):
    """Rows of tokens/s: ours and transformers' generate, alternating, each under the run's autocast."""
    cfg = GPTConfig(block_size=64, vocab_size=320, **TINY_BODY) if tiny else \
        GPTConfig(block_size=1024, vocab_size=50304, **GPT2_BODY)
    prompt_len, new_tokens, batches = (8, 8, (1, 2)) if tiny else (32, 128, (1, 64, 256))
    torch.manual_seed(0)
    ours = GPT(cfg).to(device).eval()
    try:
        hf = ours.to_transformers()
    except ImportError:
        print("transformers is not installed: the sampler runs alone (for the comparison: pip install -r requirements-extra.txt)")
        hf = None
    autocast = C.setup_device(dict(device=device)).autocast
    if hf is not None:  # identical weights, else the comparison means nothing
        ids = torch.randint(0, cfg.vocab_size, (2, prompt_len), device=device)
        with torch.no_grad():
            diff = (hf(ids).logits - ours(ids)).abs().max().item()
        if diff > 1e-3:
            raise RuntimeError(f"converted model's logits differ by {diff}")
    rows = []
    for batch in batches:
        prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
        input_ids = prompts.to(device)

        def sample_ours():
            with autocast:
                tokens = ours.generate(prompts.tolist(), new_tokens, temperature=1.0, seed=0).tokens
            assert all(len(t) == new_tokens for t in tokens)

        def sample_hf():
            with autocast, torch.no_grad():
                out = hf.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
            assert out.size(1) == prompt_len + new_tokens

        fns = dict(ours=sample_ours, **({"transformers": sample_hf} if hf is not None else {}))
        t = bench.alternating_medians(fns, device, repeats)
        row = dict(batch=batch, **{f"{name}_tok_s": batch * new_tokens / wall for name, (wall, _) in t.items()})
        if hf is not None:
            row["ours_vs_transformers"] = t["transformers"][0] / t["ours"][0]
        rows.append(row)
        print(json.dumps(dict(sampling=row)), flush=True)
    return rows


def algorithm_steps(device, tiny, out_root):
    """{name: figures} of a few bf16 iterations (on CUDA) of each algorithm through train.train, and on
    CUDA of SFT with --compile=True (on a CPU compiling takes minutes)."""
    results = {}
    runs = [(algo, algo, {}) for algo in ALGOS] + ([("sft --compile=True", "sft", dict(compile=True))]
                                                  if device.startswith("cuda") else [])
    for name, algo, extra in runs:
        out_dir = os.path.join(out_root, name.replace(" ", "_"))
        overrides = dict(algo=algo, device=device, out_dir=out_dir, max_iters=3 if tiny else 6, eval_interval=0,
                         log_interval=1, checkpoint=False, plot=False, block_size=128, **ALGO_KEYS[algo],
                         **(TINY_BODY if tiny else GPT2_BODY), **extra)
        if tiny:
            overrides.update({k: v for k, v in TINY_KEYS.items() if k in T.make_config(dict(algo=algo))})
        t0 = time.time()
        T.train(overrides)
        rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
        steady = rows[1:]  # the first iteration warms up the kernels (and compiles)
        results[name] = dict(iter_s=statistics.median(r["iter_time"] for r in steady),
                             update_s=statistics.median(r["time_update"] for r in steady),
                             tokens_per_iter=rows[-1]["train_tokens"] / rows[-1]["iter"], run_s=time.time() - t0)
        results[name]["update_tok_s"] = results[name]["tokens_per_iter"] / results[name]["update_s"]
        print(json.dumps({name: results[name]}), flush=True)
    return results


def two_rank_sft(single, tiny, out_root):
    """SFT under torchrun with 2 GPUs (NCCL): its tokens per second of update against one GPU's."""
    out_dir = os.path.join(out_root, "sft_ddp")
    args = [f"--{k}={v}" for k, v in
            dict(algo="sft", out_dir=out_dir, max_iters=6, eval_interval=0, log_interval=1, checkpoint=False,
                 plot=False, block_size=128, **ALGO_KEYS["sft"], **(TINY_BODY if tiny else GPT2_BODY)).items()]
    subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", os.path.join(ROOT, "train.py"), *args],
                   check=True, cwd=ROOT)
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    tokens = rows[-1]["train_tokens"] / rows[-1]["iter"]  # over both ranks
    update_s = statistics.median(r["time_update"] for r in rows[1:])
    return dict(update_s=update_s, tokens_per_iter=tokens, update_tok_s=tokens / update_s,
                vs_one_gpu=(tokens / update_s) / single["update_tok_s"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and few steps: checks that it runs")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per sampler and batch")
    parser.add_argument("--out", default=os.path.join("out", "gpu_check.json"))
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device=cpu --tiny to check the script on a CPU")
    t0 = time.time()
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{device_name}, torch {torch.__version__}, {torch.cuda.device_count()} GPU(s)", flush=True)
    report = dict(device=device_name, torch=torch.__version__, tiny=args.tiny)
    report["sampling"] = sampler_vs_generate(args.device, args.tiny, 1 if args.tiny else args.repeats)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as out_root:
        report["training"] = algorithm_steps(args.device, args.tiny, out_root)
        if args.device.startswith("cuda") and torch.cuda.device_count() > 1:
            report["ddp_2_gpus"] = two_rank_sft(report["training"]["sft"], args.tiny, out_root)
    report["minutes"] = (time.time() - t0) / 60
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    print("\n| batch | ours tok/s | transformers tok/s | ours / transformers |\n|---|---|---|---|")
    for r in report["sampling"]:
        print(f"| {r['batch']} | {r['ours_tok_s']:,.0f} | {r.get('transformers_tok_s', float('nan')):,.0f} | "
              f"{r.get('ours_vs_transformers', float('nan')):.2f} |")
    print("\n| algorithm | iteration s | update s | tokens / iteration | update tokens/s |\n|---|---|---|---|---|")
    for algo, r in report["training"].items():
        print(f"| {algo} | {r['iter_s']:.3f} | {r['update_s']:.3f} | {r['tokens_per_iter']:,.0f} | {r['update_tok_s']:,.0f} |")
    if "ddp_2_gpus" in report:
        d = report["ddp_2_gpus"]
        print(f"\nSFT on 2 GPUs (torchrun, NCCL): {d['update_tok_s']:,.0f} tokens/s, {d['vs_one_gpu']:.2f}x one GPU")
    print(f"\n{report['minutes']:.1f} minutes; every figure in {args.out}")
    return report


if __name__ == "__main__":
    main()
