"""
GRPO: online RL with verifiable rewards, the group-relative policy gradient (Shao et al. 2024).
SPEC §3 (REINFORCE, RLOO, GRPO, DAPO), §5 (worked examples), §6 (what a run reports), §7 (rollouts
dominate the cost); seed M14 §9–§13.

    python train.py --algo grpo --init_from=out/sft                 # GRPO from an SFT checkpoint
    python train.py --algo grpo config/dapo.py --init_from=out/sft  # a recipe: config/{grpo,dapo,dr_grpo,rloo,gspo,cispo}.py

One iteration, synchronous and on-policy:
  1. sample a group: for each of prompts_per_iter train prompts, group_size responses y_1..y_G from
     the current policy π_old (the KV-cache sampler; tokens in, tokens out);
  2. verify: the environment's verifier gives each response its reward r_i, 1 or 0;
  3. group advantages, one per response, shared by all its tokens (a group of equal rewards has no
     relative signal: A = 0):
         A_i = (r_i − mean(r_1..G)) / std(r_1..G)                               (population std)
  4. inner_epochs × minibatches optimizer steps on the clipped token loss with its KL term to π_ref,
     the frozen init_from model, per response token t:
         ρ_it = π_θ(y_it | x, y_i<t) / π_old(y_it | x, y_i<t)
         ℓ_it = −min(ρ_it·A_i, clip(ρ_it, 1 − eps_low, 1 + eps_high)·A_i) + β·k3_it
         k3_it = π_ref/π_θ − log(π_ref/π_θ) − 1 ≥ 0        loss = (1/N) Σ_i (1/|y_i|) Σ_t ℓ_it
     With A > 0 the gain stops once ρ > 1 + eps_high, with A < 0 once ρ < 1 − eps_low. On the first
     step of a rollout batch ρ = 1 and the gradient is exactly REINFORCE with A_i.
  5. evaluate: greedy held-out and OOD accuracy; on sampled answers pass@k and the KL to π_ref.

Rollouts come in shards of rollout_prompts prompts, shard s of iteration it seeded by (seed, it, s);
rank r takes shards r, r + world_size, ...; minibatch m is slice m of every shard: the batches do not
depend on how many processes share them. Every log-prob is taken at the sampling temperature with
dropout off (on_policy), so that ρ = 1 before any update. A tool's results stay in the ids with mask
0: no term of the loss trains on them.

The family's options live beside it: grpo_family.py (the keys and their checks, the reward's shaping,
the groups, the loss: DAPO's dynamic sampling, overlong shaping, Clip-Higher and token-mean, GSPO,
CISPO, truncated importance sampling, the entropy controls Clip-Cov and the top-entropy mask),
grpo_estimators.py (REINFORCE, RLOO, Dr. GRPO, the advantage's scale, process and RLVP rewards),
grpo_rollouts.py (prompts at the edge of competence, one-step-off rollouts, π_old recomputed, DAPO's
overlong filter) and grpo_breaks.py (the break-it switches with the monitors that catch them,
docs/failures.md). setup() chooses among them once; the core path below calls what it chose
(state.advantages, state.surrogate, ...). Their formulas, the figures a run logs and its passport: docs/grpo.md.
"""

import time
from types import SimpleNamespace

import numpy as np
import torch

import grpo_breaks
import grpo_estimators
import grpo_family as family
import grpo_rollouts
from nanopost import monitors
from nanopost import rewards
from nanopost.checkpoints import load_reference
from nanopost.distributed import chunks
from nanopost.evaluation import evaluate_policy
from model import kl_estimate, token_logprobs_and_entropy
from nanopost.passports import grpo_passport, verifier_check, write_passport
from nanopost.rollouts import Rollout, old_logprobs_mode, rollouts, score_tokens, shard_problems, shard_size
from model import SharedPrompts

