"""The failures of docs/failures.md at toy size: each failure (experiments/failures.py: the one function of
grpo.py it breaks, replaced) fires the monitor that names it, with the figure it reads past its threshold,
while a control run of the same length fires none of them and keeps that figure inside; the monitors'
printed line, metrics.jsonl flag and passport note; the entropy controls (Clip-Cov, the top-entropy mask)
and the truncated-answer mask on numbers."""

import json
import os
import subprocess
import sys
import zlib

import pytest
import torch

import envs
import grpo
from nanopost import monitors
from nanopost import options
import train as T
from conftest import TINY
from experiments.failures import FAILURES, prompt_format
from lab.clip_cov import clip_cov_weights
from lab.entropy_mask import top_entropy_mask

# 32 responses of up to 32 tokens from a random 2-layer model: its lengths vary (an end token now and then)
BREAK = dict(TINY, algo="grpo", prompts_per_iter=4, group_size=8, max_new_tokens=32, max_iters=2, checkpoint=False,
             warmup_iters=0)
# what a random model and a coin for a verifier fire in every run, broken or not: it parses nothing, and the coin
# disagrees with the task's solver
TOY_ALARMS = {"parse_errors", "verifier_errors"}


def coin_reward(problem, text):
    """A deterministic reward that varies between responses (crc32: the same in every process)."""
    return float(zlib.crc32(text.encode()) % 2)


def logged(tmp_path, name, monkeypatch, coin=True, breaks=(), **overrides):
    """(alarms that fired, the rows of metrics.jsonl) of a BREAK run with the functions `breaks` replaced."""
    if coin:
        for env in (envs.Arithmetic, envs.Calculator):
            monkeypatch.setattr(env, "verify", staticmethod(coin_reward))
    with monkeypatch.context() as patched:
        for module, function, replacement in breaks:
            patched.setattr(module, function, replacement)
        cfg = dict(BREAK, out_dir=str(tmp_path / name), **overrides)
        if any(function == "score" for _, function, _ in breaks):  # nan_logprob: the loop's guard stops it at the
            with pytest.raises(ValueError, match="iteration 1: the loss is (nan|inf)"):  # non-finite loss, its row logged first
                T.train(cfg)
        else:
            T.train(cfg)
    rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    return monitors.alarms(rows, options.make_config(cfg)), rows


def peak(rows, figure):
    """The largest value a run logged of a figure (0 where it never logged it: the rare figures)."""
    return max([r[figure] for r in rows if figure in r] or [0.0])


# (failure, the broken run's extra keys, its control's keys, a bound the broken run passes and the control stays
# under). Controls: the same run unbroken (the coin verifier but for format_exploit and the calculator task).
SWITCHES = [
    ("fp8_sampler", {}, {}, 1e-3),
    ("sampler_temperature", {}, {}, 0.05),
    ("top_p_uncorrected", {}, {}, 0.05),
    ("retokenize", dict(env="calculator"), dict(env="calculator"), 0.5),
    ("kl_twice", {}, {}, None),  # (the KL in the reward: kl_reward beside kl_k3)
    ("nan_logprob", {}, {}, 0.005),
    ("shifted_advantages", {}, {}, 0.2),
    ("all_equal", {}, {}, 0.75),
    ("length_bonus", {}, {}, 0.5),
    ("format_exploit", {}, {}, 0.0),
    ("stale_rollouts", {}, {}, 0.0),
    ("learning rate 1.0", dict(learning_rate=0.5, min_lr=0.5, max_iters=4, minibatches=4, grad_clip=0.0, max_new_tokens=16),
     dict(max_iters=4, minibatches=4, grad_clip=0.0, max_new_tokens=16), None),
]


