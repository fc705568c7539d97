"""Process vs outcome rewards and RLVP (SPEC §3): where step rewards land, GRPO's process
advantages, GAE across tool results, RLVP's channel normalisation and its four rules, tiny runs."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import envs
import grpo
import ppo
import train as T
from conftest import TINY
from lab.process_reward import process_advantages
from nanopost.rewards import check_reward_mode, token_rewards
from nanopost.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = Tokenizer()


def fake_roll(problems, texts, prompt_len=5):
    """The fields of a Rollout that token_rewards reads: each text tokenised as the sampler would write
    it, end token included."""
    responses = [TOK.assistant_ids(t)[0] for t in texts]
    T_ = prompt_len + max(map(len, responses))
    mask = torch.zeros(len(texts), T_ - 1)
    for i, r in enumerate(responses):
        mask[i, prompt_len - 1:prompt_len - 1 + len(r)] = 1.0
    return SimpleNamespace(problems=problems, texts=texts, responses=responses,
                           prompt_lens=torch.tensor([prompt_len] * len(texts)), mask=mask)


def test_step_rewards_land_on_the_last_token_of_each_step():
    env, run = envs.Arithmetic(), SimpleNamespace(tok=TOK)
    p = {"start": 7, "steps": [("+", 8), ("-", 3)], "answer": 12}
    text = "7+8=15. 15-3=11. Answer: 12"  # the second equation is wrong, the answer right
    values, marked = token_rewards(run, fake_roll([p], [text]), env.step_rewards)
    response = TOK.assistant_ids(text)[0]
    columns = marked[0].nonzero().flatten().tolist()
    tokens = [response[c - 4] for c in columns]  # column c scores response token c − (prompt_len − 1)
    assert TOK.decode(tokens[:2]) == ".." and tokens[2] == TOK.eos  # each equation's ".", the answer at the end
    assert values[0, columns].tolist() == [1.0, 0.0, 1.0]

    calc = envs.Calculator()
    q = {"start": 347, "steps": [("*", 28), ("+", 51)], "answer": 9767}
    demo = calc.solve(q)
    values, marked = token_rewards(run, fake_roll([q], [demo]), calc.step_rewards)
    response = TOK.assistant_ids(demo)[0]
    tokens = [response[c - 4] for c in marked[0].nonzero().flatten().tolist()]
    assert tokens == [TOK.special["/tool_call"]] * 2 + [TOK.eos]  # each call's closing tag, never a tool token
    assert values[0][marked[0]].tolist() == [1.0, 1.0, 1.0]


def test_process_advantages_normalise_over_the_group_and_sum_the_steps_that_follow():
    steps = torch.zeros(2, 5)
    ends = torch.zeros(2, 5, dtype=torch.bool)
    steps[0, 1], steps[0, 3], steps[1, 4] = 1.0, 0.0, 1.0
    ends[0, 1] = ends[0, 3] = ends[1, 4] = True
    mask = torch.ones(2, 5)
    mask[0, 4] = 0.0
    adv = process_advantages(steps, ends, mask, 2)
    hi, lo = (1 - 2 / 3) / (2 / 9) ** 0.5, (0 - 2 / 3) / (2 / 9) ** 0.5  # R = {1, 0, 1}: mean 2/3, std √(2/9)
    expected = torch.tensor([[hi + lo, hi + lo, lo, lo, 0.0], [hi] * 5])
    torch.testing.assert_close(adv, expected)
    flat = process_advantages(torch.ones(2, 5) * ends, ends, mask, 2)  # every step reward equal: A = 0
    assert not flat.any()


def test_gae_passes_over_tool_tokens_and_is_unchanged_without_them():
    torch.manual_seed(0)
    rewards, values = torch.randn(1, 7), torch.randn(1, 7)
    hole = torch.tensor([[0, 1, 1, 0, 0, 1, 1.0]])  # tool tokens at columns 3 and 4
    adv, returns = ppo.gae(rewards * hole, values, hole, 0.9, 0.8)
    keep = hole[0] > 0
    dense, dense_returns = ppo.gae(rewards[:, keep], values[:, keep], torch.ones(1, 4), 0.9, 0.8)
    torch.testing.assert_close(adv[:, keep], dense)
    assert adv[0, ~keep].abs().sum() == 0
    torch.testing.assert_close(returns[:, keep], dense_returns)


def rlvp_advantages(outcome, path, beta):
    """lab/rlvp.py's advantages of (P, G) channels: Â(O) + β·Â(Φ), each z-scored over its group."""
    G = outcome.size(1)
    return (grpo.group_advantages(outcome.flatten(), G) + beta * grpo.group_advantages(path.flatten(), G)).view(-1, G)


