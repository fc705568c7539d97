"""The menu of docs/menu.md, each checked with numbers: Muon's Newton–Schulz step and its optimiser (a
worked step, AdamW's half against torch's, an exact resume, equal DDP ranks), DFT's gradient, MaxRL's
advantages and its exact expected gradient by enumeration, SAPO's soft gate and DPPO's divergence mask
(worked examples and autograd against the formula)."""

import json
import math
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import train as T  # noqa: E402
import estimators as E  # noqa: E402
from conftest import SFT_DATA, TINY, run_ddp  # noqa: E402
from lab import dft, dppo, maxrl, muon, sapo  # noqa: E402
from model import token_logprobs  # noqa: E402


# -- Muon --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (32, 32)])
def test_newton_schulz_keeps_the_singular_vectors_and_pulls_the_values_towards_one(shape):
    """NS5 of a matrix whose singular values span 1e-2..1e2 relative: the result's values lie in the
    quintic's band (about 0.7-1.2) and it is close to the polar factor U V^T, whatever the scale of the input."""
    g = torch.Generator().manual_seed(0)
    u, _, v = torch.linalg.svd(torch.randn(*shape, generator=g), full_matrices=False)
    s = torch.logspace(-2, 0, min(shape))
    x = (u * s) @ v
    out = muon.newton_schulz(x)
    values = torch.linalg.svdvals(out)
    assert values.min() > 0.6 and values.max() < 1.25, values
    polar = u @ v
    assert (out - polar).norm() / polar.norm() < 0.25
    torch.testing.assert_close(muon.newton_schulz(1000 * x), out, atol=1e-5, rtol=1e-4)  # (scale-free)


