"""
On-policy distillation's options, beside opd.py (which is OPD itself: the full reverse KL to a frozen
teacher on the student's own samples): opd.setup chooses among them once. SPEC §3 (On-policy
distillation, OPSD); seed chapter 7 "On-Policy Distillation".

kl_estimator — three ways to turn the teacher's scores into that loss (formulas per position t,
  p = π_s(·|c_t) and q = π_t(·|c_t) at temperature τ, y_t ~ p the sampled token):
    full     ℓ_t = Σ_v p(v)(log p(v) − log q(v)), differentiated directly. Exact, no variance given
             the prefix; needs the teacher's whole distribution at every position (N·T·V numbers).
    sampled  a_t = −(log p(y_t) − log q(y_t)), a per-token advantage through the policy-gradient
             loss ℓ_t = −a_t.detach()·log p(y_t). Unbiased for ∇KL_t: E_{y~p}[(log p(y) − log q(y))
             ∇log p(y)] = Σ_v ∇p(v)(log p(v) − log q(v)) = ∇KL_t, because Σ_v p ∇log p = ∇Σ_v p = 0.
             Needs one teacher log-prob per token (what a served teacher returns cheaply), but a
             one-sample estimate: its variance grows with the log-ratio's spread under p, largest
             where student and teacher disagree. Unbiased only on fresh samples of the current π_s at
             τ with no top-k/top-p, which is why every batch is used for exactly one step.
    topk     K_t = the teacher's kl_topk most likely tokens; p̃, q̃ = p, q restricted to K_t and
             renormalised; ℓ_t = Σ_{v∈K_t} p̃(v)(log p̃(v) − log q̃(v)). No variance, k numbers per token
             from the teacher, but biased: the student's mass outside K_t (tokens the teacher rules
             out: what reverse KL exists to punish) is not penalised, and the values are the KL
             between the renormalised distributions. kl_topk = V gives `full` exactly.
    teacher_samples  off-policy distillation, the baseline OPD is measured against: the *teacher*
             samples the answers for the same prompts and the student is trained by cross-entropy
             on them, ℓ_t = −log p(y_t), y ~ π_t: SFT on teacher samples, a one-sample estimate of the
             gradient of the forward KL(π_t‖π_s) = E_{y~π_t}[log π_t(y) − log π_s(y)] on the teacher's
             own prefixes (the student never sees where its own mistakes lead). rollout_tokens counts
             the teacher's samples, reward and work_frac describe them.
  Whatever the estimator, `reverse_kl` logs the exact KL_t, token mean over the sampled positions.
  The teacher's full distribution is held for that log and for `full`; with a 50k vocabulary that is
  large (N·T·V floats per rollout batch: lower batch_size / prompts_per_iter on a big model).

anchor_coef — β of a KL anchor to the starting (SFT) model π_init, added to every estimator on the
  same sampled positions, exact over the vocabulary (r = π_init(·|c_t) at τ, a frozen copy):

         ℓ_t ← ℓ_t + β Σ_v p(v)(log p(v) − log r(v))

  For `full` the sum is (1 + β)·KL(p ‖ q^{1/(1+β)} r^{β/(1+β)} / Z) + const: the student is pulled
  towards a geometric mixture of the teacher and its own starting point, so where the teacher has
  one habit (OPSD's bare answer) and the student another (its worked steps), the student keeps part
  of its own. `anchor_kl` logs Σ_v p(log p − log r), token mean.

teacher — where π_t comes from:
    DIR   a frozen checkpoint (checkpoints.load_model + checkpoints.frozen): any size, the same tokenizer (a
          vocabulary of another size is refused, naming both); it sees the student's prompt, or
          with privileged=answer|solution the privileged one below (the student's own starting
          checkpoint so: self-distillation from a frozen snapshot, whose teacher cannot drift).
    self  OPSD: the student's own current weights, run under torch.no_grad on a privileged prompt
          (envs.PRIVILEGED, chosen by `privileged`), then the student's answer tokens unchanged:
          `answer` is the problem followed by "\n(Reference answer: <answer>)"; `solution` is a
          verified worked solution, "(Reference solution: <env.solve(problem)>)", the demonstration
          the verifier accepts, in place of the problem's text (it names every operand and step).
          The student sees only the problem. The gradient flows only through the student's
          log-probs on the plain prompt; the teacher's log-probs are constants (scored before the
          step, no graph), so the model is not also trained to read the reference. The chapter's
          warning: naive OPSD can erase the model's own style of reasoning: the teacher's
          distribution is the model *copying* a solution, and matching it token by token trades
          the student's way of working for the reference's wording (watch work_frac and the
          samples). Answer positions past the teacher's context (block_size) are not graded
          (out of the loss and its count; logged as ungraded_frac): with the byte tokenizer and
          block_size 128, a word problem plus its solution left half the answers partly ungraded,
          hence the solution alone: it leaves room for max_new_tokens = 64 on every problem;
          `answer` for every worked demonstration, not for 64 tokens after the longest problems (tested).
"""

