"""
Off-policy distillation, the baseline OPD is measured against (sequence-level KD, Kim & Rush 2016,
arXiv:1606.07947): the *teacher* samples the answers for the same prompts and the student is
trained by cross-entropy on them,

    ℓ_t = −log p(y_t),   y ~ π_t

SFT on teacher samples: a one-sample estimate of the gradient of the forward KL(π_t‖π_s) =
E_{y~π_t}[log π_t(y) − log π_s(y)] on the teacher's own prefixes (the student never sees where its
own mistakes lead). rollout_tokens counts the teacher's samples; verifier_acc and work_frac
describe them; reverse_kl logs the exact KL_t on the teacher's answers.

    python train.py --algo opd_teacher_samples --init_from=out/sft --teacher=out/teacher
"""

import opd
from opd import evaluate, on_policy, setup, starts_from  # noqa: F401  (what it does not change)

base = "opd"
defaults = dict(opd.defaults)


def batches(run, state, it):
    shards = [rollout_shard(run, state, it, s) for s in opd.my_shards(run)]
    opd.keep_rollouts(run, it, [ro for ro, _ in shards])  # tokens.jsonl, for report.py
    return [opd.micro_batches(run, shards)], opd.figures(run, state, shards)


def rollout_shard(run, state, it, shard):
    """opd.rollout_shard with the teacher writing the answers (and grading them, for the log)."""
    ro = opd.sample(run, state.teacher, it, shard)
    return opd.graded(run, state.teacher, ro, [problem["prompt"] for problem in ro.problems])


def loss(run, state, model, batch):
    logprobs = opd.student_logprobs(run, model, batch)
    per_token = cross_entropy(logprobs, batch.ids[:, 1:])
    return opd.masked_sums(per_token, opd.reverse_kl(logprobs, batch.teacher_logprobs), logprobs, batch.mask)


def cross_entropy(student_logprobs, targets):
    """ℓ_t = −log p(y_t) of the token the teacher sampled."""
    return -student_logprobs.gather(-1, targets[..., None]).squeeze(-1)
