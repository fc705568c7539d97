"""
Direct preference methods: DPO and its family (IPO, KTO, SimPO, ORPO). SPEC §3 "DPO",
"Direct-method family"; M14 §6–8.

    python train.py --algo dpo config/dpo.py --init_from=out/sft --loss=dpo   # or ipo | kto | simpo | orpo
    python train.py --algo dpo --init_from=out/sft --pairs=online             # online: dpo_online.py

Offline: the pairs are fixed (pairs.py builds them: verifier- or style-labelled answers of the SFT
model, or a file), nothing is sampled during training. Online (--pairs=online, dpo_online.py, chosen
once in setup): every few iterations a round of pairs sampled from the current policy and labelled,
the same losses on them, π_ref still the starting policy. Log-probs of a response are sums over its
tokens only: logits shifted by one, prompt and padding excluded, the same chat template for policy
and reference (model.sequence_logprobs and the 0/1 response mask):

    log π(y | x) = Σ_t m_t · log π(x_{t+1} | x_≤t)

With DPO, IPO and KTO the reference π_ref (the frozen init_from model) enters only through these
sums on the fixed data, so they are computed once at setup and cached, in memory and in out_dir
(keyed by a hash of the tokenizer, every token id and the reference weights: change any of them
and the cache is rebuilt). No reference forward runs during training; π_ref is loaded again only
at evaluation, to estimate the KL drift on the policy's own samples. SimPO and ORPO need no
reference at all.

Every loss is a mean over pairs (KTO: over single examples), count = examples.
"""

import hashlib
import math
import os

from types import SimpleNamespace

import torch
import torch.nn.functional as F

import dpo_online
from nanopost import pairs
from nanopost.checkpoints import load_reference, safe_load, weights_fingerprint
from nanopost.distributed import all_reduce_sum, chunks, over_ranks
from nanopost.evaluation import evaluate_policy, write_samples
from model import sequence_logprobs
from nanopost.passports import preference_passport, write_passport
from model import SharedPrompts

LOSSES = ("dpo", "ipo", "kto", "simpo", "orpo")
USES_REFERENCE = ("dpo", "ipo", "kto")

starts_from = {"init_from": "sft"}  # its pairs are sampled from the starting policy: no random start (options.check_start)
defaults = dict(
    loss="dpo",                  # dpo | ipo | kto | simpo | orpo
    beta=0.1,                    # DPO / IPO / KTO: strength of the anchor to π_ref
    simpo_beta=2.0,              # SimPO's reward scale (on mean log-probs, hence much larger)
    simpo_gamma=1.0,             # SimPO's target margin γ
    orpo_lambda=0.1,             # ORPO: weight λ of the odds-ratio term next to the NLL
    kto_desirable_weight=1.0,    # KTO λ_D
    kto_undesirable_weight=1.0,  # KTO λ_U
    share_prompt=True,           # run each prompt once for both responses where it saves work (model.SharedPrompts); False: never
    **pairs.PAIR_DEFAULTS,
    **dpo_online.OPTIONS,        # pairs=online: its rounds and labeler
    # common keys: one pass over a small fixed pair set at a gentle lr, far below SFT's (at 1e-4
    # DPO's KL to the reference grew to ~5 nats and held-out accuracy fell further)
    learning_rate=3e-5, min_lr=3e-6, warmup_iters=10, max_iters=60, batch_size=16, eval_interval=60,
    eval_samples=1,              # one held-out answer per problem at T = 1: the KL drift to π_ref on it
)


# ----------------------------------------------------------------------------------------------
# The losses, elementwise over examples. Inputs are sequence log-prob sums (or means: ℓ̄ = sum / |y|).

def dpo_loss(policy_lp_w, policy_lp_l, ref_lp_w, ref_lp_l, beta):
    """M14 §6, §13. Returns (loss, local slope |∂L/∂z| = σ(−z), z > 0)."""
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError("beta must be finite and positive")
    if not all(bool(torch.isfinite(v).all()) for v in (policy_lp_w, policy_lp_l, ref_lp_w, ref_lp_l)):
        raise ValueError("log probabilities must be finite")
    # z = β[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))],  L = −log σ(z)
    z = beta * ((policy_lp_w - ref_lp_w) - (policy_lp_l - ref_lp_l))
    return F.softplus(-z), torch.sigmoid(-z), z > 0  # softplus(−z) = −log σ(z) without overflow