@pytest.mark.parametrize("name,broken,control,bound", SWITCHES, ids=[s[0].replace(" ", "_") for s in SWITCHES])
def test_each_failure_fires_its_monitor_and_its_control_none(tmp_path, monkeypatch, name, broken, control, bound):
    breaks, switch, _, figure, alarm = FAILURES[name]
    switch = {k: v for k, v in switch.items() if k not in ("learning_rate", "min_lr")}  # (the toy's own rate: broken)
    coin = name != "format_exploit"  # (that one is held against the true verifier)
    fired, rows = logged(tmp_path, "broken", monkeypatch, coin, breaks, **switch, **broken)
    quiet, control_rows = logged(tmp_path, "control", monkeypatch, coin, **control)
    assert fired[alarm] <= (4 if alarm == "entropy_collapse" else 2)  # (stale: from the second rollouts on)
    toy = TOY_ALARMS | ({"degenerate_groups"} if not coin else set())  # (the true verifier: a random model fails all)
    assert not set(quiet) - toy, quiet  # the control: nothing beyond the toy's own
    if alarm == "entropy_collapse":  # below a quarter of its first value, the control's within 10% of its own
        entropy = [r["entropy"] for r in rows if "entropy" in r]
        held = [r["entropy"] for r in control_rows if "entropy" in r]
        assert min(entropy) < entropy[0] / 4 and min(held) > 0.9 * held[0]
    elif alarm == "kl_twice":  # the KL in the reward and in the loss in one row; the control: the loss's alone
        assert all("kl_reward" in r and "kl_k3" in r for r in rows if "loss" in r)
        assert not any("kl_reward" in r for r in control_rows) and all("kl_k3" in r for r in control_rows if "loss" in r)
    else:
        assert peak(rows, figure) > bound >= peak(control_rows, figure), (peak(rows, figure), peak(control_rows, figure))


def test_the_figures_of_the_sampler_failures(tmp_path, monkeypatch):
    """The size of each ratio's bias: T = 0.7 in the sampler alone, top-p = 0.9 scored on the whole softmax
    (every kept token's ρ is the kept mass, ~0.9 for a random model's flat distribution), and the same top-p
    scored on the cut (--algo truncated_sampling: ρ = 1 to float rounding)."""
    _, hot = logged(tmp_path, "hot", monkeypatch, breaks=FAILURES["sampler_temperature"][0])
    _, uncorrected = logged(tmp_path, "uncorrected", monkeypatch, breaks=FAILURES["top_p_uncorrected"][0])
    _, corrected = logged(tmp_path, "corrected", monkeypatch, algo="truncated_sampling", top_p=0.9)
    assert 0.1 < peak(hot, "ratio_dev") < 0.3
    assert 0.09 < peak(uncorrected, "ratio_dev") < 0.11
    assert peak(corrected, "ratio_dev") < 1e-5


def test_prompt_format_prefills_the_answers_marker(tmp_path):
    """prompt_format: the training rollouts' prompts are the chat template's with "Answer:" already written;
    its monitor reads the parse-error rate."""
    run = T.train(dict(BREAK, max_iters=0, out_dir=str(tmp_path / "run")))
    problems = run.env.problems("train", 2, seed=0)
    ro = prompt_format(run, run.raw_model, problems, seed=0)
    template = run.tok.prompt_ids(problems[0]["prompt"])
    assert ro.ids[0, :int(ro.prompt_lens[0])].tolist() == template + run.tok.encode("Answer:")
    row = lambda it, rate: dict(iter=it, loss=0.0, parse_error_rate=rate)
    assert monitors.alarms([row(1, 0.05), row(2, 0.9)], {}) == {"parse_errors": 2}


def test_a_monitor_prints_flags_and_notes_in_the_passport(tmp_path, monkeypatch, capsys):
    """The loop's monitors: a line printed the first time, an `alarms` flag on every row where it holds,
    the list of monitors with their thresholds in the passport and the firing noted there."""
    fired, rows = logged(tmp_path, "run", monkeypatch, breaks=FAILURES["shifted_advantages"][0])
    assert "monitor misaligned_advantages fired at iter 1: adv_sign_error_frac" in capsys.readouterr().out
    assert all("misaligned_advantages" in r["alarms"] for r in rows if "loss" in r)
    passport = open(tmp_path / "run" / "passport.md").read()
    assert "- `misaligned_advantages`: adv_sign_error_frac > 0.01" in passport
    assert "- fired: `misaligned_advantages` at iteration 1 (adv_sign_error_frac 0." in passport
    assert fired["misaligned_advantages"] == 1