def test_muon_first_step_by_hand_and_adamw_half_as_torch():
    """From zero momentum, one step of a matrix is W(1 − lr·λ) − lr·0.2·√max(m, n)·NS5(G) (NS5 of
    (1 + μ)G is NS5 of G); the AdamW groups match torch.optim.AdamW over three steps."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.nn.Parameter(torch.randn(8, 4, generator=g)), torch.nn.Parameter(torch.randn(4, generator=g))
    w0 = w.detach().clone()
    twin = torch.nn.Parameter(b.detach().clone())
    opt = muon.Muon([dict(params=[w], muon=True, weight_decay=0.1), dict(params=[b], muon=False, weight_decay=0.1)],
                    lr=0.01, momentum=0.95, betas=(0.9, 0.95))
    reference = torch.optim.AdamW([twin], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    for step in range(3):
        grad = torch.randn(8, 4, generator=g)
        w.grad, b.grad = grad, torch.randn(4, generator=g)
        twin.grad = b.grad.clone()
        opt.step()
        reference.step()
        if step == 0:
            want = w0 * (1 - 0.01 * 0.1) - 0.01 * 0.2 * math.sqrt(8) * muon.newton_schulz(grad)
            torch.testing.assert_close(w.detach(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.detach(), twin.detach(), atol=1e-6, rtol=1e-6)


def test_muon_orthogonalises_only_the_blocks_matrices(tmp_path):
    run = T.train(dict(TINY, **SFT_DATA, algo="muon", max_iters=1, out_dir=str(tmp_path / "m")))
    model = run.raw_model
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = muon.make_optimizer(run, model)
    chosen = sorted(names[id(p)] for group in optimizer.param_groups if group["muon"] for p in group["params"])
    assert chosen and all(n.startswith("transformer.h.") and n.endswith(".weight") for n in chosen)
    assert {n.split(".")[-2] for n in chosen} == {"c_attn", "c_proj", "c_fc"}
    others = {names[id(p)] for group in optimizer.param_groups if not group["muon"] for p in group["params"]}
    assert "transformer.wte.weight" in others and any(n.endswith(".bias") for n in others)


def _weights(overrides):
    run = T.train(overrides)
    return {k: v.detach().clone() for k, v in run.raw_model.state_dict().items()}


@pytest.mark.parametrize("extra", [{}, {"pretrain": True}])
def test_muon_resumes_exactly(tmp_path, extra):
    """3 iterations, a checkpoint, 3 more == 6 straight (the schedule's length fixed): Muon's momentum and
    AdamW's moments come back from the checkpoint. --pretrain=True trains on the packed corpus."""
    base = dict(TINY, **SFT_DATA, **extra, algo="muon", lr_decay_iters=6, warmup_iters=2)
    straight = _weights(dict(base, max_iters=6, out_dir=str(tmp_path / "a")))
    first = T.train(dict(base, max_iters=3, out_dir=str(tmp_path / "b")))
    assert (first.state.stream is not None) == bool(extra)
    resumed = _weights(dict(init_from="resume", out_dir=str(tmp_path / "b"), max_iters=6, device="cpu"))
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_muon_under_ddp_keeps_the_ranks_equal_and_matches_one_process(tmp_path):
    base = dict(TINY, **SFT_DATA, algo="muon", max_iters=2, checkpoint=False)
    one = _weights(dict(base, out_dir=str(tmp_path / "a"), batch_size=4, gradient_accumulation_steps=2))
    ranks = run_ddp(_weights, dict(base, out_dir=str(tmp_path / "b"), batch_size=4, gradient_accumulation_steps=1))
    for k in one:
        assert torch.equal(ranks[0][k], ranks[1][k]), k
        torch.testing.assert_close(ranks[0][k], one[k], atol=5e-5, rtol=0)


def test_muon_refuses_fsdp():
    class Run:
        fsdp, cfg = True, {}
    with pytest.raises(ValueError, match="--algo muon with --fsdp is not supported"):
        muon.make_optimizer(Run(), torch.nn.Linear(2, 2))


# -- DFT ---------------------------------------------------------------------------------------------

def test_dft_gradient_is_minus_the_probability_gradient():
    """∇ of DFT's loss sum = −Σ_t m_t·∇π_θ(token) (autograd of the probabilities themselves), and its
    value is Σ m·p·(−log p): a worked check on random logits."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 7, generator=g, requires_grad=True)
    ids = torch.randint(0, 7, (2, 6), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]]).float()
    loss_sum, count = dft.dft_nll_of(logits, ids, mask)
    grad = torch.autograd.grad(loss_sum, logits)[0]
    p = token_logprobs(logits, ids[:, 1:]).exp()
    want = torch.autograd.grad(-(p * mask[:, 1:]).sum(), logits)[0]
    torch.testing.assert_close(grad, want)
    assert float(count) == 8
    assert float(loss_sum.detach()) == pytest.approx(float((p * -p.log() * mask[:, 1:]).sum().detach()), rel=1e-6)


# -- MaxRL -------------------------------------------------------------------------------------------

def test_maxrl_advantages_by_hand():
    """One success in four: mean 1/4, A = (1 − 1/4)/(1/4) = 3 and (0 − 1/4)/(1/4) = −1; equal rewards: 0."""
    adv = maxrl.mean_normalised_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1]), 4)
    assert adv.tolist() == pytest.approx([3.0, -1.0, -1.0, -1.0, 1 / 3, 1 / 3, -1.0, 1 / 3, 0, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("G", [2, 4, 8])
def test_maxrl_expected_gradient_is_the_truncated_likelihoods_exactly(G):
    """By enumeration over the estimator lab's 31 responses: MaxRL's expected gradient (token sum) equals
    ∇ of −Σ_{k=1}^{G−1}(1 − p)^k/k, i.e. ∇p·(1 − (1 − p)^{G−1})/p; not ∇log p (the limit as G grows)."""
    theta = torch.randn(len(E.PREFIX), 3, generator=torch.Generator().manual_seed(3))
    expected = E.maxrl_expected_gradient(theta, G)
    p = float(E.expected_reward(theta))
    truth = E.flat_grad(E.expected_reward, theta)
    torch.testing.assert_close(expected, truth * (1 - (1 - p) ** (G - 1)) / p, atol=1e-6, rtol=1e-5)
    rows = E.maxrl_rows(theta, G)
    assert rows["rel_diff_to_truncated_G_minus_1"] < 1e-5 and rows["rel_diff_to_log_likelihood"] > 1e-3


def test_maxrl_monte_carlo_matches_its_exact_expectation():
    """The lab's Monte Carlo estimate through the lab's own advantages and loss (token sum) agrees with the
    enumeration within its Monte Carlo error (scale 1, no bias beyond 3 standard errors)."""
    g = torch.Generator().manual_seed(4)
    theta = torch.randn(len(E.PREFIX), 3, generator=g)
    draws = torch.multinomial(E.seq_logprobs(theta).exp().detach(), 4000 * 4, replacement=True, generator=g).view(4000, 4)
    estimates = E.batch_gradients(theta, theta, draws, "maxrl_token_sum")
    r = E.summary(estimates, E.maxrl_expected_gradient(theta, 4))  # (relative to the exact expectation)
    assert abs(r["scale"] - 1) < 3 * r["mc_se"] and r["rel_bias"] < 3 * r["mc_se"], r


# -- SAPO and DPPO -----------------------------------------------------------------------------------

def _gradient(per_token_fn, logp, old_logp, adv, on):
    logp = logp.clone().requires_grad_(True)
    ratio = torch.exp(torch.where(on, logp - old_logp, 0.0))
    return torch.autograd.grad(per_token_fn(ratio, logp).sum(), logp)[0]


def test_sapo_gradient_weight_is_four_sigma_one_minus_sigma():
    """∂ℓ/∂log π = −4σ(1 − σ)·ρ·A with σ = σ(τ(ρ − 1)), τ by A's sign: 1 at ρ = 1 (GRPO's −A)."""
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.3, 0.9]]))
    old = torch.log(torch.tensor([[0.5, 0.1, 0.6, 0.3]]))
    on = torch.ones_like(logp, dtype=torch.bool)
    for a, tau in ((2.0, 1.0), (-1.5, 1.05)):
        adv = torch.full((1, 1), a)
        grad = _gradient(lambda ratio, lp: sapo.sapo_surrogate(ratio, adv, on, 1.0, 1.05)[0], logp, old, adv, on)
        rho = (logp - old).exp()
        sig = torch.sigmoid(tau * (rho - 1))
        torch.testing.assert_close(grad, -4 * sig * (1 - sig) * rho * a)
        assert float(grad[0, 0]) == pytest.approx(-a)  # ρ = 1
    gated = sapo.sapo_surrogate(torch.tensor([[1.0, 3.0]]), torch.ones(1, 1), torch.ones(1, 2, dtype=torch.bool), 1.0, 1.05)[1]
    assert gated.tolist() == [[False, True]]  # w(3) = 4σ(2)(1 − σ(2)) = 0.42 < 1/2


def test_dppo_masks_only_moves_past_delta_in_the_advantages_direction():
    """π_old = 0.5 on every token; π_θ = 0.7 (up 0.2), 0.55 (up 0.05), 0.3 (down 0.2), δ = 0.1. With A > 0 the
    first is dropped, with A < 0 the third; every kept token's gradient is −ρ·A (∂/∂log π)."""
    old = torch.log(torch.full((1, 3), 0.5))
    logp = torch.log(torch.tensor([[0.7, 0.55, 0.3]]))
    on = torch.ones_like(logp, dtype=torch.bool)
    rho = (logp - old).exp()
    for a, dropped in ((1.0, [True, False, False]), (-1.0, [False, False, True])):
        adv = torch.full((1, 1), a)
        fn = lambda ratio, lp: dppo.dppo_surrogate(ratio, adv, lp, old, on, 0.1)[0]
        assert dppo.dppo_surrogate(rho, adv, logp, old, on, 0.1)[1].tolist() == [dropped]
        grad = _gradient(fn, logp, old, adv, on)
        want = torch.where(torch.tensor([dropped]), 0.0, -rho * a)
        torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("algo", ["maxrl", "sapo", "dppo"])
