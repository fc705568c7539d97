"""A vector reward (Ch7 "The evolution of reward paradigms": scalar, vector, generative): named dimensions,
each in [0, 1] per answer and logged as reward_<name>, combined by stated weights (rewards.DIMENSIONS):

    r(x, y) = Σ_d w_d · r_d(x, y)        e.g. reward_weights="correct=1,short=0.5": r = 1·correct + 0.5·short

where `correct` is the verifier's 0/1. Under GRPO's group normalisation only the weights' ratios
matter. Everything else is grpo.py's."""

import grpo
from nanopost.distributed import all_reduce_sum
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what the vector reward does not change)
from nanopost.passports import grpo_passport, write_passport
from nanopost.rewards import DIMENSIONS, reward_weights
from nanopost.rollouts import old_logprobs_mode

base = "grpo"
defaults = dict(
    grpo.defaults,
    reward_weights="correct=1,short=0.5",  # "name=w,...": Σ_d w_d·r_d over the dimensions correct, worked, short, parses
)


def setup(run, saved):
    """GRPO's, with the weights checked and named in the passport."""
    terms = " + ".join(f"{w:g}·{name}" for name, w in reward_weights(run.cfg["reward_weights"]).items())
    state = grpo.setup(run, saved)
    write_passport(run, grpo_passport(run, state.verifier_check, old_logprobs_mode(run), reward=(
        f"a vector reward r = {terms} (rewards.DIMENSIONS, each logged as reward_<name>); correct: the verifier's 0/1")))
    return state


def batches(run, state, it):
    """GRPO's groups, rewarded by the weighted dimensions (each dimension's mean logged)."""
    weights = reward_weights(run.cfg["reward_weights"])
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    parts = []
    for ro in shards:
        ro.reward, part = vector_reward(run, ro, weights)
        ro.advantages = grpo.group_advantages(ro.reward, run.cfg["group_size"])
        parts.append(part)
    sums = all_reduce_sum({name: float(sum(part[name].sum() for part in parts)) for name in weights}
                          | dict(n=sum(len(ro.reward) for ro in shards)), run)
    dimensions = {f"reward_{name}": sums[name] / sums["n"] for name in weights}
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), dict(grpo.rollout_figures(run, state, shards), **dimensions)


def vector_reward(run, ro, weights):
    """(r = Σ_d w_d·r_d (N,), {dimension: r_d (N,)}) of a rollout's answers."""
    parts = {name: ro.verified if name == "correct" else DIMENSIONS[name](run, ro).to(ro.verified) for name in weights}
    return sum(w * parts[name] for name, w in weights.items()), parts
