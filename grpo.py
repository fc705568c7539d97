"""
Online RL with verifiable rewards: REINFORCE, RLOO, GRPO, Dr. GRPO and DAPO as named, independent
choices of one loop. SPEC §3 (REINFORCE, RLOO, GRPO, DAPO), §5 (worked examples), §6 (what a run
reports, its passport), §7 (rollouts dominate the cost); seed M14 §9–§13.

    python train.py --algo grpo --init_from=out/sft                 # GRPO from an SFT checkpoint
    python train.py --algo grpo config/dapo.py --init_from=out/sft  # a recipe: config/{grpo,dapo,dr_grpo,rloo}.py

One iteration (synchronous, on-policy; staleness below):
  1. rollouts: prompts_per_iter prompts × group_size responses sampled from the current policy
     (π_old) with the KV-cache sampler, tokens in / tokens out; rewards from the verifier;
  2. one advantage A_i per response, shared by all its tokens;
  3. inner_epochs × minibatches optimizer steps on the clipped surrogate, per response token t:

         ρ_it = π_θ(y_it | x, y_i<t) / π_old(y_it | x, y_i<t)
         q_it = min(ρ_it·A_i, clip(ρ_it, 1 − eps_low, 1 + eps_high)·A_i)      loss = −q_it (+ β·k3_it)

     With A > 0 the gain stops once ρ > 1 + eps_high, with A < 0 once ρ < 1 − eps_low (the gradient
     is cut on that side only). Clip-Higher (DAPO): eps_high > eps_low lets rare tokens grow more.
     On the first step of a rollout batch ρ = 1 and the gradient is exactly REINFORCE with A_i.

ratio_level — token: ρ_it as above. sequence (GSPO, Zheng et al. 2025): one ratio per response,
         s_i = exp((1/|y_i|) Σ_t log(π_θ/π_old)(y_it)),   q_it = min(s_i·A_i, clip(s_i, 1 − eps_low, 1 + eps_high)·A_i)
  computed per token as sg(s_i)·π_θ(y_it)/sg(π_θ(y_it)), so its value is s_i and its gradient
  s_i·A_i·∇log π_θ(y_it): with seq_mean_token_mean that is ∇ of s_i·A_i. Outside the band the whole
  response stops (on the clipped side), never a single token. A mean of log-ratios moves far less
  than one token's, hence GSPO's narrow band (config/gspo.py: 3e-4 / 4e-4).

policy_loss — clip: q_it above. cispo (MiniMax-M1, 2025): the weight is capped, the token kept,
         ℓ_it = −sg(clip(ρ_it, 1 − eps_low, 1 + eps_high))·A_i·log π_θ(y_it)
  so every token keeps the gradient A_i·∇log π_θ, scaled by its capped ratio: a rare token whose ρ
  ran past 1 + eps_high still learns (PPO's clip would zero it). At ρ = 1 it is plain REINFORCE.
  With ratio_level=sequence the capped weight is clip(s_i). config/cispo.py.

The choices (config keys):

estimator — rewards r_1..r_G of one prompt's group -> advantages:
    reinforce  A_i = r_i − mean(r over the whole batch)     (one batch-mean baseline, no groups)
    rloo       A_i = r_i − (Σ_{j≠i} r_j) / (G − 1)          (leave-one-out: the baseline ignores r_i)
    grpo       A_i = (r_i − mean(r_1..G)) / std(r_1..G)     (population std, ddof = 0)
    dr_grpo    A_i = r_i − mean(r_1..G)                      (no std)
  A mean that includes r_i shrinks the expected gradient by (G − 1)/G (SPEC §5: 0.18375 vs 0.21).

adv_scale — what the centred advantage is divided by. The estimator fixes the baseline, adv_scale the
  divisor, and an explicit adv_scale wins over what the estimator's name implies (auto):
    auto    group for grpo, none for the others (today's four estimators exactly)
    group   the group's population std:   grpo == dr_grpo + group,  dr_grpo == grpo + none
    batch   A_i / std(A over every kept response of the global batch): REINFORCE++'s global
            normalisation with estimator=reinforce (A = (r − mean_B r) / std_B r); with a group
            baseline it is REINFORCE++-baseline. One std for all, so an easy prompt's small
            differences are not blown up to ±1 as the group std does (outcome, rlvp and path modes)
    none    the centred reward as it is

loss_agg — how the per-token losses ℓ_it of one optimizer step's global batch become one number,
  mapped onto the loop's contract loss = Σ loss_sum / Σ count (over micro-batches and ranks):
    seq_mean_token_mean      (1/N) Σ_i (1/|y_i|) Σ_t ℓ_it   loss_sum = Σ_i mean_t ℓ_it,  count = N responses  (GRPO)
    token_mean               Σ_it ℓ_it / Σ_i |y_i|          loss_sum = Σ_it ℓ_it,        count = tokens       (DAPO)
    seq_mean_token_sum_norm  (1/N) Σ_i Σ_t ℓ_it / L_max     loss_sum = Σ_it ℓ_it / L_max, count = N           (Dr. GRPO)
  The last is Dr. GRPO's Σ_it ℓ_it / (G·L_max) per group, averaged over groups; L_max = max_new_tokens,
  a constant, so a response's weight does not depend on its own length. Prompt and padding are in no sum.

kl — to π_ref, the frozen init_from model, scored at the sampler's temperature (β = kl_coef):
    off        no KL term (the DAPO and Dr. GRPO recipes)
    k1_reward  r_i ← r_i − β Σ_t (log π_old − log π_ref)(y_it): the sequence's log-ratio folded into the
               reward before the advantages (γ = 1; one advantage per response). Unbiased: the
               score-function gradient of E_π[log π/π_ref] is ∇KL(π‖π_ref), since E_π[∇log π] = 0.
    k3_loss    + β·k3_it per token, k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 ≥ 0, aggregated like the policy
               term (as in the GRPO paper's objective). Its value estimates KL(π‖π_ref) without bias,
               but its gradient is biased: E_π[∇k3] = −Σ_y π_ref(y)·∇log π_θ(y) = ∇KL(π_ref‖π_θ), the
               other direction of the KL (and here on π_old's samples, with no ratio).
  With a KL term, KL(π_old‖π_ref) per token (the k1 mean) is logged every iteration. With kl=off
  nothing in training reads π_ref, so it runs no forward there; evaluation logs heldout_kl_ref
  (KL(π‖π_ref) per response on the policy's samples of held-out prompts) whatever this key says.

on_degenerate — a group whose rewards are all equal carries no relative signal:
    drop   its responses leave the batch: they are in no sum and no denominator
    zeros  A = 0: no policy-gradient term, but its responses still count in the denominator and the
           k3 term still pulls them towards π_ref (M14 §9)
    raise  stop with an error
  reinforce has no groups, so the rule does not apply to it.

dynamic_sampling_rounds — DAPO's dynamic sampling (needs on_degenerate=drop): after the first
  rollout, up to this many extra rollouts of fresh prompts refill each shard with informative groups;
  extra responses are counted (extra_rollouts). If the rounds run out, the missing groups are
  degenerate ones marked dropped: the batch never trains on a degenerate group.

overlong_cache — DAPO's soft overlong penalty, added to the reward, with L = the response limit:
    0 if |y| ≤ L − L_cache;  (L − L_cache − |y|) / L_cache in the last L_cache tokens (−1 at |y| = L).

reward_mode — what the advantages are made of (SPEC §3 "Process vs outcome rewards", "RLVP"):
    outcome  one reward per response, the verifier's (with the shaping above): everything above
    process  a reward at the last token of each verifiable step (env.step_rewards: each written
             equation, each tool call that computes a step, the answer), normalised over all the
             step rewards of the group and summed over the steps from each token on
             (process_advantages, the GRPO paper's process supervision): one advantage per token
    rlvp     R = O + β·Φ: the outcome O and the rule engine's path signal Φ = Σ (−λ per bad action,
             +μ per compliant one; env.path_signals) each through the estimator on its own, then
             A = Â(O) + β·Â(Φ) (rlvp_advantages; β = rlvp_beta ≤ 1, λ = rlvp_penalty, μ = rlvp_bonus)
    path     Φ alone: the inaction trap (penalties without the outcome), for experiments/agentic.py
  The non-outcome modes need a group estimator; process takes no sequence shaping (k1_reward, overlong).

old_logprobs — where π_old comes from: "sampler" (the log-probs the sampler drew with; equal to a
  training forward in fp32, checked by a test), "recompute" (one no-grad forward of the same weights
  before the first update: needed when sampling and training differ numerically, e.g. bf16 autocast
  on a GPU, or a separate inference engine), or "auto" (recompute under autocast, else sampler).
  π_old stays fixed for all inner epochs: it is the policy that sampled, not the current one.
  With recompute the sampler's own numbers are compared every iteration: sampler_logprob_gap (mean
  |log π_old − log π_sampler| per response token, PPO's name) and sampler_logprob_gap_max.

tis_cap — C > 0: truncated importance sampling for the sampler/trainer mismatch (needs
  old_logprobs=recompute: with the sampler's log-probs there is nothing to compare). Each token's
  policy term is multiplied by the constant
         w_it = min(π_old(y_it) / π_sampler(y_it), C)
  (the samples came from π_sampler, the loss assumes π_old: w corrects the difference, the cap
  bounds its variance); tis_capped_frac logs the share of tokens at the cap. 0 = off.

prompt_sampling — uniform: fresh problems of the train split for every shard (the generator has
  thousands of distinct problems: prompts rarely return). edge (budget at the edge of competence,
  SPEC §3 DAPO): a fixed pool of prompt_pool train problems (seed = the run's seed); each iteration
  draws prompts_per_iter distinct pool prompts: unseen ones first (in pool order), then at random
  among those whose running success s lies in [edge_low, edge_high], then the rest nearest the
  band's middle. After each rollout s ← mean reward of the prompt's group on its first visit, else
  s ← (s + mean) / 2. The draw depends on (seed, iteration) and s only; s is summed over ranks
  before the update, so every rank draws the same prompts, and it is checkpointed, so a resumed run
  draws what the uninterrupted one did (tested). Needs staleness=0 and no dynamic sampling.

share_prompt — the G responses of a prompt share it: with True, every forward outside the sampler
  (π_ref and π_old scoring, the loss) runs each distinct prompt once and lets its rows attend to
  its keys and values (sampler.SharedPrompts); the gradient of the prompt's part is the sum over its
  rows, as in G separate forwards. Same numbers up to fp32 rounding (tested); False: one full row each.

staleness — 0: the loop above. 1: one-step-off rollouts: while iteration k updates, the rollouts of
  k + 1 are sampled by the weights of k in a second thread (one_step_off_rollouts), so k + 1 trains
  on samples of a policy one update behind. π_old is then that behaviour policy: the sampler's own
  log-probs (or a recompute with the sampler's copy of the weights), so ρ = π_θ/π_old corrects
  for the lag and the clip bounds it; ρ ≠ 1 from the first step. The first iteration (and the first
  after a resume, which samples with the checkpoint's sampler weights) waits for its rollouts;
  logged: staleness (0 or 1) and time_wait_rollouts (the sampling the update did not hide).

Rollouts are sampled in shards of rollout_prompts prompts, shard s of iteration it seeded by
(seed, it, s); rank r takes shards r, r + world_size, ...; minibatch m is slice m of every shard.
So a run's batches do not depend on how many processes share them: two ranks take the same steps
as one process (tested), and every rank always returns the same number of steps and micro-batches
(dropped groups are masked, never removed, so DDP cannot deadlock).

The policy is scored with dropout off (eval mode) in the loss too: π_θ in ρ must be the function
that sampled, or ρ ≠ 1 before any update.

break_it — a classic failure on purpose, each with the monitor that must catch it (alarms(), tested):
    fp8_sampler    the rollouts come from an FP8 (e4m3, per-tensor scale) copy of the weights, as a
                   low-precision inference engine would sample -> sampler_logprob_gap (with
                   recompute) and tis_capped_frac; with the sampler's log-probs, ratio drift
    all_equal      every reward 0 (a task out of reach) -> degenerate_frac
    length_bonus   +0.01 reward per response token -> reward_len_corr (and the length)
    format_exploit the training reward accepts a response that contains the right number anywhere
                   (several guesses pass) -> verifier_error_rate; held-out accuracy is still scored
                   by the strict verifier
  and two without a switch: stale rollouts (--staleness=1 -> staleness, ratio_dev on an on-policy
  step) and too high a learning rate (--learning_rate=... -> entropy collapse).

Logged every iteration (metrics.jsonl, SPEC §6): reward (verifier, first rollout: a fair sample of
the policy), reward_shaped (what the advantages saw), degenerate_frac (groups with all-equal verifier
rewards), kept_groups_frac, extra_rollouts, len_mean / len_std / truncated_frac, work_frac (first
rollout's share of answers that show their work), kl_ref
(with a KL term), and per micro-batch means of entropy, clip_frac, ratio_dev (max |ρ − 1|) and kl_k3;
the time split time_decode / time_verify / time_score / time_update and decode_tok_per_s (this
rank's clock); all_fail_frac (groups where every response fails the verifier) and, where the
environment has a rule engine, violations_per_episode (its −1 signals per response, whatever the
reward_mode); parse_error_rate (first rollout's responses with no answer in the task's form:
above ~20% RL fails, SPEC §6), reward_len_corr (correlation of the shaped reward with the length
among the responses the verifier rejects: 0 unless the reward pays for length) and
verifier_error_rate (the training verifier against the solver, verifier_check, in the passport too).

Tool environments (--env=calculator): rollouts run the tool inside generation; its results stay in
ids and have mask 0, so the surrogate and the KL term never train on them (rollouts.rollouts).
"""


