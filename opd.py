"""
On-policy distillation (OPD): the student samples its own answers and a teacher grades every token
of them. SPEC §3 (On-policy distillation, OPSD); seed chapter 7 "On-Policy Distillation" and its
section on sample efficiency ("online + dense signal").

    python train.py --algo opd --init_from=out/sft --teacher=out/teacher      # OPD, a stronger teacher
    python train.py --algo opd --init_from=out/sft --teacher=self             # OPSD: its own weights, shown the answer
    python train.py --algo opd --init_from=out/sft --teacher=out/teacher --kl_estimator=sampled

One iteration (synchronous, strictly on-policy: one optimizer step per batch of fresh samples):
  1. rollouts: prompts_per_iter × group_size answers sampled from the student π_s (its current
     weights) at temperature τ; the verifier's reward is only logged, nothing trains on it;
  2. the teacher π_t scores every response position of them in one forward pass (no gradient, eval
     mode, the same τ): log π_t(·| x, y_<t) over the whole vocabulary;
  3. one optimizer step on the per-token reverse KL, token mean over the response tokens:

         KL_t = Σ_v π_s(v|c_t) [log π_s(v|c_t) − log π_t(v|c_t)],   c_t = (x, y_<t) drawn from π_s
         loss = Σ_it KL_it / Σ_i |y_i|       (loss_sum = Σ_it KL_it, count = response tokens)

     Prompt and padding positions are in neither sum. Reverse KL (the student's own expectation) is
     mode-seeking: the student is pushed off every token the teacher finds unlikely, on exactly the
     prefixes it reaches itself, so the teacher corrects the student's own mistakes (SFT on teacher
     text, a forward KL on the teacher's prefixes, never sees them). As in GKD and the Thinking
     Machines recipe, the prefixes c_t count as given: the gradient flows through π_s(·|c_t) at each
     position, not through which prefixes were sampled.

Rollouts are sampled in shards of rollout_prompts prompts, shard s of iteration it seeded by
(seed, it, s); rank r takes shards r, r + world_size, ...: two ranks take the same step as one
process (tested). Student and teacher are scored with dropout off. Logged every iteration:
reverse_kl, anchor_kl, entropy, tokens, reward (the rollouts' verifier accuracy), len_mean,
truncated_frac, ungraded_frac, work_frac, rollout_tokens, time_decode / time_teacher / time_update.

The options (opd_family.py, chosen once in setup): the estimators sampled, topk and teacher_samples
(off-policy distillation), an anchor to π_init, and OPSD's privileged prompts (--teacher=self). A
teacher for the default task: config/teacher.py, then experiments/distill.py and experiments/opsd.py.
"""

import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import opd_family as family
from nanopost.checkpoints import load_reference, load_teacher
from envs import PRIVILEGED, privileged_prompt
from nanopost.data import collate
from nanopost.distributed import all_reduce_sum, chunks
from nanopost.evaluation import evaluate_policy
from nanopost.passports import opd_passport, unparsed, verifier_check, write_passport
from nanopost.rollouts import last_response_column, rollouts, shard_problems, shard_size

starts_from = {"init_from": "sft", "teacher": "grpo"}  # after the ladder: its SFT stage, graded by its GRPO stage
on_policy = True  # the teacher (if self) and the student score what was sampled; every rank grades alike
defaults = dict(
    teacher="",                # a checkpoint directory (OPD) or "self" (OPSD)
    prompts_per_iter=128,      # prompts per iteration, global over ranks (GRPO's default 16 × 8 rollouts)
    group_size=1,              # answers per prompt: distillation needs no group, every token is graded
    rollout_prompts=0,         # prompts per sampler call (a shard); 0 = prompts_per_iter / world_size
    temperature=1.0,           # sampling temperature; student and teacher logits are both divided by it
    eval_samples=4,            # held-out answers sampled per problem at the temperature (0: off)
    **family.OPTIONS,
    # shared keys with RL values (one step per batch of fresh samples), sized for the tiny model on a CPU
    learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, max_iters=30, eval_interval=10, log_interval=1,
)


def reverse_kl(student_logprobs, targets, teacher_logprobs, exact, topk):
    """OPD's own per-token loss: the exact reverse KL_t, differentiated directly (no variance given
    the prefix; needs the teacher's whole distribution at every position)."""
    return exact


ESTIMATORS = dict(full=reverse_kl, **family.ESTIMATORS)