def ipo_loss(policy_lp_w, policy_lp_l, ref_lp_w, ref_lp_l, beta):
    # h = (log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l)),  L = (h − 1/(2β))²:
    # a bounded target margin, so near-tied or noisy pairs are not pushed apart without end
    h = (policy_lp_w - ref_lp_w) - (policy_lp_l - ref_lp_l)
    return (h - 1 / (2 * beta)) ** 2


def kto_loss(policy_lp, ref_lp, desirable, z_ref, beta, desirable_weight, undesirable_weight):
    # r = log π_θ(y|x) − log π_ref(y|x), z_ref = detached KL(π_θ‖π_ref) estimate ≥ 0,
    # v = λ_D σ(β(r − z_ref)) if desirable else λ_U σ(β(z_ref − r)),  L = λ_y − v
    r = policy_lp - ref_lp
    value = torch.where(desirable, desirable_weight * torch.sigmoid(beta * (r - z_ref)),
                        undesirable_weight * torch.sigmoid(beta * (z_ref - r)))
    return torch.where(desirable, desirable_weight, undesirable_weight) - value


def simpo_loss(mean_lp_w, mean_lp_l, beta, gamma):
    # ℓ̄ = log π_θ(y|x) / |y| (no reference),  L = −log σ(β(ℓ̄_w − ℓ̄_l) − γ)
    return F.softplus(-(beta * (mean_lp_w - mean_lp_l) - gamma))


def log_odds(mean_lp):
    """log(p / (1 − p)) of the per-token likelihood p = exp(ℓ̄); ℓ̄ is kept just below 0, where
    log(1 − p) = log(−expm1(ℓ̄)) would be −inf."""
    mean_lp = mean_lp.clamp(max=-1e-6)
    return mean_lp - torch.log(-torch.expm1(mean_lp))


def orpo_loss(mean_lp_w, mean_lp_l, lam):
    # L = −ℓ̄_w + λ · (−log σ(log odds(y_w) − log odds(y_l))): SFT on the chosen answer plus an
    # odds-ratio penalty on the rejected one, one stage, no reference
    return -mean_lp_w + lam * F.softplus(-(log_odds(mean_lp_w) - log_odds(mean_lp_l)))


# ----------------------------------------------------------------------------------------------
# Sequence log-probs and the reference cache

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


def cache_key(run, reference, example_sets):
    """Changes when the tokenizer, any token id (template included) or the reference weights change."""
    h = hashlib.sha256(f"{run.tok.name}|{weights_fingerprint(reference)}".encode())
    for examples in example_sets:
        for ex in examples:
            h.update(repr((ex["prompt"], ex["responses"])).encode())
    return h.hexdigest()


@torch.no_grad()
def reference_logprobs(run, reference, examples):
    """(N, 2) log π_ref sums of every example's two responses, the chunks shared out over the ranks."""
    def chunk_sums(chunk, i):
        with run.autocast:
            (a, b), _ = sequence_sums(run, reference, pairs.collate(run, chunk))
        return torch.stack([a, b], 1).float().cpu()
    return torch.cat(over_ranks(run, examples, run.cfg["eval_batch_size"], chunk_sums) or [torch.zeros(0, 2)])


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
        values = [reference_logprobs(run, reference, examples) for examples in example_sets]
        if run.master:  # (out_dir is made here: a run writes nothing else there before its setup succeeded)
            os.makedirs(run.cfg["out_dir"], exist_ok=True)
            torch.save(dict(key=key, values=values), path + ".tmp")
            os.replace(path + ".tmp", path)
    for examples, v in zip(example_sets, values):
        for ex, ref in zip(examples, v.tolist()):
            ex["ref"] = tuple(ref)
    return path


# ----------------------------------------------------------------------------------------------
# Per-example loss and implicit rewards of the chosen --loss

