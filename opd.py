"""
On-policy distillation (OPD) and on-policy self-distillation (OPSD): the student samples its own
answers and a teacher grades every token of them. SPEC §3 (On-policy distillation, OPSD); seed
chapter 7 "On-Policy Distillation" and its section on sample efficiency ("online + dense signal").

    python train.py --algo opd --init_from=out/sft --teacher=out/teacher      # OPD, a stronger teacher
    python train.py --algo opd --init_from=out/sft --teacher=self             # OPSD
    python train.py --algo opd --init_from=out/sft --teacher=out/teacher --kl_estimator=sampled

One iteration (synchronous, strictly on-policy: one optimizer step per batch of fresh samples):
  1. rollouts: prompts_per_iter × samples_per_prompt answers sampled from the student π_s (its
     current weights) with the KV-cache sampler at temperature τ; the verifier's reward is only
     logged, nothing trains on it;
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
          (PRIVILEGED below, chosen by `privileged`), then the student's answer tokens unchanged:
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

Rollouts are sampled in shards of rollout_prompts prompts, shard s of iteration it seeded by
(seed, it, s); rank r takes shards r, r + world_size, ...: two ranks take the same step as one
process (tested). Student and teacher are scored with dropout off (eval mode).

Logged every iteration: reverse_kl, anchor_kl, entropy (student, on its own samples), tokens (response tokens
with loss weight, summed by the loop), reward (verifier accuracy of the rollouts), len_mean,
truncated_frac, ungraded_frac, work_frac (share of answers that show their work), rollout_tokens, and the time
split time_decode / time_teacher / time_update.

A teacher for the default task, made with the project's own scripts (config/teacher.py: 6 layers ×
192, SFT on worked demonstrations, then 10 GRPO iterations; the student is the default 4 × 128 SFT):

    python train.py config/teacher.py --out_dir=out/teacher_sft
    python train.py --algo grpo --init_from=out/teacher_sft --out_dir=out/teacher --max_iters=10 --eval_interval=5
    python experiments/distill.py --student=out/sft --teacher=out/teacher   # GRPO, OPD × 2, off-policy, to the plateau
    python experiments/opsd.py --student=out/sft                            # OPSD: answer / solution, ± anchor
"""

import time

import torch
import torch.nn.functional as F

from data import collate
from distributed import all_reduce_sum, chunks
from evaluation import evaluate_policy
from model import count_parameters
from paperwork import unparsed, verification_text, verifier_check, write_passport
from rollouts import last_response_column, rollouts, shard_problems, shard_size

starts_from = "sft"  # distillation refines a policy that can already answer
teacher_from = "grpo"  # with no --teacher on the command line: the ladder's GRPO stage of the task (train.after_the_ladder)

defaults = dict(
    teacher="",                # a checkpoint directory (OPD) or "self" (OPSD)
    kl_estimator="full",       # full | sampled | topk
    kl_topk=16,                # k of the topk estimator (k = vocab size: exactly full)
    anchor_coef=0.0,           # β: + β·KL(π_s‖π_init) on the student's samples, keeps its own way of answering (0 = off)
    privileged="auto",         # the teacher's prompt: answer | solution (PRIVILEGED) | none (the student's); auto = answer
                               # under --teacher=self (OPSD), none for a checkpoint (a frozen snapshot given a solution: solution)
    prompts_per_iter=128,      # prompts per iteration, global over ranks (GRPO's default 16 × 8 rollouts)
    samples_per_prompt=1,      # answers per prompt: distillation needs no group, every token is graded
    rollout_prompts=0,         # prompts per sampler call (a shard); 0 = prompts_per_iter / world_size
    temperature=1.0,           # sampling temperature; student and teacher logits are both divided by it
    eval_samples=4,            # held-out answers sampled per problem at the temperature (0: off)
    # common keys with RL values (one step per batch of fresh samples), sized for the tiny model on a CPU
    learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, max_iters=30, eval_interval=10, log_interval=1,
)

ESTIMATORS = ("full", "sampled", "topk", "teacher_samples")
# OPSD: what the teacher sees, the student not. The worked solution names every operand and operation,
# so it stands in for the problem's text: problem + solution + answer would not fit the 128-token context
PRIVILEGED = dict(answer="{prompt}\n(Reference answer: {answer})",
                  solution="(Reference solution: {solution})")


# ----------------------------------------------------------------------------------------------
# The math (a pure function, tested on numbers)

