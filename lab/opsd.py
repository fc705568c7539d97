"""
On-policy self-distillation (OPSD; SPEC §3 "OPSD"; seed chapter 7 "On-Policy Distillation"): the
teacher is the student's own current weights shown privileged context, the student sees only the
problem. The teacher reads a privileged prompt (envs.PRIVILEGED, chosen by `privileged`), then the
student's answer tokens unchanged:

    answer    the problem followed by "\n(Reference answer: <answer>)"
    solution  a verified worked solution, "(Reference solution: <env.solve(problem)>)", the
              demonstration the verifier accepts, in place of the problem's text (it names every
              operand and step)

and opd's per-token reverse KL to it, plus with anchor_coef = β > 0 a KL anchor to the starting
(SFT) model π_init on the same sampled positions, exact over the vocabulary (r = π_init(·|c_t) at τ,
a frozen copy):

    ℓ_t = Σ_v p(v)(log p(v) − log q(v))  +  β Σ_v p(v)(log p(v) − log r(v))

For the sum, (1 + β)·KL(p ‖ q^{1/(1+β)} r^{β/(1+β)} / Z) + const: the student is pulled towards a
geometric mixture of the teacher and its own start, so where the teacher has one habit (OPSD's bare
answer) and the student another (its worked steps), the student keeps part of its own. anchor_kl
logs Σ_v p(log p − log r), token mean.

The gradient flows only through the student's log-probs on the plain prompt; the teacher's are
constants (scored before the step, no graph), so the model is not also trained to read the
reference. The chapter's warning: naive OPSD can erase the model's own style of reasoning: the
teacher's distribution is the model *copying* a solution, and matching it token by token trades the
student's way of working for the reference's wording (watch work_frac and the samples). Answer
positions past the teacher's context (block_size) are not graded (out of the loss and its count;
logged as ungraded_frac): with the byte tokenizer and block_size 128, a word problem plus its
solution left half the answers partly ungraded, hence the solution alone: it leaves room for
max_new_tokens = 64 on every problem; `answer` for every worked demonstration, not for 64 tokens
after the longest problems (tested). --teacher=DIR in place of self: a frozen snapshot (the
student's own starting checkpoint, say) reads the privileged prompt, a teacher that cannot drift.

    python train.py --algo opsd --init_from=out/sft --privileged=solution --anchor_coef=1.0
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

import opd
from nanopost.checkpoints import load_reference, load_teacher
from nanopost.distributed import chunks
from envs import PRIVILEGED, privileged_prompt
from opd import evaluate, on_policy  # noqa: F401  (what it does not change)
from nanopost.passports import opd_passport, verifier_check, write_passport

base = "opd"
starts_from = {"init_from": "sft"}  # its own teacher
defaults = dict(
    opd.defaults,
    teacher="self",            # self (the student's current weights) | a checkpoint dir (a frozen snapshot)
    privileged="answer",       # what the teacher reads, the student not: answer | solution (envs.PRIVILEGED)
    anchor_coef=0.0,           # β: + β·KL(π_s‖π_init) on the student's samples, keeps its own way of answering (0 = off)
)


def setup(run, saved):
    """The teacher (the student itself, or a frozen snapshot), π_init for the anchor."""
    cfg = run.cfg
    if cfg["privileged"] not in PRIVILEGED:
        raise ValueError(f"privileged={cfg['privileged']!r}: choose from {tuple(PRIVILEGED)} (the teacher reading the "
                         f"student's own prompt is --algo opd)")
    opd.check_shards(run)
    state = SimpleNamespace(teacher=load_teacher(run), verifier_check=verifier_check(run.env, run.env.verify))
    state.reference = load_reference(run) if cfg["anchor_coef"] else None  # π_init, the anchor's
    write_passport(run, opd_passport(run, state.verifier_check, state.teacher, PRIVILEGED[cfg["privileged"]]))
    return state


def batches(run, state, it):
    shards = [rollout_shard(run, state, it, s) for s in opd.my_shards(run)]
    opd.keep_rollouts(run, it, [ro for ro, _ in shards])  # tokens.jsonl, for report.py
    return [opd.micro_batches(run, shards)], opd.figures(run, state, shards)


def rollout_shard(run, state, it, shard):
    """opd.rollout_shard with the teacher reading the privileged prompt; π_init's log-probs for the anchor."""
    cfg = run.cfg
    ro = opd.sample(run, run.raw_model, it, shard)
    prompts = [privileged_prompt(run.env, problem, cfg["privileged"]) for problem in ro.problems]
    ro, ungraded = opd.graded(run, state.teacher, ro, prompts)
    ro.ref_logprobs = anchor_logprobs(run, state, ro) if cfg["anchor_coef"] else None
    return ro, ungraded


@torch.no_grad()
def anchor_logprobs(run, state, ro):
    """log π_init(·| student prompt, y_<t) at τ (N, T-1, V), the anchor's constants: the frozen
    starting model reads exactly what the student read, in chunks of batch_size rows."""
    out = torch.zeros(*ro.mask.shape, state.reference.config.vocab_size, device=ro.mask.device)
    for rows in chunks(range(len(ro.ids)), run.cfg["batch_size"]):
        with run.autocast:
            logits = state.reference(ro.ids[rows.start:rows.stop, :-1])
        out[rows.start:rows.stop] = F.log_softmax(logits.float() / run.cfg["temperature"], dim=-1)
    return out


def loss(run, state, model, batch):
    """opd's reverse KL to the privileged teacher, + β·KL(π_s‖π_init) with the anchor."""
    logprobs = opd.student_logprobs(run, model, batch)
    p = logprobs.exp()  # one p for both terms (the gradient's rounding as the ladder's opsd stage was measured)
    kl = (p * (logprobs - batch.teacher_logprobs)).sum(-1)  # KL_t = Σ_v p(v)(log p(v) − log q(v)), opd.reverse_kl
    if not run.cfg["anchor_coef"]:
        return opd.masked_sums(kl, kl, logprobs, batch.mask, anchor_kl=torch.zeros_like(kl))
    anchor = (p * (logprobs - batch.ref_logprobs)).sum(-1)  # Σ_v p(v)(log p(v) − log r(v))
    return opd.masked_sums(kl + run.cfg["anchor_coef"] * anchor, kl, logprobs, batch.mask, anchor_kl=anchor)
