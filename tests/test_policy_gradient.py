"""grpo.py's policy-gradient family on numbers (its lab: gspo, cispo, reinforce_pp, tis, edge_prompts): GSPO's
and CISPO's gradients against GRPO's and the plain policy gradient, the clip band, batch vs group scaling,
truncated importance sampling, edge prompt sampling (band, resume, DDP), the verifier check and the
rollout-cost example (each failure against the monitor that must catch it: test_failures.py)."""

import json
import types
import zlib

import numpy as np
import pytest
import torch

import envs
import grpo
import train as T
from conftest import TINY, run_ddp
from nanopost.distributed import rollout_cost
from experiments.failures import lax_verify
from lab import cispo, dapo, dr_grpo, gspo, reinforce_pp, tis
from lab.edge_prompts import edge_draw, edge_update
from model import clipped_surrogate
from nanopost.passports import unparsed, verification_text, verifier_check


def grad(logp, old, adv, mask, ratio_level="token", surrogate="clip", aggregate=grpo.seq_mean_token_mean, eps=0.2,
         weights=1.0):
    """d(loss_sum / count) / d logp of the family's pieces: GRPO's token ratio or GSPO's sequence ratio, the
    clipped surrogate or CISPO's capped weight, an aggregation, per-token weights (TIS)."""
    logp = logp.detach().requires_grad_(True)
    on = mask > 0
    ratio = (gspo.sequence_ratio if ratio_level == "sequence" else grpo.token_ratio)(logp, old, on)
    if surrogate == "cispo":
        per_token, clipped = cispo.cispo_surrogate(ratio, adv[:, None], logp, on, eps, eps)
    else:
        per_token, clipped = clipped_surrogate(ratio, adv[:, None], on, eps, eps)
    loss_sum, count = aggregate(per_token * weights, mask)
    (loss_sum / count).backward()
    return logp.grad, grpo.ratio_figures(ratio, clipped, on)


# three responses of lengths 4, 2 and 3
MASK = torch.tensor([[1., 1., 1., 1.], [1., 1., 0., 0.], [1., 1., 1., 0.]])
LOGP = torch.log(torch.tensor([[.5, .2, .7, .9], [.3, .6, .5, .5], [.8, .1, .4, .5]]))
ADV = torch.tensor([1.0, -0.5, 2.0])


def test_gspo_at_rho_1_is_grpo_with_per_sequence_token_means():
    """At the first step (π_θ = π_old) GSPO's gradient is GRPO's: A_i/|y_i| per token, over N = 3
    responses; the loss values agree too."""
    g_seq, _ = grad(LOGP, LOGP, ADV, MASK, ratio_level="sequence")
    g_tok, _ = grad(LOGP, LOGP, ADV, MASK)
    expected = -(ADV[:, None] / MASK.sum(1, keepdim=True)) * MASK / 3
    assert torch.allclose(g_seq, expected, atol=1e-7) and torch.allclose(g_tok, expected, atol=1e-7)


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_cispo_at_rho_1_is_the_plain_policy_gradient(ratio_level):
    """CISPO at ρ = 1 with the token mean: −A_i / (total tokens = 9) on every response token."""
    g, metrics = grad(LOGP, LOGP, ADV, MASK, ratio_level, "cispo", dapo.token_mean)
    assert torch.allclose(g, -ADV[:, None] * MASK / 9, atol=1e-7) and metrics["clip_frac"] == 0


def test_outside_the_band_gspo_stops_the_response_and_cispo_keeps_it_capped():
    """Response 0 (A = +1) has token log-ratios (+0.5, 0, 0, 0): its sequence ratio exp(0.125) = 1.133
    is past 1 + 0.1, so GSPO stops all four of its tokens (three of which are inside the band on their
    own: token-level clipping stops only the first). CISPO keeps every token, the first with the
    capped weight 1.1, the others with their own ratio 1; response 2 (inside the band) is untouched."""
    old = LOGP.clone()
    old[0, 0] -= 0.5
    g_seq, m_seq = grad(LOGP, old, ADV, MASK, "sequence", eps=0.1)
    assert torch.equal(g_seq[0], torch.zeros(4)) and m_seq["clip_frac"] == pytest.approx(4 / 9)
    assert torch.allclose(g_seq[2], -2.0 / 3 / 3 * MASK[2], atol=1e-7)
    g_tok, _ = grad(LOGP, old, ADV, MASK, eps=0.1)
    assert g_tok[0, 0] == 0 and torch.allclose(g_tok[0, 1:], torch.full((3,), -1 / 4 / 3), atol=1e-7)
    g_cispo, m_cispo = grad(LOGP, old, ADV, MASK, "token", "cispo", dapo.token_mean, eps=0.1)
    assert float(g_cispo[0, 0]) == pytest.approx(-1.1 * 1.0 / 9, rel=1e-6)
    assert torch.allclose(g_cispo[0, 1:], torch.full((3,), -1.0 / 9), atol=1e-7)
    assert m_cispo["clip_frac"] == pytest.approx(1 / 9)
    # GSPO's ratio in CISPO's weight: the sequence's capped weight 1.1 on all four tokens
    g_both, _ = grad(LOGP, old, ADV, MASK, "sequence", "cispo", dapo.token_mean, eps=0.1)
    assert torch.allclose(g_both[0], torch.full((4,), -1.1 / 9), atol=1e-6)