def test_every_failure_names_a_monitor_and_replaces_a_function_of_grpo():
    assert all(monitor in monitors.ALARMS for *_, monitor in FAILURES.values())
    assert all(getattr(module, function) is not None for breaks, *_ in FAILURES.values() for module, function, _ in breaks)
    assert all(module is not grpo or callable(getattr(grpo, function)) for breaks, *_ in FAILURES.values()
               for module, function, _ in breaks)


def test_reward_hacking_fires_when_reward_rises_and_held_out_accuracy_falls():
    row = lambda it, reward: dict(iter=it, reward=reward, entropy=1.0, ratio_dev=0.0, degenerate_frac=0.0, len_mean=10.0)
    rows = [dict(iter=0, heldout_acc=0.50), row(1, 0.40), row(2, 0.60), dict(iter=2, heldout_acc=0.49), row(3, 0.70),
            dict(iter=3, heldout_acc=0.45)]
    cfg = dict(minibatches=1, inner_epochs=1)
    assert monitors.alarms(rows, cfg) == {"reward_hacking": 3}  # at 2 the accuracy fell by 0.01 only
    rows[-1]["heldout_acc"] = 0.52
    assert monitors.alarms(rows, cfg) == {}


def test_reward_hacking_is_measured_against_the_best_evaluation_so_far():
    """GRPO on the judge (docs/reward_sources.md): held-out 0.304 → 0.484 → 0.329 on 500 problems while the
    judge's reward rose. Against the first evaluation the fall never shows (0.329 > 0.304 − 0.02); against
    the best so far it does: 0.329 < 0.484 − 0.0438 (the binomial band of 0.484 on 500 problems), at the
    third evaluation. A fall inside the best evaluation's band is noise: 0.55 → 0.52 on 200 problems
    (band 0.069) fires nothing. PPO logs no `reward`: its verifier_acc, or rm_score on a reward model, is
    the reward it trains on, and the monitor reads it."""
    cfg = dict(minibatches=1, inner_epochs=1, eval_problems=500)
    judge = [dict(iter=0, reward=0.30, heldout_acc=0.304), dict(iter=10, reward=0.55, heldout_acc=0.484),
             dict(iter=20, reward=0.80, heldout_acc=0.329)]
    assert monitors.alarms(judge, cfg) == {"reward_hacking": 20}
    assert 0.329 > 0.304 - 0.02 and monitors.binomial(0.484, 500) == pytest.approx(0.0438, abs=1e-4)
    ppo = [{k.replace("reward", "verifier_acc"): v for k, v in row.items()} for row in judge]
    assert monitors.alarms(ppo, cfg) == {"reward_hacking": 20}
    rm = [dict(row, rm_score=row["verifier_acc"] * 4, verifier_acc=0.3) for row in ppo]
    assert monitors.alarms(rm, cfg) == {"reward_hacking": 20}  # the RM's score rose, the verifier's did not
    noise = [dict(iter=0, reward=0.30, heldout_acc=0.50), dict(iter=10, reward=0.55, heldout_acc=0.55),
             dict(iter=20, reward=0.80, heldout_acc=0.52)]
    assert monitors.alarms(noise, dict(cfg, eval_problems=200)) == {}
    assert monitors.alarms(noise[:2] + [dict(noise[2], heldout_acc=0.47)], dict(cfg, eval_problems=200)) == {"reward_hacking": 20}
    flat = [dict(row, reward=0.30) for row in judge]  # the fall alone, with no reward rising: not this alarm
    assert monitors.alarms(flat, cfg) == {}


# ----------------------------------------------------------------------------------------------
# The entropy controls and the truncated-answer mask

