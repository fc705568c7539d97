"""The failures of docs/failures.md at toy size: each break-it switch fires the monitor that names it,
with the figure it reads past its threshold, while a control run of the same length fires none of
them and keeps that figure inside; the monitors' printed line, metrics.jsonl flag and passport note;
the entropy controls (Clip-Cov, the top-entropy mask) and the truncated-answer mask on numbers."""

import json
import os
import subprocess
import sys
import zlib
from types import SimpleNamespace

import pytest
import torch

import envs
import grpo_breaks
import grpo_family as family
from nanopost import monitors
from nanopost import options
import train as T
from conftest import TINY
from experiments.failures import FAILURES

# 32 responses of up to 32 tokens from a random 2-layer model: its lengths vary (an end token now and then)
BREAK = dict(TINY, algo="grpo", prompts_per_iter=4, group_size=8, max_new_tokens=32, max_iters=2, checkpoint=False,
             warmup_iters=0)
# what a random model and a coin for a verifier fire in every run, broken or not: it parses nothing, and the coin
# disagrees with the task's solver
TOY_ALARMS = {"parse_errors", "verifier_errors"}


def coin_reward(problem, text):
    """A deterministic reward that varies between responses (crc32: the same in every process)."""
    return float(zlib.crc32(text.encode()) % 2)


def logged(tmp_path, name, monkeypatch, coin=True, **overrides):
    """(alarms that fired, the rows of metrics.jsonl) of a BREAK run with the overrides."""
    if coin:
        for env in (envs.Arithmetic, envs.Calculator):
            monkeypatch.setattr(env, "verify", staticmethod(coin_reward))
    cfg = dict(BREAK, out_dir=str(tmp_path / name), **overrides)
    if overrides.get("break_it") == "nan_logprob":  # the loop's guard stops it at the non-finite loss, its row logged first
        with pytest.raises(ValueError, match="iteration 1: the loss is (nan|inf)"):
            T.train(cfg)
    else:
        T.train(cfg)
    rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    return monitors.alarms(rows, options.make_config(cfg)), rows


def peak(rows, figure):
    """The largest value a run logged of a figure (0 where it never logged it: the rare figures)."""
    return max([r[figure] for r in rows if figure in r] or [0.0])


# (switch, its control's overrides, the monitor, the figure it reads, a bound the broken run passes and the control
# stays under). Controls: the same run unbroken (the coin verifier but for format_exploit, top_p and the calculator
# task where the switch needs them).
SWITCHES = [
    (dict(break_it="fp8_sampler"), {}, "ratio_drift", "ratio_dev", 1e-3),
    (dict(break_it="fp8_sampler", old_logprobs="recompute", tis_cap=1.05), dict(old_logprobs="recompute", tis_cap=1.05),
     "sampler_mismatch", "sampler_logprob_gap", 1e-3),
    (dict(break_it="sampler_temperature"), {}, "ratio_drift", "ratio_dev", 0.05),
    (dict(break_it="top_p_uncorrected", top_p=0.9), dict(top_p=0.9), "ratio_drift", "ratio_dev", 0.05),
    (dict(break_it="retokenize", env="calculator"), dict(env="calculator"), "retokenized", "retokenized_frac", 0.5),
    (dict(break_it="kl_twice"), {}, "kl_twice", "kl_k3", None),  # (the KL in the reward: kl_reward beside it)
    (dict(break_it="nan_logprob"), {}, "nonfinite", "nonfinite_logprob_frac", 0.005),
    (dict(break_it="shifted_advantages"), {}, "misaligned_advantages", "adv_sign_error_frac", 0.2),
    (dict(break_it="all_equal"), {}, "degenerate_groups", "degenerate_frac", 0.75),
    (dict(break_it="length_bonus"), {}, "length_bias", "reward_len_corr", 0.5),
    (dict(break_it="format_exploit"), {}, "verifier_errors", "verifier_error_rate", 0.0),
    (dict(staleness=1), {}, "stale_rollouts", "staleness", 0.0),
    (dict(learning_rate=0.5, max_iters=4, minibatches=4, grad_clip=0.0, max_new_tokens=16),
     dict(max_iters=4, minibatches=4, grad_clip=0.0, max_new_tokens=16), "entropy_collapse", "entropy", None),
]


