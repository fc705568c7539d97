"""experiments/estimators.py, the estimator lab, on its --quick size: the enumeration is exact, the
unbiased estimators are unbiased within their Monte Carlo error and the normalised ones are not,
Dr. GRPO's scale is (G − 1)/(G·L_max), k1 and k3 are unbiased and k2 is not, and exact ascent on the
KL-regularised objective reaches π* ∝ π_ref·exp(r/β)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))

import estimators as E  # noqa: E402


def test_enumeration_is_a_distribution_and_its_gradient_is_exact():
    theta = torch.randn(len(E.PREFIX), 3, generator=torch.Generator().manual_seed(3))
    assert E.Y == 31 and float(E.seq_logprobs(theta).exp().sum()) == pytest.approx(1.0, abs=1e-6)
    grad = E.flat_grad(E.expected_reward, theta.double())
    step = torch.zeros(theta.numel(), dtype=torch.float64)
    step[4] = 1e-6
    finite = (E.expected_reward(theta.double() + step.view_as(theta)) -
              E.expected_reward(theta.double() - step.view_as(theta))) / 2e-6
    assert float(grad[4]) == pytest.approx(float(finite), rel=1e-6)


def test_quick_lab_bias_variance_kl_and_optimum(tmp_path):
    res = E.main(["--quick", "--out", str(tmp_path)])
    on, off, kl = res["on_policy"], res["off_policy"], res["kl"]
    for r in (on["reinforce"], on["rloo"], off["seq_is"]):  # unbiased: what is left is Monte Carlo noise
        assert r["rel_bias"] < 3 * r["mc_se"] and abs(r["scale"] - 1) < 4 * r["mc_se"]
    for r in (on["grpo"], off["grpo"], off["gspo"]):  # std/length normalisation, clipping: a bias in direction
        assert r["rel_bias"] > 10 * r["mc_se"]
    assert on["gspo"] == on["grpo"]  # at ρ = 1 GSPO is GRPO with per-sequence token means, to the bit
    G = res["settings"]["group_size"]
    assert on["dr_grpo"]["scale"] == pytest.approx((G - 1) / (G * E.L), abs=4 * on["dr_grpo"]["mc_se"])
    assert on["dr_grpo"]["rel_bias"] < 3 * on["dr_grpo"]["mc_se"]  # the right direction, a constant step size
    assert abs(kl["k1"]["bias"]) < 1e-5 and abs(kl["k3"]["bias"]) < 1e-5 and abs(kl["k2"]["bias"]) > 1e-3
    assert kl["k3"]["std"] < kl["k1"]["std"]
    assert kl["k3_loss_gradient"]["rel_diff_to_grad_kl"] > 0.1  # k3's gradient is not ∇KL(π‖π_ref)
    o = res["optimum"]
    assert o["objective_at_trained"] == pytest.approx(o["beta_log_z"], abs=1e-4) and o["kl_trained_to_optimum"] < 1e-3
    assert (tmp_path / "estimators.png").exists() and (tmp_path / "estimators.json").exists()


def test_help():
    with pytest.raises(SystemExit) as exit_:
        E.main(["--help"])
    assert exit_.value.code == 0
