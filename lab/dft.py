"""Dynamic fine-tuning, DFT (Wu et al. 2025, "On the Generalization of SFT: A Reinforcement Learning
Perspective with Reward Rectification", arXiv:2508.05629): SFT's gradient is a policy gradient whose
implicit reward is 1/π_θ(y_t) on the demonstrated token, huge where the model finds the token unlikely.
DFT rectifies it by weighting each token's loss with its own probability, detached:

    L = − Σ_t m_t · sg(π_θ(x_{t+1} | x_≤t)) · log π_θ(x_{t+1} | x_≤t)  /  Σ_t m_t

so ∇L = −Σ_t m_t·∇π_θ(x_{t+1} | x_≤t) / Σ_t m_t: every token's gradient is bounded, and a token the
model already finds unlikely pulls less. The validation loss stays SFT's (the plain NLL, comparable across
the two). Everything else is sft.py's.

    python train.py --algo dft                       # in place of --algo sft
"""

import sft
from sft import batches, evaluate, setup  # noqa: F401  (what DFT does not change)
from model import token_logprobs

base = "sft"
defaults = dict(sft.defaults)


def loss(run, state, model, batch):
    """The probability-weighted next-token loss of a collated (ids, mask) micro-batch."""
    ids, mask = batch
    loss_sum, count = dft_nll_of(model(ids[:, :-1]), ids, mask)
    return loss_sum, count, {"tokens": count}


def dft_nll_of(logits, ids, mask):
    """(Σ m·sg(p)·(−log p), Σ m), p = π_θ(ids[t+1] | ids[:t+1]), from the logits of ids[:, :-1]."""
    m = mask[:, 1:]
    logp = token_logprobs(logits, ids[:, 1:])
    return -(logp.detach().exp() * logp * m).sum(), m.sum()