@pytest.mark.parametrize("broken,control,alarm,figure,bound", SWITCHES,
                         ids=[f"{a}-{'-'.join(map(str, b.values()))}" for b, _, a, _, _ in SWITCHES])
def test_each_switch_fires_its_monitor_and_its_control_none(tmp_path, monkeypatch, broken, control, alarm, figure,
                                                            bound):
    coin = broken.get("break_it") != "format_exploit"  # (that one is held against the true verifier)
    fired, rows = logged(tmp_path, "broken", monkeypatch, coin, **broken)
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


def test_the_figures_of_the_sampler_switches(tmp_path, monkeypatch):
    """The size of each ratio's bias: T = 0.7 in the sampler alone, top-p = 0.9 scored on the whole softmax
    (every kept token's ρ is the kept mass, ~0.9 for a random model's flat distribution), and the same top-p
    scored on the cut distribution (ρ = 1 to float rounding)."""
    _, hot = logged(tmp_path, "hot", monkeypatch, break_it="sampler_temperature")
    _, uncorrected = logged(tmp_path, "uncorrected", monkeypatch, break_it="top_p_uncorrected", top_p=0.9)
    _, corrected = logged(tmp_path, "corrected", monkeypatch, top_p=0.9)
    assert 0.1 < peak(hot, "ratio_dev") < 0.3
    assert 0.09 < peak(uncorrected, "ratio_dev") < 0.11
    assert peak(corrected, "ratio_dev") < 1e-5


def test_prompt_format_prefills_the_answers_marker(tmp_path):
    """break_it=prompt_format: the training rollouts' prompts are the chat template's with "Answer:" already
    written, the evaluation's the template alone; its monitor reads the parse-error rate."""
    run = T.train(dict(BREAK, break_it="prompt_format", max_iters=0, out_dir=str(tmp_path / "run")))
    problems = run.env.problems("train", 2, seed=0)
    ro = run.state.sample(run, run.raw_model, problems, 2, max_new_tokens=4, seed=0)
    template = run.tok.prompt_ids(problems[0]["prompt"])
    assert ro.ids[0, :int(ro.prompt_lens[0])].tolist() == template + run.tok.encode("Answer:")
    row = lambda it, rate: dict(iter=it, loss=0.0, parse_error_rate=rate)
    assert monitors.alarms([row(1, 0.05), row(2, 0.9)], {}) == {"parse_errors": 2}


def test_a_monitor_prints_flags_and_notes_in_the_passport(tmp_path, monkeypatch, capsys):
    """The loop's monitors: a line printed the first time, an `alarms` flag on every row where it holds,
    the list of monitors with their thresholds in the passport and the firing noted there."""
    fired, rows = logged(tmp_path, "run", monkeypatch, break_it="shifted_advantages")
    assert "monitor misaligned_advantages fired at iter 1: adv_sign_error_frac" in capsys.readouterr().out
    assert all("misaligned_advantages" in r["alarms"] for r in rows if "loss" in r)
    passport = open(tmp_path / "run" / "passport.md").read()
    assert "which the monitor `misaligned_advantages` must catch" in passport
    assert "- `misaligned_advantages`: adv_sign_error_frac > 0.01" in passport
    assert "- fired: `misaligned_advantages` at iteration 1 (adv_sign_error_frac 0." in passport
    assert set(monitors.ALARMS) >= set(grpo_breaks.BREAKS.values()) and fired["misaligned_advantages"] == 1


def test_every_break_it_switch_names_a_monitor():
    assert grpo_breaks.CHOICES["break_it"] == ("none", *grpo_breaks.BREAKS)
    assert all(monitor in monitors.ALARMS for monitor in grpo_breaks.BREAKS.values())