def distillation_loss(student_logits, targets, teacher_logprobs, mask, estimator, temperature=1.0, topk=16,
                      anchor_logprobs=None, anchor_coef=0.0):
    """Per-token reverse KL to the teacher on the sampled positions, by `estimator` (a function of
    ESTIMATORS). student_logits (B, T, V) with gradient; targets (B, T) the sampled tokens;
    teacher_logprobs (B, T, V) log π_t at temperature τ, constants; mask (B, T) 1 on response tokens;
    anchor_logprobs (B, T, V) log π_init, constants, for the anchor term (anchor_coef > 0). Returns
    (loss_sum, count, reverse_kl_sum, entropy_sum, anchor_kl_sum): sums over the masked positions,
    count = their number."""
    student_logprobs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    on = mask > 0
    p = student_logprobs.exp()
    exact = (p * (student_logprobs - teacher_logprobs)).sum(-1)  # KL_t (B, T)
    per_token = estimator(student_logprobs, targets, teacher_logprobs, exact, topk)
    anchor = torch.zeros_like(exact)
    if anchor_coef:  # + β Σ_v p(v)(log p(v) − log r(v)): the student keeps part of its own way (opd_family)
        anchor = (p * (student_logprobs - anchor_logprobs)).sum(-1)
        per_token = per_token + anchor_coef * anchor
    with torch.no_grad():
        entropy = -(p * student_logprobs).sum(-1)
    # where, not *: whatever the logits hold on prompt and padding, no value or gradient leaks from there
    return (torch.where(on, per_token, 0.0).sum(), on.sum(), torch.where(on, exact.detach(), 0.0).sum(),
            torch.where(on, entropy, 0.0).sum(), torch.where(on, anchor.detach(), 0.0).sum())


# ----------------------------------------------------------------------------------------------
# Rollouts and the teacher's grades

@torch.no_grad()
def teacher_logprobs(run, state, ro):
    """The teacher's grades of the rollouts ro: (log-probs (N, T-1, V), graded (N, T-1)), aligned
    with ro.ids[:, 1:] like ro.mask: log π_t(·| teacher prompt, y_<t) at τ on the graded response
    positions, 0 elsewhere. Each row is re-rendered as the teacher's prompt + the student's answer
    tokens, as many as fit the teacher's context (graded = the sampled response positions kept; a
    tool's results are read as context, never graded), and scored in one forward pass per chunk; the
    kept positions of both layouts hold the same tokens in the same order, so the two mask-selects align."""
    ids, mask, tau = ro.ids, ro.mask, run.cfg["temperature"]
    context = state.teacher.config.block_size + 1  # the last token is only a target
    prompts = [run.tok.prompt_ids(state.teacher_prompt(p)) for p in ro.problems]
    room = torch.tensor([max(context - len(p), 0) for p in prompts], device=mask.device)
    response = mask + ro.forced  # the teacher reads tool results too, but grades only sampled tokens
    kept = response * (response.cumsum(1) <= room[:, None])
    graded = mask * kept
    out = torch.zeros(*mask.shape, state.teacher.config.vocab_size, device=mask.device)
    for rows in chunks(range(len(ids)), run.cfg["batch_size"]):
        examples = []
        for i in rows:
            answer = ids[i, 1:][kept[i] > 0].tolist()
            prompt = prompts[i][:context - len(answer)]  # cut only where nothing is graded
            examples.append((prompt + answer, [0] * len(prompt) + mask[i][kept[i] > 0].long().tolist()))
        teacher_ids, teacher_mask = collate(examples, run.tok.pad, run.device)
        with run.autocast:
            logits = state.teacher(teacher_ids[:, :-1])
        logprobs = F.log_softmax(logits.float() / tau, dim=-1)
        out[rows.start:rows.stop][graded[rows.start:rows.stop] > 0] = logprobs[teacher_mask[:, 1:] > 0]
    return out, graded


def rollout_shard(run, state, it, shard):
    """Shard `shard` of iteration `it`: fresh train problems, the student's answers, the teacher's
    grades. Returns (the Rollout, its response tokens left ungraded)."""
    cfg = run.cfg
    problems, seed = shard_problems(run, it, shard)
    ro = rollouts(run, state.writer, problems, cfg["group_size"], temperature=cfg["temperature"],
                  max_new_tokens=cfg["max_new_tokens"], seed=seed)
    t0 = time.time()
    ro.teacher_logprobs, graded = teacher_logprobs(run, state, ro)
    ro.ref_logprobs = state.anchor_logprobs(run, state, ro)
    ro.score_time = time.time() - t0
    ungraded = float((ro.mask - graded).sum())
    ro.mask, ro.seq_len = graded, last_response_column(graded) + 2  # the loss and its count: graded positions only
    return ro, ungraded