def test_on_policy_the_new_objectives_step_like_their_estimator(algo):
    """At ρ = 1 (π_θ = π_old) SAPO's and DPPO's per-token gradients are GRPO's (−A per token): the estimator
    lab's on-policy rows for them equal grpo's exactly; MaxRL's direction differs only by its advantages."""
    theta = torch.randn(len(E.PREFIX), 3, generator=torch.Generator().manual_seed(5))
    draws = torch.multinomial(E.seq_logprobs(theta).exp().detach(), 50 * 4, replacement=True,
                              generator=torch.Generator().manual_seed(6)).view(50, 4)
    grpo_rows = E.batch_gradients(theta, theta, draws, "grpo")
    rows = E.batch_gradients(theta, theta, draws, algo)
    if algo == "maxrl":
        assert not torch.allclose(rows, grpo_rows)
    else:
        torch.testing.assert_close(rows, grpo_rows)


# -- RL's Razor (experiments/razor.py) at toy size ----------------------------------------------------

def test_razor_puts_the_start_at_the_origin_and_measures_a_stage(tmp_path):
    """The SFT start measured as a stage of its own: KL 0 (up to the sampler's rounding against a training
    forward), no rise of the corpus loss and no accuracy drop, exactly (the same model); a GRPO stage from it
    gets a finite KL of its own; a missing stage is skipped."""
    import razor
    root = tmp_path / "ladder"
    T.train(dict(TINY, **SFT_DATA, algo="sft", max_iters=2, checkpoint=True, out_dir=str(root / "sft")))
    T.train(dict(TINY, algo="grpo", init_from=str(root / "sft"), max_iters=1, prompts_per_iter=2, group_size=2,
                 max_new_tokens=8, learning_rate=1e-2, min_lr=1e-2, warmup_iters=0, checkpoint=True,
                 out_dir=str(root / "grpo")))
    results = razor.main([f"--root={root}", "--stages=sft,grpo,ppo", "--problems=4", "--samples=2", "--docs=4"])
    start = results["stages"]["sft"]
    assert start["kl"][0] == pytest.approx(0, abs=1e-5) and start["corpus_loss_rise"] == (0.0, 0.0)
    assert start["other_acc_drop"][0] == 0
    assert set(results["stages"]) == {"sft", "grpo"} and math.isfinite(results["stages"]["grpo"]["kl"][0])
    assert (root / "razor" / "razor.png").exists()