def test_reward_hacking_fires_when_reward_rises_and_held_out_accuracy_falls():
    row = lambda it, reward: dict(iter=it, reward=reward, entropy=1.0, ratio_dev=0.0, degenerate_frac=0.0, len_mean=10.0)
    rows = [dict(iter=0, heldout_acc=0.50), row(1, 0.40), row(2, 0.60), dict(iter=2, heldout_acc=0.49), row(3, 0.70),
            dict(iter=3, heldout_acc=0.45)]
    cfg = dict(minibatches=1, inner_epochs=1)
    assert monitors.alarms(rows, cfg) == {"reward_hacking": 3}  # at 2 the accuracy fell by 0.01 only
    rows[-1]["heldout_acc"] = 0.52
    assert monitors.alarms(rows, cfg) == {}


# ----------------------------------------------------------------------------------------------
# The entropy controls and the truncated-answer mask

def batch_of(logp, adv, mask):
    return SimpleNamespace(advantages=torch.tensor(adv), mask=torch.tensor(mask), old_logprobs=None)


def test_clip_cov_cuts_the_tokens_of_largest_covariance():
    """cov_t = (log π − mean)(A − mean) over the response tokens: with clip_cov = 0.25 of 4 tokens the one of
    largest cov (a confident token, log π = −0.1, in the row of positive advantage) loses its gradient."""
    logp = torch.tensor([[-0.1, -2.0, 0.0], [-0.2, -0.5, 0.0]])
    batch = batch_of(logp, [1.0, -1.0], [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    weights, figures = family.clip_cov(dict(clip_cov=0.25), batch, logp, None)
    # means: log π −0.7, A 0; cov = (0.6, −1.3)·1 and (0.5, 0.2)·(−1) = 0.6, −1.3, −0.5, −0.2
    assert weights.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]] and float(figures["clip_cov_frac"]) == 0.25


def test_top_entropy_mask_keeps_the_forks():
    entropy = torch.tensor([[0.1, 2.0, 0.3, 9.0], [1.5, 0.0, 0.2, 9.0]])
    batch = batch_of(None, [1.0, 1.0], [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    weights, figures = family.top_entropy_mask(dict(top_entropy_quantile=1 / 3), batch, None, entropy)
    assert weights.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # the top third of six: 2.0 and 1.5
    assert abs(float(figures["entropy_kept_frac"]) - 1 / 3) < 1e-6


def test_mask_truncated_leaves_a_cut_answer_out_of_the_loss(tmp_path):
    run = T.train(dict(BREAK, mask_truncated=True, max_iters=0, out_dir=str(tmp_path / "run")))
    ro = run.state.sample(run, run.raw_model, run.env.problems("train", 16, seed=0), 4, max_new_tokens=32, seed=0)
    assert ro.truncated.any() and not ro.truncated.all()
    assert ro.mask.sum(1).eq(0).tolist() == ro.truncated.tolist()  # the cut rows, and only they, have no term


def test_the_entropy_controls_run_and_log(tmp_path, monkeypatch):
    """Clip-Cov cuts at most its share of each micro-batch's tokens (those of positive cov only), the entropy
    mask keeps about its quantile; neither fires a monitor."""
    fired, rows = logged(tmp_path, "run", monkeypatch, clip_cov=0.2, top_entropy_quantile=0.5)
    trained = [r for r in rows if "loss" in r]
    assert all(0.05 < r["clip_cov_frac"] <= 0.2 and 0.45 < r["entropy_kept_frac"] <= 0.55 for r in trained), trained
    assert not set(fired) - TOY_ALARMS


@pytest.mark.slow
def test_the_gallery_and_the_study_run_at_toy_size(tmp_path):
    """experiments/failures.py --quick: every failure, its control and the entropy study's arms, end to end
    from a random model, with their tables and figures."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "failures.py")
    for study in ("gallery", "entropy"):
        subprocess.run([sys.executable, script, "--quick", f"--study={study}", f"--out={tmp_path}"], check=True,
                       capture_output=True)
    table = open(tmp_path / "failures.md").read()
    assert all(f"| {name} |" in table for name, *_ in FAILURES)
    assert os.path.isfile(tmp_path / "failures.png") and os.path.isfile(tmp_path / "entropy" / "entropy.png")