# ----------------------------------------------------------------------------------------------
# The algorithm module interface (see train.py)

def setup(run, saved):
    """The teacher (--teacher=DIR frozen, or the student itself under --teacher=self) and the options,
    chosen once: each state.X is OPD's own or the option's from opd_family.py."""
    cfg = run.cfg
    family.check_config(run, ESTIMATORS)
    P, shard = cfg["prompts_per_iter"], shard_size(run)
    if shard < 1 or P % shard or (P // shard) % run.world_size:
        raise ValueError(f"prompts_per_iter={P} must split into shards of rollout_prompts={shard} prompts, a whole "
                         f"number per each of {run.world_size} ranks")
    state = SimpleNamespace(teacher=load_teacher(run), verifier_check=verifier_check(run.env, run.env.verify))
    state.reference = load_reference(run) if cfg["anchor_coef"] else None  # π_init, the anchor's
    state.estimator = ESTIMATORS[cfg["kl_estimator"]]
    context = family.privileged(cfg)  # OPSD: what the teacher reads, the student not
    state.teacher_prompt = ((lambda problem: privileged_prompt(run.env, problem, context)) if context != "none"
                            else (lambda problem: problem["prompt"]))
    state.writer = state.teacher if cfg["kl_estimator"] == "teacher_samples" else run.raw_model  # off-policy: the teacher writes
    state.anchor_logprobs = family.anchor_logprobs if cfg["anchor_coef"] else (lambda run, state, ro: None)
    write_passport(run, opd_passport(run, state.verifier_check, state.teacher,
                                     PRIVILEGED[context] if context != "none" else None))
    return state


def batches(run, state, it):
    """This rank's shards, graded by the teacher; the figures for the log; one optimizer step of
    micro-batches of at most batch_size answers."""
    n_shards = run.cfg["prompts_per_iter"] // shard_size(run)
    shards, ungraded = zip(*[rollout_shard(run, state, it, s) for s in range(run.rank, n_shards, run.world_size)])
    sums = all_reduce_sum(dict(
        reward=sum(float(ro.verified.sum()) for ro in shards), answers=sum(len(ro.verified) for ro in shards),
        tokens=sum(float(ro.lengths.sum()) for ro in shards),
        truncated=sum(float(ro.truncated.sum()) for ro in shards), ungraded=sum(ungraded),
        work=sum(sum(map(run.env.shows_work, ro.texts)) for ro in shards),
        parse_errors=sum(unparsed(run.env, t) for ro in shards for t in ro.texts)), run)
    figures = dict(reward=sums["reward"] / sums["answers"], len_mean=sums["tokens"] / sums["answers"],
                   truncated_frac=sums["truncated"] / sums["answers"], rollout_tokens=sums["tokens"],
                   ungraded_frac=sums["ungraded"] / max(sums["tokens"], 1.0),
                   time_decode=sum(ro.decode_time for ro in shards), time_teacher=sum(ro.score_time for ro in shards),
                   work_frac=sums["work"] / sums["answers"], parse_error_rate=sums["parse_errors"] / sums["answers"],
                   verifier_error_rate=state.verifier_check["verifier_error_rate"])
    # each micro-batch cut to its own rows' width (the last graded token)
    return [[ro.select(rows) for ro in shards for rows in chunks(range(len(ro.ids)), run.cfg["batch_size"])]], figures


def loss(run, state, model, batch):
    """One micro-batch: the student's logits at τ on its own answers, the estimator's loss."""
    ids, mask = batch.ids, batch.mask
    logits = model(ids[:, :-1])
    loss_sum, count, reverse_kl, entropy, anchor_kl = distillation_loss(
        logits, ids[:, 1:], batch.teacher_logprobs, mask, state.estimator, run.cfg["temperature"],
        run.cfg["kl_topk"], batch.ref_logprobs, run.cfg["anchor_coef"])
    n = torch.as_tensor(count).clamp(min=1)  # tensors: the loop reads them once per step
    return loss_sum, count, dict(reverse_kl=reverse_kl.detach() / n, entropy=entropy.detach() / n,
                                 anchor_kl=torch.as_tensor(anchor_kl).detach() / n, tokens=count)


def evaluate(run, state, it):
    """Greedy held-out and OOD accuracy; sampled held-out accuracy and pass@eval_samples."""
    return evaluate_policy(run, run.raw_model, it, temperature=run.cfg["temperature"])[0]
