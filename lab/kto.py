"""
KTO: Kahneman–Tversky Optimization (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic
Optimization", arXiv:2402.01306). SPEC §3 "Direct-method family".

    python train.py --algo kto --init_from=out/sft
    python train.py --algo kto --data=rows.jsonl              # {"prompt", "completion", "label": bool} rows, or pairs

What changes from dpo.py: KTO learns from single answers labelled desirable or not, not from pairs (a
pair gives two: its chosen answer desirable, its rejected one undesirable). Each answer's implicit
reward is measured against a reference point z_ref, an estimate of KL(π_θ ‖ π_ref) from mismatched
pairs (x_i, y_j), answers given to another prompt, detached (no gradient flows through it):

    r = log π_θ(y|x) − log π_ref(y|x)
    z_ref = max(0, mean_j [log π_θ(y_j|x_i) − log π_ref(y_j|x_i)])     over the step's batch, all ranks
    v = λ_D σ(β(r − z_ref))  if y is desirable,   λ_U σ(β(z_ref − r))  if not
    L_KTO = λ_y − v                                           one term per answer, count = answers

π_ref's log-probs of both (the answer and its mismatched one) are cached as DPO's. Logged: the reward
β·r of desirable and undesirable answers (each over its own class), kto_z_ref, log-prob and length.
"""

from types import SimpleNamespace

import torch

import dpo
from nanopost import pairs
from nanopost.checkpoints import load_reference
from nanopost.distributed import all_reduce_sum
from dpo import batches, starts_from  # noqa: F401  (what KTO does not change)
from nanopost.evaluation import write_samples
from nanopost.passports import preference_passport, write_passport
from nanopost.rollouts import response_text

base = "dpo"
defaults = dict(
    dpo.defaults,
    kto_desirable_weight=1.0,    # KTO's λ_D, the weight of desirable answers
    kto_undesirable_weight=1.0,  # KTO's λ_U, the weight of undesirable answers
)
KTO_FIGURES = ("n", "n_desirable", "loss", "reward_desirable", "reward_undesirable", "logp", "length")


# ----------------------------------------------------------------------------------------------
# Single labelled answers, each with a mismatched one

def setup(run, saved):
    """π_ref, the single labelled answers (a file's, or split from pairs), each given a mismatched
    answer, and π_ref's log-probs of both, once."""
    reference = load_reference(run)
    train, heldout, skipped = pairs.load_preferences(run, reference, singles=True)
    train, heldout = add_mismatched(run, as_singles(train)), add_mismatched(run, as_singles(heldout))
    write_samples(run, 0, [describe(run, ex) for ex in train[:4]])
    state = SimpleNamespace(reference=reference, train_examples=train, heldout_examples=heldout, skipped_rows=skipped)
    state.ref_cache_path = dpo.attach_reference(run, reference, [train, heldout])
    write_passport(run, preference_passport(
        run, f"the kto loss (SPEC §3), β = {run.cfg['beta']}; the reference's log-probs computed once and cached",
        references=f"π_ref = `{run.cfg['init_from']}` frozen"))
    return state


def as_singles(examples):
    """Single labelled answers: a pair's chosen answer desirable (label 1), its rejected one not (0); a
    file's single rows as they are."""
    if not examples or examples[0]["responses"][1] is None:
        return examples
    return [dict(prompt=p["prompt"], responses=(p["responses"][j], None), masks=(p["masks"][j], None), label=1.0 - j)
            for p in examples for j in (0, 1)]


def add_mismatched(run, singles):
    """Give each single example the completion of the next example with another prompt: the pair
    (x_i, y_j) on which KTO estimates its KL reference point. Deterministic, so cacheable."""
    n = len(singles)
    for i, ex in enumerate(singles):
        for shift in range(1, n):
            other = singles[(i + shift) % n]
            if other["prompt"] != ex["prompt"] and len(ex["prompt"]) + len(other["responses"][0]) <= run.cfg["block_size"]:
                ex["responses"] = (ex["responses"][0], other["responses"][0])
                ex["masks"] = (ex["masks"][0], other["masks"][0])
                break
        else:
            raise ValueError("KTO needs examples of at least two different prompts (for its mismatched-pair KL)")
    return singles


