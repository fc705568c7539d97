"""
Ask a trained checkpoint questions with the KV-cache sampler.

    python sample.py out/sft "What is 7 + 8 - 3 + 5?"
    python sample.py out/grpo "Ann had 4 coins, got 9, gave away 2, got 1. How many now?" --temperature=0.8 --n=4

Prints each answer with its log-probability under the sampler and the verifier's verdict when the
checkpoint's environment recognises the question as one of its own, in any of its phrasings.
"""

import argparse

from checkpoints import load_model, load_tokenizer, read_checkpoint
from data import config_env


def verdict(env, question, answer):
    """"  [correct]" or "  [wrong]" when the environment recognises the question as one of its own
    (its parse_problem, in any of its phrasings), else "" (no verdict)."""
    problem = env.parse_problem(question) if hasattr(env, "parse_problem") else None
    if problem is None:
        return ""
    return "  [correct]" if env.verify(problem, answer) > 0 else "  [wrong]"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("question")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=1, help="number of samples")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, tok = load_model(args.checkpoint), load_tokenizer(args.checkpoint)
    env = config_env(read_checkpoint(args.checkpoint)["config"])  # the task the checkpoint was trained on
    prompt = tok.prompt_ids(args.question)
    tokens, logprobs, _ = model.generate([prompt] * args.n, args.max_new_tokens, temperature=args.temperature,
                                      stop_tokens=(tok.eos,), seed=args.seed, pad_id=tok.pad)
    for toks, lps in zip(tokens, logprobs):
        text = tok.decode([t for t in toks if t != tok.eos])
        print(f"{text!r}  (log-prob {sum(lps):.2f}){verdict(env, args.question, text)}")


if __name__ == "__main__":
    main()
