"""--fsdp (FSDP2) on two gloo processes: the same training as one process, and exact resume, for
every algorithm (SFT and GRPO in the default suite, the rest marked slow); sharded (lockstep)
rollouts against gathered ones (GRPO, PPO, OPD: the on_policy algorithms)."""

import json
import os

import pytest
import torch

import envs
from nanopost import options
import train as T
from nanopost.checkpoints import build_model, load_model, read_checkpoint
from conftest import SFT_DATA, TINY, free_ports, run_ddp
from nanopost.tokenizer import make_tokenizer

SMALL_RL = dict(prompts_per_iter=4, rollout_prompts=2, group_size=2, batch_size=4, max_new_tokens=8, eval_problems=2, eval_batch_size=4)
ALGOS = {
    "sft": dict(SFT_DATA, batch_size=2),  # (dropout 0: a rank's own masks resumed, test_scale.py)
    "grpo": dict(SMALL_RL, learning_rate=1e-3, share_prompt=False),
    "dpo": dict(train_prompts=8, heldout_prompts=4, group_size=2, max_new_tokens=8, eval_batch_size=4),
    "rm": dict(train_prompts=8, heldout_prompts=4, group_size=2, max_new_tokens=8, eval_batch_size=4),
    "opsd": dict(prompts_per_iter=4, rollout_prompts=2, group_size=2, batch_size=4, max_new_tokens=8),  # OPD, its own teacher
    "ppo": dict(prompt_pool=64, batch_size=2, minibatches=2, inner_epochs=2, max_new_tokens=8, learning_rate=1e-3,
                eval_problems=2, eval_batch_size=4),  # (policy and critic: two sharded roots)
    "rft": dict(rounds=4, round_prompts=8, group_size=8, max_new_tokens=64, eval_batch_size=4),  # (a round per iteration
    # whatever max_iters, so the stopped run draws the same pools; room for an end token)
}


def _odd_length_reward(problem, response):
    """A reward a random model earns half the time, so that RL's advantages are not all 0 (a correct
    answer never is, and a gradient of float noise makes no comparison)."""
    return float(len(response) % 2)


# algorithms whose global batch is ranks × accumulation × batch_size (GRPO's and OPD's are global)
PER_RANK_BATCH = ("sft", "rm", "dpo", "rft", "ppo")


def _in_turn(runs, ports):
    """Several training runs one after the other in each rank's process, a fresh free port for each
    (chosen by the parent, so both ranks use the same ones)."""
    envs.Arithmetic.verify = staticmethod(_odd_length_reward)
    for overrides, port in zip(runs, ports):
        os.environ["MASTER_PORT"] = str(port)
        T.train(overrides)


def in_turn(runs):
    """_in_turn on two gloo ranks."""
    run_ddp(_in_turn, runs, free_ports(len(runs)))


def _losses(out):
    return [row["loss"] for row in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "loss" in row]


def _rows(out):
    """metrics.jsonl without its timings (the two runs' clocks differ, nothing else should) and the
    monitors' lists of alarms (the figures they read are compared)."""
    return [{k: v for k, v in row.items() if "time" not in k and "per_s" not in k and k != "alarms"}
            for row in map(json.loads, open(os.path.join(out, "metrics.jsonl")))]


def _weights(out):
    return read_checkpoint(out)["model"]


def check_fsdp(tmp_path, monkeypatch, algo, sharded_rollouts=False):
    """Two ranks under --fsdp: one iteration equals one process's (same rollouts, one update: its
    loss, and its weights up to float noise), and 2 iterations, stop, resume to 4 equal 4 straight.
    sharded_rollouts: that one iteration again with --fsdp_rollouts=sharded gives the same figures
    and weights as gathered (test_fsdp_sharded_rollouts_match_gathered below goes further)."""
    base = dict(TINY, algo=algo, fsdp=True, max_iters=4, lr_decay_iters=4, **ALGOS[algo])
    one, first = str(tmp_path / "one"), str(tmp_path / "first")
    straight, half, sharded = str(tmp_path / "straight"), str(tmp_path / "half"), str(tmp_path / "sharded")
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(_odd_length_reward))
    accumulate = 2 if algo in PER_RANK_BATCH else 1  # one process takes both ranks' micro-batches
    T.train(dict(base, out_dir=one, max_iters=1, gradient_accumulation_steps=accumulate))  # (--fsdp: nothing to shard)
    in_turn([dict(base, out_dir=first, max_iters=1), dict(base, out_dir=straight),
             dict(base, out_dir=half, max_iters=2), dict(init_from="resume", out_dir=half, max_iters=4)]
            + [dict(base, out_dir=sharded, max_iters=1, fsdp_rollouts="sharded")] * sharded_rollouts)
    if sharded_rollouts:
        assert [row == pytest.approx(want, rel=1e-5, abs=1e-6) for row, want in zip(_rows(sharded), _rows(first))] == [True]
        for k, v in _weights(first).items():
            assert torch.allclose(_weights(sharded)[k], v, atol=1e-6), k
    ckpt = read_checkpoint(straight)
    assert ckpt["sharded"] and ckpt["optimizer"] is None  # the trained state sharded; the export gathered
    assert sorted(n for n in os.listdir(half) if n.startswith("sharded_")) == ["sharded_0000004"]
    assert _losses(first) == pytest.approx(_losses(one), rel=1e-4, abs=5e-5)
    # Adam's first step is near sign(g)·lr: a gradient within float noise of 0 flips its step, so the
    # weights are compared in norm: the two runs' difference against the distance trained
    start = build_model(options.make_config(dict(base, out_dir=one)), make_tokenizer("byte")).state_dict()
    for k, v in _weights(one).items():
        moved = v - start.get(k.removeprefix("gpt."), torch.zeros_like(v))  # (a scalar head: from 0)
        assert (_weights(first)[k] - v).norm() <= 0.05 * moved.norm() + 1e-6, k
    assert _losses(half) == _losses(straight)  # resume is exact: each step's loss, then every weight
    for k, v in _weights(straight).items():
        assert torch.equal(_weights(half)[k], v), k