def distillation_loss(student_logits, targets, teacher_logprobs, mask, estimator, temperature=1.0, topk=16,
                      anchor_logprobs=None, anchor_coef=0.0):
    """Per-token reverse KL to the teacher on the sampled positions. student_logits (B, T, V) with
    gradient; targets (B, T) the sampled tokens; teacher_logprobs (B, T, V) log π_t at temperature τ,
    constants; mask (B, T) 1 on response tokens; anchor_logprobs (B, T, V) log π_init, constants, for
    the anchor term (anchor_coef > 0). Returns (loss_sum, count, reverse_kl_sum, entropy_sum,
    anchor_kl_sum): sums over the masked positions, count = their number."""
    student_logprobs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    on = mask > 0
    p = student_logprobs.exp()
    exact = (p * (student_logprobs - teacher_logprobs)).sum(-1)  # KL_t (B, T)
    if estimator == "full":
        per_token = exact
    elif estimator == "sampled":
        logp = student_logprobs.gather(-1, targets[..., None]).squeeze(-1)
        teacher_logp = teacher_logprobs.gather(-1, targets[..., None]).squeeze(-1)
        advantage = -(logp - teacher_logp).detach()
        per_token = -advantage * logp
    elif estimator == "topk":
        top = teacher_logprobs.topk(min(topk, teacher_logprobs.size(-1)), dim=-1).indices
        top_p, top_q = student_logprobs.gather(-1, top), teacher_logprobs.gather(-1, top)
        top_p, top_q = top_p - top_p.logsumexp(-1, keepdim=True), top_q - top_q.logsumexp(-1, keepdim=True)
        per_token = (top_p.exp() * (top_p - top_q)).sum(-1)  # renormalised on K_t
    elif estimator == "teacher_samples":
        per_token = -student_logprobs.gather(-1, targets[..., None]).squeeze(-1)  # targets sampled by π_t
    else:
        raise ValueError(f"kl_estimator={estimator!r}: choose from {ESTIMATORS}")
    anchor = torch.zeros_like(exact)
    if anchor_coef:
        anchor = (p * (student_logprobs - anchor_logprobs)).sum(-1)
        per_token = per_token + anchor_coef * anchor
    with torch.no_grad():
        entropy = -(p * student_logprobs).sum(-1)
    # where, not *: whatever the logits hold on prompt and padding, no value or gradient leaks from there
    return (torch.where(on, per_token, 0.0).sum(), on.sum(), torch.where(on, exact.detach(), 0.0).sum(),
            torch.where(on, entropy, 0.0).sum(), torch.where(on, anchor.detach(), 0.0).sum())


# ----------------------------------------------------------------------------------------------
# Rollouts and the teacher's scores

def privileged_prompt(env, problem, privileged):
    """OPSD's user message for the teacher: the PRIVILEGED template `privileged` filled in."""
    return PRIVILEGED[privileged].format(prompt=problem["prompt"], answer=problem["answer"], solution=env.solve(problem))


def teacher_prompt(run, problem):
    """The user message the teacher sees: the student's own, or under OPSD the privileged one."""
    context = privileged(run.cfg)
    return privileged_prompt(run.env, problem, context) if context != "none" else problem["prompt"]


def privileged(cfg):
    """The teacher's context: cfg's privileged, with auto resolved (answer for OPSD, none for OPD)."""
    if cfg["privileged"] != "auto":
        return cfg["privileged"]
    return "answer" if cfg["teacher"] == "self" else "none"


@torch.no_grad()
def anchor_logprobs(run, ro):
    """log π_init(·| student prompt, y_<t) at τ (N, T-1, V), the anchor's constants: the frozen
    starting model reads exactly what the student read, in chunks of batch_size rows."""
    out = torch.zeros(*ro.mask.shape, run.ref_model.config.vocab_size, device=ro.mask.device)
    for rows in chunks(range(len(ro.ids)), run.cfg["batch_size"]):
        with run.autocast:
            logits = run.ref_model(ro.ids[rows.start:rows.stop, :-1])
        out[rows.start:rows.stop] = F.log_softmax(logits.float() / run.cfg["temperature"], dim=-1)
    return out


