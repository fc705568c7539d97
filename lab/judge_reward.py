"""A generative reward model for a reward (Ch7 "The evolution of reward paradigms"; Zheng et al. 2023,
"Judging LLM-as-a-Judge", arXiv:2306.05685): a judge reads each answer and writes "Verdict: correct" or
"Verdict: wrong"; the reward is its probability of the first, the mean over judge_samples judgements
(judge.py, rewards.judged):

    r_i = (1/k) Σ_j P(Verdict: correct | x, y_i, judgement_j)

Logged: judge_agree (the share of answers where P > 0.5 agrees with the verifier) and judge_verdict_written
(the share of judgements that wrote "Verdict:"). Everything else is grpo.py's."""

import time

import grpo
from grpo import evaluate, loss, on_policy, starts_from  # noqa: F401  (what the judge does not change)
from checkpoints import load_judge
from distributed import all_reduce_sum
from judge import JUDGE_KEYS, judge_scores, rollout_seed

base = "grpo"
defaults = dict(grpo.defaults, **JUDGE_KEYS)  # the judge, and how many judgements per answer (judge.py)


def setup(run, saved):
    """GRPO's, and the judge loaded once, frozen."""
    if not run.cfg["judge"]:
        raise ValueError("--algo judge_reward needs --judge=<the judge's checkpoint dir> (python "
                         "experiments/judge_agreement.py trains one)")
    state = grpo.setup(run, saved)
    state.judge = load_judge(run)
    return state


def batches(run, state, it):
    """GRPO's groups, rewarded by the judge."""
    shards = [grpo.sample_groups(run, state, run.raw_model, it, shard) for shard in grpo.my_shards(run)]
    cfg, sums = run.cfg, dict(agree=0.0, written=0.0, n=0)
    for ro in shards:
        t0 = time.time()
        p, wrote = judge_scores(run, state.judge, ro.problems, ro.texts, cfg["judge_samples"], cfg["judge_temperature"],
                                seed=rollout_seed(ro.ids))
        ro.reward = p.mean(1)  # r_i = (1/k) Σ_j P(correct | x, y_i, j)
        ro.verify_time += time.time() - t0  # (the judge's judgements: verifying)
        ro.advantages = grpo.group_advantages(ro.reward, cfg["group_size"])
        sums = dict(agree=sums["agree"] + float(((ro.reward > 0.5).float() == ro.verified).sum()),
                    written=sums["written"] + float(wrote.float().mean(1).sum()), n=sums["n"] + len(ro.reward))
    sums = all_reduce_sum(sums, run)
    return grpo.minibatches(run, shards), dict(grpo.rollout_figures(run, state, shards),
                                               judge_agree=sums["agree"] / sums["n"],
                                               judge_verdict_written=sums["written"] / sums["n"])