starts_from = {"init_from": "sft"}  # RL selects among what a trained policy does: no random start
on_policy = True  # the loss scores the function that sampled; every rank makes the same forwards
defaults = dict(
    prompts_per_iter=16,       # P: prompts per iteration, global over ranks
    group_size=16,             # G: responses per prompt; 16 so that a prompt the SFT model gets right
                               # 1 time in 4 still has a correct and a wrong answer in most groups
    rollout_prompts=0,         # prompts per sampler call (a shard); 0 = prompts_per_iter / world_size
    temperature=1.0,           # sampling temperature; π_θ, π_old and π_ref are all scored at it
    top_k=0,                   # sample from the k likeliest tokens only (0 = off)
    top_p=1.0,                 # sample from the nucleus of mass top_p only (1 = off); with either, π_θ and π_old
                               # are scored on the same truncated, renormalised distribution (π_ref on its whole one)
    eps_low=0.2,               # ε_low: the clip range's lower side, 1 − eps_low
    eps_high=0.2,              # ε_high: the clip range's upper side, 1 + eps_high (DAPO's Clip-Higher: eps_high > eps_low)
    inner_epochs=1,            # passes over each rollout batch
    minibatches=1,             # optimizer steps per pass; 1 = exactly on-policy (ρ = 1, plain
                               # group-normalised REINFORCE); more reuse each rollout batch, off-policy
    kl_coef=0.04,              # β, the weight of the KL term to π_ref (kl=k3_loss; k1_reward: in the reward)
    eval_samples=8,            # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
    **family.OPTIONS,
    # shared keys with RL values: 20x below SFT's lr, constant after a short warm-up (Adam's first
    # steps are sign steps). At 1e-4 the policy switches to worked answers within about 10
    # iterations on the default task (README); 3e-4 lost 16 points on the old all-worked task.
    learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, max_iters=20, eval_interval=5, log_interval=1,
)


def setup(run, saved):
    """π_ref, the verifier's own error rate and the family's options, chosen once: each state.X
    below is GRPO's own function, or the option's from its family's files."""
    cfg = run.cfg
    family.check_config(run)
    grpo_breaks.check_config(run)
    state = SimpleNamespace(reference=load_reference(run),  # π_ref: the starting policy, frozen
                            verifier_check=verifier_check(run.env, grpo_breaks.training_verifier(run)))
    # sampling a group: the prompts, the weights that sample, when the sampling happens
    state.prompts = grpo_rollouts.edge_prompts(run, saved) if cfg["prompt_sampling"] == "edge" else FRESH_PROMPTS
    state.sampling_model = lambda model: model  # the weights that sample: the policy's own
    state.sample = grpo_rollouts.masking_truncated(rollouts) if cfg["mask_truncated"] else rollouts
    state.truncation = grpo_rollouts.truncation(cfg)  # top_k / top_p: what the trainer scores π_θ and π_old on
    state.sampler = grpo_rollouts.sampler_copy(run, saved) if cfg["staleness"] else None  # (one-step-off: its weights)
    state.rollouts = grpo_rollouts.one_step_off_rollouts if cfg["staleness"] else synchronous_rollouts
    state.old_logprobs, state.rescore = grpo_rollouts.old_logprobs(run, state.truncation)  # π_old: sampler or recomputed
    state.reference_logprobs = reference_logprobs if cfg["kl"] != "off" else (lambda run, state, ro: None)
    # verifying and the advantages
    state.training_reward = rewards.training_reward(run)  # r_i: the verifier's 0/1; or the judge's P(correct),
                                                          # a vector reward's Σ_d w_d·r_d (rewards.py)
    state.kl_in_reward = cfg["kl"] == "k1_reward"
    state.shape = family.shaping(run, state.kl_in_reward)  # DAPO's overlong penalty, −β·KL; else the reward as it is
    state.advantages = group_advantages if grpo_estimators.plain_advantages(cfg) else grpo_estimators.advantages(run)
    state.batch_advantages = grpo_estimators.batch_advantages(run)  # REINFORCE's batch mean, adv_scale=batch; else none
    state.fill_groups = family.fill_groups(run) if family.drops_groups(cfg) else keep_every_group
    # the loss
    state.logprobs = shared_prompt_logprobs if cfg["share_prompt"] else policy_logprobs
    state.token_weights = (family.token_weights(cfg) if family.weighs_tokens(cfg)  # TIS, Clip-Cov, an entropy mask
                           else (lambda batch, logp, entropy: (1.0, {})))
    state.loss_parts = loss_parts(cfg)
    grpo_breaks.break_it(run, state)  # --break_it: one piece above replaced by a classic bug, on purpose
    if run.master and cfg["init_from"] == "scratch":
        print("grpo: init_from=scratch: a random policy rarely earns a reward; start from an SFT checkpoint")
    write_passport(run, grpo_passport(run, state.verifier_check, old_logprobs_mode(run),
                                      grpo_estimators.advantage_scale(cfg), grpo_breaks.BREAKS.get(cfg["break_it"])))
    return state