@torch.no_grad()
def teacher_logprobs(run, ro):
    """The teacher's grades of the rollouts ro: (log-probs (N, T-1, V), graded (N, T-1)), aligned
    with ro.ids[:, 1:] like ro.mask: log π_t(·| teacher prompt, y_<t) at τ on the graded
    response positions, 0 elsewhere. Each row is re-rendered as the teacher's prompt + the student's
    answer tokens, as many as fit the teacher's context (graded = the sampled response positions kept;
    a tool's results are read as context, never graded), and
    scored in one forward pass per chunk; the kept positions of both layouts hold the same tokens in
    the same order, so the two mask-selects align."""
    ids, mask, tau = ro.ids, ro.mask, run.cfg["temperature"]
    context = run.teacher.config.block_size + 1  # the last token is only a target
    prompts = [run.tok.prompt_ids(teacher_prompt(run, p)) for p in ro.problems]
    room = torch.tensor([max(context - len(p), 0) for p in prompts], device=mask.device)
    response = mask + ro.forced  # the teacher reads tool results too, but grades only sampled tokens
    kept = response * (response.cumsum(1) <= room[:, None])
    graded = mask * kept
    out = torch.zeros(*mask.shape, run.teacher.config.vocab_size, device=mask.device)
    for rows in chunks(range(len(ids)), run.cfg["batch_size"]):
        examples = []
        for i in rows:
            answer = ids[i, 1:][kept[i] > 0].tolist()
            prompt = prompts[i][:context - len(answer)]  # cut only where nothing is graded
            examples.append((prompt + answer, [0] * len(prompt) + mask[i][kept[i] > 0].long().tolist()))
        teacher_ids, teacher_mask = collate(examples, run.tok.pad, run.device)
        with run.autocast:
            logits = run.teacher(teacher_ids[:, :-1])
        logprobs = F.log_softmax(logits.float() / tau, dim=-1)
        out[rows.start:rows.stop][graded[rows.start:rows.stop] > 0] = logprobs[teacher_mask[:, 1:] > 0]
    return out, graded


def rollout_shard(run, it, shard):
    """Shard `shard` of iteration `it`: fresh train problems, the student's answers, the teacher's
    scores. Returns (the Rollout, its response tokens left ungraded)."""
    cfg = run.cfg
    problems, seed = shard_problems(run, it, shard)
    sampler = run.teacher if cfg["kl_estimator"] == "teacher_samples" else run.raw_model  # off-policy: the teacher writes
    ro = rollouts(run, sampler, problems, cfg["samples_per_prompt"], temperature=cfg["temperature"],
                    max_new_tokens=cfg["max_new_tokens"], seed=seed)
    t0 = time.time()
    ro.teacher_logprobs, graded = teacher_logprobs(run, ro)
    if cfg["anchor_coef"]:
        ro.ref_logprobs = anchor_logprobs(run, ro)
    ro.score_time = time.time() - t0
    ungraded = float((ro.mask - graded).sum())
    ro.mask, ro.seq_len = graded, last_response_column(graded) + 2  # the loss and its count: graded positions only
    return ro, ungraded


# ----------------------------------------------------------------------------------------------
# The algorithm module interface (see train.py)

loss_dropout = False  # the loop keeps dropout off in the loss: the teacher (if self) and the student score what was sampled


def needs(cfg):
    """The frozen models the loop builds once: the teacher (run.teacher: --teacher=DIR, or the student
    itself under --teacher=self), and π_init (run.ref_model) when the anchor reads it."""
    return ("teacher", "reference") if cfg["anchor_coef"] else ("teacher",)


