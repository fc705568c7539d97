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
from nanopost.checkpoints import load_judge
from nanopost.distributed import all_reduce_sum
from nanopost.judge import JUDGE_KEYS
from nanopost.passports import grpo_passport, write_passport
from nanopost.rewards import judged_reward
from nanopost.rollouts import old_logprobs_mode

base = "grpo"
defaults = dict(grpo.defaults, **JUDGE_KEYS)  # the judge, and how many judgements per answer (judge.py)


def setup(run, saved):
    """GRPO's, and the judge loaded once, frozen."""
    if not run.cfg["judge"]:
        raise ValueError("--algo judge_reward needs --judge=<the judge's checkpoint dir> (python "
                         "experiments/judge_agreement.py trains one)")
    state = grpo.setup(run, saved)
    state.judge = load_judge(run)
    k = run.cfg["judge_samples"]
    reward = (f"a generative reward model, the judge `{run.cfg['judge']}` (judge.py): P(Verdict: correct) after "
              + (f"each of {k} judgements sampled at T = {run.cfg['judge_temperature']}, their mean" if k else
                 "its greedy judgement") + "; the verifier's 0/1 logged beside it (judge_agree)")
    write_passport(run, grpo_passport(run, state.verifier_check, old_logprobs_mode(run), reward=reward))
    return state


def batches(run, state, it):
    """GRPO's groups, rewarded by the judge."""
    shards = grpo.sample_shards(run, state, run.raw_model, it)
    sums = dict(agree=0.0, written=0.0, n=0)
    for ro in shards:
        t0 = time.time()
        ro.reward, figures = judged_reward(run, state.judge, ro)  # r_i = (1/k) Σ_j P(correct | x, y_i, j)
        ro.time_verify += time.time() - t0  # (the judge's judgements: verifying)
        ro.advantages = grpo.group_advantages(ro.reward, run.cfg["group_size"])
        sums = dict(agree=sums["agree"] + float(figures["judge_agree"].sum()),
                    written=sums["written"] + float(figures["judge_verdict_written"].sum()), n=sums["n"] + len(ro.reward))
    sums = all_reduce_sum(sums, run)
    grpo.keep_rollouts(run, it, shards)  # tokens.jsonl, for report.py
    return grpo.minibatches(run, shards), dict(grpo.rollout_figures(run, state, shards),
                                               judge_agree=sums["agree"] / sums["n"],
                                               judge_verdict_written=sums["written"] / sums["n"])
