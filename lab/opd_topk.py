"""
OPD with the reverse KL on the teacher's top k tokens (as served teachers return them; cf. Agarwal
et al. 2024, GKD, arXiv:2306.13649): K_t = the teacher's kl_topk most likely tokens, p̃ and q̃ = p
and q restricted to K_t and renormalised there,

    ℓ_t = Σ_{v∈K_t} p̃(v)(log p̃(v) − log q̃(v))

No variance and k numbers per token from the teacher, but biased: the student's mass outside K_t
(tokens the teacher rules out: what reverse KL exists to punish) is not penalised, and the values
are the KL between the renormalised distributions. kl_topk = V gives opd's full KL exactly.

    python train.py --algo opd_topk --init_from=out/sft --teacher=out/teacher --kl_topk=16
"""

import opd
from opd import batches, evaluate, on_policy, setup, starts_from  # noqa: F401  (what it does not change)

base = "opd"
defaults = dict(
    opd.defaults,
    kl_topk=16,                # k: the teacher's most likely tokens the KL is taken over (k = vocab size: opd's full KL)
)


def topk_kl(student_logprobs, teacher_logprobs, k):
    """The KL between p and q restricted to the teacher's k most likely tokens, renormalised there."""
    top = teacher_logprobs.topk(min(k, teacher_logprobs.size(-1)), dim=-1).indices
    top_p, top_q = student_logprobs.gather(-1, top), teacher_logprobs.gather(-1, top)
    top_p, top_q = top_p - top_p.logsumexp(-1, keepdim=True), top_q - top_q.logsumexp(-1, keepdim=True)
    return (top_p.exp() * (top_p - top_q)).sum(-1)


def loss(run, state, model, batch):
    logprobs = opd.student_logprobs(run, model, batch)
    per_token = topk_kl(logprobs, batch.teacher_logprobs, run.cfg["kl_topk"])
    return opd.masked_sums(per_token, opd.reverse_kl(logprobs, batch.teacher_logprobs), logprobs, batch.mask)
