"""
Ask a trained checkpoint questions with the KV-cache sampler.

    python sample.py out/sft "What is 7 + 8 - 3 + 5?"
    python sample.py out/grpo "Ann had 4 coins, got 9, gave away 2, got 1. How many now?" --temperature=0.8 --n=4

Prints each answer with its log-probability under the sampler and the verifier's verdict when
the question is one of the built-in task's (its answer can be computed).
"""

import argparse
import re

import common as C
from envs import parse_answer


def expected_answer(question):
    """The answer to a symbol-form built-in question ("What is 7 + 8 - 3?"), else None."""
    m = re.fullmatch(r"What is (\d+(?: [+-] \d+)+)\?", question.strip())
    if not m:
        return None
    tokens = m.group(1).split()
    value = int(tokens[0])
    for op, b in zip(tokens[1::2], tokens[2::2]):
        value = value + int(b) if op == "+" else value - int(b)
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("question")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=1, help="number of samples")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, tok = C.load_model(args.checkpoint), C.load_tokenizer(args.checkpoint)
    prompt = tok.prompt_ids(args.question)
    tokens, logprobs = model.generate([prompt] * args.n, args.max_new_tokens, temperature=args.temperature,
                                      stop_tokens=(tok.eos,), seed=args.seed, pad_id=tok.pad)
    expected = expected_answer(args.question)
    for toks, lps in zip(tokens, logprobs):
        text = tok.decode([t for t in toks if t != tok.eos])
        verdict = "" if expected is None else ("  [correct]" if parse_answer(text) == expected else "  [wrong]")
        print(f"{text!r}  (log-prob {sum(lps):.2f}){verdict}")


if __name__ == "__main__":
    main()