import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from checkpoints import frozen
from distributed import all_reduce_sum, chunks, seeded_rng
from evaluation import evaluate_policy
from model import kl_estimate, sequence_logprobs, token_logprobs_and_entropy
from paperwork import unparsed, verification_text, verifier_check, write_passport
from rewards import REWARD_KEYS, check_reward_mode, path_signals, token_rewards
from rollouts import Rollout, rollouts, shard_problems, shard_size
from sampler import SharedPrompts

starts_from = "sft"  # RL selects among what a trained policy does: no random start (train.check_start)
defaults = dict(
    prompts_per_iter=16,       # P: prompts per iteration, global over ranks
    group_size=16,             # G: responses per prompt; 16 so that a prompt the SFT model gets right
                               # 1 time in 4 still has a correct and a wrong answer in most groups
    rollout_prompts=0,         # prompts per sampler call (a shard); 0 = prompts_per_iter / world_size
    temperature=1.0,           # sampling temperature; π_θ, π_old and π_ref are all scored at it
    estimator="grpo",          # reinforce | rloo | grpo | dr_grpo
    adv_scale="auto",          # auto | group | batch | none: the advantage's divisor (auto: group for grpo, else none)
    loss_agg="seq_mean_token_mean",  # seq_mean_token_mean | token_mean | seq_mean_token_sum_norm
    eps_low=0.2,               # ε_low: the clip range's lower side, 1 − eps_low
    eps_high=0.2,              # ε_high: the clip range's upper side, 1 + eps_high (DAPO's Clip-Higher: eps_high > eps_low)
    ratio_level="token",       # token | sequence (GSPO: one ratio per response, exp of its mean token log-ratio)
    policy_loss="clip",        # clip (PPO's min) | cispo (capped, detached ratio times log π: every token keeps a gradient)
    inner_epochs=1,            # passes over each rollout batch
    minibatches=1,             # optimizer steps per pass; 1 = exactly on-policy (ρ = 1, plain
                               # group-normalised REINFORCE); more reuse each rollout batch, off-policy
    kl="k3_loss",              # off | k1_reward | k3_loss
    kl_coef=0.04,              # β
    on_degenerate="zeros",     # drop | zeros | raise
    dynamic_sampling_rounds=0, # DAPO: extra rollouts to refill informative groups (0 = off)
    overlong_cache=0,          # DAPO: soft length penalty over the last L_cache tokens (0 = off)
    old_logprobs="auto",       # auto | sampler | recompute
    tis_cap=0.0,               # truncated importance sampling: weight min(π_old/π_sampler, C) per token (needs recompute; 0 = off)
    prompt_sampling="uniform", # uniform (fresh problems) | edge (a fixed pool, prompts with success in the band first)
    prompt_pool=2048,          # edge: the pool's size (prompts come back once it is used up)
    edge_low=0.2,              # edge: the lower end of the band of running success that is drawn first
    edge_high=0.8,             # edge: the upper end of that band
    break_it="none",           # none | fp8_sampler | all_equal | length_bonus | format_exploit (a failure and its monitor)
    share_prompt=True,         # run each prompt once for its G responses, in scoring and in the loss
    staleness=0,               # 0: synchronous; 1: the next rollouts are sampled during the update (one-step-off rollouts)
    eval_samples=8,            # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
    # common keys with RL values: 20x below SFT's lr, constant after a short warm-up (Adam's first
    # steps are sign steps). At 1e-4 the policy switches to worked answers within about 10
    # iterations on the default task (README); 3e-4 lost 16 points on the old all-worked task.
    learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, max_iters=20, eval_interval=5, log_interval=1,
)

