"""
DPO: Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290). SPEC §3 "DPO"; M14 §6–8.

    python train.py --algo dpo --init_from=out/sft                    # verifier pairs of the SFT model's answers
    python train.py --algo dpo config/dpo.py --init_from=out/sft      # verifier and style pairs

DPO learns from fixed preference pairs (x, y_w ≻ y_l) with no reward model and no sampling in training:
the policy's own log-ratio to the frozen starting policy π_ref is its implicit reward,

    r̂(x, y) = β · (log π_θ(y|x) − log π_ref(y|x))
    L_DPO = −log σ(r̂(x, y_w) − r̂(x, y_l))                    one term per pair, count = pairs

1. setup: the pairs (pairs.py: verifier- or style-labelled answers of the starting policy, or a file)
   and π_ref's log-probs of both answers of every pair, computed once and cached;
2. each iteration: a batch of pairs (pairs.step_batches), the policy's log-probs of both answers in
   one forward, the loss, and its figures: the implicit rewards of chosen and rejected, their margin
   and the share of pairs it orders right (pref_acc).

The log-prob of a response is a sum over its tokens only: logits shifted by one, prompt and padding
excluded, the same chat template for policy and reference (model.sequence_logprobs and the 0/1
response mask):

    log π(y | x) = Σ_t m_t · log π(x_{t+1} | x_≤t)

π_ref enters only through these sums on the fixed pairs, so they are computed once at setup and
cached, in memory and in out_dir (keyed by a hash of the tokenizer, every token id and the reference
weights: change any of them and the cache is rebuilt). No reference forward runs during training;
π_ref stays loaded for the evaluation, which estimates the KL drift on the policy's own samples.

The family, each a file of the lab that imports this one and shows what it changes (--algo NAME):
lab/ipo.py, lab/kto.py, lab/simpo.py, lab/orpo.py, and lab/online_dpo.py (the pairs sampled each
round from the current policy).
"""

import hashlib
import math
import os

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from nanopost import pairs
from nanopost.checkpoints import load_reference, safe_load, weights_fingerprint
from nanopost.distributed import all_reduce_sum, chunks, over_ranks
from nanopost.evaluation import evaluate_policy, write_samples
from model import sequence_logprobs
from nanopost.passports import preference_passport, write_passport
from nanopost.token_records import keep_pairs
from model import SharedPrompts

starts_from = {"init_from": "sft"}  # its pairs are sampled from the starting policy: no random start (options.check_start)
defaults = dict(
    beta=0.1,                    # β: the strength of the anchor to π_ref (the scale of the implicit reward)
    share_prompt=True,           # run each prompt once for both responses where it saves work (model.SharedPrompts); False: never
    **pairs.PAIR_DEFAULTS,
    # common keys: one pass over a small fixed pair set at a gentle lr, far below SFT's (at 1e-4
    # DPO's KL to the reference grew to ~5 nats and held-out accuracy fell further)
    learning_rate=3e-5, min_lr=3e-6, warmup_iters=10, max_iters=60, batch_size=16, eval_interval=60,
    eval_samples=1,              # one held-out answer per problem at T = 1: the KL drift to π_ref on it
)
PAIR_FIGURES = ("n", "loss", "pref_acc", "margin", "reward_chosen", "reward_rejected", "len_chosen", "len_rejected",
                "logp_chosen", "logp_rejected")  # (logged as val_<figure> by evaluate, "n" the count)


# ----------------------------------------------------------------------------------------------
# 1. The pairs and π_ref's log-probs of them, once

def setup(run, saved):
    """π_ref (the frozen starting policy), the pairs, and π_ref's log-probs of both answers of every pair."""
    state = load_pairs(run)
    state.ref_cache_path = attach_reference(run, state.reference, [state.train_examples, state.heldout_examples])
    write_passport(run, preference_passport(
        run, f"the DPO loss (SPEC §3), β = {run.cfg['beta']}; the reference's log-probs computed once and cached",
        references=f"π_ref = `{run.cfg['init_from']}` frozen"))
    return state