def state_dict(run, state):
    """What a resumed run needs of the family's options (edge sampling's pool, one-step-off's weights)."""
    return grpo_rollouts.state_dict(state) or None


# ----------------------------------------------------------------------------------------------
# Sample a group per prompt, verify, group advantages

def batches(run, state, it):
    """This rank's shards sampled and rewarded, the advantages, the iteration's figures; then the
    optimizer steps: inner_epochs × minibatches, each a list of micro-batches of at most batch_size
    responses."""
    cfg = run.cfg
    figures = state.prompts.draw(run, it)  # (edge sampling draws the iteration's prompts from its pool)
    sampled, waited = state.rollouts(run, state, it, rollout_shards)
    shards, counts = [rows for rows, _ in sampled], [c for _, c in sampled]
    state.batch_advantages(run, shards)  # (REINFORCE's baseline and adv_scale=batch need every rank's rows)
    figures.update(waited, **state.prompts.record(run, [c["group_reward"] for c in counts]))
    figures.update(monitors.rollout_figures(run, state, shards, counts))
    # minibatch m = slice m of every shard, so the global minibatch is the same for any world size
    minibatches = []
    for m in range(cfg["minibatches"]):
        rows = Rollout.cat([b.select(np.array_split(np.arange(len(b.ids)), cfg["minibatches"])[m]) for b in shards],
                           run.tok.pad)
        minibatches.append([rows.select(r) for r in chunks(range(len(rows.ids)), cfg["batch_size"])])
    state.rescore(run, [micro for mb in minibatches for micro in mb])  # (π_old recomputed, on the loss's rows)
    return [mb for _ in range(cfg["inner_epochs"]) for mb in minibatches], figures


def synchronous_rollouts(run, state, it, sample_shards):
    """The rollouts of iteration `it`, sampled now by the current weights; no figures of their own."""
    return sample_shards(run, state, run.raw_model, it), {}


def rollout_shards(run, state, model, it):
    """This rank's shards of iteration `it`, sampled by `model`: a list of (rows, counts)."""
    n_shards = run.cfg["prompts_per_iter"] // shard_size(run)
    return [rollout_shard(run, state, model, it, s) for s in range(run.rank, n_shards, run.world_size)]


def rollout_shard(run, state, model, it, shard):
    """A shard's training rows sampled by `model`: shard_size(run) groups of G responses, keep = 0
    on rows that must not train (the family's dropped groups), and the shard's counts for the log."""
    G = run.cfg["group_size"]
    first = sample_round(run, state, model, it, shard, 0)
    parts, rounds = state.fill_groups(run, lambda round_: sample_round(run, state, model, it, shard, round_), first)
    for part in parts:
        part.rows = part.rollout.select([g * G + j for g in part.groups for j in range(G)])
        part.rows.keep = torch.full((len(part.groups) * G,), float(part.kept), device=part.rows.ids.device)
    batch = Rollout.cat([part.rows for part in parts], run.tok.pad)
    batch.mask = batch.mask * batch.keep[:, None]
    return batch, monitors.shard_counts(run, first, batch, rounds)


def sample_round(run, state, model, it, shard, round_):
    """One rollout of a shard by `model` (π_old): train problems, G responses each, verified and
    rewarded, with their advantages. Returns SimpleNamespace(rollout, reward: the training reward
    before shaping, logged: the reward's per-answer figures (a vector reward's dimensions, the judge's),
    degenerate: (P,) True on groups of equal rewards)."""
    cfg = run.cfg
    problems, seed = state.prompts.problems(run, it, shard, round_)
    ro = state.sample(run, state.sampling_model(model), problems, cfg["group_size"], temperature=cfg["temperature"],
                      top_k=cfg["top_k"] or None, top_p=cfg["top_p"], max_new_tokens=cfg["max_new_tokens"], seed=seed)
    t0 = time.time()
    state.old_logprobs(run, model, ro)  # π_old: the sampler's own log-probs (or recomputed)
    ro.ref_logprobs = state.reference_logprobs(run, state, ro)
    ro.score_time = time.time() - t0
    t0 = time.time()
    reward, logged = state.training_reward(ro)  # r_i: the verifier's 0/1 (or the judge's, a vector reward's)
    ro.verify_time += time.time() - t0  # (a judge's judgements: verifying, timed with the verifier)
    ro.reward = state.shape(run, ro, reward, problems)
    degenerate = state.advantages(run, ro)
    return SimpleNamespace(rollout=ro, reward=reward, logged=logged, degenerate=degenerate.to(reward.device))


