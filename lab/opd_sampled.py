"""
OPD with the one-sample estimator of the reverse KL (Thinking Machines, "On-Policy Distillation",
2025: the per-token reverse KL as an advantage): the sampled token's log-ratio is a per-token
advantage through the policy-gradient loss, p = π_s(·|c_t), q = π_t(·|c_t) at τ, y_t ~ p,

    a_t = −(log p(y_t) − log q(y_t)),        ℓ_t = −sg(a_t)·log p(y_t)

Unbiased for ∇KL_t: E_{y~p}[(log p(y) − log q(y)) ∇log p(y)] = Σ_v ∇p(v)(log p(v) − log q(v)) = ∇KL_t,
because Σ_v p ∇log p = ∇Σ_v p = 0. Needs one teacher log-prob per token (what a served teacher
returns cheaply), but a one-sample estimate: its variance grows with the log-ratio's spread under
p, largest where student and teacher disagree. Unbiased only on fresh samples of the current π_s at
τ with no top-k/top-p, which is why every batch is used for exactly one step. reverse_kl still logs
the exact KL_t (here the teacher's whole distribution is held for that log).

    python train.py --algo opd_sampled --init_from=out/sft --teacher=out/teacher
"""

import opd
from opd import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what it does not change)

base = "opd"
defaults = dict(opd.defaults)


def sampled_kl(student_logprobs, targets, teacher_logprobs):
    """ℓ_t = −sg(a_t)·log p(y_t), a_t = −(log p(y_t) − log q(y_t))."""
    logp = student_logprobs.gather(-1, targets[..., None]).squeeze(-1)
    teacher_logp = teacher_logprobs.gather(-1, targets[..., None]).squeeze(-1)
    advantage = -(logp - teacher_logp).detach()
    return -advantage * logp


def loss(run, state, model, batch):
    logprobs = opd.student_logprobs(run, model, batch)
    per_token = sampled_kl(logprobs, batch.ids[:, 1:], batch.teacher_logprobs)
    return opd.masked_sums(per_token, opd.reverse_kl(logprobs, batch.teacher_logprobs), logprobs, batch.mask)