def setup(run):
    cfg = run.cfg
    if cfg["kl_estimator"] not in ESTIMATORS:
        raise ValueError(f"kl_estimator={cfg['kl_estimator']!r}: choose from {ESTIMATORS}")
    if cfg["privileged"] not in ("auto", "none", *PRIVILEGED):
        raise ValueError(f"privileged={cfg['privileged']!r}: choose from {('auto', 'none', *PRIVILEGED)}")
    if cfg["teacher"] == "self" and privileged(cfg) == "none":
        raise ValueError("--teacher=self with privileged=none: the teacher would be the student itself, every KL 0")
    P, shard = cfg["prompts_per_iter"], shard_size(run)
    if shard < 1 or P % shard or (P // shard) % run.world_size or cfg["samples_per_prompt"] < 1 or cfg["kl_topk"] < 1:
        raise ValueError(f"prompts_per_iter={P} must split into shards of rollout_prompts={shard} prompts, a whole "
                         f"number per each of {run.world_size} ranks; samples_per_prompt and kl_topk must be >= 1")
    if cfg["teacher"] == "self" and cfg["kl_estimator"] == "teacher_samples":
        raise ValueError("kl_estimator=teacher_samples trains on a separate teacher's samples: it needs --teacher=DIR")
    if cfg["anchor_coef"] < 0:
        raise ValueError(f"anchor_coef={cfg['anchor_coef']} must be >= 0")
    run.verifier_check = verifier_check(run.env, run.env.verify)  # logged: the reward the passport reports
    write_passport(run, passport(run))


def passport(run):
    """The run's post-training passport (SPEC §6) as markdown."""
    c = run.cfg
    context = privileged(c)
    reads = f", reading a privileged prompt: `{PRIVILEGED[context]!r}`" if context != "none" else ", reading the student's prompt"
    if c["teacher"] == "self":
        teacher = "the student's own current weights (OPSD), detached" + reads
    else:
        t = run.teacher.config
        teacher = (f"`{c['teacher']}`, frozen, {t.n_layer} layers × {t.n_embd} "
                   f"({count_parameters(run.teacher)[1]:,} parameters)" + reads)
    signal = ("cross-entropy on the teacher's own samples (off-policy distillation)" if c["kl_estimator"] == "teacher_samples"
              else "per-token reverse KL(π_student ‖ π_teacher) on the student's sampled positions")
    anchor = (f"anchor: + {c['anchor_coef']} · KL(π_student ‖ π_init) on the same positions, π_init = `{c['init_from']}` "
              f"frozen" if c["anchor_coef"] else "no reward model, no critic, no KL to a reference beyond the teacher itself")
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo opd`, on-policy distillation, started from `{c['init_from']}`

## Data and mode
- online: {c['prompts_per_iter']} prompts × {c['samples_per_prompt']} answers per iteration sampled by the current student
  at temperature {c['temperature']}, {c['max_iters']} iterations, one optimizer step per batch
- prompts: the `{c['env']}` environment's *train* split; evaluation on *heldout* and *ood*
- the verifier's reward is logged, never trained on; {verification_text(run.verifier_check)};
  parse_error_rate logged every iteration

## Optimisation
- teacher: {teacher}
- loss: {signal}, estimator
  **{c['kl_estimator']}**{f" (k = {c['kl_topk']})" if c['kl_estimator'] == 'topk' else ''}; both at temperature {c['temperature']}
- {anchor}

## Infrastructure
- {run.device} × {run.world_size}; rollouts in shards of {shard_size(run)} prompts, micro-batches of {c['batch_size']}
"""


def batches(run, it):
    """This rank's shards, scored by the teacher; figures for the log; one optimizer step of
    micro-batches of at most batch_size answers."""
    shards, ungraded = zip(*[rollout_shard(run, it, s) for s in range(run.rank, run.cfg["prompts_per_iter"] // shard_size(run),
                                                                      run.world_size)])
    sums = all_reduce_sum(dict(
        reward=sum(float(ro.rewards.sum()) for ro in shards), answers=sum(len(ro.rewards) for ro in shards),
        tokens=sum(float(ro.lengths.sum()) for ro in shards),
        truncated=sum(float(ro.truncated.sum()) for ro in shards), ungraded=sum(ungraded),
        work=sum(sum(map(run.env.shows_work, ro.texts)) for ro in shards),
        parse_errors=sum(unparsed(run.env, t) for ro in shards for t in ro.texts)), run)
    run.stats.update(reward=sums["reward"] / sums["answers"], len_mean=sums["tokens"] / sums["answers"],
                     truncated_frac=sums["truncated"] / sums["answers"], rollout_tokens=sums["tokens"],
                     ungraded_frac=sums["ungraded"] / max(sums["tokens"], 1.0),
                     time_decode=sum(ro.decode_time for ro in shards),
                     time_teacher=sum(ro.score_time for ro in shards))
    run.stats.update(work_frac=sums["work"] / sums["answers"], parse_error_rate=sums["parse_errors"] / sums["answers"],
                     verifier_error_rate=run.verifier_check["verifier_error_rate"])
    # each micro-batch cut to its own rows' width (the last graded token)
    return [[ro.select(rows) for ro in shards for rows in chunks(range(len(ro.ids)), run.cfg["batch_size"])]]


def loss(run, model, batch):
    """One micro-batch: the student's logits at τ on its own answers, the estimator's loss."""
    ids, mask = batch.ids, batch.mask
    logits = model(ids[:, :-1])
    loss_sum, count, reverse_kl, entropy, anchor_kl = distillation_loss(
        logits, ids[:, 1:], batch.teacher_logprobs, mask, run.cfg["kl_estimator"], run.cfg["temperature"],
        run.cfg["kl_topk"], batch.ref_logprobs, run.cfg["anchor_coef"])
    n = torch.as_tensor(count).clamp(min=1)  # tensors: the loop reads them once per step
    return loss_sum, count, dict(reverse_kl=reverse_kl.detach() / n, entropy=entropy.detach() / n,
                                 anchor_kl=torch.as_tensor(anchor_kl).detach() / n, tokens=count)


def evaluate(run, it):
    """Greedy held-out and OOD accuracy; sampled held-out accuracy and pass@eval_samples."""
    return evaluate_policy(run, run.raw_model, it, temperature=run.cfg["temperature"])[0]
