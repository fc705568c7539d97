"""
Pre-training and SFT: one masked next-token loss. SPEC §3 "Pre-training / SFT".

    L = - Σ_t m_t · log π_θ(x_{t+1} | x_≤t)  /  Σ_t m_t

--algo pretrain: m_t = 1 on every token of packed block_size windows of a corpus.
--algo sft:      m_t = 1 only on the assistant's tokens (end token included); prompt, template,
                 environment output and padding have m_t = 0 and get no gradient.

Data: the built-in environment (solver demonstrations; a corpus of worked equations for
pre-training) or --data=FILE (data.load_rows), rows as {"text"}, {"prompt", "completion"} or
{"messages": [{"role", "content"}, ...]}.
"""

import random
from types import SimpleNamespace

import torch

from nanopost.data import RowError, check_length, collate, encode_rows, load_rows, pretraining, render_messages, require
from nanopost.distributed import all_reduce_sum, chunks, seeded_rng, shard
from envs import privileged_prompt
from nanopost.evaluation import evaluate_policy
from model import token_logprobs
from nanopost.passports import sft_passport, write_passport

defaults = dict(
    train_problems=20000,  # built-in SFT pool (solver demonstrations of train-split problems)
    corpus_docs=40000,     # built-in pre-training corpus size (documents)
    val_examples=256,      # held-out examples for the validation loss
    reader_frac=0.0,       # share of the built-in training rows that show a verified worked solution before the
                           # question (envs.PRIVILEGED["solution"]) and ask for that worked answer: a student that
                           # can read a reference, which OPSD's self-teacher needs (the ladder's reader stage)
)


# -- the loss --------------------------------------------------------------------------------------

def masked_nll(model, ids, mask):
    """(Σ m·(−log p), Σ m) of the next-token loss (SPEC §3 SFT): position t predicts ids[t+1], weighted
    by mask[t+1] (a mask aligned with ids, 1 on the tokens to learn). SFT and RFT train with it."""
    return masked_nll_of(model(ids[:, :-1]), ids, mask)


def masked_nll_of(logits, ids, mask):
    """masked_nll from the logits (B, T-1, V) of ids[:, :-1]."""
    m = mask[:, 1:]
    return -(token_logprobs(logits, ids[:, 1:]) * m).sum(), m.sum()


def loss(run, state, model, batch):
    """masked_nll of a collated (ids, mask) micro-batch, and its trained tokens (rft.py trains with it too)."""
    loss_sum, count = masked_nll(model, *batch)
    return loss_sum, count, {"tokens": count}  # tensors: the loop reads them once per step


# -- data ------------------------------------------------------------------------------------------

def encode_row(run, row):
    """One file row -> (ids, loss mask), or RowError naming the bad field."""
    tok, limit = run.tok, run.cfg["block_size"] + 1  # inputs are ids[:-1]: block_size tokens
    row = {k: v for k, v in row.items() if v is not None}  # datasets fills absent columns with None
    if "messages" in row:
        messages = require(row, "messages", list)
        ids, mask = render_messages(run, messages, "messages")
        if not any(m.get("role") == "assistant" and m["content"].strip() for m in messages):
            raise RowError("messages", "no non-empty assistant message")
        field = "messages"
    elif "prompt" in row or "completion" in row:
        prompt, completion = require(row, "prompt", str), require(row, "completion", str)
        if not completion.strip():
            raise RowError("completion", "empty answer")
        ids = tok.prompt_ids(prompt)
        answer = tok.response_ids(completion)
        if not pretraining(run.cfg):
            check_length(ids, answer, "completion", limit, f"block_size+1={limit}")
        ids, mask = ids + answer, [0] * len(ids) + [1] * len(answer)
        field = "completion"
    elif "text" in row:
        text = require(row, "text", str)
        if not text.strip():
            raise RowError("text", "empty text")
        ids = [tok.bos] + tok.encode(text) + [tok.eos]
        mask, field = [1] * len(ids), "text"
    else:
        raise RowError("text", f"no known layout: expected 'text', 'prompt'+'completion' or "
                                 f"'messages', got fields {sorted(row)}")
    if not pretraining(run.cfg):
        check_length([], ids, field, limit, f"block_size+1={limit}")
    return ids, mask