def load_pairs(run):
    """π_ref and the pairs (pairs.load_preferences; the built-in ones sampled by π_ref), a few written
    to samples.txt. π_ref also gives the KL drift at evaluation."""
    reference = load_reference(run)
    train_pairs, heldout_pairs, skipped = pairs.load_preferences(run, reference)
    write_samples(run, 0, [pairs.describe(run, ex) for ex in train_pairs[:4]])
    return SimpleNamespace(reference=reference, train_examples=train_pairs, heldout_examples=heldout_pairs,
                           skipped_rows=skipped)


def sequence_sums(run, model, batch):
    """One forward over the batch's rows: (log-prob sums, response lengths), each split into the
    examples' first and second responses. With share_prompt the two rows of an example run their
    common prompt once, where that runs fewer positions than two full rows (on ragged prompts it may
    not: model.SharedPrompts.saves_work)."""
    ids, lens = batch["ids"], batch["prompt_lens"]  # rows i and i + B answer example i's prompt
    share = run.cfg["share_prompt"] and SharedPrompts.saves_work(lens, ids.size(1), len(lens) // 2)
    token_lp = sequence_logprobs(model, ids, prompt_lens=lens if share else None) * batch["mask"]
    sums, lengths = token_lp.sum(1), batch["mask"].sum(1)
    return sums.chunk(2), lengths.chunk(2)


@torch.no_grad()
def reference_sums(run, reference, examples):
    """(N, 2) log π_ref sums of every example's two responses, the chunks shared out over the ranks."""
    def chunk_sums(chunk, i):
        with run.autocast:
            (a, b), _ = sequence_sums(run, reference, pairs.collate(run, chunk))
        return torch.stack([a, b], 1).float().cpu()
    return torch.cat(over_ranks(run, examples, run.cfg["eval_batch_size"], chunk_sums) or [torch.zeros(0, 2)])


def cache_key(run, reference, example_sets):
    """Changes when the tokenizer, any token id (template included), the reference weights or the number
    of example sets change."""
    h = hashlib.sha256(f"{run.tok.name}|{weights_fingerprint(reference)}|{len(example_sets)}".encode())
    for examples in example_sets:
        for ex in examples:
            h.update(repr((ex["prompt"], ex["responses"])).encode())
    return h.hexdigest()


def attach_reference(run, reference, example_sets):
    """Put ex["ref"] = (log π_ref(resp 0), log π_ref(resp 1)) on every example, from the cache file
    when its key matches, else computed once (each rank some chunks, gathered; rank 0 writes).
    Returns the cache file's path."""
    key = cache_key(run, reference, example_sets)
    path = os.path.join(run.cfg["out_dir"], f"ref_logprobs_{key[:16]}.pt")
    cached = safe_load(path) if os.path.isfile(path) else None
    if cached is not None and cached["key"] == key:
        values = cached["values"]
    else:
        values = [reference_sums(run, reference, examples) for examples in example_sets]
        if run.master:  # (out_dir is made here: a run writes nothing else there before its setup succeeded)
            os.makedirs(run.cfg["out_dir"], exist_ok=True)
            torch.save(dict(key=key, values=values), path + ".tmp")
            os.replace(path + ".tmp", path)
    for examples, v in zip(example_sets, values):
        for ex, ref in zip(examples, v.tolist()):
            ex["ref"] = tuple(ref)
    return path


# ----------------------------------------------------------------------------------------------
# 2. Each iteration: a batch of pairs, the loss, its figures

def batches(run, state, it):
    """One optimizer step of the fixed pairs (a per-epoch shuffle, pairs.step_batches)."""
    steps = pairs.step_batches(run, it, state.train_examples)
    keep_pairs(run, it, steps, state.reference)  # a few iterations' tokens, for report.py
    return steps, {}


def dpo_loss(policy_lp_w, policy_lp_l, ref_lp_w, ref_lp_l, beta):
    """M14 §6, §13. Returns (loss, local slope |∂L/∂z| = σ(−z), z > 0)."""
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError("beta must be finite and positive")
    if not all(bool(torch.isfinite(v).all()) for v in (policy_lp_w, policy_lp_l, ref_lp_w, ref_lp_l)):
        raise ValueError("log probabilities must be finite")
    # z = β[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))],  L = −log σ(z)
    z = beta * ((policy_lp_w - ref_lp_w) - (policy_lp_l - ref_lp_l))
    return F.softplus(-z), torch.sigmoid(-z), z > 0  # softplus(−z) = −log σ(z) without overflow


def implicit_rewards(run, batch, sums):
    """r̂ = β · (log π_θ(y|x) − log π_ref(y|x)) of the chosen and of the rejected answer."""
    ref_w, ref_l = batch["ref"].unbind(1)
    return run.cfg["beta"] * (sums[0] - ref_w), run.cfg["beta"] * (sums[1] - ref_l)


def pair_losses(run, model, batch):
    """Per pair: the DPO loss, and the sums of its figures over the batch (pair_figures)."""
    sums, lengths = sequence_sums(run, model, batch)
    ref_w, ref_l = batch["ref"].unbind(1)
    losses = dpo_loss(sums[0], sums[1], ref_w, ref_l, run.cfg["beta"])[0]
    with torch.no_grad():
        return losses, pair_figures(sums, lengths, losses, *implicit_rewards(run, batch, sums))


def pair_figures(sums, lengths, losses, reward_w, reward_l):
    """Sums (not means) over the pairs of one batch: the loss, the rewards of chosen and rejected (in
    the method's own units), their margin, the pairs they order right, log-probs and lengths."""
    (lp_w, lp_l), (len_w, len_l) = sums, lengths
    return dict(loss=losses.sum(), reward_chosen=reward_w.sum(), reward_rejected=reward_l.sum(),
                margin=(reward_w - reward_l).sum(), pref_acc=(reward_w > reward_l).sum(),
                logp_chosen=lp_w.sum(), logp_rejected=lp_l.sum(), len_chosen=len_w.sum(),
                len_rejected=len_l.sum(), n=len(losses))


def means(figures):
    """Figures summed over pairs -> their means ("n": the count of pairs)."""
    return {k: v / max(figures["n"], 1.0) for k, v in figures.items() if k != "n"}


def step_figures(figures, batch):
    """The loss's logged figures: means over the micro-batch's pairs (the loop logs the loss itself)
    and its response tokens."""
    return {**{k: v for k, v in means(figures).items() if k != "loss"}, "tokens": batch["mask"].sum()}


def loss(run, state, model, batch):
    # L = −log σ(β[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))]), a mean over pairs
    losses, figures = pair_losses(run, model, batch)
    return losses.sum(), len(losses), step_figures(figures, batch)


# ----------------------------------------------------------------------------------------------
# 3. Evaluation

def evaluate(run, state, it):
    """Held-out pair figures (val_*), and on the built-in task the policy's figures: greedy held-out
    and OOD accuracy and length, and on sampled answers (T = 1) the KL drift to π_ref."""
    return heldout_figures(run, state, it, [pair_losses(run, run.raw_model, b)[1]
                                            for b in heldout_batches(run, state)])


def heldout_batches(run, state):
    """This rank's share of the held-out examples, eval_batch_size at a time, collated; the caller's
    forward on each batch runs without gradients, under the run's autocast."""
    for chunk in chunks(state.heldout_examples[run.rank::run.world_size], run.cfg["eval_batch_size"]):
        with torch.no_grad(), run.autocast:
            yield pairs.collate(run, chunk)


def heldout_figures(run, state, it, figures, keys=PAIR_FIGURES):
    """val_<key>: the means of the batches' figures over every rank's held-out examples (every key
    reduced, on ranks without examples too), and the policy's own figures."""
    totals = {k: sum(float(f[k]) for f in figures) for k in keys}
    return {**{f"val_{k}": v for k, v in means(all_reduce_sum(totals, run)).items()}, **policy_figures(run, state, it)}


@torch.no_grad()
def policy_figures(run, state, it):
    """On the built-in task (no --data): the policy's own held-out figures (evaluation.evaluate_policy)."""
    return {} if run.cfg["data"] else evaluate_policy(run, run.raw_model, it, state.reference)[0]
