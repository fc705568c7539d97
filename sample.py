"""
Ask a trained checkpoint questions with the KV-cache sampler, or chat with it.

    python sample.py out/sft "What is 7 + 8 - 3 + 5?"
    python sample.py out/grpo "Ann had 4 coins, got 9, gave away 2, got 1. How many now?" --temperature=0.8 --n=4
    python sample.py out/calc_sft "What is 347*28+51-86?"     # the calculator's calls run, as in training
    python sample.py smollm2 "What is 7 + 8 - 3 + 5?"         # a GGUF file: 'smollm2' or PATH.gguf (docs/smollm2.md)
    python sample.py smollm2                                  # no question: a chat

Without a question it opens a chat: each line you type is a user turn, the whole conversation goes
through the chat template, and the answer is printed as it is sampled. /reset starts a new
conversation; ^C stops an answer (that turn is forgotten); ^C or ^D at the prompt ends the chat.

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
from nanopost.options import config_env
from nanopost.gguf_file import gguf_path, is_gguf, read_model
from nanopost.tokenizer import make_tokenizer
from nanopost.options import DEFAULTS, optional_dependency
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


def load(checkpoint):
    """(model, tokenizer, the config it ran with, one line saying what it is) of a checkpoint directory
    or a GGUF file (its config: the defaults, the default environment's verifier for a verdict)."""
    if is_gguf(checkpoint):
        cfg = dict(DEFAULTS, init_from=checkpoint, tokenizer=checkpoint)
        return read_model(checkpoint), make_tokenizer(checkpoint), cfg, f"{checkpoint}: {gguf_path(checkpoint)}"
    ckpt = read_checkpoint(checkpoint)
    if ckpt["kind"] == "scalar":
        raise ValueError(f"{checkpoint} is a reward model (--algo {ckpt['config']['algo']}): it scores answers "
                         f"and writes none; ask a language-model checkpoint")
    cfg = {**DEFAULTS, **ckpt["config"]}  # (an older checkpoint's config may lack a newer key)
    return load_model(checkpoint), load_tokenizer(checkpoint), cfg, describe(checkpoint, ckpt)


def stream(tok, out):
    """A sampler hook that writes each sampled token's text to `out` as it comes and injects nothing:
    the text of the answer so far minus the text before this token (an unfinished UTF-8 character
    waits for its next byte)."""
    def hook(row, generated):
        def visible(ids):
            return tok.decode([t for t in ids if t != tok.eos]).rstrip("\ufffd")
        before, now = visible(generated[:-1]), visible(generated)
        out.write(now[len(before):])
        out.flush()
        return None
    return hook


def chat(model, tok, turns, out, max_new_tokens, temperature=0.0, seed=0):
    """A multi-turn conversation: each line of `turns` is a user message (/reset starts over), the
    messages so far rendered with the chat template, the answer streamed to `out`. Returns the
    conversation's messages."""
    messages = []
    for line in turns:
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            messages = []
            out.write("(a new conversation)\n")
            continue
        messages.append({"role": "user", "content": text})
        prompt = tok.render_chat(messages, add_generation_prompt=True)[0]
        if len(prompt) >= model.config.block_size:
            messages.pop()
            out.write(f"(the conversation is {len(prompt):,} tokens, more than block_size="
                      f"{model.config.block_size}: /reset to start over)\n")
            continue
        out.write("assistant> ")
        try:
            tokens = sample(model, [prompt], max_new_tokens, temperature=temperature, stop_tokens=(tok.eos,),
                            seed=seed, pad_id=tok.pad, tool_hook=stream(tok, out)).tokens[0]
        except KeyboardInterrupt:  # ^C stops this answer; the conversation goes on without the turn
            messages.pop()
            out.write(" (stopped: this turn is forgotten)\n")
            continue
        out.write("\n")
        messages.append({"role": "assistant", "content": tok.decode([t for t in tokens if t != tok.eos])})
    return messages


def typed_lines():
    """The lines typed at the prompt, until ^D (or the end of piped input)."""
    interactive = sys.stdin.isatty()
    while True:
        try:
            yield input("you> " if interactive else "")
        except EOFError:
            return


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("question", nargs="?", help="none: a chat")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=1, help="number of samples")
    parser.add_argument("--max_new_tokens", type=int, default=0, help="0 = the checkpoint's own (a chat: 256)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_options(args)
    model, tok, cfg, description = load(args.checkpoint)
    print(description)
    if args.question is None:
        print("a chat: type a message; /reset starts over; ^C stops an answer; ^D or ^C here ends")
        try:
            chat(model, tok, typed_lines(), sys.stdout, args.max_new_tokens or 256, args.temperature, args.seed)
        except KeyboardInterrupt:  # (^C at the prompt)
            print()
        return
    run = SimpleNamespace(cfg=cfg, tok=tok, env=config_env(cfg))  # what the rollouts' tool hook reads
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
    except ImportError as e:  # gguf or transformers, optional
        sys.exit(f"error: {optional_dependency(e)}")
