"""
GRPO: online RL with verifiable rewards, the group-relative policy gradient (Shao et al. 2024,
"DeepSeekMath", arXiv:2402.03300). SPEC §3 (REINFORCE, RLOO, GRPO, DAPO), §5 (worked examples), §6
(what a run reports), §7 (rollouts dominate the cost); seed M14 §9–§13.

    python train.py --algo grpo --init_from=out/sft      # GRPO from an SFT checkpoint
    python train.py --algo dapo --init_from=out/sft      # a variant of the lab (lab/dapo.py, ...; docs/grpo.md)

One iteration (batches), synchronous and on-policy:
  1. sample a group: for each of prompts_per_iter train prompts, group_size responses y_1..y_G from
     the current policy π_old (the KV-cache sampler; tokens in, tokens out);
  2. verify: the environment's verifier gives each response its reward r_i, 1 or 0;
  3. group advantages, one per response, shared by all its tokens (a group of equal rewards has no
     relative signal: A = 0):
         A_i = (r_i − mean(r_1..G)) / std(r_1..G)                               (population std)
  4. inner_epochs × minibatches optimizer steps on the clipped token loss (loss) with its KL term to
     π_ref, the frozen init_from model. On the first step of a rollout batch ρ = 1 and the gradient is
     exactly REINFORCE with A_i.
  5. evaluate: greedy held-out and OOD accuracy; on sampled answers pass@k and the KL to π_ref.

Rollouts come in shards of rollout_prompts prompts, shard s of iteration it seeded by (seed, it, s);
rank r takes shards r, r + world_size, ...; minibatch m is slice m of every shard: the batches do not
depend on how many processes share them. Every log-prob is taken at the sampling temperature with
dropout off (on_policy), so that ρ = 1 before any update. A tool's results stay in the ids with mask
0: no term of the loss trains on them. The figures a run logs: nanopost/rollout_figures.py; the variants of the
family (DAPO, Dr. GRPO, GSPO, CISPO, RLOO, ...), each a file that imports this one: lab/.
"""

import time
from types import SimpleNamespace

import numpy as np
import torch

from nanopost.checkpoints import load_reference
from nanopost.distributed import chunks
from nanopost.evaluation import evaluate_policy
from nanopost.rollout_figures import rollout_figures
from model import SharedPrompts, clipped_surrogate, kl_estimate, token_logprobs_and_entropy
from nanopost.passports import grpo_passport, verifier_check, write_passport
from nanopost.rollouts import Rollout, old_logprobs_mode, rollouts, score_tokens, shard_problems, shard_size
from nanopost.token_records import keep_rollouts

starts_from = {"init_from": "sft"}  # RL selects among what a trained policy does: no random start
on_policy = True  # the loss scores the function that sampled; every rank makes the same forwards
defaults = dict(
    prompts_per_iter=16,       # P: prompts per iteration, global over ranks
    group_size=16,             # G: responses per prompt; 16 so that a prompt the SFT model gets right
                               # 1 time in 4 still has a correct and a wrong answer in most groups
    rollout_prompts=0,         # prompts per sampler call (a shard); 0 = prompts_per_iter / world_size
    temperature=1.0,           # sampling temperature; π_θ, π_old and π_ref are all scored at it
    clip_eps=0.2,              # ε: the clip range [1 − ε, 1 + ε] of the ratio ρ
    inner_epochs=1,            # passes over each rollout batch
    minibatches=1,             # optimizer steps per pass; 1 = exactly on-policy (ρ = 1, plain
                               # group-normalised REINFORCE); more reuse each rollout batch, off-policy
    kl_coef=0.04,              # β, the weight of the k3 KL term to π_ref in the loss (0: none)
    old_logprobs="auto",       # π_old: sampler (its own log-probs) | recompute (a training forward) | auto (recompute under autocast)
    share_prompt=True,         # run each prompt once for its G responses, in scoring and in the loss (the same numbers, faster)
    eval_samples=8,            # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
    # shared keys with RL values: 20x below SFT's lr, constant after a short warm-up (Adam's first
    # steps are sign steps). At 1e-4 the policy switches to worked answers within about 10
    # iterations on the default task (README); 3e-4 lost 16 points on the old all-worked task.
    learning_rate=1e-4, min_lr=1e-4, warmup_iters=5, max_iters=20, eval_interval=5, log_interval=1,
)


