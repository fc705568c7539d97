"""
Ask a trained checkpoint questions with the KV-cache sampler.

    python sample.py out/sft "What is 7 + 8 - 3 + 5?"
    python sample.py out/grpo "Ann had 4 coins, got 9, gave away 2, got 1. How many now?" --temperature=0.8 --n=4
    python sample.py out/calc_sft "What is 347*28+51-86?"     # the calculator's calls run, as in training

The first line says which stage and environment were loaded. The environment's tool (the
calculator, the treasure game) runs each call the answer makes, through the rollouts' own hook, so
an answer reads as it did in training and evaluation. Prints each answer with its log-probability
under the sampler and the verifier's verdict when the checkpoint's environment recognises the
question as one of its own, in any of its phrasings.
"""

import argparse
import json
import math
import os
import sys
from types import SimpleNamespace

# OpenMP's waiting threads sleep instead of spinning: beside any other process a spinning run on two
# cores slows 3x or more (docs/benchmarks.md, "Beside other work"). Set before torch loads OpenMP;
# OMP_WAIT_POLICY=ACTIVE brings the spinning back, faster for SFT on idle cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from nanopost.checkpoints import load_model, load_tokenizer, read_checkpoint
from nanopost.data import config_env
from nanopost.options import DEFAULTS
from nanopost.rollouts import tool_hook
from sampler import sample


def verdict(env, question, answer):
    """"  [correct]" or "  [wrong]" when the environment recognises the question as one of its own
    (its parse_problem, in any of its phrasings), else "" (no verdict)."""
    problem = env.parse_problem(question) if hasattr(env, "parse_problem") else None
    if problem is None:
        return ""
    return "  [correct]" if env.verify(problem, answer) > 0 else "  [wrong]"


def describe(checkpoint, ckpt):
    """One line: the checkpoint, the ladder stage it is (ladder.json), its algorithm, environment and iteration."""
    cfg, record = ckpt["config"], os.path.join(checkpoint, "ladder.json")
    stage = f"the ladder's {json.load(open(record))['stage']} stage, " if os.path.isfile(record) else ""
    return f"{checkpoint}: {stage}--algo {cfg['algo']} on env={cfg['env']}, iteration {ckpt['iter']}"


def check_options(args):
    """Each option in its range (argparse checks only the type): a one-line error, not garbage printed."""
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature={args.temperature} is out of range: it must be finite and >= 0 (0 = greedy)")
    for name, low in (("n", 1), ("max_new_tokens", 0), ("seed", 0)):
        if getattr(args, name) < low:
            raise ValueError(f"--{name}={getattr(args, name)} is out of range: it must be >= {low}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("question")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=1, help="number of samples")
    parser.add_argument("--max_new_tokens", type=int, default=0, help="0 = the checkpoint's own")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_options(args)
    ckpt = read_checkpoint(args.checkpoint)
    if ckpt["kind"] == "scalar":
        raise ValueError(f"{args.checkpoint} is a reward model (--algo {ckpt['config']['algo']}): it scores answers "
                         f"and writes none; ask a language-model checkpoint")
    cfg = {**DEFAULTS, **ckpt["config"]}  # (an older checkpoint's config may lack a newer key)
    model, tok = load_model(args.checkpoint), load_tokenizer(args.checkpoint)
    run = SimpleNamespace(cfg=cfg, tok=tok, env=config_env(cfg))  # what the rollouts' tool hook reads
    print(describe(args.checkpoint, ckpt))
    prompt = tok.prompt_ids(args.question)
    if len(prompt) >= model.config.block_size:
        raise ValueError(f"the question is {len(prompt):,} tokens with its template; {args.checkpoint} reads at most "
                         f"block_size={model.config.block_size} (question and answer together): shorten it")
    prompts = [prompt] * args.n
    tokens, logprobs, _ = sample(model, prompts, args.max_new_tokens or cfg["max_new_tokens"],
                                 temperature=args.temperature, stop_tokens=(tok.eos,), seed=args.seed,
                                 pad_id=tok.pad, tool_hook=tool_hook(run, prompts))
    for toks, lps in zip(tokens, logprobs):
        text = tok.decode([t for t in toks if t != tok.eos])
        print(f"{text!r}  (log-prob {sum(lps):.2f}){verdict(run.env, args.question, text)}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
