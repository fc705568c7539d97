"""
SimPO: Simple Preference Optimization with a reference-free reward (Meng et al. 2024, arXiv:2405.14734).
SPEC §3 "Direct-method family".

    python train.py --algo simpo --init_from=out/sft

What changes from dpo.py: no reference model, and the reward is the policy's average log-prob per token,
so a longer answer is not favoured merely for having more tokens; a target margin γ asks the chosen
answer to win by more than a tie:

    ℓ̄(y) = log π_θ(y|x) / |y|                              (length-normalised, no π_ref)
    L_SimPO = −log σ(β(ℓ̄(y_w) − ℓ̄(y_l)) − γ)                 one term per pair

Its logged rewards are β·ℓ̄. The pairs and the figures are DPO's; π_ref is loaded only to sample the
built-in pairs and to measure the KL drift at evaluation, and no reference log-probs are computed.
"""

import torch
import torch.nn.functional as F

import dpo
from dpo import batches, starts_from  # noqa: F401  (what SimPO does not change)
from nanopost.passports import preference_passport, write_passport

base = "dpo"
defaults = dict(
    {k: v for k, v in dpo.defaults.items() if k != "beta"},  # (no π_ref: DPO's β has nothing to scale)
    simpo_beta=2.0,              # SimPO's reward scale β (on mean log-probs per token, hence much larger than DPO's)
    simpo_gamma=1.0,             # SimPO's target margin γ
)


def setup(run, saved):
    """DPO's pairs, without π_ref's log-probs (the loss reads no reference)."""
    state = dpo.load_pairs(run)
    write_passport(run, preference_passport(run, f"the {run.cfg['algo']} loss (SPEC §3); no reference model",
                                            references="none"))
    return state


def simpo_loss(mean_lp_w, mean_lp_l, beta, gamma):
    # ℓ̄ = log π_θ(y|x) / |y| (no reference),  L = −log σ(β(ℓ̄_w − ℓ̄_l) − γ)
    return F.softplus(-(beta * (mean_lp_w - mean_lp_l) - gamma))


def pair_losses(run, model, batch):
    """Per pair: the SimPO loss, and DPO's figures with SimPO's rewards β·ℓ̄."""
    sums, lengths = dpo.sequence_sums(run, model, batch)
    mean_w, mean_l = sums[0] / lengths[0], sums[1] / lengths[1]
    losses = simpo_loss(mean_w, mean_l, run.cfg["simpo_beta"], run.cfg["simpo_gamma"])
    with torch.no_grad():
        return losses, dpo.pair_figures(sums, lengths, losses, run.cfg["simpo_beta"] * mean_w,
                                        run.cfg["simpo_beta"] * mean_l)


def loss(run, state, model, batch):
    losses, figures = pair_losses(run, model, batch)  # −log σ(β(ℓ̄_w − ℓ̄_l) − γ)
    return losses.sum(), len(losses), dpo.step_figures(figures, batch)


def evaluate(run, state, it):
    return dpo.heldout_figures(run, state, it, [pair_losses(run, run.raw_model, b)[1]
                                                for b in dpo.heldout_batches(run, state)])