def test_the_level_rule_of_the_sft_variants_study():
    """experiments/sft_variants.py's pre-registered rule on a worked curve: the first evaluation at or
    below the level, with the training seconds to it; never reached: a miss (None), said in the table."""
    import sft_variants as V
    points = [(25, 10.0, 1.0, 0.1, 0.0, 0.5), (50, 21.0, 0.8, 0.2, 0.0, 0.5), (75, 33.0, 0.7, 0.3, 0.1, 0.6)]
    assert V.to_level(points, 0.8) == (50, 21.0) and V.to_level(points, 0.75) == (75, 33.0)
    assert V.to_level(points, 0.5) is None
    results = dict(settings=dict(eval_problems=10, arms=["sft", "muon"], iters=75, eval_every=25, init_from="scratch"),
                   seeds={1: dict(level=0.7, sft=dict(curve=points, to_level=(75, 33.0)),
                                  muon=dict(curve=points[:2], to_level=None))})
    text = V.table(results)
    assert "miss (not reached)" in text and "Muon missed the level in 1 of 1 seeds" in text
    # the arms' held-out accuracy paired with the baseline's: differences +0.1, +0.2, +0.3 with per-problem bands
    # 0.05: t(0.975, 2)·0.1/√3 = 0.2484 and the bands' root mean square 0.05, added in variance: 0.2534
    results["settings"]["arms"] = ["sft", "dft"]
    results["seeds"] = {seed: dict(level=0.7, sft=dict(curve=points, to_level=(75, 33.0)),
                                   dft=dict(curve=points, to_level=(75, 33.0), heldout_paired=(d, 0.05)))
                        for seed, d in ((1, 0.1), (2, 0.2), (3, 0.3))}
    assert "DFT − SFT (AdamW), greedy held-out accuracy at iteration 75, paired per problem and across seeds: " \
           "+0.200 ± 0.253 (per seed +0.100, +0.200, +0.300)" in V.table(results)


def test_two_ladders_paired_stage_by_stage(tmp_path):
    """experiments/ladders_paired.py on two hand-written --seeds=3 ladders: per seed a − b of each stage's
    ladder_eval.json, the t band over the seeds (t(0.975, 2)·0.1/√3 = 0.2484 for differences 0.1, 0.2, 0.3),
    a verdict only where the band excludes 0, and a stage either ladder lacks left out."""
    import ladder
    import ladders_paired as P

    def write(root, name, k, figures):
        path = ladder.stage_path(str(root), name, k)
        os.makedirs(path, exist_ok=True)
        json.dump(figures, open(os.path.join(path, "ladder_eval.json"), "w"))

    for k, (ga, gb) in enumerate(((0.5, 0.4), (0.6, 0.4), (0.7, 0.4)), start=1):
        write(tmp_path / "a", "sft", k, dict(kind="policy", greedy_acc=ga, sampled_acc=0.3, pass_at_k=0.8))
        write(tmp_path / "b", "sft", k, dict(kind="policy", greedy_acc=gb, sampled_acc=0.2, pass_at_k=0.8))
        write(tmp_path / "a", "rm", k, dict(kind="reward_model", pair_acc=0.8))
        write(tmp_path / "b", "rm", k, dict(kind="reward_model", pair_acc=0.7))
    write(tmp_path / "a", "dpo", 1, dict(kind="policy", greedy_acc=0.5, sampled_acc=0.3, pass_at_k=0.8))
    results = P.compare(str(tmp_path / "a"), str(tmp_path / "b"), 3)
    assert list(results) == ["sft", "rm"]
    differences, mean, half = results["sft"]["greedy"]
    assert differences == pytest.approx([0.1, 0.2, 0.3]) and mean == pytest.approx(0.2) and half == pytest.approx(0.2484, abs=1e-4)
    assert P.verdict(mean, half) == "the same" and results["sft"]["sampled"][1:] == pytest.approx((0.1, 0.0))
    assert P.verdict(*results["rm"]["pair accuracy"][1:]) == "higher" and P.verdict(-0.1, 0.05) == "lower"
    text = P.table(results, ["A", "B"])
    assert "| sft | +0.200 ± 0.248 | +0.100, +0.200, +0.300 | the same | +0.100 ± 0.000 | +0.000 ± 0.000 |" in text
