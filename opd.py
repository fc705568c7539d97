"""
On-policy distillation (OPD): the student samples its own answers and a teacher grades every token
of them (Agarwal et al. 2024, GKD, arXiv:2306.13649; Thinking Machines, "On-Policy Distillation",
2025). SPEC §3 (On-policy distillation); seed chapter 7 "On-Policy Distillation" and its section on
sample efficiency ("online + dense signal").

    python train.py --algo opd --init_from=out/sft --teacher=out/teacher

One iteration (synchronous, strictly on-policy: one optimizer step per batch of fresh samples):
  1. sample: prompts_per_iter × group_size answers from the student π_s (its current weights) at
     temperature τ; the verifier's accuracy of them is only logged (verifier_acc), nothing trains on it;
  2. score: the teacher π_t reads every response position of them in one forward pass (no gradient,
     eval mode, the same τ): log π_t(·| x, y_<t) over the whole vocabulary;
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
reverse_kl, entropy, tokens, verifier_acc, len_mean, truncated_frac, ungraded_frac, work_frac,
rollout_tokens, time_decode / time_teacher / time_update.

The lab changes one piece each (python train.py --algo NAME): opd_sampled and opd_topk (cheaper
estimators of the KL), opd_teacher_samples (off-policy distillation: SFT on the teacher's answers),
opsd (self-distillation: the student's own weights shown the answer). A teacher for the default
task: config/teacher.py, then experiments/distill.py and experiments/opsd.py.
"""

import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from nanopost.checkpoints import load_teacher
from nanopost.data import collate
from nanopost.distributed import all_reduce_sum, chunks
from nanopost.evaluation import evaluate_policy
from nanopost.passports import opd_passport, unparsed, verifier_check, write_passport
from nanopost.rollouts import last_response_column, rollouts, shard_problems, shard_size
from nanopost.token_records import keep_rollouts

starts_from = {"init_from": "sft", "teacher": "grpo"}  # after the ladder: its SFT stage, graded by its GRPO stage
on_policy = True  # the teacher and the student score what was sampled; every rank grades alike
defaults = dict(
    teacher="",                # the teacher's checkpoint directory (the student's tokenizer, any size)
    prompts_per_iter=128,      # prompts per iteration, global over ranks (GRPO's default 16 × 8 rollouts)
    group_size=1,              # answers per prompt: distillation needs no group, every token is graded
    rollout_prompts=0,         # prompts per sampler call (a shard); 0 = prompts_per_iter / world_size
    temperature=1.0,           # sampling temperature; student and teacher logits are both divided by it
    eval_samples=4,            # held-out answers sampled per problem at the temperature (0: off)
    # shared keys with RL values (one step per batch of fresh samples), sized for the tiny model on a CPU
    learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, max_iters=30, eval_interval=10, log_interval=1,
)


def setup(run, saved):
    """The frozen teacher; the verifier's own error rate (logged)."""
    check_shards(run)
    state = SimpleNamespace(teacher=load_teacher(run), verifier_check=verifier_check(run.env, run.env.verify))
    write_passport(run, opd_passport(run, state.verifier_check, state.teacher, None))
    return state