def preference_terms(run, batch, sums, lengths, z_ref=None):
    """Per-example (loss, reward of response 0, reward of response 1), rewards in each method's own
    units: β·log(π_θ/π_ref) for DPO / IPO / KTO, SimPO's β·ℓ̄, ORPO's log-odds."""
    cfg, kind = run.cfg, run.cfg["loss"]
    (lp_a, lp_b), (len_a, len_b) = sums, lengths
    if kind in USES_REFERENCE:
        ref_a, ref_b = batch["ref"].unbind(1)
        reward_a, reward_b = cfg["beta"] * (lp_a - ref_a), cfg["beta"] * (lp_b - ref_b)
    if kind == "dpo":
        losses = dpo_loss(lp_a, lp_b, ref_a, ref_b, cfg["beta"])[0]
    elif kind == "ipo":
        losses = ipo_loss(lp_a, lp_b, ref_a, ref_b, cfg["beta"])
    elif kind == "kto":  # response 1 is the mismatched completion: it only feeds z_ref
        losses = kto_loss(lp_a, ref_a, batch["label"] > 0, z_ref, cfg["beta"],
                          cfg["kto_desirable_weight"], cfg["kto_undesirable_weight"])
    elif kind == "simpo":
        mean_a, mean_b = lp_a / len_a, lp_b / len_b
        losses = simpo_loss(mean_a, mean_b, cfg["simpo_beta"], cfg["simpo_gamma"])
        reward_a, reward_b = cfg["simpo_beta"] * mean_a, cfg["simpo_beta"] * mean_b
    elif kind == "orpo":
        mean_a, mean_b = lp_a / len_a, lp_b / len_b
        losses = orpo_loss(mean_a, mean_b, cfg["orpo_lambda"])
        reward_a, reward_b = log_odds(mean_a), log_odds(mean_b)
    return losses, reward_a, reward_b


def mismatched_kl(batch, sums):
    """KTO's reference point terms: Σ over the batch of log π_θ(y_j|x_i) − log π_ref(y_j|x_i) on
    the mismatched pairs, detached (no gradient through z_ref), and their count."""
    return float((sums[1] - batch["ref"][:, 1]).detach().sum()), len(sums[1])


def example_metrics(run, batch, sums, lengths, losses, reward_a, reward_b):
    """Sums (not means) of the logged figures over the examples of one batch."""
    (lp_a, lp_b), (len_a, len_b) = sums, lengths
    if run.cfg["loss"] == "kto":
        desirable = (batch["label"] > 0).float()
        return dict(loss=losses.sum(), reward_desirable=(reward_a * desirable).sum(),
                    reward_undesirable=(reward_a * (1 - desirable)).sum(), n_desirable=desirable.sum(),
                    logp=lp_a.sum(), length=len_a.sum(), n=len(losses))
    return dict(loss=losses.sum(), reward_chosen=reward_a.sum(), reward_rejected=reward_b.sum(),
                margin=(reward_a - reward_b).sum(), pref_acc=(reward_a > reward_b).sum(),
                logp_chosen=lp_a.sum(), logp_rejected=lp_b.sum(), len_chosen=len_a.sum(),
                len_rejected=len_b.sum(), n=len(losses))


def as_means(sums):
    """Turn example_metrics sums into means (KTO's rewards over their own class)."""
    n, n_d = sums["n"], sums.get("n_desirable")
    out = {}
    for k, v in sums.items():
        if k in ("n", "n_desirable"):
            continue
        denominator = n_d if k == "reward_desirable" else n - n_d if k == "reward_undesirable" else n
        # (tensors in the loss, read once per step by the loop; Python numbers in evaluation)
        out[k] = v / (denominator.clamp(min=1) if torch.is_tensor(denominator) else max(denominator, 1.0))
    return out


# ----------------------------------------------------------------------------------------------
# The algorithm