defaults.update(REWARD_KEYS)  # reward_mode and RLVP's β, λ, μ: one definition for grpo.py and ppo.py

CHOICES = dict(estimator=("reinforce", "rloo", "grpo", "dr_grpo"), adv_scale=("auto", "group", "batch", "none"),
               ratio_level=("token", "sequence"), policy_loss=("clip", "cispo"),
               prompt_sampling=("uniform", "edge"),
               break_it=("none", "fp8_sampler", "all_equal", "length_bonus", "format_exploit"),
               loss_agg=("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"),
               kl=("off", "k1_reward", "k3_loss"), on_degenerate=("drop", "zeros", "raise"),
               old_logprobs=("auto", "sampler", "recompute"))


# ----------------------------------------------------------------------------------------------
# The core path, the seeds' recipe, top to bottom: setup -> batches (sample a group per prompt, the
# verifier's reward, group advantages) -> loss (the clipped token loss) -> evaluate. The options hook
# in by name and live below it.

needs = ("reference",)  # the loop builds π_ref once: run.ref_model
sharded_rollouts = True  # --fsdp_rollouts=sharded: every rank makes the same number of scoring forwards
loss_dropout = False    # the loop keeps dropout off in the loss too: it scores the function that sampled


def setup(run):
    check_config(run.cfg, run.world_size)
    if run.cfg["staleness"] and run.fsdp:
        raise ValueError("staleness=1 samples with a second copy of the weights in a thread: not with --fsdp")
    if run.cfg["dynamic_sampling_rounds"] and run.lockstep:  # (a rank's extra rounds would be forwards alone)
        raise ValueError("dynamic_sampling_rounds > 0 samples a different number of rounds on each rank: not with "
                         "--fsdp_rollouts=sharded (use gathered)")
    check_reward_mode(run.cfg, run.env)
    if run.cfg["break_it"] == "format_exploit" and not isinstance(run.env.problems("train", 1)[0].get("answer"), int):
        raise ValueError(f"break_it=format_exploit looks for the answer's number: env={run.cfg['env']} has no integer answer")
    run.verifier_check = verifier_check(run.env, training_verifier(run))
    if run.cfg["prompt_sampling"] == "edge":  # the pool and each prompt's running success (NaN: unseen)
        run.pool = run.env.problems("train", run.cfg["prompt_pool"], seed=run.cfg["seed"])
        run.pool_success = np.full(len(run.pool), np.nan)
    mode = run.cfg["old_logprobs"]
    run.old_logprobs_mode = mode if mode != "auto" else ("recompute" if run.device.startswith("cuda") else "sampler")
    if run.cfg["staleness"]:  # one_step_off_rollouts: the sampler's own weights, and its thread
        run.sampler, run.sampler_iter, run.pending = frozen(run.raw_model), None, None
        run.sampling_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-sampler")
    if run.master and run.cfg["init_from"] == "scratch":
        print("grpo: init_from=scratch: a random policy rarely earns a reward; start from an SFT checkpoint")
    write_passport(run, passport(run))


def batches(run, it):
    """Rollouts of this rank's shards, advantages, figures for the log, then the optimizer steps:
    inner_epochs × minibatches, each a list of micro-batches of at most batch_size responses."""
    cfg = run.cfg
    if cfg["prompt_sampling"] == "edge":
        edge_batches(run, it)
    if cfg["staleness"]:
        t0 = time.time()
        rollouts = one_step_off_rollouts(run, it)
        run.stats["time_wait_rollouts"] = time.time() - t0  # what the overlap did not hide
    else:
        rollouts = rollout_shards(run, run.raw_model, it)
    shards, counts = [r for r, _ in rollouts], [c for _, c in rollouts]
    global_batch_advantages(run, shards)  # reinforce's baseline, adv_scale=batch: both need every rank's rows
    if cfg["prompt_sampling"] == "edge":
        edge_record(run, [c["group_reward"] for c in counts])

    log_figures(run, shards, counts)

    # minibatch m = slice m of every shard, so the global minibatch is the same for any world size
    minibatches = []
    for m in range(cfg["minibatches"]):
        rows = Rollout.cat([b.select(np.array_split(np.arange(len(b.ids)), cfg["minibatches"])[m]) for b in shards],
                             run.tok.pad)
        minibatches.append([rows.select(r) for r in chunks(range(len(rows.ids)), cfg["batch_size"])])
    if run.old_logprobs_mode == "recompute" and not cfg["staleness"]:
        # π_old again on the very tensors the loss sees: under bf16 autocast the same rows in another
        # batch shape (the shard's scoring chunks) round differently, and ρ ≠ 1 before any update
        for micro in [micro for mb in minibatches for micro in mb]:
            micro.old_logprobs = score(run, run.raw_model, micro.ids, micro.prompt_lens) * micro.mask
    return [mb for _ in range(cfg["inner_epochs"]) for mb in minibatches]