def reference_logprobs(run, state, ro):
    """log π_ref of the sampled tokens, for the KL term: on π_ref's whole distribution (a truncated one
    can leave out the very token sampled, log 0)."""
    return score_tokens(run, state.reference, ro.ids, ro.prompt_lens) * ro.mask


def degenerate_groups(rewards):
    """(P, G) rewards -> (P,) True where every reward of the group is equal. Exact equality, not
    std == 0: the mean of equal floats can be off by an ulp, and dividing by that std explodes."""
    return (rewards == rewards[..., :1]).all(-1)


def group_advantages(run, ro):
    """A_i = (r_i − mean(r_1..G)) / std(r_1..G) within each group (population std), set on the rows;
    a degenerate group gets exactly 0 (what the formula gives in exact arithmetic). Returns (P,) True
    on degenerate groups."""
    rewards = ro.reward.view(-1, run.cfg["group_size"])
    degenerate = degenerate_groups(rewards)
    centred = rewards - rewards.mean(1, keepdim=True)
    adv = centred / torch.where(degenerate[:, None], 1.0, rewards.std(1, correction=0, keepdim=True))
    ro.advantages = torch.where(degenerate[:, None], 0.0, adv).flatten()
    return degenerate


def keep_every_group(run, sample, first):
    """GRPO's rule for a degenerate group: it stays, with A = 0 (no policy gradient; its tokens still
    count in the mean and feel the KL term). Returns (parts, the rounds sampled)."""
    groups = list(range(len(first.degenerate)))
    return [SimpleNamespace(rollout=first.rollout, groups=groups, kept=True)], [first]


FRESH_PROMPTS = SimpleNamespace(  # fresh train problems for every shard and round (the generator has thousands)
    draw=lambda run, it: {}, problems=shard_problems, record=lambda run, group_rewards: {})


# ----------------------------------------------------------------------------------------------
# The clipped token loss with its KL term

def loss(run, state, model, batch):
    """One micro-batch: π_θ's log-probs at the sampling temperature, the policy loss, and the policy's
    entropy on its own samples."""
    mask = batch.mask
    logp, entropy = state.logprobs(model, batch, run.cfg["temperature"], **state.truncation)
    weights, metrics = state.token_weights(batch, logp, entropy)  # (TIS's min(π_old/π_sampler, C), Clip-Cov, ...)
    loss_sum, count, terms = policy_loss(logp, batch.old_logprobs, batch.advantages, mask, run.cfg,
                                         batch.ref_logprobs, weights, state.loss_parts)
    metrics.update(terms, entropy=(entropy * mask).sum() / mask.sum().clamp(min=1), tokens=mask.sum())
    return loss_sum, count, metrics  # (tensors: the loop reads them once per step)


def policy_loss(logp, old_logp, advantages, mask, cfg, ref_logp=None, weights=1.0, parts=None):
    """ℓ_it = −min(ρ_it·A_i, clip(ρ_it, 1 − ε_low, 1 + ε_high)·A_i) + β·k3_it, aggregated: (loss_sum,
    count, metrics). logp (B, T) with gradient; old_logp, ref_logp (B, T) constants; advantages (B,),
    or (B, T) one per token (process rewards); mask (B, T) 0/1; weights: a constant per token (TIS)
    or 1. parts: the ratio, surrogate, KL term and aggregation setup chose (loss_parts(cfg) if none)."""
    parts = parts or loss_parts(cfg)
    on = mask > 0
    ratio = parts.ratio(logp, old_logp, on)  # ρ_it = π_θ(y_it)/π_old(y_it)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    low, high = 1 - cfg["eps_low"], 1 + cfg["eps_high"]
    per_token, clipped = parts.surrogate(ratio, adv, logp, on, low, high)  # −min(ρ·A, clip(ρ, low, high)·A)
    per_token, metrics = parts.kl_term(per_token * weights, logp, ref_logp, on, cfg)  # + β·k3
    loss_sum, count = parts.aggregate(per_token, mask, cfg["max_new_tokens"])
    n = on.sum().clamp(min=1)
    metrics.update(clip_frac=clipped.sum() / n, ratio_dev=((ratio - 1).abs() * on).amax().detach())
    return loss_sum, count, metrics


