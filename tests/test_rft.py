"""Rejection-sampling fine-tuning: candidate selection, a tiny run, Best-of-N."""

import torch

import envs
import rft
import train as T
from conftest import SFT_DATA
from nanopost.evaluation import sampled_accuracy


def test_selection_keeps_verified_distinct_and_capped():
    groups = [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]
    responses = [(1,), (1,), (2,), (3,), (4,), (1,), (5,), (6,), (7,), (7,)]
    rewards = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    # prompt 0: (1,) twice -> once, (2,) wrong, (3,) kept, (4,) over the cap of 2; prompt 1: (1,) is
    # wrong there (a response is judged per prompt); prompt 2: nothing verified
    assert rft.select_candidates(groups, responses, rewards, cap=2) == [0, 3, 6, 7]
    assert rft.select_candidates(groups, responses, rewards, cap=1) == [0, 6]
    assert rft.select_candidates(groups, responses, [0.0] * 10, cap=4) == []


def test_tiny_rft_run_completes(tiny, tmp_path, monkeypatch):
    # long enough an SFT that some samples end with the end token (an unfinished one never counts)
    sft = dict(tiny, **SFT_DATA, algo="sft", out_dir=str(tmp_path / "sft"), max_iters=30, batch_size=8,
               learning_rate=3e-3)
    T.train(sft)
    # the tiny model solves nothing: let every finished answer pass, so the pool is not empty
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(lambda problem, response: 1.0))
    run = T.train(dict(tiny, algo="rft", init_from=sft["out_dir"], max_iters=4, rounds=2, round_prompts=4,
                       group_size=4, per_prompt_cap=2, eval_interval=4, eval_samples=2, max_new_tokens=32))
    assert 0 < len(run.state.pool) <= 4 * 2
    assert set(run.metrics) >= {"heldout_acc", "ood_acc", "heldout_pass@2"}
    assert run.metrics["heldout_pass@2"] == 1.0


def test_best_of_n_follows_one_minus_miss_rate_to_the_n(tiny, monkeypatch):
    """Best-of-N by the verifier on a case solvable by enumeration: one-token answers, "correct" when
    the token is an ASCII letter or digit, so problem i is solved by one sample with probability p_i (read off
    the model's softmax) and by the best of N with 1 − (1 − p_i)^N. The figure matches that within
    the sampling noise, rises with N far beyond it, and N = 1 is the plain sampled accuracy."""
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(lambda problem, response: float(
        response[:1].isascii() and response[:1].isalnum())))
    right = [b for b in range(128) if chr(b).isalnum()]
    run = T.train(dict(tiny, algo="grpo", max_iters=0, max_new_tokens=1, eval_batch_size=600))
    n = 200
    problems = run.env.problems("heldout", n, seed=0)
    with torch.no_grad():
        p = torch.stack([run.raw_model(torch.tensor([run.tok.prompt_ids(q["prompt"])]))[0, -1].softmax(-1)[right].sum()
                         for q in problems])
    sampled = {N: sampled_accuracy(run, run.raw_model, n, N, temperature=1.0)[0] for N in (1, 3, 8)}
    figures = [sampled[1]["heldout_sampled_acc"], sampled[3]["heldout_pass@3"], sampled[8]["heldout_pass@8"]]
    expected = [float((1 - (1 - p) ** N).mean()) for N in (1, 3, 8)]
    assert 0.1 < expected[0] < 0.4 and expected[-1] - expected[0] > 0.3
    for got, want in zip(figures, expected):
        assert abs(got - want) < 0.1  # 3 standard errors of a mean of 200 Bernoullis
    assert figures == sorted(figures) and figures[-1] - figures[0] > 0.3
    assert sampled_accuracy(run, run.raw_model, n, 1, temperature=1.0)[0] == sampled[1]  # fixed seed
    assert abs(sampled[8]["heldout_sampled_acc"] - expected[0]) < 0.05  # 1,600 samples: the plain accuracy


def test_grpo_and_ppo_log_best_of_n_beside_their_results(tiny):
    """pass@k (Best-of-k by the verifier) with eval_samples = k, or under its old name; none with 0."""
    for algo in ("grpo", "ppo"):
        run = T.train(dict(tiny, algo=algo, max_iters=0, eval_interval=1, max_new_tokens=8, eval_best_of_n=3,
                           eval_problems=4, out_dir=tiny["out_dir"] + algo))
        assert run.cfg["eval_samples"] == 3 and 0.0 <= run.metrics["heldout_pass@3"] <= 1.0
        assert run.metrics["heldout_sampled_acc"] <= run.metrics["heldout_pass@3"]
        off = T.train(dict(tiny, algo=algo, max_iters=0, eval_interval=1, max_new_tokens=8, eval_samples=0,
                           eval_problems=4, out_dir=tiny["out_dir"] + algo + "off"))
        assert not any("pass@" in k or "sampled" in k for k in off.metrics)