def test_batch_vs_group_scaling_by_hand():
    """Groups [1,0,0,0] and [1,1,0,0]: centred (0.75, −0.25 ×3) and (±0.5); the group std is 0.4330
    and 0.5, the batch std of all eight centred values √(1.75/8) = 0.46771."""
    rewards = torch.tensor([1., 0., 0., 0., 1., 1., 0., 0.])
    group = grpo.group_advantages(rewards, 4).view(2, 4)
    assert group[0].tolist() == pytest.approx([1.7320508, -0.5773503, -0.5773503, -0.5773503], rel=1e-6)
    assert group[1].tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0])
    centred = dr_grpo.centred_advantages(rewards, 4)  # Dr. GRPO: no std
    assert torch.allclose(group.flatten(), centred / torch.tensor([0.4330127] * 4 + [0.5] * 4))  # GRPO = Dr. GRPO / std
    (batch,) = reinforce_pp.batch_scale([centred], types.SimpleNamespace(ddp=False))
    assert batch.tolist() == pytest.approx([1.6035675, -0.5345225, -0.5345225, -0.5345225,
                                            1.0690450, 1.0690450, -1.0690450, -1.0690450], rel=1e-6)


def test_tis_weight_is_one_when_sampler_and_trainer_agree_and_capped_when_not():
    mask = torch.tensor([[1., 1., 1., 0.]])
    old = torch.log(torch.tensor([[.5, .2, .4, .3]]))
    w, capped = tis.tis_weights(old, old.clone(), mask, 2.0)
    assert torch.equal(w, mask) and capped == 0
    sampler = old + torch.tensor([[-np.log(3.0), np.log(2.0), 0.0, 5.0]])  # ratios 3, 0.5, 1 (and padding)
    w, capped = tis.tis_weights(old, sampler, mask, 2.0)
    assert w.tolist()[0] == pytest.approx([2.0, 0.5, 1.0, 0.0]) and float(capped) == pytest.approx(1 / 3)
    g, _ = grad(LOGP[:1], LOGP[:1], ADV[:1], MASK[:1], aggregate=dapo.token_mean, weights=torch.tensor([[2.0, .5, 1., 1.]]))
    assert torch.allclose(g, -torch.tensor([[2.0, .5, 1., 1.]]) / 4, atol=1e-7)


def test_edge_draw_stays_in_the_band_while_in_band_prompts_remain():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        success = rng.uniform(size=64)
        success[rng.uniform(size=64) < 0.2] = np.nan
        n = int(rng.integers(1, 40))
        drawn = edge_draw(success, n, np.random.default_rng(seed), 0.2, 0.8)
        unseen = np.flatnonzero(np.isnan(success))
        in_band = np.flatnonzero((success >= 0.2) & (success <= 0.8))
        assert len(set(drawn.tolist())) == len(drawn) == n
        assert drawn[:min(n, len(unseen))].tolist() == unseen[:n].tolist()  # unseen first, in pool order
        later = drawn[len(unseen):]
        k = min(len(later), len(in_band))
        assert set(later[:k].tolist()) <= set(in_band.tolist())  # the band before anything outside it
    s = np.array([np.nan, 0.5, 0.0])
    edge_update(s, np.array([0, 1]), np.array([0.25, 1.0]))
    assert s.tolist() == [0.25, 0.75, 0.0]


def coin_reward(problem, text):
    return float(zlib.crc32(text.encode()) % 2)


EDGE = dict(TINY, algo="edge_prompts", prompts_per_iter=4, group_size=4, max_new_tokens=8, prompt_pool=6,
            learning_rate=1e-3, rollout_prompts=2)


def test_edge_sampling_resumes_exactly(tmp_path, monkeypatch):
    """2 iterations + resume to 4 draw what 4 straight do: the pool's success is checkpointed."""
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin_reward))
    straight = T.train(dict(EDGE, max_iters=4, lr_decay_iters=4, out_dir=str(tmp_path / "straight")))
    T.train(dict(EDGE, max_iters=2, lr_decay_iters=4, out_dir=str(tmp_path / "resumed")))  # (the schedule of 4)
    resumed = T.train(dict(algo="edge_prompts", init_from="resume", max_iters=4, out_dir=str(tmp_path / "resumed")))
    assert np.array_equal(straight.state.success, resumed.state.success, equal_nan=True)
    assert all(torch.equal(a, b) for a, b in zip(straight.raw_model.state_dict().values(),
                                                 resumed.raw_model.state_dict().values()))
    assert not np.isnan(straight.state.success).any()  # 16 draws from a pool of 6: every prompt came back


