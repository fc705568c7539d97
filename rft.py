"""
Rejection-sampling fine-tuning (RFT, "expert iteration"): SFT on the policy's own verified answers.
SPEC §3 "Pre-training / SFT" (rejection-sampling fine-tuning) and "Best-of-N"; Ch7 "Data".

    python train.py --algo rft --init_from=out/sft
    python train.py --algo rft --init_from=out/sft --env=generalpoints

Each of `rounds` rounds, at the first iteration of its share of max_iters:
  1. sample `group_size` candidates (k, 4–16) per prompt for `round_prompts` fresh train prompts with
     the KV-cache sampler, at `temperature`;
  2. keep the candidates the verifier accepts (reward 1, ended with the end token), drop repeats
     of the same response to the same prompt, keep at most `per_prompt_cap` per prompt;
  3. train on that pool for the round's iterations with SFT's masked next-token loss,

         L = − Σ_t m_t · log π_θ(y_t | x, y_<t) / Σ_t m_t       (m_t = 1 on response tokens)

     batch_size examples drawn per iteration, depending only on (seed, it).
The next round samples from the updated policy, so the pool follows the policy. The cap keeps easy
prompts, where every candidate is right, from crowding out the hard ones in the pool.

Logged per round: verifier_acc (the share of candidates the verifier accepts, a sample of the
policy at the temperature; one cut off by the length limit counts as rejected, as in the filter), unique_frac (distinct verified responses / verified ones), kept_frac (kept / all
candidates), prompt_cover (prompts with at least one kept answer) and pool (examples kept); per
iteration the policy's token entropy on the pool's answers.
Evaluation (evaluation.evaluate_policy): greedy held-out and OOD accuracy, and on eval_samples = N
sampled answers per held-out problem pass@N, which is Best-of-N by the verifier: the accuracy of the
best of N samples, an upper-bound estimate of what RL or RFT can reach by selection.

The ranks share a round's sampling out (rollouts.generate with spread=True: each samples some chunks,
all gather them), so every rank holds the same pool, the one a single process samples, and trains
on its shard of each global batch, as SFT does.
"""

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import sft
from nanopost.distributed import seeded_rng
from nanopost.evaluation import evaluate_policy
from model import token_entropy
from nanopost.passports import rft_passport, unparsed, verifier_check, write_passport
from nanopost.rollouts import response_text, rollouts

starts_from = {"init_from": "sft"}  # it filters what the policy already writes: a random start keeps nothing
defaults = dict(
    rounds=3,              # R: sampling rounds, spread evenly over max_iters
    round_prompts=256,     # train prompts sampled per round
    group_size=8,          # k: responses sampled per prompt (4–16)
    per_prompt_cap=2,      # at most this many distinct verified responses per prompt enter the pool
    temperature=1.0,       # sampling temperature of the candidates
    eval_samples=8,        # held-out answers per problem at the temperature: pass@8 is Best-of-8 by the verifier
    # common keys with fine-tuning values: a gentler lr than SFT from scratch, short runs
    learning_rate=3e-4, min_lr=3e-5, warmup_iters=5, max_iters=60, eval_interval=20, log_interval=1,
)


def select_candidates(groups, responses, rewards, cap):
    """Indices of the candidates to train on: verified (reward > 0), the first of identical
    responses to the same prompt, at most `cap` per prompt, in sampling order.
    groups: the prompt index of each candidate; responses: hashable (token tuples); rewards: floats."""
    seen, per_prompt, kept = set(), {}, []
    for i, (group, response, reward) in enumerate(zip(groups, responses, rewards)):
        if reward <= 0 or (group, response) in seen:
            continue
        seen.add((group, response))
        if per_prompt.get(group, 0) < cap:
            per_prompt[group] = per_prompt.get(group, 0) + 1
            kept.append(i)
    return kept


def round_length(cfg):
    return math.ceil(cfg["max_iters"] / cfg["rounds"])