def setup(run, saved):
    """π_ref (the frozen starting policy), the pairs (KTO: single labelled examples) and, for the
    losses that read π_ref, its log-probs of every response, once. pairs=online: the held-out pairs
    here, each round's train pairs sampled later (dpo_online.py)."""
    cfg = run.cfg
    if cfg["loss"] not in LOSSES:
        raise ValueError(f"loss={cfg['loss']!r}: choose from {LOSSES}")
    dpo_online.check_config(run)
    reference = load_reference(run)  # the pairs' sampler, the reference log-probs, the KL at evaluation
    kto = cfg["loss"] == "kto"  # KTO learns from single labelled examples, the others from pairs
    train_examples, heldout_examples, transcripts, skipped = pairs.load_preferences(run, reference, singles=kto)
    uses_ref = cfg["loss"] in USES_REFERENCE
    cache = attach_reference(run, reference, [train_examples, heldout_examples]) if uses_ref else None
    write_samples(run, 0, transcripts)
    write_passport(run, preference_passport(
        run, f"the {cfg['loss']} loss (SPEC §3), β = {cfg['beta']}" + ("; the reference's log-probs computed once and "
                                                                     "cached" if uses_ref else "; no reference model"),
        references=f"π_ref = `{cfg['init_from']}` frozen" if uses_ref else "none"))
    state = SimpleNamespace(reference=reference, train_examples=train_examples, heldout_examples=heldout_examples,
                            skipped_rows=skipped, ref_cache_path=cache, batches=fixed_pairs)
    if cfg["pairs"] == "online":  # state.batches = a round of pairs from the current policy every online_every iterations
        dpo_online.setup(run, state, saved, (lambda examples: reference_logprobs(run, reference, examples)) if uses_ref
                         else None)
    return state


def fixed_pairs(run, state, it):
    """Offline: one optimizer step of the fixed pairs (a per-epoch shuffle, pairs.step_batches)."""
    return pairs.step_batches(run, it, state.train_examples), {}


def batches(run, state, it):
    return state.batches(run, state, it)  # fixed_pairs; pairs=online: dpo_online.round_batches


def state_dict(run, state):
    """pairs=online: the round's pairs (a resumed run trains on those the interrupted one sampled); offline: nothing."""
    return dpo_online.state_dict(state) if run.cfg["pairs"] == "online" else None


def loss(run, state, model, batch):
    sums, lengths = sequence_sums(run, model, batch)
    z_ref = None
    if run.cfg["loss"] == "kto":  # the KL estimate of the whole step batch, over all ranks
        kl_sum, kl_count = all_reduce_sum(mismatched_kl(batch, sums), run)
        z_ref = max(kl_sum / kl_count, 0.0)
    losses, reward_a, reward_b = preference_terms(run, batch, sums, lengths, z_ref)
    with torch.no_grad():
        metrics = as_means(example_metrics(run, batch, sums, lengths, losses, reward_a, reward_b))
    metrics.pop("loss")  # (the loop logs the loss itself)
    if z_ref is not None:
        metrics["kto_z_ref"] = z_ref
    return losses.sum(), len(losses), {**metrics, "tokens": batch["mask"].sum()}


@torch.no_grad()
def evaluate(run, state, it):
    """Held-out preference figures (val_*), and on the built-in task the policy's figures: greedy
    held-out and OOD accuracy and length, and on sampled answers (T = 1) the KL drift to π_ref."""
    model = run.raw_model
    totals = {}
    with run.autocast:
        for chunk in chunks(state.heldout_examples[run.rank::run.world_size], run.cfg["eval_batch_size"]):
            batch = pairs.collate(run, chunk)
            sums, lengths = sequence_sums(run, model, batch)
            z_ref = None
            if run.cfg["loss"] == "kto":  # this chunk's own estimate: ranks may hold different chunk counts
                kl_sum, kl_count = mismatched_kl(batch, sums)
                z_ref = max(kl_sum / kl_count, 0.0)
            terms = preference_terms(run, batch, sums, lengths, z_ref)
            for k, v in example_metrics(run, batch, sums, lengths, *terms).items():
                totals[k] = totals.get(k, 0.0) + float(v)
    keys = ["n", "loss", "pref_acc", "margin", "reward_chosen", "reward_rejected", "len_chosen", "len_rejected",
            "logp_chosen", "logp_rejected"] if run.cfg["loss"] != "kto" else \
        ["n", "n_desirable", "loss", "reward_desirable", "reward_undesirable", "logp", "length"]
    reduced = all_reduce_sum({k: totals.get(k, 0.0) for k in keys}, run)  # every key, on ranks without examples too
    metrics = {f"val_{k}": v for k, v in as_means(reduced).items()}
    if not run.cfg["data"]:
        metrics.update(evaluate_policy(run, model, it, state.reference)[0])
    return metrics