def test_clip_cov_cuts_the_tokens_of_largest_covariance():
    """cov_t = (log π − mean)(A − mean) over the response tokens: with clip_cov = 0.25 of 4 tokens the one of
    largest cov (a confident token, log π = −0.1, in the row of positive advantage) loses its gradient."""
    logp = torch.tensor([[-0.1, -2.0, 0.0], [-0.2, -0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    weights, cut = clip_cov_weights(logp, torch.tensor([[1.0], [-1.0]]), mask, 0.25)
    # means: log π −0.7, A 0; cov = (0.6, −1.3)·1 and (0.5, 0.2)·(−1) = 0.6, −1.3, −0.5, −0.2
    assert weights.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]] and float(cut) == 0.25


def test_clip_cov_at_the_papers_ratio_cuts_one_token_per_five_thousand():
    """The default is Cui et al.'s 2e-4 of the response tokens, at least one: of the 4 tokens above the one of
    largest cov (not 2e-4 · 4 = 0 tokens); of 12,000 tokens int(2.4) = 2, the two of largest cov_t; at 0 none."""
    from lab import clip_cov
    assert clip_cov.defaults["clip_cov"] == 2e-4
    logp = torch.tensor([[-0.1, -2.0, 0.0], [-0.2, -0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    weights, cut = clip_cov_weights(logp, torch.tensor([[1.0], [-1.0]]), mask, 2e-4)
    assert weights.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]] and float(cut) == 0.25
    assert clip_cov_weights(logp, torch.tensor([[1.0], [-1.0]]), mask, 0.0)[0].eq(1.0).all()
    g = torch.Generator().manual_seed(0)
    logp, adv = -torch.rand(120, 100, generator=g) * 3, torch.randn(120, 1, generator=g)
    weights, cut = clip_cov_weights(logp, adv, torch.ones(120, 100), 2e-4)
    cov = (logp - logp.mean()) * (adv - adv.mean())
    assert weights.eq(0).sum() == 2 and set(weights.flatten().eq(0).nonzero().flatten().tolist()) == set(cov.flatten().topk(2).indices.tolist())
    assert float(cut) == pytest.approx(2 / 12000)


def test_top_entropy_mask_keeps_the_forks():
    entropy = torch.tensor([[0.1, 2.0, 0.3, 9.0], [1.5, 0.0, 0.2, 9.0]])
    weights, kept = top_entropy_mask(entropy, torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]), 1 / 3)
    assert weights.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # the top third of six: 2.0 and 1.5
    assert abs(float(kept) - 1 / 3) < 1e-6


def test_mask_truncated_leaves_a_cut_answer_out_of_the_loss(tmp_path):
    """DAPO's overlong filtering: the cut rows, and only they, have no loss term."""
    from lab import dapo
    run = T.train(dict(BREAK, algo="dapo", mask_truncated=True, overlong_cache=0, max_iters=0, out_dir=str(tmp_path / "run")))
    ro = dapo.sample_groups(run, run.state, run.raw_model, 0, 0, 0)
    assert ro.truncated.any() and not ro.truncated.all()
    assert ro.mask.sum(1).eq(0).tolist() == ro.truncated.tolist()


def test_the_entropy_controls_run_and_log(tmp_path, monkeypatch):
    """Clip-Cov cuts at most its share of each micro-batch's tokens (those of positive cov only), the entropy
    mask keeps about its quantile; neither fires a monitor."""
    fired, rows = logged(tmp_path, "cov", monkeypatch, algo="clip_cov", clip_cov=0.2)  # (the entropy study's 0.2, not the default 2e-4)
    quiet, masked = logged(tmp_path, "mask", monkeypatch, algo="entropy_mask", top_entropy_quantile=0.5)
    assert all(0.05 < r["clip_cov_frac"] <= 0.2 for r in rows if "loss" in r), rows
    assert all(0.45 < r["entropy_kept_frac"] <= 0.55 for r in masked if "loss" in r), masked
    assert not (set(fired) | set(quiet)) - TOY_ALARMS


@pytest.mark.slow
def test_the_gallery_and_the_study_run_at_toy_size(tmp_path):
    """experiments/failures.py --quick: every failure, its control and the entropy study's arms, end to end
    from a random model, with their tables and figures."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "failures.py")
    for study in ("gallery", "entropy"):
        subprocess.run([sys.executable, script, "--quick", f"--study={study}", f"--out={tmp_path}"], check=True,
                       capture_output=True)
    table = open(tmp_path / "failures.md").read()
    assert all(f"| {name} |" in table for name in FAILURES)
    assert os.path.isfile(tmp_path / "failures.png") and os.path.isfile(tmp_path / "entropy" / "entropy.png")