def loss_parts(cfg):
    """The pieces of the token loss, chosen once: GRPO's own, or the family's options."""
    return SimpleNamespace(
        ratio=family.sequence_ratio if cfg["ratio_level"] == "sequence" else token_ratio,  # GSPO: one per response
        surrogate=family.cispo_surrogate if cfg["policy_loss"] == "cispo" else clipped_surrogate,  # CISPO
        kl_term=k3_term if cfg["kl"] == "k3_loss" else (lambda per_token, logp, ref_logp, on, cfg: (per_token, {})),
        aggregate=family.AGGREGATES.get(cfg["loss_agg"], seq_mean_token_mean))  # DAPO's token_mean, Dr. GRPO's


def shared_prompt_logprobs(model, batch, temperature, top_k=None, top_p=None):
    """(log π_θ, entropy) per token: each distinct prompt runs once, its keys and values shared by its
    G rows (model.SharedPrompts: the same numbers as a full row each, up to fp32 rounding)."""
    shared = SharedPrompts(batch.ids, batch.prompt_lens)
    logp, entropy = token_logprobs_and_entropy(model(shared.inputs, prompts=shared), shared.targets, temperature,
                                               top_k, top_p)
    return shared.to_rows(logp), shared.to_rows(entropy)


def policy_logprobs(model, batch, temperature, top_k=None, top_p=None):
    """(log π_θ, entropy) per token, one full row per response (share_prompt=False)."""
    return token_logprobs_and_entropy(model(batch.ids[:, :-1]), batch.ids[:, 1:], temperature, top_k, top_p)


def token_ratio(logp, old_logp, on):
    """ρ_it = π_θ(y_it)/π_old(y_it); 1 off the response (no exp of whatever padding holds)."""
    return torch.exp(torch.where(on, logp - old_logp, 0.0))


def clipped_surrogate(ratio, adv, logp, on, low, high):
    """−min(ρ·A, clip(ρ, low, high)·A) per token, and the tokens whose gradient the clip cut."""
    per_token = -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    with torch.no_grad():
        clipped = on & (((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low)))
    return per_token, clipped


def k3_term(per_token, logp, ref_logp, on, cfg):
    """+ β·k3 per token, k3 = π_ref/π_θ − log(π_ref/π_θ) − 1: its value estimates KL(π_θ‖π_ref) without
    bias; its gradient (on π_old's samples, no ratio) is that of KL(π_ref‖π_θ), the other direction."""
    kl = kl_estimate(logp, torch.where(on, ref_logp, logp), "k3")
    return per_token + cfg["kl_coef"] * kl, {"kl_k3": (kl.detach() * on).sum() / on.sum().clamp(min=1)}


def seq_mean_token_mean(per_token, mask, max_len):
    """(loss_sum, count) of (1/N) Σ_i (1/|y_i|) Σ_t ℓ_it: each response's token mean, summed, over N
    responses. Rows with no token (padding rows, dropped groups) count nowhere; where, not *: a NaN or
    inf on a padded position must not leak."""
    on = mask > 0
    n_tokens = on.sum(1)
    return (torch.where(on, per_token, 0.0).sum(1) / n_tokens.clamp(min=1)).sum(), (n_tokens > 0).sum()


def evaluate(run, state, it):
    """Greedy held-out and OOD accuracy; on eval_samples held-out answers per problem at the training
    temperature their accuracy, pass@k (Best-of-k by the verifier) and the KL to π_ref."""
    return evaluate_policy(run, run.raw_model, it, state.reference, run.cfg["temperature"])[0]