def test_fsdp_sft_matches_and_resumes_exactly(tmp_path, monkeypatch):
    check_fsdp(tmp_path, monkeypatch, "sft")
    model = load_model(str(tmp_path / "straight"))  # the gathered export loads as any checkpoint
    assert model.config.n_embd == TINY["n_embd"]


def test_fsdp_grpo_matches_and_resumes_exactly(tmp_path, monkeypatch):
    check_fsdp(tmp_path, monkeypatch, "grpo", sharded_rollouts=True)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dpo", "rm", "opsd", "rft", "ppo"])
def test_fsdp_other_algorithms(tmp_path, monkeypatch, algo):
    check_fsdp(tmp_path, monkeypatch, algo)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo", "opsd"])
def test_fsdp_sharded_rollouts_match_gathered(tmp_path, monkeypatch, algo):
    """--fsdp_rollouts=sharded (every sampling and scoring forward a collective, ranks in lockstep)
    samples the same tokens and trains the same as gathered weights: 2 iterations with evaluations
    where the ranks hold 2 and 1 of 3 problems, one row per sampler call (so rank 1 pads with an
    idle call, and with an idle π_ref forward for the sampled answers' KL)."""
    base = dict(TINY, algo=algo, fsdp=True, max_iters=2, lr_decay_iters=2, eval_interval=2,
                **dict(ALGOS[algo], eval_problems=3, eval_batch_size=1, eval_samples=2))
    gathered, sharded = str(tmp_path / "gathered"), str(tmp_path / "sharded")
    in_turn([dict(base, out_dir=gathered), dict(base, out_dir=sharded, fsdp_rollouts="sharded")])
    assert open(os.path.join(sharded, "samples.txt")).read() == open(os.path.join(gathered, "samples.txt")).read()
    rows, expected = _rows(sharded), _rows(gathered)
    assert [sorted(r) for r in rows] == [sorted(r) for r in expected]
    assert "heldout_kl_ref" in rows[-1] or algo == "opsd"  # (OPD's evaluation has no reference to measure)
    for row, want in zip(rows, expected):
        assert row == pytest.approx(want, rel=1e-5, abs=1e-6)
    for k, v in _weights(gathered).items():
        assert torch.allclose(_weights(sharded)[k], v, atol=1e-6), k


@pytest.mark.slow
def test_fsdp_shared_prompts_match_plain(tmp_path):
    """--fsdp with share_prompt=True (every block runs twice in one forward: the prompts, then the
    continuations) trains as share_prompt=False does: GRPO, 2 iterations of 2 optimizer steps of 2
    accumulated micro-batches each, on two ranks."""
    base = dict(TINY, algo="grpo", fsdp=True, max_iters=2, lr_decay_iters=2,
                **dict(SMALL_RL, learning_rate=1e-3, minibatches=2, batch_size=1))
    shared, plain = str(tmp_path / "shared"), str(tmp_path / "plain")
    in_turn([dict(base, out_dir=shared, share_prompt=True), dict(base, out_dir=plain, share_prompt=False)])
    rows, expected = _rows(shared), _rows(plain)
    assert len(rows) == len(expected) == 2
    for row, want in zip(rows, expected):  # (the loss is near 0 on-policy: compare it absolutely)
        assert row == pytest.approx(want, rel=1e-4, abs=1e-6)
    for k, v in _weights(plain).items():
        assert torch.allclose(_weights(shared)[k], v, atol=1e-5), k