def describe(run, ex):
    """A single example as text, for samples.txt."""
    answer = response_text(run, ex["responses"][0])
    return f"[single] {run.tok.decode(ex['prompt'])}\n  {'desirable' if ex['label'] else 'undesirable'}: {answer!r}"


# ----------------------------------------------------------------------------------------------
# The loss

def kto_loss(policy_lp, ref_lp, desirable, z_ref, beta, desirable_weight, undesirable_weight):
    # r = log π_θ(y|x) − log π_ref(y|x), z_ref = detached KL(π_θ‖π_ref) estimate ≥ 0,
    # v = λ_D σ(β(r − z_ref)) if desirable else λ_U σ(β(z_ref − r)),  L = λ_y − v
    r = policy_lp - ref_lp
    value = torch.where(desirable, desirable_weight * torch.sigmoid(beta * (r - z_ref)),
                        undesirable_weight * torch.sigmoid(beta * (z_ref - r)))
    return torch.where(desirable, desirable_weight, undesirable_weight) - value


def mismatched_kl(batch, sums):
    """KTO's reference point terms: Σ over the batch of log π_θ(y_j|x_i) − log π_ref(y_j|x_i) on
    the mismatched pairs, detached (no gradient through z_ref), and their count."""
    return float((sums[1] - batch["ref"][:, 1]).detach().sum()), len(sums[1])


def kto_losses(run, batch, sums, lengths, z_ref):
    """Per answer: the KTO loss, and the sums of its figures over the batch."""
    cfg, desirable = run.cfg, batch["label"] > 0
    losses = kto_loss(sums[0], batch["ref"][:, 0], desirable, z_ref, cfg["beta"], cfg["kto_desirable_weight"],
                      cfg["kto_undesirable_weight"])
    with torch.no_grad():
        reward, d = cfg["beta"] * (sums[0] - batch["ref"][:, 0]), desirable.float()
        return losses, dict(loss=losses.sum(), reward_desirable=(reward * d).sum(),
                            reward_undesirable=(reward * (1 - d)).sum(), n_desirable=d.sum(),
                            logp=sums[0].sum(), length=lengths[0].sum(), n=len(losses))


def class_means(figures):
    """Figures summed over answers -> means, each reward over its own class (desirable or not)."""
    n, n_d = figures["n"], figures["n_desirable"]
    counts = dict(reward_desirable=n_d, reward_undesirable=n - n_d)
    out = {}
    for k, v in figures.items():
        if k not in ("n", "n_desirable"):
            count = counts.get(k, n)  # (tensors in the loss, read once per step by the loop; numbers in evaluation)
            out[k] = v / (count.clamp(min=1) if torch.is_tensor(count) else max(count, 1.0))
    return out


def loss(run, state, model, batch):
    sums, lengths = dpo.sequence_sums(run, model, batch)
    kl_sum, kl_count = all_reduce_sum(mismatched_kl(batch, sums), run)  # z_ref of the whole step batch, all ranks
    z_ref = max(kl_sum / kl_count, 0.0)
    losses, figures = kto_losses(run, batch, sums, lengths, z_ref)  # λ_y − v(r, z_ref)
    metrics = {k: v for k, v in class_means(figures).items() if k != "loss"}  # (the loop logs the loss itself)
    return losses.sum(), len(losses), {**metrics, "kto_z_ref": z_ref, "tokens": batch["mask"].sum()}


def evaluate(run, state, it):
    figures = []
    for batch in dpo.heldout_batches(run, state):
        sums, lengths = dpo.sequence_sums(run, run.raw_model, batch)
        kl_sum, kl_count = mismatched_kl(batch, sums)  # this chunk's own z_ref: ranks may hold different chunk counts
        figures.append(kto_losses(run, batch, sums, lengths, max(kl_sum / kl_count, 0.0))[1])
    reduced = all_reduce_sum({k: sum(float(f[k]) for f in figures) for k in KTO_FIGURES}, run)
    return {**{f"val_{k}": v for k, v in class_means(reduced).items()}, **dpo.policy_figures(run, state, it)}