def setup(run, saved):
    """π_ref (the starting policy, frozen), the verifier's own error rate, the checks and the passport."""
    check_config(run)
    state = SimpleNamespace(reference=load_reference(run), verifier_check=verifier_check(run.env, run.env.verify))
    if run.master and run.cfg["init_from"] == "scratch":
        print("grpo: init_from=scratch: a random policy rarely earns a reward; start from an SFT checkpoint")
    own = [f"`{key}` = {run.cfg[key]!r}" for key in run.algo.defaults if key not in defaults]  # (a variant's keys)
    write_passport(run, grpo_passport(run, state.verifier_check, old_logprobs_mode(run), changes=own))
    return state


def check_config(run):
    """The shards and the minibatches must divide as the iteration cuts them (a group of one response
    is degenerate, A = 0: the degenerate_groups monitor says so)."""
    cfg, world_size = run.cfg, run.world_size
    P, G, shard = cfg["prompts_per_iter"], cfg["group_size"], shard_size(run)
    if cfg["old_logprobs"] not in ("auto", "sampler", "recompute"):
        raise ValueError(f"config old_logprobs={cfg['old_logprobs']!r}: choose from auto, sampler, recompute")
    if shard < 1 or P % shard or (P // shard) % world_size:
        raise ValueError(f"prompts_per_iter={P} must split into shards of rollout_prompts={shard} prompts, "
                         f"a whole number of shards per each of {world_size} ranks")
    if cfg["minibatches"] > shard * G:
        raise ValueError(f"minibatches={cfg['minibatches']} must be <= rollout_prompts*group_size = {shard * G}")


# ----------------------------------------------------------------------------------------------
# One iteration: sample the groups, verify, group advantages, minibatches

def batches(run, state, it):
    """This rank's shards sampled, verified and given their advantages, and the iteration's figures;
    then the optimizer steps: inner_epochs × minibatches, each a list of micro-batches."""
    shards = sample_shards(run, state, run.raw_model, it)
    keep_rollouts(run, it, shards)  # a few iterations' tokens, for report.py (nanopost/token_records.py)
    return minibatches(run, shards), rollout_figures(run, state, shards)


def sample_shards(run, state, model, it):
    """This rank's shards of iteration `it`, sampled by `model`: shards r, r + world_size, ..."""
    return [sample_groups(run, state, model, it, shard) for shard in my_shards(run)]


def my_shards(run):
    """This rank's shard indices of an iteration."""
    return range(run.rank, run.cfg["prompts_per_iter"] // shard_size(run), run.world_size)


def sample_groups(run, state, model, it, shard):
    """One shard: its train problems, G responses each from `model` (π_old), verified (r_i, the
    verifier's 1 or 0), scored (π_old, π_ref) and given their group advantages: a Rollout."""
    ro = sample(run, model, *shard_problems(run, it, shard, 0))
    score(run, state, model, ro)
    ro.reward = ro.verified  # r_i
    ro.advantages = group_advantages(ro.reward, run.cfg["group_size"])
    return ro


def sample(run, model, problems, seed):
    """G responses per problem from `model` at the sampling temperature (rollouts.rollouts)."""
    cfg = run.cfg
    return rollouts(run, model, problems, cfg["group_size"], temperature=cfg["temperature"],
                    max_new_tokens=cfg["max_new_tokens"], seed=seed)


def score(run, state, model, ro):
    """log π_old and log π_ref of the sampled tokens. π_old is the sampler's own log-probs, or under
    old_logprobs=recompute (auto: under a GPU's autocast, whose sampler rounds differently) a training
    forward of the sampling weights, the sampler's numbers kept for sampler_logprob_gap. π_ref on its
    whole distribution, for the KL term (none at kl_coef = 0)."""
    t0 = time.time()
    if old_logprobs_mode(run) == "recompute":
        ro.sampler_logprobs = ro.old_logprobs
        ro.old_logprobs = score_tokens(run, model, ro.ids, ro.prompt_lens) * ro.mask
    if run.cfg["kl_coef"]:
        ro.ref_logprobs = score_tokens(run, state.reference, ro.ids, ro.prompt_lens) * ro.mask
    ro.time_score = time.time() - t0


def group_advantages(rewards, G):
    """A_i = (r_i − mean(r_1..G)) / std(r_1..G) within each group (population std), (N,) -> (N,); a
    degenerate group gets exactly 0 (what the formula gives in exact arithmetic)."""
    rewards = rewards.view(-1, G)
    degenerate = degenerate_groups(rewards)
    centred = rewards - rewards.mean(1, keepdim=True)
    adv = centred / torch.where(degenerate[:, None], 1.0, rewards.std(1, correction=0, keepdim=True))
    return torch.where(degenerate[:, None], 0.0, adv).flatten()


def degenerate_groups(rewards):
    """(P, G) rewards -> (P,) True where every reward of the group is equal. Exact equality, not
    std == 0: the mean of equal floats can be off by an ulp, and dividing by that std explodes."""
    return (rewards == rewards[..., :1]).all(-1)


def minibatches(run, shards):
    """inner_epochs passes of `minibatches` optimizer steps, each a list of micro-batches of at most
    batch_size rows. Minibatch m = slice m of every shard, so the global minibatch is the same for any
    world size. Under old_logprobs=recompute π_old is taken again on these very rows: under bf16 autocast
    the same rows in another batch shape round differently."""
    cfg = run.cfg
    steps = []
    for m in range(cfg["minibatches"]):
        rows = Rollout.cat([b.select(np.array_split(np.arange(len(b.ids)), cfg["minibatches"])[m]) for b in shards],
                           run.tok.pad)
        steps.append([rows.select(r) for r in chunks(range(len(rows.ids)), cfg["batch_size"])])
    if old_logprobs_mode(run) == "recompute":
        for micro in (micro for step in steps for micro in step):
            micro.old_logprobs = score_tokens(run, run.raw_model, micro.ids, micro.prompt_lens) * micro.mask
    return [step for _ in range(cfg["inner_epochs"]) for step in steps]


# ----------------------------------------------------------------------------------------------
# The loss: the clipped surrogate with its KL term to π_ref

def loss(run, state, model, batch):
    """One micro-batch, per response token t of response i:
        ρ_it = π_θ(y_it | x, y_i<t) / π_old(y_it | x, y_i<t)
        ℓ_it = −min(ρ_it·A_i, clip(ρ_it, 1 − ε, 1 + ε)·A_i) + β·k3_it
        k3_it = π_ref/π_θ − log(π_ref/π_θ) − 1 ≥ 0        loss = (1/N) Σ_i (1/|y_i|) Σ_t ℓ_it
    With A > 0 the gain stops once ρ > 1 + ε, with A < 0 once ρ < 1 − ε. Returns (loss_sum, count,
    figures); the loop divides by the count summed over micro-batches and ranks."""
    logp, entropy = policy_logprobs(run, model, batch)
    per_token, figures = policy_term(run, batch, logp)            # −min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A)
    per_token, kl_figures = with_kl_term(run, per_token, logp, batch)  # + β·k3
    loss_sum, count = seq_mean_token_mean(per_token, batch.mask)  # (1/N) Σ_i (1/|y_i|) Σ_t
    return loss_sum, count, dict(figures, **kl_figures, **sample_figures(batch, entropy))


def policy_term(run, batch, logp, eps_high=None):
    """−min(ρ_it·A_i, clip(ρ_it, 1 − ε, 1 + eps_high)·A_i) per token (eps_high: ε unless a variant
    widens the top, DAPO's Clip-Higher), and its figures: clip_frac (the share of tokens whose gradient
    the clip cut) and ratio_dev (max |ρ − 1|: 0 on an on-policy step)."""
    on, eps = batch.mask > 0, run.cfg["clip_eps"]
    ratio = token_ratio(logp, batch.old_logprobs, on)
    per_token, clipped = clipped_surrogate(ratio, per_token_advantages(batch), on, eps, eps if eps_high is None else eps_high)
    return per_token, ratio_figures(ratio, clipped, on)


def with_kl_term(run, per_token, logp, batch):
    """ℓ_it + β·k3_it, and kl_k3 (its mean over the tokens); β = kl_coef = 0: no KL term (π_ref then
    runs only at evaluation)."""
    if not run.cfg["kl_coef"]:
        return per_token, {}
    on = batch.mask > 0
    kl = k3(logp, batch.ref_logprobs, on)
    return per_token + run.cfg["kl_coef"] * kl, dict(kl_k3=masked_mean(kl.detach(), on))


def policy_logprobs(run, model, batch, top_k=None, top_p=None):
    """(log π_θ, entropy) per token at the sampling temperature; with share_prompt each distinct
    prompt runs once, its keys and values shared by its G rows (model.SharedPrompts: the same
    numbers as a full row each, up to fp32 rounding)."""
    temperature = run.cfg["temperature"]
    if not run.cfg["share_prompt"]:
        return token_logprobs_and_entropy(model(batch.ids[:, :-1]), batch.ids[:, 1:], temperature, top_k, top_p)
    shared = SharedPrompts(batch.ids, batch.prompt_lens)
    logp, entropy = token_logprobs_and_entropy(model(shared.inputs, prompts=shared), shared.targets, temperature,
                                               top_k, top_p)
    return shared.to_rows(logp), shared.to_rows(entropy)


def token_ratio(logp, old_logp, on):
    """ρ_it = π_θ(y_it)/π_old(y_it); 1 off the response (no exp of whatever padding holds)."""
    return torch.exp(torch.where(on, logp - old_logp, 0.0))


def per_token_advantages(batch):
    """The advantages as (B, 1), one per response, broadcast over its tokens (or (B, T) as they are)."""
    return batch.advantages[:, None] if batch.advantages.dim() == 1 else batch.advantages


def k3(logp, ref_logp, on):
    """k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 per token (0 off the response): its value estimates
    KL(π_θ‖π_ref) without bias; its gradient (on π_old's samples, no ratio) is that of KL(π_ref‖π_θ)."""
    return kl_estimate(logp, torch.where(on, ref_logp, logp), "k3")


def seq_mean_token_mean(per_token, mask):
    """(loss_sum, count) of (1/N) Σ_i (1/|y_i|) Σ_t ℓ_it: each response's token mean, summed, over N
    responses. Rows with no token (padding rows) count nowhere; where, not *: a NaN or inf on a padded
    position must not leak."""
    on = mask > 0
    n_tokens = on.sum(1)
    return (torch.where(on, per_token, 0.0).sum(1) / n_tokens.clamp(min=1)).sum(), (n_tokens > 0).sum()


def ratio_figures(ratio, clipped, on):
    """clip_frac, the share of tokens whose gradient the clip cut, and ratio_dev, max |ρ − 1| (0 on an
    on-policy step)."""
    return dict(clip_frac=clipped.sum() / on.sum().clamp(min=1), ratio_dev=((ratio - 1).abs() * on).amax().detach())


def sample_figures(batch, entropy):
    """The policy's entropy on its own samples and the tokens trained (tensors: the loop reads them
    once per step)."""
    return dict(entropy=masked_mean(entropy, batch.mask > 0), tokens=batch.mask.sum())


def masked_mean(values, on):
    """The mean of `values` over the response tokens."""
    return (values * on).sum() / on.sum().clamp(min=1)


def evaluate(run, state, it):
    """Greedy held-out and OOD accuracy; on eval_samples held-out answers per problem at the training
    temperature their accuracy, pass@k (Best-of-k by the verifier) and the KL to π_ref."""
    return evaluate_policy(run, run.raw_model, it, state.reference, run.cfg["temperature"])[0]