def builtin_examples(run, split, n):
    """(ids, loss mask) of n problems' demonstrations; in training a reader_frac share of them instead
    reads the worked solution in the prompt and writes it out (the training rows only: the validation
    loss stays the task's)."""
    tok, env = run.tok, run.env
    reading = random.Random(f"reader-{split}")  # which rows read: the same in every run and on every rank
    out = []
    for p in env.problems(split, n, seed=0):
        if split == "train" and reading.random() < run.cfg["reader_frac"]:
            prompt, target = privileged_prompt(env, p, "solution"), env.solve(p)
        else:
            prompt, target = p["prompt"], env.demonstration(p)
        # a tool-using demonstration keeps its results as context with mask 0 (tokenizer.assistant_ids)
        prompt, (answer, answer_mask) = tok.prompt_ids(prompt), tok.assistant_ids(target)
        out.append((prompt + answer, [0] * len(prompt) + answer_mask))
    longest = max(len(ids) for ids, _ in out)
    if longest > run.cfg["block_size"] + 1:
        raise ValueError(f"built-in {split} examples reach {longest} tokens: raise block_size "
                         f"(now {run.cfg['block_size']}) or lower env_digits / env_ops")
    return out


def corpus_examples(run, split, n):
    """Pre-training's (ids, loss mask) examples: n documents of the environment's corpus (seed 0 for
    train, 1 for val), each between <|bos|> and <|eos|>, every token in the loss."""
    docs = ([run.tok.bos] + run.tok.encode(text) + [run.tok.eos]
            for text in run.env.corpus(n, seed=0 if split == "train" else 1))
    return [(ids, [1] * len(ids)) for ids in docs]


def setup(run, saved):
    """The demonstrations: (ids, loss mask) examples for training and for the validation loss; for
    pre-training, the training documents packed into one stream of tokens."""
    cfg, state = run.cfg, SimpleNamespace(skipped_rows=0, stream=None)
    if cfg["reader_frac"] and (cfg["data"] or pretraining(cfg)):
        raise ValueError("reader_frac mixes reading rows into the built-in SFT demonstrations: not with --data or pretrain")
    if cfg["data"]:
        examples, state.skipped_rows = encode_rows(run, cfg["data"], load_rows(cfg["data"]), encode_row)
        n_val = max(1, min(cfg["val_examples"], len(examples) // 20))
        state.train_examples, state.val_examples = examples[:-n_val] or examples, examples[-n_val:]
    elif pretraining(cfg):
        state.train_examples = corpus_examples(run, "train", cfg["corpus_docs"])
        state.val_examples = corpus_examples(run, "val", cfg["val_examples"])
    else:
        state.train_examples = builtin_examples(run, "train", cfg["train_problems"])
        state.val_examples = builtin_examples(run, "heldout", cfg["val_examples"])
    if pretraining(cfg):  # pack documents into one stream of tokens
        state.stream = torch.tensor([t for ids, _ in state.train_examples for t in ids])
        if len(state.stream) <= cfg["block_size"] + 1:
            raise ValueError(f"pre-training corpus has {len(state.stream)} tokens, fewer than block_size+1")
    write_passport(run, sft_passport(run, len(state.train_examples), len(state.val_examples)))
    return state


def pool_batches(run, it, examples):
    """One optimizer step of gradient_accumulation_steps micro-batches of (ids, mask) examples drawn
    at random from a pool (SFT's data, RFT's kept answers); the global batch depends only on (seed, it)."""
    accum, bs = run.cfg["gradient_accumulation_steps"], run.cfg["batch_size"]
    rng = seeded_rng(run, it)
    picks = [examples[i] for i in rng.integers(0, len(examples), run.world_size * accum * bs)]
    return [[collate(mb, run.tok.pad, run.device) for mb in shard(picks, run, accum, bs)]]


def batches(run, state, it):
    """One optimizer step of gradient_accumulation_steps micro-batches, cut from a global batch that
    depends only on (seed, it); no figures of its own."""
    cfg = run.cfg
    if not pretraining(cfg):
        return pool_batches(run, it, state.train_examples), {}
    accum, bs = cfg["gradient_accumulation_steps"], cfg["batch_size"]
    L = cfg["block_size"] + 1
    starts = seeded_rng(run, it).integers(0, len(state.stream) - L, run.world_size * accum * bs)
    windows = [(state.stream[s:s + L].tolist(), [1] * L) for s in starts]
    return [[collate(mb, run.tok.pad, run.device) for mb in shard(windows, run, accum, bs)]], {}


@torch.no_grad()
def evaluate(run, state, it):
    """The validation loss; with the built-in task (SFT, not pre-training) the policy's figures."""
    model = run.raw_model
    L = run.cfg["block_size"] + 1
    examples = [(ids[:L], m[:L]) for ids, m in state.val_examples[run.rank::run.world_size]]
    total, count = 0.0, 0.0
    with run.autocast:
        for chunk in chunks(examples, run.cfg["eval_batch_size"]):
            s, c = masked_nll(model, *collate(chunk, run.tok.pad, run.device))
            total, count = total + float(s), count + float(c)
    total, count = all_reduce_sum([total, count], run)
    metrics = {"val_loss": total / max(count, 1.0)}
    if not pretraining(run.cfg) and not run.cfg["data"]:
        metrics.update(evaluate_policy(run, model, it)[0])
    return metrics