def check_shards(run):
    P, shard = run.cfg["prompts_per_iter"], shard_size(run)
    if shard < 1 or P % shard or (P // shard) % run.world_size:
        raise ValueError(f"prompts_per_iter={P} must split into shards of rollout_prompts={shard} prompts, a whole "
                         f"number per each of {run.world_size} ranks")


# ----------------------------------------------------------------------------------------------
# One iteration: the student samples, the teacher grades, one step on the reverse KL

def batches(run, state, it):
    """This rank's shards, graded by the teacher; the figures for the log; one optimizer step of
    micro-batches of at most batch_size answers."""
    shards = [rollout_shard(run, state, it, s) for s in my_shards(run)]  # 1-2. sampled and graded
    keep_rollouts(run, it, [ro for ro, _ in shards])  # a few iterations' tokens, for report.py
    return [micro_batches(run, shards)], figures(run, state, shards)


def my_shards(run):
    """This rank's shards of the iteration: r, r + world_size, ..."""
    return range(run.rank, run.cfg["prompts_per_iter"] // shard_size(run), run.world_size)


def rollout_shard(run, state, it, shard):
    """Shard `shard` of iteration `it`: the student's answers, the teacher's grades. Returns (the
    Rollout, its response tokens left ungraded)."""
    ro = sample(run, run.raw_model, it, shard)                                             # 1. the student writes
    return graded(run, state.teacher, ro, [problem["prompt"] for problem in ro.problems])  # 2. the teacher grades


def sample(run, writer, it, shard):
    """group_size answers by `writer` at τ to each of the shard's fresh train problems, seeded by (seed, it, shard)."""
    problems, seed = shard_problems(run, it, shard)
    return rollouts(run, writer, problems, run.cfg["group_size"], temperature=run.cfg["temperature"],
                    max_new_tokens=run.cfg["max_new_tokens"], seed=seed)


def graded(run, teacher, ro, prompts):
    """The rollouts ro graded by `teacher` reading `prompts` (one per row) before each answer: its
    log-probs on ro.teacher_logprobs, ro.mask cut to the graded positions (the loss and its count).
    Returns (ro, its response tokens left ungraded)."""
    t0 = time.time()
    ro.teacher_logprobs, graded_mask = teacher_logprobs(run, teacher, ro, prompts)
    ro.time_score = time.time() - t0
    ungraded = float((ro.mask - graded_mask).sum())
    ro.mask, ro.seq_len = graded_mask, last_response_column(graded_mask) + 2
    return ro, ungraded


@torch.no_grad()
def teacher_logprobs(run, teacher, ro, prompts):
    """The teacher's grades of the rollouts ro: (log-probs (N, T-1, V), graded (N, T-1)), aligned
    with ro.ids[:, 1:] like ro.mask: log π_t(·| prompt, y_<t) at τ on the graded response positions,
    0 elsewhere. Each row is re-rendered as its prompt (the teacher's, one text per row) + the
    student's answer tokens, as many as fit the teacher's context (graded = the sampled response
    positions kept; a tool's results are read as context, never graded), and scored in one forward
    pass per chunk; the kept positions of both layouts hold the same tokens in the same order, so
    the two mask-selects align."""
    ids, mask, tau = ro.ids, ro.mask, run.cfg["temperature"]
    context = teacher.config.block_size + 1  # the last token is only a target
    prompts = [run.tok.prompt_ids(p) for p in prompts]
    room = torch.tensor([max(context - len(p), 0) for p in prompts], device=mask.device)
    response = mask + ro.forced  # the teacher reads tool results too, but grades only sampled tokens
    kept = response * (response.cumsum(1) <= room[:, None])
    graded_mask = mask * kept
    out = torch.zeros(*mask.shape, teacher.config.vocab_size, device=mask.device)
    for rows in chunks(range(len(ids)), run.cfg["batch_size"]):
        examples = []
        for i in rows:
            answer = ids[i, 1:][kept[i] > 0].tolist()
            prompt = prompts[i][:context - len(answer)]  # cut only where nothing is graded
            examples.append((prompt + answer, [0] * len(prompt) + mask[i][kept[i] > 0].long().tolist()))
        teacher_ids, teacher_mask = collate(examples, run.tok.pad, run.device)
        with run.autocast:
            logits = teacher(teacher_ids[:, :-1])
        logprobs = F.log_softmax(logits.float() / tau, dim=-1)
        out[rows.start:rows.stop][graded_mask[rows.start:rows.stop] > 0] = logprobs[teacher_mask[:, 1:] > 0]
    return out, graded_mask


def micro_batches(run, shards):
    """The optimizer step's micro-batches: each shard's rows in chunks of batch_size, each cut to its
    own rows' width (the last graded token)."""
    return [ro.select(rows) for ro, _ in shards for rows in chunks(range(len(ro.ids)), run.cfg["batch_size"])]


def figures(run, state, shards):
    """The iteration's figures, over every rank's shards."""
    rolls = [ro for ro, _ in shards]
    sums = all_reduce_sum(dict(
        verified=sum(float(ro.verified.sum()) for ro in rolls), answers=sum(len(ro.verified) for ro in rolls),
        tokens=sum(float(ro.lengths.sum()) for ro in rolls),
        truncated=sum(float(ro.truncated.sum()) for ro in rolls), ungraded=sum(ungraded for _, ungraded in shards),
        work=sum(sum(map(run.env.shows_work, ro.texts)) for ro in rolls),
        parse_errors=sum(unparsed(run.env, t) for ro in rolls for t in ro.texts)), run)
    return dict(verifier_acc=sums["verified"] / sums["answers"], len_mean=sums["tokens"] / sums["answers"],
                truncated_frac=sums["truncated"] / sums["answers"], rollout_tokens=sums["tokens"],
                ungraded_frac=sums["ungraded"] / max(sums["tokens"], 1.0),
                time_decode=sum(ro.time_decode for ro in rolls), time_teacher=sum(ro.time_score for ro in rolls),
                work_frac=sums["work"] / sums["answers"], parse_error_rate=sums["parse_errors"] / sums["answers"],
                verifier_error_rate=state.verifier_check["verifier_error_rate"])


# ----------------------------------------------------------------------------------------------
# The loss: the per-token reverse KL to the teacher

def student_logprobs(run, model, batch):
    """log π_s(·|c_t) at τ on every position of the micro-batch's rows, (N, T-1, V), with gradient."""
    return F.log_softmax(model(batch.ids[:, :-1]).float() / run.cfg["temperature"], dim=-1)


def reverse_kl(student_logprobs, teacher_logprobs):
    """KL_t = Σ_v p(v)(log p(v) − log q(v)) per position, p = π_s, q = π_t (both log-probs at τ):
    exact, differentiated directly (no variance given the prefix)."""
    return (student_logprobs.exp() * (student_logprobs - teacher_logprobs)).sum(-1)


def masked_sums(per_token, kl, student_logprobs, mask, **logged):
    """(loss_sum, count, metrics) over the graded positions (mask 1): the loss's per-token terms
    summed, their count, and as token means the reverse KL (kl), the student's entropy and any
    other per-token figure given (`logged`). `where`, not *: whatever the logits hold on prompt
    and padding, no value or gradient leaks from there."""
    on = mask > 0
    with torch.no_grad():
        entropy = -(student_logprobs.exp() * student_logprobs).sum(-1)
    count = on.sum()
    n = count.clamp(min=1)  # tensors: the loop reads them once per step
    figures = dict(reverse_kl=kl.detach(), entropy=entropy, **logged)
    metrics = {name: torch.where(on, value.detach(), 0.0).sum() / n for name, value in figures.items()}
    return torch.where(on, per_token, 0.0).sum(), count, dict(metrics, tokens=count)


def loss(run, state, model, batch):
    """One micro-batch: the student's log-probs at τ on its own answers, the reverse KL to the teacher's."""
    logprobs = student_logprobs(run, model, batch)
    kl = reverse_kl(logprobs, batch.teacher_logprobs)  # KL_t = Σ_v π_s(v|c_t)(log π_s(v|c_t) − log π_t(v|c_t))
    return masked_sums(kl, kl, logprobs, batch.mask)


def evaluate(run, state, it):
    """Greedy held-out and OOD accuracy; sampled held-out accuracy and pass@eval_samples."""
    return evaluate_policy(run, run.raw_model, it, temperature=run.cfg["temperature"])[0]
