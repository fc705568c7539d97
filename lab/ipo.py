"""
IPO: Identity Preference Optimisation (Azar et al. 2023, "A General Theoretical Paradigm to Understand
Learning from Human Preferences", arXiv:2310.12036). SPEC §3 "Direct-method family".

    python train.py --algo ipo --init_from=out/sft

What changes from dpo.py: the loss only. DPO's −log σ(βh) keeps pushing a pair apart however far apart
it already is (the loss tends to 0 only as h → ∞), so near-tied or noisy pairs are over-fitted. IPO
regresses the log-ratio margin onto a bounded target instead:

    h = (log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))
    L_IPO = (h − 1/(2β))²                                     one term per pair

The pairs, π_ref's cached log-probs, the implicit rewards β·(log π_θ − log π_ref) and the figures are DPO's.
"""

import torch

import dpo
from dpo import batches, setup, starts_from  # noqa: F401  (what IPO does not change)

base = "dpo"
defaults = dict(dpo.defaults)  # DPO's keys: β sets IPO's target margin 1/(2β)


def ipo_loss(policy_lp_w, policy_lp_l, ref_lp_w, ref_lp_l, beta):
    # h = (log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l)),  L = (h − 1/(2β))²
    h = (policy_lp_w - ref_lp_w) - (policy_lp_l - ref_lp_l)
    return (h - 1 / (2 * beta)) ** 2


def pair_losses(run, model, batch):
    """Per pair: the IPO loss, and DPO's figures."""
    sums, lengths = dpo.sequence_sums(run, model, batch)
    ref_w, ref_l = batch["ref"].unbind(1)
    losses = ipo_loss(sums[0], sums[1], ref_w, ref_l, run.cfg["beta"])
    with torch.no_grad():
        return losses, dpo.pair_figures(sums, lengths, losses, *dpo.implicit_rewards(run, batch, sums))


def loss(run, state, model, batch):
    losses, figures = pair_losses(run, model, batch)  # (h − 1/(2β))²
    return losses.sum(), len(losses), dpo.step_figures(figures, batch)


def evaluate(run, state, it):
    return dpo.heldout_figures(run, state, it, [pair_losses(run, run.raw_model, b)[1]
                                                for b in dpo.heldout_batches(run, state)])
