"""A vector reward (Ch7 "The evolution of reward paradigms": scalar, vector, generative): named dimensions,
each in [0, 1] per answer and logged as reward_<name>, combined by stated weights (rewards.DIMENSIONS):

    r(x, y) = Σ_d w_d · r_d(x, y)        e.g. reward_weights="correct=1,short=0.5": r = 1·correct + 0.5·short

where `correct` is the verifier's 0/1. Under GRPO's group normalisation only the weights' ratios
matter. Everything else is grpo.py's."""

import grpo
from distributed import all_reduce_sum
from grpo import evaluate, loss, on_policy, setup, starts_from  # noqa: F401  (what the vector reward does not change)
from rewards import DIMENSIONS, reward_weights

base = "grpo"
defaults = dict(
    grpo.defaults,
    reward_weights="correct=1,short=0.5",  # "name=w,...": Σ_d w_d·r_d over the dimensions correct, worked, short, parses
)


def batches(run, state, it):
    """GRPO's groups, rewarded by the weighted dimensions (each dimension's mean logged)."""
    weights = reward_weights(run.cfg["reward_weights"])
    shards = [grpo.sample_groups(run, state, run.raw_model, it, shard) for shard in grpo.my_shards(run)]
    parts = [{name: ro.verified if name == "correct" else DIMENSIONS[name](run, ro).to(ro.verified) for name in weights}
             for ro in shards]
    for ro, part in zip(shards, parts):
        ro.reward = sum(w * part[name] for name, w in weights.items())  # r = Σ_d w_d·r_d
        ro.advantages = grpo.group_advantages(ro.reward, run.cfg["group_size"])
    sums = all_reduce_sum({name: float(sum(part[name].sum() for part in parts)) for name in weights}
                          | dict(n=sum(len(ro.reward) for ro in shards)), run)
    dimensions = {f"reward_{name}": sums[name] / sums["n"] for name in weights}
    return grpo.minibatches(run, shards), dict(grpo.rollout_figures(run, state, shards), **dimensions)