def test_rlvp_channels_are_normalised_separately():
    outcome = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    path = torch.tensor([[-2.0, 1.0, 1.0, 1.0]])
    adv = rlvp_advantages(outcome, path, 0.5)
    z = lambda x: (x - x.mean()) / x.std(correction=0)
    torch.testing.assert_close(adv, z(outcome) + 0.5 * z(path))
    # a denser or larger path signal (ten times the actions) weighs the same: it cannot drown the outcome
    torch.testing.assert_close(rlvp_advantages(outcome, 10 * path, 0.5), adv)
    # rule 2, the outcome stays the main driver: the one success, though it broke the rule, still leads
    assert adv[0, 0] > adv[0, 1:].max()
    only_path = rlvp_advantages(torch.zeros(1, 4), path, 0.5)
    torch.testing.assert_close(only_path, 0.5 * z(path))
    assert not rlvp_advantages(torch.ones(1, 4), torch.ones(1, 4), 0.5).any()


def test_the_four_rlvp_rules_of_the_calculator_rule_engine():
    """SPEC §3 RLVP's four rules, on envs.Calculator.path_signals and rewards.check_reward_mode."""
    env = envs.Calculator()
    p = {"start": 347, "steps": [("*", 28), ("+", 51), ("-", 86)], "answer": 9681}
    call = lambda e: f"{envs.TOOL_CALL}{e}{envs.END_CALL}{envs.TOOL_RESULT}{envs.calculator(e)}{envs.END_RESULT}"
    # 1. only verifiable actions are penalised, never "no progress": doing nothing, talking, or a
    #    wrong but honest one-step call earns no penalty
    for idle in ["", "Let me think.", call("347*82"), call("347*28")]:
        assert all(s > 0 for _, s in env.path_signals(p, idle))
    # 3. every penalty has a paired compliant action that earns +μ
    shortcut = call("347*28+51-86") + "Answer: 9681"
    head = "Answer: 9681"
    honest = env.solve(p)
    assert [s for _, s in env.path_signals(p, shortcut)] == [-1.0, 1.0]     # forbidden call; answer copied
    assert [s for _, s in env.path_signals(p, head)] == [-1.0]              # an answer no tool computed
    assert [s for _, s in env.path_signals(p, honest)] == [1.0] * 4         # one step a call; copied answer
    # 4. the compliant path is reachable: the solver (what SFT shows) breaks no rule, earns every
    #    bonus and the outcome (and fits the default token budget: test_calculator)
    for q in env.problems("train", 50):
        assert all(s > 0 for _, s in env.path_signals(q, env.solve(q))) and env.verify(q, env.solve(q)) == 1.0
    # both constraints are outcome-neutral: the verifier accepts the shortcut and the head answer
    assert env.verify(p, shortcut) == env.verify(p, head) == 1.0
    # 2. the outcome stays the main driver: β ≤ 1 on channels of the same scale (test above), checked
    cfg = dict(reward_mode="rlvp", rlvp_beta=1.5, rlvp_penalty=1.0, rlvp_bonus=1.0)
    with pytest.raises(ValueError, match="main driver"):
        check_reward_mode(cfg, env)
    with pytest.raises(ValueError, match="step_rewards"):
        check_reward_mode(dict(cfg, reward_mode="process", rlvp_beta=0.5), envs.GeneralPoints())


def small(tmp_path, algo, **cfg):
    base = dict(batch_size=4, minibatches=1) if algo.startswith("ppo") else dict(prompts_per_iter=2, group_size=4)
    return T.train(dict(TINY, **base, algo=algo, max_iters=1, checkpoint=False, max_new_tokens=24,
                        out_dir=str(tmp_path / f"{algo}-{len(os.listdir(tmp_path))}")) | cfg)


def logged(run):
    return [json.loads(line) for line in open(os.path.join(run.cfg["out_dir"], "metrics.jsonl"))][-1]


GRPO_MODES = dict(process=dict(algo="process_reward"), rlvp=dict(algo="rlvp"), path=dict(algo="rlvp", path_only=True))


