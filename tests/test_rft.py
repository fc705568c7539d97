"""Rejection-sampling fine-tuning: candidate selection, a tiny run, Best-of-N."""

import envs
import rft
import train as T
from conftest import SFT_DATA


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
                       candidates=4, per_prompt_cap=2, eval_interval=4, best_of_n=2, max_new_tokens=32))
    assert 0 < len(run.pool) <= 4 * 2
    assert set(run.metrics) >= {"heldout_acc", "ood_acc", "heldout_best_of_2"}
    assert run.metrics["heldout_best_of_2"] == 1.0