@torch.no_grad()
def sample_pool(run, state, round_):
    """One round: candidates from the current policy, verified, selected -> (pool, figures)."""
    cfg, tok, k = run.cfg, run.tok, run.cfg["group_size"]
    problems = run.env.problems("train", cfg["round_prompts"], seed=int(seeded_rng(run, round_).integers(2 ** 31)))
    roll = rollouts(run, run.raw_model, problems, k, temperature=cfg["temperature"], seed=cfg["seed"] + round_,
                      batch_size=cfg["eval_batch_size"], spread=True)
    groups, tokens, prompts = roll.group.tolist(), roll.responses, [tok.prompt_ids(p["prompt"]) for p in problems]
    # an answer cut off by the length limit would teach the model not to stop: not verified
    rewards = (roll.verified * ~roll.truncated).tolist()
    kept = select_candidates(groups, [tuple(t) for t in tokens], rewards, cfg["per_prompt_cap"])
    # mask 1 on the answer's own tokens; 0 on the prompt and on tool results (the environment's text)
    masks = roll.response_masks()
    pool = [(prompts[groups[i]] + tokens[i], [0] * len(prompts[groups[i]]) + masks[i]) for i in kept]
    verified = sum(r > 0 for r in rewards)
    distinct = len({(g, tuple(t)) for g, t, r in zip(groups, tokens, rewards) if r > 0})
    n_unparsed = sum(unparsed(run.env, response_text(run, t)) for t in tokens)
    figures = dict(verifier_acc=verified / len(tokens), unique_frac=distinct / max(verified, 1),
                   kept_frac=len(kept) / len(tokens), prompt_cover=len({groups[i] for i in kept}) / len(problems),
                   pool=len(pool), parse_error_rate=n_unparsed / len(tokens),
                   verifier_error_rate=state.verifier_check["verifier_error_rate"])
    return pool, figures


def setup(run, saved):
    """The checks and the verifier's own error rate; the pool comes at the first iteration of a round
    (resuming: the interrupted run's pool, saved)."""
    state = SimpleNamespace(pool=None, round_figures={}, verifier_check=verifier_check(run.env, run.env.verify))
    if saved is not None:
        state.pool, state.round_figures = saved["pool"], saved["round_figures"]
    write_passport(run, rft_passport(run, state.verifier_check))
    return state


def batches(run, state, it):
    """A new pool at the first iteration of every round, then one SFT step on it (as sft.py)."""
    cfg = run.cfg
    if it % round_length(cfg) == 0 or state.pool is None:
        round_ = it // round_length(cfg)
        state.pool, state.round_figures = sample_pool(run, state, round_)
        if run.master:
            print(f"rft round {round_}: " + ", ".join(f"{k} {v:.4g}" for k, v in state.round_figures.items()))
        if not state.pool:
            raise ValueError(f"rft round {round_}: no verified candidate among {cfg['round_prompts']} prompts x "
                             f"{cfg['group_size']}: start from a policy that solves some (--init_from=out/sft), "
                             f"or raise group_size")
    return sft.pool_batches(run, it, state.pool), dict(state.round_figures)  # (logged every iteration of the round)


def loss(run, state, model, batch):
    """SFT's masked next-token loss on the kept answers, and the policy's token entropy on them (a pool
    that narrows the policy shows as falling entropy)."""
    ids, mask = batch
    logits = model(ids[:, :-1])
    loss_sum, count = sft.masked_nll_of(logits, ids, mask)
    entropy = token_entropy(F.log_softmax(logits.detach().float(), dim=-1))
    return loss_sum, count, {"tokens": count, "entropy": (entropy * mask[:, 1:]).sum() / count.clamp(min=1)}


def evaluate(run, state, it):
    """Greedy held-out and OOD accuracy; sampled held-out accuracy and pass@k, Best-of-k by the verifier."""
    return evaluate_policy(run, run.raw_model, it, temperature=run.cfg["temperature"])[0]


def state_dict(run, state):
    """The round's pool: a resumed run trains on the pool the interrupted one sampled."""
    return {"pool": state.pool, "round_figures": state.round_figures}