def loss(run, model, batch):
    """One micro-batch: π_θ log-probs at the sampler's temperature, the clipped surrogate, and the
    policy's entropy on its own samples."""
    ids, mask, temperature = batch.ids, batch.mask, run.cfg["temperature"]
    if run.cfg["share_prompt"]:  # each distinct prompt runs once, its keys and values shared by its rows
        shared = SharedPrompts(ids, batch.prompt_lens)
        logp, entropy = token_logprobs_and_entropy(model(shared.inputs, prompts=shared), shared.targets, temperature)
        logp, entropy = shared.to_rows(logp), shared.to_rows(entropy)
    else:
        logp, entropy = token_logprobs_and_entropy(model(ids[:, :-1]), ids[:, 1:], temperature)
    advantages = batch.step_advantages if batch.step_advantages is not None else batch.advantages
    tis, capped = (tis_weights(batch.old_logprobs, batch.sampler_logprobs, mask, run.cfg["tis_cap"])
                   if run.cfg["tis_cap"] else (None, 0))
    # ℓ_it = −min(ρ_it·A_i, clip(ρ_it, 1 − ε_low, 1 + ε_high)·A_i) + β·k3_it,  ρ_it = π_θ(y_it)/π_old(y_it),
    # aggregated per loss_agg (SPEC §3 GRPO, DAPO; GSPO and CISPO variants in policy_loss)
    loss_sum, count, metrics = policy_loss(logp, batch.old_logprobs, advantages, mask, run.cfg,
                                           ref_logp=batch.ref_logprobs, tis_weight=tis)
    if run.cfg["tis_cap"]:
        metrics["tis_capped_frac"] = capped / mask.sum().clamp(min=1)
    metrics["entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
    return loss_sum, count, {**metrics, "tokens": mask.sum()}  # tensors: the loop reads them once per step


def evaluate(run, it):
    """Greedy held-out and OOD accuracy; on eval_samples held-out answers per problem at the training
    temperature their accuracy, pass@k (Best-of-k by the verifier) and the KL to π_ref."""
    return evaluate_policy(run, run.raw_model, it, run.ref_model, run.cfg["temperature"])[0]


def rollout_shards(run, model, it):
    """This rank's shards of iteration `it`, sampled by `model`: a list of (rows, counts)."""
    n_shards = run.cfg["prompts_per_iter"] // shard_size(run)
    return [rollout_shard(run, model, it, s) for s in range(run.rank, n_shards, run.world_size)]


def rollout_shard(run, model, it, shard):
    """A shard's training rows sampled by `model`: shard_size(run) groups, with keep = 0 on rows
    that must not train (dropped degenerate groups), plus the shard's counts for the logs."""
    cfg, G, n = run.cfg, run.cfg["group_size"], shard_size(run)
    first, first_degenerate = sample_round(run, model, it, shard, 0)
    if first_degenerate.any() and cfg["on_degenerate"] == "raise" and cfg["estimator"] != "reinforce":
        raise ValueError(f"iteration {it}: {int(first_degenerate.sum())} of {n} groups have all rewards "
                         f"equal (on_degenerate='raise'); choose drop or zeros")
    rounds = [(first, first_degenerate)]
    informative = lambda degenerate: [g for g in range(n) if not degenerate[g]]
    found = len(informative(first_degenerate))
    while found < n and len(rounds) <= cfg["dynamic_sampling_rounds"]:
        rounds.append(sample_round(run, model, it, shard, len(rounds)))
        found += len(informative(rounds[-1][1]))
    drop = cfg["on_degenerate"] == "drop" and cfg["estimator"] != "reinforce"
    parts, taken = [], 0
    for ro, degenerate in rounds:  # informative groups first, in sampling order
        groups = informative(degenerate)[:n - taken] if drop else list(range(n))
        taken += len(groups)
        if groups:
            parts.append(ro.select([g * G + j for g in groups for j in range(G)]))
            parts[-1].keep = torch.ones(len(groups) * G, device=ro.ids.device)
        if taken == n:
            break
    if taken < n:  # rounds ran out: fill with degenerate groups of the first round, masked out
        groups = [g for g in range(n) if first_degenerate[g]][:n - taken]
        parts.append(first.select([g * G + j for g in groups for j in range(G)]))
        parts[-1].keep = torch.zeros(len(groups) * G, device=first.ids.device)
    batch = Rollout.cat(parts, run.tok.pad)
    batch.mask = batch.mask * batch.keep[:, None]
    counts = dict(
        reward_sum=float(first.rewards.sum()), reward_n=len(first.rewards),
        all_fail=float((first.rewards.view(-1, G).amax(1) == 0).sum()),
        violations=sum(sign < 0 for p, t in zip(first.problems, first.texts)
                       for _, sign in run.env.path_signals(p, t)) if hasattr(run.env, "path_signals") else 0,
        degenerate=float(degenerate_groups(first.rewards.view(-1, G)).sum()), groups=n,  # on the verifier's reward
        extra_rollouts=(len(rounds) - 1) * n * G, kept_groups=float(batch.keep.sum()) / G,
        time_decode=sum(ro.decode_time for ro, _ in rounds), time_verify=sum(ro.verify_time for ro, _ in rounds),
        time_score=sum(ro.score_time for ro, _ in rounds),
        work=sum(map(run.env.shows_work, first.texts)),
        parse_errors=sum(unparsed(run.env, t) for t in first.texts),
        group_reward=first.rewards.view(-1, G).mean(1).tolist(),  # edge sampling's running success
        decoded_tokens=sum(float(ro.lengths.sum()) for ro, _ in rounds))
    rejected = first.verified == 0  # reward_len_corr's moments: shaped reward y against length x
    x, y = first.lengths[rejected].double(), first.reward[rejected].double()
    counts.update(corr_n=len(x), corr_x=float(x.sum()), corr_y=float(y.sum()), corr_xy=float((x * y).sum()),
                  corr_xx=float((x * x).sum()), corr_yy=float((y * y).sum()))
    return batch, counts


def sample_round(run, model, it, shard, round_):
    """One rollout of a shard by `model` (π_old): fresh train problems, G responses each, scored and
    rewarded. Returns (the Rollout, (P,) True on degenerate groups)."""
    cfg, G = run.cfg, run.cfg["group_size"]
    problems, seed = shard_problems(run, it, shard, round_)
    if cfg["prompt_sampling"] == "edge":  # this shard's slice of the iteration's draw from the pool
        problems = [run.pool[i] for i in run.edge_draw[shard]]
    sampler = fp8_copy(model) if cfg["break_it"] == "fp8_sampler" else model
    ro = rollouts(run, sampler, problems, G, temperature=cfg["temperature"], max_new_tokens=cfg["max_new_tokens"],
                    seed=seed)
    t0 = time.time()
    if run.old_logprobs_mode == "recompute":  # the sampler's numbers kept for the gap and TIS
        ro.sampler_logprobs = ro.old_logprobs
        ro.old_logprobs = score(run, model, ro.ids, ro.prompt_lens) * ro.mask
    if cfg["kl"] != "off":  # with kl=off nothing reads π_ref: no forward (evaluation logs the KL)
        ro.ref_logprobs = score(run, run.ref_model, ro.ids, ro.prompt_lens) * ro.mask
    ro.score_time = time.time() - t0
    ro.verified, ro.rewards = ro.rewards, broken_rewards(cfg["break_it"], ro)  # the env's verdict, the training reward
    ro.reward = reward = shaped_reward(run, ro, problems)
    if cfg["estimator"] == "reinforce" or cfg["reward_mode"] != "outcome":
        degenerate = option_advantages(run, ro, reward, problems)
    else:  # the seeds' recipe: A_i = (r_i − mean(r_1..G)) / std(r_1..G) within each group
        adv, degenerate = group_advantages(reward.view(-1, G), cfg["estimator"], advantage_scale(cfg))
        ro.advantages = adv.flatten()
    return ro, degenerate.to(reward.device)


@torch.no_grad()
def score(run, model, ids, prompt_lens):
    """Per-token log-probs of ids[:, 1:] at the sampling temperature, no gradient, in chunks; with
    share_prompt each distinct prompt of a chunk runs once (sampler.SharedPrompts)."""
    size, share = run.cfg["batch_size"], run.cfg["share_prompt"]
    with run.autocast:
        return torch.cat([sequence_logprobs(model, chunk, run.cfg["temperature"], lens if share else None).float()
                          for chunk, lens in zip(chunks(ids, size), chunks(prompt_lens, size))])


def log_figures(run, shards, counts):
    """The iteration's figures for the log (run.stats), summed over ranks; round-0 figures are an
    unbiased sample of the policy."""
    cfg, G = run.cfg, run.cfg["group_size"]
    rewards = torch.cat([b.reward for b in shards])
    kept = torch.cat([b.mask.sum(1) > 0 for b in shards])
    lengths = torch.cat([b.lengths.float() for b in shards])
    sums = {k: sum(c[k] for c in counts)
            for k in ("reward_sum", "reward_n", "degenerate", "groups", "extra_rollouts", "kept_groups", "work",
                      "all_fail", "violations", "parse_errors", "corr_n", "corr_x", "corr_y", "corr_xy", "corr_xx",
                      "corr_yy")}
    sums.update(
        len_sum=float(lengths.sum()), len_sq=float((lengths ** 2).sum()), len_n=len(lengths),
        truncated=sum(float(b.truncated.sum()) for b in shards),
        tokens=sum(float(b.mask.sum()) for b in shards), shaped=float((rewards * kept).sum()))
    if cfg["kl"] != "off":
        sums["kl"] = sum(float(((b.old_logprobs - b.ref_logprobs) * b.mask).sum()) for b in shards)
    if run.old_logprobs_mode == "recompute":  # the sampler against the trainer, same weights
        gaps = [((b.old_logprobs - b.sampler_logprobs).abs() * b.mask) for b in shards]
        sums["gap"] = sum(float(g.sum()) for g in gaps)
        sums.update({f"gap_max_{r}": max(float(g.max()) for g in gaps) if r == run.rank else 0.0
                     for r in range(run.world_size)})  # the max over ranks, through a sum
    sums = all_reduce_sum(sums, run)
    len_mean = sums["len_sum"] / sums["len_n"]
    local_time = {k: sum(c[k] for c in counts) for k in ("time_decode", "time_verify", "time_score")}
    run.stats.update(
        reward=sums["reward_sum"] / sums["reward_n"],
        reward_shaped=sums["shaped"] / max(sums["kept_groups"] * G, 1),
        degenerate_frac=sums["degenerate"] / sums["groups"],
        all_fail_frac=sums["all_fail"] / sums["groups"],
        kept_groups_frac=sums["kept_groups"] / sums["groups"],
        extra_rollouts=sums["extra_rollouts"],
        len_mean=len_mean, len_std=max(sums["len_sq"] / sums["len_n"] - len_mean ** 2, 0.0) ** 0.5,
        truncated_frac=sums["truncated"] / sums["len_n"],
        decode_tok_per_s=sum(c["decoded_tokens"] for c in counts) / max(local_time["time_decode"], 1e-9),
        **local_time)
    if "kl" in sums:
        run.stats["kl_ref"] = sums["kl"] / max(sums["tokens"], 1.0)
    run.stats["work_frac"] = sums["work"] / sums["reward_n"]
    run.stats.update(parse_error_rate=sums["parse_errors"] / sums["reward_n"], reward_len_corr=correlation(sums),
                     verifier_error_rate=run.verifier_check["verifier_error_rate"])
    if "gap" in sums:
        run.stats["sampler_logprob_gap"] = sums["gap"] / max(sums["tokens"], 1.0)
        run.stats["sampler_logprob_gap_max"] = max(sums[f"gap_max_{r}"] for r in range(run.world_size))
    if hasattr(run.env, "path_signals"):  # RLVP's rule engine, counted whatever the reward_mode
        run.stats["violations_per_episode"] = sums["violations"] / sums["reward_n"]


# ----------------------------------------------------------------------------------------------
# The core math: group advantages, the clipped loss and its aggregation (pure functions, tested on numbers)

def degenerate_groups(rewards):
    """(P, G) rewards -> (P,) True where every reward of the group is equal. Exact equality, not
    std == 0: the mean of equal floats can be off by an ulp, and dividing by that std explodes."""
    return (rewards == rewards[..., :1]).all(-1)


def grpo_advantages(rewards, on_degenerate="raise"):
    """The seed's primitive (M14 §13) in torch: (r − mean) / std with the population std (ddof = 0),
    per group along the last dimension ((G,) or (P, G)). A degenerate group is an error or zeros."""
    if on_degenerate not in ("raise", "zeros"):
        raise ValueError(f"on_degenerate must be 'raise' or 'zeros', got {on_degenerate!r}")
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.float()
    if r.dim() not in (1, 2) or r.size(-1) < 2:
        raise ValueError(f"rewards must be one group (G,) or groups (P, G) with G >= 2, got shape {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite (got NaN or inf)")
    degenerate = degenerate_groups(r)
    if degenerate.any() and on_degenerate == "raise":
        raise ValueError(f"{int(degenerate.sum())} group(s) with all rewards equal: no relative signal "
                         f"(choose on_degenerate='zeros', or drop such groups)")
    centred = r - r.mean(-1, keepdim=True)
    std = r.std(-1, correction=0, keepdim=True)
    return torch.where(degenerate.unsqueeze(-1), 0.0, centred / torch.where(degenerate.unsqueeze(-1), 1.0, std))


def advantage_scale(cfg):
    """adv_scale with auto resolved: the group std for grpo, nothing for the other estimators."""
    if cfg["adv_scale"] != "auto":
        return cfg["adv_scale"]
    return "group" if cfg["estimator"] == "grpo" else "none"


def group_advantages(rewards, estimator, scale=None):
    """(P, G) rewards -> (advantages (P, G), degenerate (P,)) for a group estimator: its baseline,
    then the group's population std as divisor when scale is "group" (None: what the estimator
    implies; "batch" is applied later, over the whole batch). Degenerate groups get exactly 0 (what
    every formula gives in exact arithmetic); the caller applies the rule."""
    degenerate = degenerate_groups(rewards)
    G = rewards.size(1)
    scale = scale or advantage_scale(dict(estimator=estimator, adv_scale="auto"))
    if estimator in ("grpo", "dr_grpo"):
        adv = rewards - rewards.mean(1, keepdim=True)
    elif estimator == "rloo":
        if G < 2:
            raise ValueError("rloo needs group_size >= 2 (the others' mean is the baseline)")
        adv = rewards - (rewards.sum(1, keepdim=True) - rewards) / (G - 1)
    else:
        raise ValueError(f"{estimator!r} is not a group estimator")
    if scale == "group":
        adv = adv / torch.where(degenerate[:, None], 1.0, rewards.std(1, correction=0, keepdim=True))
    return torch.where(degenerate[:, None], 0.0, adv), degenerate


def policy_loss(logp, old_logp, advantages, mask, cfg, ref_logp=None, tis_weight=None):
    """The policy term (+ β·k3) aggregated per cfg: the clipped surrogate or CISPO, on token or
    sequence ratios (formulas at the top). logp (B, T) with gradient, old_logp, ref_logp and
    tis_weight (B, T) constants, advantages (B,) or (B, T), mask (B, T) 0/1.
    Returns (loss_sum, count, metrics)."""
    on = mask > 0
    log_ratio = torch.where(on, logp - old_logp, 0.0)  # 0 off the response: no exp(garbage) on padding
    if cfg["ratio_level"] == "sequence":  # GSPO: value s_i on every token, gradient s_i·∇log π_θ(y_it)
        seq = log_ratio.sum(1, keepdim=True) / on.sum(1, keepdim=True).clamp(min=1)
        log_ratio = torch.where(on, seq.detach() + logp - logp.detach(), 0.0)
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # per response, or per token (process)
    low, high = 1 - cfg["eps_low"], 1 + cfg["eps_high"]
    if cfg["policy_loss"] == "cispo":  # the capped ratio is a constant weight: every token keeps its gradient
        per_token = -ratio.clamp(low, high).detach() * adv * torch.where(on, logp, 0.0)
    else:
        per_token = -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    if tis_weight is not None:  # truncated importance sampling: min(π_old/π_sampler, C), a constant
        per_token = per_token * tis_weight
    metrics = {}
    if cfg["kl"] == "k3_loss":
        kl = kl_estimate(logp, torch.where(on, ref_logp, logp), "k3")
        per_token = per_token + cfg["kl_coef"] * kl
        metrics["kl_k3"] = (kl.detach() * on).sum() / on.sum().clamp(min=1)
    loss_sum, count = aggregate(per_token, mask, cfg["loss_agg"], cfg["max_new_tokens"])
    with torch.no_grad():  # clip: tokens whose gradient the clip cut; cispo: tokens whose weight it capped
        if cfg["policy_loss"] == "cispo":
            clipped = on & ((ratio > high) | (ratio < low))
        else:
            clipped = on & (((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low)))
        n = on.sum().clamp(min=1)
        metrics["clip_frac"] = clipped.sum() / n
        metrics["ratio_dev"] = ((ratio - 1).abs() * on).amax()  # (tensors: read once per step)
    return loss_sum, count, metrics


def aggregate(values, mask, loss_agg, max_len):
    """Per-token values (B, T) on the tokens where mask > 0 -> (loss_sum, count) per `loss_agg`
    (table at the top). Rows with no token (padding rows, dropped groups) count nowhere."""
    on = mask > 0
    v = torch.where(on, values, 0.0)  # where, not *: a NaN/inf on a padded position must not leak
    n_tokens = on.sum(1)
    n_responses = (n_tokens > 0).sum()
    if loss_agg == "token_mean":
        return v.sum(), n_tokens.sum()
    if loss_agg == "seq_mean_token_mean":
        return (v.sum(1) / n_tokens.clamp(min=1)).sum(), n_responses
    if loss_agg == "seq_mean_token_sum_norm":
        return v.sum() / max_len, n_responses
    raise ValueError(f"loss_agg must be one of {CHOICES['loss_agg']}, got {loss_agg!r}")


# ----------------------------------------------------------------------------------------------
# Options: reward shaping, other estimators and reward modes, TIS, one-step-off rollouts

def shaped_reward(run, ro, problems):
    """The reward the advantages see: the training reward, DAPO's overlong penalty (overlong_cache)
    and, with kl=k1_reward, −β·Σ_t log(π_old/π_ref) (formulas at the top)."""
    cfg = run.cfg
    # the sampler stops earlier than max_new_tokens when the longest prompt leaves less room
    longest_prompt = max(len(run.tok.prompt_ids(p["prompt"])) for p in problems)
    limit = min(cfg["max_new_tokens"], run.raw_model.config.block_size - longest_prompt)
    reward = ro.rewards + overlong_penalty(ro.lengths.cpu(), limit, cfg["overlong_cache"]).to(ro.rewards.device)
    if cfg["kl"] == "k1_reward":
        reward = reward - cfg["kl_coef"] * ((ro.old_logprobs - ro.ref_logprobs) * ro.mask).sum(1)
    return reward


def option_advantages(run, ro, reward, problems):
    """The advantages of the estimators and reward modes off the seeds' path: reinforce (filled in
    later, over the whole batch), process (one per token), rlvp and path. Sets them on ro; returns
    (P,) True on degenerate groups."""
    cfg, G = run.cfg, run.cfg["group_size"]
    if cfg["estimator"] == "reinforce":  # the batch-mean baseline needs the whole batch: later
        ro.advantages, degenerate = torch.zeros_like(reward), torch.zeros(len(problems), dtype=torch.bool)
    elif cfg["reward_mode"] == "process":  # one advantage per token, the response's shared one unused
        steps, ends = token_rewards(run, ro, run.env.step_rewards)
        ro.step_advantages, degenerate = process_advantages(steps, ends, ro.mask, G, cfg["estimator"],
                                                                     advantage_scale(cfg))
        ro.advantages = torch.zeros_like(reward)
    elif cfg["reward_mode"] in ("rlvp", "path"):  # path: Φ alone (no outcome channel), the inaction trap
        signals = path_signals(run)
        path = torch.tensor([sum(v for _, v in signals(p, t)) for p, t in zip(ro.problems, ro.texts)],
                            dtype=torch.float32, device=reward.device)  # float even when no row has a signal
        outcome = reward if cfg["reward_mode"] == "rlvp" else torch.zeros_like(reward)
        beta = cfg["rlvp_beta"] if cfg["reward_mode"] == "rlvp" else 1.0
        adv, degenerate = rlvp_advantages(outcome.view(-1, G), path.view(-1, G), cfg["estimator"], beta,
                                                advantage_scale(cfg))
        ro.advantages = adv.flatten()
    return degenerate


def global_batch_advantages(run, shards):
    """The advantages that need the whole global batch (summed over ranks), set on the shards:
    estimator=reinforce's batch-mean baseline, then adv_scale=batch's one std."""
    cfg = run.cfg
    rewards = torch.cat([b.reward for b in shards])
    if cfg["estimator"] == "reinforce":  # A = r − mean of the whole global batch
        total, n = all_reduce_sum([float(rewards.sum()), len(rewards)], run)
        for b in shards:
            b.advantages = b.reward - total / n
    if advantage_scale(cfg) == "batch":  # one std over the global batch (REINFORCE++)
        scaled = batch_scale([b.advantages for b in shards], [b.mask.sum(1) > 0 for b in shards], run)
        for b, adv in zip(shards, scaled):
            b.advantages = adv


def batch_scale(advantages, kept, run):
    """adv_scale=batch: divide by the population std of the advantages of every kept response of
    the global batch (summed over ranks). advantages, kept: lists of this rank's (N,) tensors."""
    a = torch.cat(advantages)[torch.cat(kept)]
    s, sq, n = all_reduce_sum([float(a.sum()), float((a ** 2).sum()), len(a)], run)
    std = max(sq / max(n, 1) - (s / max(n, 1)) ** 2, 0.0) ** 0.5
    return [adv / std if std > 0 else adv for adv in advantages]


def process_advantages(step_rewards, step_ends, mask, group_size, estimator, scale=None):
    """Process supervision as in the GRPO paper (Shao et al. 2024, §4.1.3; SPEC §3 Process vs
    outcome): the step rewards of a group's G responses are normalised together,
        r̃_j = (r_j − mean(R)) / std(R)      R = every step reward of the group (dr_grpo: r_j − mean(R)),
    and a token's advantage sums the normalised rewards of the steps that end at or after it:
        A_t = Σ_{steps j with end(j) ≥ t} r̃_j.
    step_rewards (N, T) hold each step's reward at its last token, step_ends (N, T) bool mark those
    tokens, mask (N, T) the trained tokens; rows are grouped by prompt (N = P·G). Returns
    (advantages (N, T), degenerate (P,): groups whose step rewards are all equal get A = 0)."""
    N, T = step_rewards.shape
    r, on = step_rewards.reshape(-1, group_size * T), step_ends.reshape(-1, group_size * T)
    n = on.sum(1, keepdim=True).clamp(min=1)
    degenerate = (torch.where(on, r, float("-inf")).amax(1) == torch.where(on, r, float("inf")).amin(1)) | ~on.any(1)
    centred = torch.where(on, r - torch.where(on, r, 0.0).sum(1, keepdim=True) / n, 0.0)
    if (scale or advantage_scale(dict(estimator=estimator, adv_scale="auto"))) == "group":
        std = ((centred ** 2).sum(1, keepdim=True) / n).sqrt()
        centred = centred / torch.where(degenerate[:, None], 1.0, std)
    normalised = torch.where(degenerate[:, None], 0.0, centred).reshape(N, T)
    return normalised.flip(1).cumsum(1).flip(1) * mask, degenerate


def rlvp_advantages(outcome, path, estimator, beta, scale=None):
    """RLVP (SPEC §3, "reward the outcome, constrain the process"): R = O + β·Φ with the two channels
    normalised separately, then combined: each goes through the group estimator on its own (grpo:
    z-scored over the group), A = Â(O) + β·Â(Φ), so a dense path signal cannot drown the sparse
    outcome however many actions it counts. outcome, path (P, G). A channel whose group is all equal
    adds 0; the group is degenerate when both are."""
    outcome_adv, outcome_flat = group_advantages(outcome, estimator, scale)
    path_adv, path_flat = group_advantages(path, estimator, scale)
    return outcome_adv + beta * path_adv, outcome_flat & path_flat


def overlong_penalty(lengths, limit, cache):
    """DAPO's soft overlong penalty: 0 up to limit − cache tokens, then linear down to −1 at limit."""
    if cache <= 0:
        return torch.zeros(lengths.shape)
    over = (lengths.float() - (limit - cache)).clamp(min=0)
    return -(over / cache).clamp(max=1.0)


def tis_weights(old_logp, sampler_logp, mask, cap):
    """Truncated importance sampling: min(π_old/π_sampler, cap) per token (0 off the response) and
    the number of tokens at the cap."""
    on = mask > 0
    weight = torch.exp(torch.where(on, old_logp - sampler_logp, 0.0))
    return torch.where(on, weight.clamp(max=cap), 0.0), (on & (weight > cap)).sum()


def correlation(sums):
    """Pearson's r from summed moments (corr_n, corr_x, corr_y, corr_xy, corr_xx, corr_yy); 0 when
    either side does not vary."""
    n = sums["corr_n"]
    if n < 2:
        return 0.0
    cov = sums["corr_xy"] / n - sums["corr_x"] * sums["corr_y"] / n ** 2
    vx = sums["corr_xx"] / n - (sums["corr_x"] / n) ** 2
    vy = sums["corr_yy"] / n - (sums["corr_y"] / n) ** 2
    return cov / (vx * vy) ** 0.5 if vx > 1e-12 and vy > 1e-12 else 0.0


def one_step_off_rollouts(run, it):
    """staleness=1: return the rollouts of iteration `it`, sampled by the weights of it − 1 while
    the update of it − 1 ran, and start sampling those of it + 1 with the weights of it, to run
    while the loop updates.

    The design: a second thread with its own copy of the weights (run.sampler, refreshed here,
    between two updates, while the thread is idle). Torch releases the GIL inside its ops, so on a
    CPU the sampler's decode and the update's forward/backward run on different cores at once. The
    thread runs rollout_shards only: no collective (the DDP all-reduces stay on the main thread, in
    the same order on every rank) and no global RNG (each shard's sampler has its own seeded
    generator), so the rollouts of `it` depend on (seed, it) and the sampler's weights alone, as in
    the synchronous loop. On a GPU it shares the default stream, so only the host-side work (the
    Python of the decode loop, the verifier) overlaps. The checkpoint holds the sampler's weights:
    after a resume the first iteration samples with them what the uninterrupted run sampled in the
    background (and the very first iteration samples with the initial weights: staleness 0)."""
    if run.pending is None:
        rollouts = rollout_shards(run, run.sampler, it)
    else:
        rollouts = run.pending.result()
    # how many updates behind the trained weights the rollouts' sampler is (None: it holds them)
    lag = 0 if run.sampler_iter is None else it - run.sampler_iter
    if not 0 <= lag <= run.cfg["staleness"]:
        raise RuntimeError(f"iteration {it} would train on rollouts of the weights of iteration {run.sampler_iter}: "
                           f"staleness {lag} > {run.cfg['staleness']}")
    run.stats["staleness"] = lag
    run.sampler.load_state_dict(run.raw_model.state_dict())
    run.sampler_iter = it
    last = it + 1 >= run.cfg["max_iters"]
    run.pending = None if last else run.sampling_thread.submit(rollout_shards, run, run.sampler, it + 1)
    return rollouts


def rollout_cost(prompts, answers, tokens, gpus, tok_per_s_per_gpu, n_params, flops_per_gpu, mfu):
    """Why rollouts dominate RL's cost (SPEC §7, seed M14 §11): decoding prompts·answers·tokens at
    tok_per_s_per_gpu on each of `gpus` against one training pass over the same tokens by 6·N·D
    FLOPs at flops_per_gpu·mfu. Returns dict(tokens, decode_s, decode_min, train_min, ratio)."""
    n_tokens = prompts * answers * tokens
    decode_s = n_tokens / (gpus * tok_per_s_per_gpu)
    train_s = 6 * n_params * n_tokens / (gpus * flops_per_gpu * mfu)
    return dict(tokens=n_tokens, decode_s=decode_s, decode_min=decode_s / 60, train_min=train_s / 60,
                ratio=decode_s / train_s)


# ----------------------------------------------------------------------------------------------
# Options: prompts at the edge of competence, break-it switches and the monitors that catch them

def edge_draw(success, n, rng, low, high):
    """prompt_sampling=edge: n distinct pool indices, unseen prompts first (pool order), then those
    with running success in [low, high] at random, then the rest nearest the band's middle.
    success: (pool,) floats, NaN = never drawn."""
    seen = ~np.isnan(success)
    in_band = np.flatnonzero(seen & (success >= low) & (success <= high))
    rest = np.flatnonzero(seen & ((success < low) | (success > high)))
    rest = rest[np.argsort(np.abs(success[rest] - (low + high) / 2), kind="stable")]
    return np.concatenate([np.flatnonzero(~seen), rng.permutation(in_band), rest])[:n]


def edge_update(success, drawn, group_success):
    """The running success of the drawn prompts: the group's mean reward on a first visit, else the
    mean of the old estimate and the new one (recent visits weigh most: the policy moves)."""
    old = success[drawn]
    success[drawn] = np.where(np.isnan(old), group_success, (old + group_success) / 2)


def edge_batches(run, it):
    """Draw iteration `it`'s pool prompts (the same on every rank), one row of indices per shard."""
    cfg, n = run.cfg, shard_size(run)
    drawn = edge_draw(run.pool_success, cfg["prompts_per_iter"], seeded_rng(run, it), cfg["edge_low"], cfg["edge_high"])
    before = run.pool_success[drawn]
    in_band = (before >= cfg["edge_low"]) & (before <= cfg["edge_high"])
    run.stats.update(edge_unseen_frac=float(np.isnan(before).mean()), edge_in_band_frac=float(in_band.mean()))
    run.edge_draw = drawn.reshape(-1, n)


def edge_record(run, group_rewards):
    """After the rollouts: every rank's groups' mean rewards, summed over ranks, update the pool."""
    n, n_shards = shard_size(run), len(run.edge_draw)
    mine = np.zeros(n_shards * n)
    for s, rewards in zip(range(run.rank, n_shards, run.world_size), group_rewards):
        mine[s * n:(s + 1) * n] = rewards
    edge_update(run.pool_success, run.edge_draw.reshape(-1), np.array(all_reduce_sum(mine.tolist(), run)))
    run.stats["pool_seen_frac"] = float((~np.isnan(run.pool_success)).mean())


@torch.no_grad()
def fp8_copy(model):
    """break_it=fp8_sampler: the weights as an FP8 inference engine holds them (e4m3, one scale
    per tensor so that its largest entry maps to e4m3's largest, 448)."""
    copy = frozen(model)
    for p in copy.parameters():
        scale = p.abs().max().clamp(min=1e-12) / 448
        p.copy_((p / scale).to(torch.float8_e4m3fn).float() * scale)
    return copy


def lax_verify(problem, response):
    """break_it=format_exploit: the right number anywhere in the response passes, so listing
    several guesses (or copying one from the prompt) earns the reward."""
    return 1.0 if str(problem["answer"]) in re.findall(r"-?[0-9]+", response) else 0.0


def training_verifier(run):
    """The verifier the rewards come from (evaluation always uses the environment's own)."""
    return lax_verify if run.cfg["break_it"] == "format_exploit" else run.env.verify


def broken_rewards(kind, ro):
    """The training reward under break_it=kind (unchanged for none and fp8_sampler)."""
    if kind == "all_equal":
        return torch.zeros_like(ro.rewards)
    if kind == "length_bonus":
        return ro.rewards + 0.01 * ro.lengths.to(ro.rewards)
    if kind == "format_exploit":
        return torch.tensor([lax_verify(p, t) for p, t in zip(ro.problems, ro.texts)], device=ro.rewards.device)
    return ro.rewards


def alarms(rows, cfg):
    """The monitors (SPEC §6) over a run's logged rows (metrics.jsonl, in order) -> {alarm: the
    first iteration it fired}. Each watches one figure against a bound it must not cross:
        sampler_mismatch   sampler_logprob_gap > 1e-3 or tis_capped_frac > 0.01 (fp32 sampler and
                           trainer agree to ~1e-6)
        ratio_drift        ratio_dev > 1e-3 in a run with one optimizer step per rollout batch,
                           where ρ must be 1 (stale rollouts, or a sampler whose log-probs differ)
        stale_rollouts     staleness > 0
        degenerate_groups  degenerate_frac > 0.75: most groups carry no signal
        entropy_collapse   entropy below a quarter of the first iteration's (or not finite)
        length_bias        reward_len_corr > 0.5 (rejected answers earn more the longer they are)
                           or len_mean above twice the first iteration's
        verifier_errors    verifier_error_rate > 0: the reward's verifier disagrees with the solver
        parse_errors       parse_error_rate > 0.2 (SPEC §6: above ~20% RL fails)
        reward_hacking     the training reward up by > 0.05 from the first iteration while held-out
                           accuracy (the environment's own verifier) fell by > 0.02 from the first
                           evaluation: the reward pays for something other than the task"""
    train = [r for r in rows if "entropy" in r]
    if not train:
        return {}
    on_policy = cfg["minibatches"] == 1 and cfg["inner_epochs"] == 1
    first = train[0]
    tests = dict(
        sampler_mismatch=lambda r: r.get("sampler_logprob_gap", 0) > 1e-3 or r.get("tis_capped_frac", 0) > 0.01,
        ratio_drift=lambda r: on_policy and r["ratio_dev"] > 1e-3,
        stale_rollouts=lambda r: r.get("staleness", 0) > 0,
        degenerate_groups=lambda r: r["degenerate_frac"] > 0.75,
        entropy_collapse=lambda r: not r["entropy"] >= first["entropy"] / 4,  # NaN too
        length_bias=lambda r: r.get("reward_len_corr", 0) > 0.5 or r["len_mean"] > 2 * first["len_mean"],
        verifier_errors=lambda r: r.get("verifier_error_rate", 0) > 0,
        parse_errors=lambda r: r.get("parse_error_rate", 0) > 0.2)
    fired = {}
    for r in train:
        for name, test in tests.items():
            if name not in fired and test(r):
                fired[name] = r["iter"]
    evals = [r for r in rows if "heldout_acc" in r]
    for r in evals[1:]:
        gained = max(t["reward"] for t in train if t["iter"] <= r["iter"]) - first["reward"]
        if gained > 0.05 and r["heldout_acc"] < evals[0]["heldout_acc"] - 0.02 and "reward_hacking" not in fired:
            fired["reward_hacking"] = r["iter"]
    return fired


# ----------------------------------------------------------------------------------------------
# Configuration checks, the passport, checkpointed state

def check_config(cfg, world_size):
    for key, allowed in CHOICES.items():
        if cfg[key] not in allowed:
            raise ValueError(f"config {key}={cfg[key]!r}: choose from {allowed}")
    P, G = cfg["prompts_per_iter"], cfg["group_size"]
    if P < 1 or G < 1:
        raise ValueError("prompts_per_iter and group_size must be >= 1")
    if G < 2 and cfg["estimator"] != "reinforce":
        raise ValueError(f"estimator={cfg['estimator']!r} compares responses within a group: group_size must be >= 2")
    shard = cfg["rollout_prompts"] or P // world_size
    if shard < 1 or P % shard or (P // shard) % world_size:
        raise ValueError(f"prompts_per_iter={P} must split into shards of rollout_prompts={shard} prompts, "
                         f"a whole number of shards per each of {world_size} ranks")
    if not 1 <= cfg["minibatches"] <= shard * G or cfg["inner_epochs"] < 1:
        raise ValueError(f"need inner_epochs >= 1 and 1 <= minibatches <= rollout_prompts*group_size = {shard * G}")
    if cfg["dynamic_sampling_rounds"] and (cfg["on_degenerate"] != "drop" or cfg["estimator"] == "reinforce"):
        raise ValueError("dynamic sampling refills dropped groups: it needs on_degenerate='drop' and a group estimator")
    if not (0 <= cfg["eps_low"] <= 1 and cfg["eps_high"] >= 0):
        raise ValueError("clip range needs 0 <= eps_low <= 1 and eps_high >= 0 (eps_low = 1: no lower bound, CISPO's)")
    if cfg["tis_cap"] < 0 or (cfg["tis_cap"] and cfg["old_logprobs"] != "recompute"):
        raise ValueError(f"tis_cap={cfg['tis_cap']} weighs tokens by π_old/π_sampler: it needs old_logprobs='recompute' "
                         f"(got {cfg['old_logprobs']!r}: with the sampler's own log-probs the two are the same numbers)")
    if cfg["adv_scale"] == "group" and cfg["estimator"] == "reinforce":
        raise ValueError("adv_scale=group needs a group estimator (reinforce has no groups: use batch)")
    if cfg["adv_scale"] == "batch" and cfg["reward_mode"] == "process":
        raise ValueError("adv_scale=batch scales one advantage per response; reward_mode=process has one per token")
    if cfg["prompt_sampling"] == "edge":
        if cfg["staleness"] or cfg["dynamic_sampling_rounds"]:
            raise ValueError("prompt_sampling=edge draws each iteration from the success of the last: it needs "
                             "staleness=0 and dynamic_sampling_rounds=0")
        if cfg["prompt_pool"] < P or not 0 <= cfg["edge_low"] <= cfg["edge_high"] <= 1:
            raise ValueError(f"prompt_sampling=edge needs prompt_pool >= prompts_per_iter={P} and "
                             f"0 <= edge_low <= edge_high <= 1")
    if cfg["staleness"] not in (0, 1):
        raise ValueError(f"staleness={cfg['staleness']}: choose 0 (synchronous) or 1 (one-step-off rollouts)")
    if cfg["overlong_cache"] >= cfg["max_new_tokens"]:
        raise ValueError(f"overlong_cache={cfg['overlong_cache']} must be below max_new_tokens={cfg['max_new_tokens']}")
    if cfg["reward_mode"] != "outcome" and cfg["estimator"] == "reinforce":
        raise ValueError(f"reward_mode={cfg['reward_mode']} normalises rewards within a group: choose a group estimator")
    if cfg["reward_mode"] == "process" and (cfg["kl"] == "k1_reward" or cfg["overlong_cache"]):
        raise ValueError("reward_mode=process rewards steps: kl=k1_reward and overlong_cache shape one sequence "
                         "reward and do not apply (use kl=k3_loss or off)")


REWARD_TEXT = dict(
    outcome="one scalar per response, no partial credit",
    process="a reward at the last token of each verifiable step (env.step_rewards), normalised over the group's "
            "steps, each token's advantage the sum over the steps from it on",
    rlvp="R = O + β·Φ, β = {rlvp_beta}: the outcome and the rule engine's path signal (−{rlvp_penalty} per bad "
         "action, +{rlvp_bonus} per compliant one) normalised separately over the group, then combined",
    path="the path signal Φ alone, without the outcome (the inaction trap: an experiment, not a recipe)")


def passport(run):
    """The run's post-training passport (SPEC §6, M14 §17) as markdown."""
    c = run.cfg
    P, G, shard = c["prompts_per_iter"], c["group_size"], shard_size(run)
    kl = {"off": "not used (π_ref runs only at evaluation, for the logged heldout_kl_ref)", "k1_reward": f"in the reward: r − β·Σ_t log(π_old/π_ref), β = {c['kl_coef']}",
          "k3_loss": f"a separate loss term β·k3 per token, β = {c['kl_coef']}, aggregated like the policy term"}[c["kl"]]
    steps = c["inner_epochs"] * c["minibatches"]
    degenerate = ("not applicable (batch-mean baseline, no groups)" if c["estimator"] == "reinforce" else
                  {"drop": "dropped: out of every sum and denominator", "zeros": "zero advantage, still counted",
                   "raise": "an error"}[c["on_degenerate"]])
    if c["dynamic_sampling_rounds"]:
        degenerate += f"; dynamic sampling refills them with up to {c['dynamic_sampling_rounds']} extra rollouts per shard"
    overlong = (f"soft penalty over the last {c['overlong_cache']} tokens before the limit" if c["overlong_cache"]
                else "no penalty (a truncated answer simply fails the verifier)")
    sync = ("one-step-off (staleness 1): the rollouts of iteration k + 1 are sampled by the weights of k, in a second "
            "thread, while k updates; the loss's ratio is against the sampler's log-probs" if c["staleness"]
            else "synchronous (staleness 0)")
    loss = "CISPO (capped, detached ratio × log π)" if c["policy_loss"] == "cispo" else "clipped surrogate"
    mode = "on-policy (ρ = 1)" if steps == 1 and not c["staleness"] else "off-policy after the first step (ρ ≠ 1)"
    scale = {"group": "the group's std", "batch": "the global batch's std", "none": "nothing"}[advantage_scale(c)]
    tis = (f"truncated importance sampling, weight min(π_old/π_sampler, {c['tis_cap']})" if c["tis_cap"]
           else "no correction (sampler_logprob_gap logged with old_logprobs=recompute)")
    prompts = ("fresh problems every iteration" if c["prompt_sampling"] == "uniform" else
               f"edge sampling from a fixed pool of {c['prompt_pool']}, success band [{c['edge_low']}, {c['edge_high']}]")
    broken = "" if c["break_it"] == "none" else f"; BROKEN ON PURPOSE: break_it={c['break_it']}"
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo grpo` with estimator **{c['estimator']}**, loss aggregation **{c['loss_agg']}**, started from `{c['init_from']}`

## Data and mode
- online trajectories: {P} prompts × {G} responses per iteration, {c['max_iters']} iterations
- prompts: the `{c['env']}` environment's procedurally generated *train* split ({prompts}); evaluation on the *heldout* split
  (disjoint by equation) and *ood* (a digit more in the start value): no train/eval leakage by construction
- answers written by the current policy (π_old = the weights at the start of the iteration), temperature {c['temperature']}
- reuse of rollouts: {c['inner_epochs']} epoch(s) × {c['minibatches']} minibatch(es) = {steps} optimizer step(s) per batch, then discarded

## Reward and verification
- source: the environment's rule verifier (`envs/`, `{c['env']}.verify`), 1 or 0 per response{broken}
- {verification_text(run.verifier_check)}; parse_error_rate is logged every iteration
- reward_mode {c['reward_mode']}: {REWARD_TEXT[c['reward_mode']].format(**c)}; overlong answers: {overlong}
  (limit {c['max_new_tokens']} new tokens)

## Optimisation
- {mode}, {loss} on {c['ratio_level']} ratios with ε_low = {c['eps_low']}, ε_high = {c['eps_high']};
  advantages: {c['estimator']} baseline, divided by {scale}
- sampler/trainer mismatch: {tis}
- models: policy (trained), π_old ({c['old_logprobs']} log-probs → {run.old_logprobs_mode}), π_ref (frozen `{c['init_from']}`);
  no critic, no reward model
- KL to π_ref: {kl}
- loss aggregation units: {c['loss_agg']} over each optimizer step's global batch
- degenerate (all-equal-reward) groups: {degenerate}

## Infrastructure
- generation and training on the same device(s): {run.device} × {run.world_size}, {sync}
- rollouts in shards of {shard} prompts (sampler batch {shard * G}), micro-batches of {c['batch_size']} responses
- time split per iteration in metrics.jsonl: time_decode, time_verify, time_score (π_ref/π_old forwards), time_update
"""


def state_dict(run):
    """staleness=1: the weights that sample the next iteration's rollouts (one_step_off_rollouts);
    prompt_sampling=edge: the pool's running success."""
    state = {}
    if run.cfg["staleness"]:
        state.update(sampler=run.sampler.state_dict(), sampler_iter=run.sampler_iter)
    if run.cfg["prompt_sampling"] == "edge":
        state["pool_success"] = torch.from_numpy(run.pool_success.copy())
    return state or None


def load_state_dict(run, state):
    if run.cfg["staleness"]:
        run.sampler.load_state_dict(state["sampler"])
        run.sampler_iter = state["sampler_iter"]
    if run.cfg["prompt_sampling"] == "edge":
        run.pool_success = state["pool_success"].numpy().copy()