import torch
import torch.nn.functional as F

from nanopost.distributed import chunks
from envs import PRIVILEGED

OPTIONS = dict(
    kl_estimator="full",       # full | sampled | topk | teacher_samples (off-policy: SFT on the teacher's answers)
    kl_topk=16,                # k of the topk estimator (k = vocab size: exactly full)
    anchor_coef=0.0,           # β: + β·KL(π_s‖π_init) on the student's samples, keeps its own way of answering (0 = off)
    privileged="auto",         # the teacher's prompt: answer | solution (envs.PRIVILEGED) | none (the student's); auto = answer
                               # under --teacher=self (OPSD), none for a checkpoint (a frozen snapshot given a solution: solution)
)

def check_config(run, estimators):
    cfg = run.cfg
    if cfg["kl_estimator"] not in estimators:
        raise ValueError(f"kl_estimator={cfg['kl_estimator']!r}: choose from {tuple(estimators)}")
    if cfg["privileged"] not in ("auto", "none", *PRIVILEGED):
        raise ValueError(f"privileged={cfg['privileged']!r}: choose from {('auto', 'none', *PRIVILEGED)}")
    if cfg["teacher"] == "self" and privileged(cfg) == "none":
        raise ValueError("--teacher=self with privileged=none: the teacher would be the student itself, every KL 0")
    if cfg["teacher"] == "self" and cfg["kl_estimator"] == "teacher_samples":
        raise ValueError("kl_estimator=teacher_samples trains on a separate teacher's samples: it needs --teacher=DIR")


# ----------------------------------------------------------------------------------------------
# The estimators: per-token losses from the student's log-probs p (B, T, V), the sampled tokens and
# the teacher's log-probs q at τ (exact: the full reverse KL per token, opd.py's own)

def sampled(student_logprobs, targets, teacher_logprobs, exact, topk):
    """a_t = −(log p(y_t) − log q(y_t)), a per-token advantage: ℓ_t = −sg(a_t)·log p(y_t)."""
    logp = student_logprobs.gather(-1, targets[..., None]).squeeze(-1)
    teacher_logp = teacher_logprobs.gather(-1, targets[..., None]).squeeze(-1)
    advantage = -(logp - teacher_logp).detach()
    return -advantage * logp


def topk(student_logprobs, targets, teacher_logprobs, exact, k):
    """The KL between p and q restricted to the teacher's k most likely tokens, renormalised there."""
    top = teacher_logprobs.topk(min(k, teacher_logprobs.size(-1)), dim=-1).indices
    top_p, top_q = student_logprobs.gather(-1, top), teacher_logprobs.gather(-1, top)
    top_p, top_q = top_p - top_p.logsumexp(-1, keepdim=True), top_q - top_q.logsumexp(-1, keepdim=True)
    return (top_p.exp() * (top_p - top_q)).sum(-1)


def teacher_samples(student_logprobs, targets, teacher_logprobs, exact, topk):
    """Off-policy distillation: cross-entropy −log p(y_t) on answers the teacher sampled."""
    return -student_logprobs.gather(-1, targets[..., None]).squeeze(-1)


ESTIMATORS = dict(sampled=sampled, topk=topk, teacher_samples=teacher_samples)


# ----------------------------------------------------------------------------------------------
# OPSD's privileged prompt, the anchor to π_init

def privileged(cfg):
    """The teacher's context: cfg's privileged, with auto resolved (answer for OPSD, none for OPD)."""
    if cfg["privileged"] != "auto":
        return cfg["privileged"]
    return "answer" if cfg["teacher"] == "self" else "none"


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
