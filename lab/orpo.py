"""
ORPO: Odds Ratio Preference Optimization, monolithic preference optimisation without a reference model
(Hong et al. 2024, arXiv:2403.07691). SPEC §3 "Direct-method family".

    python train.py --algo orpo --init_from=out/sft

What changes from dpo.py: no reference model, and one stage instead of SFT then DPO: the loss is SFT's
negative log-likelihood of the chosen answer plus λ times an odds-ratio penalty on the rejected one. With
the per-token likelihood p = exp(ℓ̄), ℓ̄(y) = log π_θ(y|x) / |y|,

    log odds(y) = log(p / (1 − p))
    L_ORPO = −ℓ̄(y_w) + λ · (−log σ(log odds(y_w) − log odds(y_l)))       one term per pair

Its logged rewards are the log-odds. The pairs, and the reference-free setup, are SimPO's (lab/simpo.py).
"""

import torch
import torch.nn.functional as F

import dpo
from dpo import batches, starts_from  # noqa: F401  (what ORPO does not change)
from lab.simpo import setup  # noqa: F401  (DPO's pairs, no reference log-probs)

base = "dpo"
defaults = dict(
    {k: v for k, v in dpo.defaults.items() if k != "beta"},  # (no π_ref: DPO's β has nothing to scale)
    orpo_lambda=0.1,             # ORPO's weight λ of the odds-ratio term next to the NLL of the chosen answer
)


def log_odds(mean_lp):
    """log(p / (1 − p)) of the per-token likelihood p = exp(ℓ̄); ℓ̄ is kept just below 0, where
    log(1 − p) = log(−expm1(ℓ̄)) would be −inf."""
    mean_lp = mean_lp.clamp(max=-1e-6)
    return mean_lp - torch.log(-torch.expm1(mean_lp))


def orpo_loss(mean_lp_w, mean_lp_l, lam):
    # L = −ℓ̄_w + λ · (−log σ(log odds(y_w) − log odds(y_l))): SFT on the chosen answer plus an
    # odds-ratio penalty on the rejected one, one stage, no reference
    return -mean_lp_w + lam * F.softplus(-(log_odds(mean_lp_w) - log_odds(mean_lp_l)))


def pair_losses(run, model, batch):
    """Per pair: the ORPO loss, and DPO's figures with the log-odds as rewards."""
    sums, lengths = dpo.sequence_sums(run, model, batch)
    mean_w, mean_l = sums[0] / lengths[0], sums[1] / lengths[1]
    losses = orpo_loss(mean_w, mean_l, run.cfg["orpo_lambda"])
    with torch.no_grad():
        return losses, dpo.pair_figures(sums, lengths, losses, log_odds(mean_w), log_odds(mean_l))


def loss(run, state, model, batch):
    losses, figures = pair_losses(run, model, batch)  # −ℓ̄_w + λ·(−log σ(log odds(y_w) − log odds(y_l)))
    return losses.sum(), len(losses), dpo.step_figures(figures, batch)


def evaluate(run, state, it):
    return dpo.heldout_figures(run, state, it, [pair_losses(run, run.raw_model, b)[1]
                                                for b in dpo.heldout_batches(run, state)])