def edge_run(cfg):
    """One edge-sampling run with the coin reward, the real verifier put back after (this also runs
    in the test's own process: a verifier left patched broke later tests)."""
    real, envs.Arithmetic.verify = envs.Arithmetic.__dict__["verify"], staticmethod(coin_reward)
    try:
        run = T.train(cfg)
    finally:
        envs.Arithmetic.verify = real
    return run.state.success.tolist(), [r["edge_in_band_frac"] for r in map(json.loads, open(cfg["out_dir"] + "/metrics.jsonl"))
                                        if "edge_in_band_frac" in r]


@pytest.mark.slow
def test_edge_sampling_is_identical_on_two_ranks(tmp_path):
    cfg = dict(EDGE, max_iters=3)
    (s0, d0), (s1, d1) = run_ddp(edge_run, dict(cfg, out_dir=str(tmp_path / "ddp")))
    s, d = edge_run(dict(cfg, out_dir=str(tmp_path / "one")))
    assert d0 == d1 == d and np.allclose(s0, s, equal_nan=True) and np.allclose(s1, s, equal_nan=True)


def test_verifier_check_catches_a_broken_verifier():
    env = envs.make_env("arithmetic")
    assert verifier_check(env, env.verify)["verifier_error_rate"] == 0
    always = verifier_check(env, lambda p, r: 1.0)
    assert always["verifier_false_positives"] == always["verifier_probes"] - 64 > 50
    assert verifier_check(env, lambda p, r: 0.0)["verifier_false_negatives"] == 64
    assert verifier_check(env, lax_verify)["verifier_false_positives"] > 0  # the format exploit
    assert env.parses("3+4=7. Answer: 7") and not env.parses("Answer: 7 8")
    unsolved = verifier_check(types.SimpleNamespace(), env.verify)  # no solver: unknown, not 0
    assert np.isnan(unsolved["verifier_error_rate"]) and "unchecked" in verification_text(unsolved)
    assert not unparsed(types.SimpleNamespace(), "anything") and unparsed(env, "Answer: 7 8")


def test_rollout_cost_example():
    """SPEC §5 / M14 §11: 256 × 8 × 4,000 tokens at 8 × 209.4 tok/s against 6ND at 8 × 990 TFLOP/s × 0.4."""
    c = rollout_cost(256, 8, 4000, 8, 209.4, 8.03e9, 990e12, 0.4)
    assert c["tokens"] == 8_192_000 and round(c["decode_s"], 1) == 4890.2 and round(c["decode_min"], 1) == 81.5
    assert round(c["train_min"], 6) == 2.076444 and round(c["ratio"], 4) == 39.2511


def test_config_errors(tmp_path):
    base = dict(TINY, prompts_per_iter=2, group_size=2, max_iters=0, out_dir=str(tmp_path / "x"))
    for bad, match in [(dict(algo="edge_prompts", prompt_pool=1), "prompt_pool"),
                       (dict(algo="grpo", tis_cap=2.0), "--algo tis"), (dict(algo="grpo", ratio_level="seq"), "ratio_level"),
                       (dict(algo="rlvp"), "path_signals"), (dict(algo="process_reward", env="generalpoints"), "step_rewards")]:
        with pytest.raises(ValueError, match=match):
            T.train(dict(base, **bad))


SFT_TINY = dict(train_problems=64, val_examples=8)
PAIRS_TINY = dict(pairs="style", train_prompts=4, heldout_prompts=2)


@pytest.mark.parametrize("algo,extra", [("sft", SFT_TINY), ("rm", PAIRS_TINY), ("dpo", PAIRS_TINY),
                                        ("ppo", dict(prompt_pool=16)), ("rft", dict(round_prompts=2, group_size=2)),
                                        ("opsd", {}), ("grpo", {})])
def test_every_algorithm_writes_its_passport(tmp_path, algo, extra):
    """SPEC §6: the four parts of the passport, and in every RL and OPD run the verifier's own error rate."""
    T.train(dict(TINY, algo=algo, max_iters=0, out_dir=str(tmp_path / algo), **extra))
    text = open(tmp_path / algo / "passport.md").read()
    assert all(part in text for part in ("## Data and mode", "## Optimisation", "## Infrastructure", f"--algo {algo}"))
    assert ("verifier's own error rate against the solver: 0.000" in text) == (algo in ("ppo", "rft", "opsd", "grpo"))


def test_batch_scaling_in_the_loop_gives_unit_std(tmp_path, monkeypatch):
    """REINFORCE++: the rows that train have advantages of population std 1 over the whole batch."""
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin_reward))
    run = T.train(dict(TINY, algo="reinforce_pp", prompts_per_iter=4, group_size=4, max_new_tokens=8, max_iters=0,
                       out_dir=str(tmp_path / "run")))
    rows = [mb for step in run.algo.batches(run, run.state, 0)[0][:1] for mb in step]
    adv = torch.cat([mb.advantages for mb in rows])
    assert len(adv) >= 8 and float(adv.std(correction=0)) == pytest.approx(1.0, abs=1e-5)