@pytest.mark.parametrize("mode", ["process", "rlvp", "path"])
def test_grpo_and_ppo_train_in_every_reward_mode(tmp_path, mode):
    for env in (["arithmetic"] if mode == "process" else []) + ["calculator"]:
        row = logged(small(tmp_path, **GRPO_MODES[mode], env=env))
        assert row["loss"] == row["loss"] and ("violations_per_episode" in row) == (env == "calculator")
        assert 0 <= row["all_fail_frac"] <= 1
        variant = dict(process=dict(), rlvp=dict(), path=dict(rlvp_outcome=False))[mode]  # PPO's: lab/ppo_*.py
        ppo_algo = "ppo_process" if mode == "process" else "ppo_rlvp"
        assert logged(small(tmp_path, ppo_algo, env=env, **variant))["loss"] == pytest.approx(
            logged(small(tmp_path, ppo_algo, env=env, **variant))["loss"])  # deterministic
    with pytest.raises(ValueError, match="no one variant"):  # (a reward mode with another baseline: no variant)
        small(tmp_path, **GRPO_MODES[mode], env="calculator", estimator="reinforce")


def test_process_mode_trains_on_per_token_advantages(tmp_path):
    run = small(tmp_path, "process_reward", max_iters=0)
    # a random model writes no equation: two made-up steps per response, at its middle and its end
    run.env.step_rewards = lambda p, text: [(len(text) // 2, float(len(text) % 2)), (len(text), float(len(text) % 3))]
    mb = run.algo.batches(run, run.state, 0)[0][0][0]
    adv = mb.advantages
    assert adv.shape == mb.mask.shape and bool((adv[mb.mask == 0] == 0).all())
    assert adv[mb.mask > 0].abs().sum() > 0
    for row, m in zip(adv, mb.mask):  # constant up to the middle step, then constant to the end
        values = row[m > 0].unique_consecutive()
        assert len(values) <= 2


def test_advantage_mass_on_all_fail_groups(tmp_path):
    """all_fail_adv_share = Σ|A| over the rows of all-fail groups / Σ|A| over all rows, a row's |A| its
    advantage or the mean |A_t| over its response tokens: 0 under the outcome reward (such a group
    has A = 0), all of it where every group fails and a process reward still ranks the samples."""
    outcome = grpo.batches(*(lambda run: (run, run.state, 0))(small(tmp_path, "grpo", max_iters=0)))[1]
    assert outcome["all_fail_frac"] == 1.0 and outcome["all_fail_adv_share"] == 0.0  # a random model fails every group
    run = small(tmp_path, "process_reward", max_iters=0)
    run.env.step_rewards = lambda p, text: [(len(text) // 2, float(len(text) % 2)), (len(text), 0.0)]
    process = run.algo.batches(run, run.state, 0)[1]
    assert process["all_fail_frac"] == 1.0 and process["all_fail_adv_share"] == 1.0
    # the share is of the final advantages: REINFORCE's batch baseline (A = r − 0.5 when one group of two
    # wins every answer) weighs the all-fail group's rows as much as the winners'
    for algo, share in (("grpo", 0.0), ("reinforce", 0.5)):
        run = small(tmp_path, algo, max_iters=0)
        calls = iter(range(10 ** 6))
        run.env.verify = lambda problem, text: 1.0 if next(calls) < 4 else 0.0  # the first group's four answers
        figures = run.algo.batches(run, run.state, 0)[1]
        assert figures["all_fail_frac"] == 0.5 and figures["all_fail_adv_share"] == pytest.approx(share)


@pytest.mark.slow  # a script's smoke run at toy size: `-m slow`
def test_agentic_experiment_script_runs_at_tiny_size(tmp_path):
    out = tmp_path / "agentic"
    args = [sys.executable, os.path.join(ROOT, "experiments", "agentic.py"), f"--out={out}", "--iters=1",
            "--sft_iters=2", "--eval_problems=4", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2",
            "--set", "prompts_per_iter=2", "--set", "group_size=2", "--set", "batch_size=4", "--set", "device='cpu'",
            "--set", "eval_batch_size=8", "--set", "max_new_tokens=16", "--set", "eval_samples=0", "--set", "plot=False"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(out / "results.json"))
    assert set(results["arms"]) == {"outcome", "penalty", "partial_credit", "penalty_only"}
    for arm in results["arms"].values():
        assert {"violations_per_episode", "success", "all_fail_frac"} <= set(arm["curve"][-1])
    assert (out / "agentic.png").exists()
