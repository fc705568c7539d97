"""Online DPO (lab/online_dpo.py, --algo online_dpo; the old spelling --algo dpo --pairs=online): the pairs
a round makes from labelled answers, by hand (which, how many, the no-pair share), the labeler's agreement with the verifier by hand; a round's pairs
are the current policy's (the same seed: the same pairs; changed weights: other pairs); each labeler (the
verifier, a reward model, a judge) ranks as it says; resume equals an uninterrupted run; two processes make
the pairs one does; the config errors; and experiments/online_dpo.py at toy size."""

import json
import os
import subprocess
import sys
import zlib

import pytest
import torch

import dpo
import envs
from nanopost import bands, options, pairs
import train as T
from nanopost.checkpoints import frozen, load_model
from conftest import TINY, run_ddp
from nanopost.judge import judge_scores, rollout_seed
from lab import online_dpo
from nanopost.rollouts import response_text, score_responses
from test_judge import write_scalar_checkpoint
from test_opd import write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONLINE = dict(TINY, algo="online_dpo", online_prompts=8, online_every=2, group_size=3, heldout_prompts=4,
              max_new_tokens=10, batch_size=2)


def coin(problem, response):
    """The verifier's stand-in (as tests/test_golden.py): 0 or 1 by the answer's text, so that a random
    tiny policy's groups hold right and wrong answers."""
    return float(zlib.crc32(response.encode()) % 2)


@pytest.fixture
def start(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin))
    return write_checkpoint(tmp_path_factory.mktemp("online") / "start", seed=0)


def online_run(start, tmp_path, **overrides):
    return T.train(dict(ONLINE, init_from=start, out_dir=str(tmp_path / "run"), **overrides))


def captured_rollouts(monkeypatch):
    """A list that gets (the model, the Rollout) of every rollouts() call lab/online_dpo.py makes."""
    calls = []

    def recorded(run, model, *args, **kwargs):
        roll = rollouts(run, model, *args, **kwargs)
        calls.append((model, roll))
        return roll
    rollouts = online_dpo.rollouts
    monkeypatch.setattr(online_dpo, "rollouts", recorded)
    return calls


# ----------------------------------------------------------------------------------------------
# Pairs from labelled answers, by hand

def test_pairs_from_verifier_labels_by_hand():
    """Four prompts × 4 answers labelled 0/1: prompt 0 (1 0 1 0) pairs its first right answer (0) with its
    first wrong one (1); prompt 1 (all right) and prompt 2 (all wrong) make none; prompt 3 (0 0 1 0) pairs
    answer 14 with answer 12. Two pairs, the no-pair share 2/4."""
    scores = [1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0]
    made = online_dpo.best_and_worst(scores, 4)
    assert made == [(0, 0, 1), (3, 14, 12)]
    assert 1 - len(made) / 4 == 0.5


def test_pairs_from_scores_take_the_highest_and_the_lowest():
    """Scores (a reward model's, a judge's P): prompt 0 (0.9 0.2 0.7) pairs 0 over 1; prompt 1 (0.5 0.5 0.5)
    none; prompt 2 (0.3 0.8 0.8) pairs the first of its two highest, 7, over 6."""
    assert online_dpo.best_and_worst([0.9, 0.2, 0.7, 0.5, 0.5, 0.5, 0.3, 0.8, 0.8], 3) == [(0, 0, 1), (2, 7, 6)]
    assert online_dpo.best_and_worst([-1.0, 2.5], 2) == [(0, 1, 0)]  # a Bradley–Terry score may be negative
    assert online_dpo.best_and_worst([0.4] * 6, 2) == []


def test_the_labelers_agreement_with_the_verifier_by_hand():
    """Three pairs a reward model made; the verifier marks chosen/rejected 1/0 (agrees), 0/1 (reverses),
    1/1 (alike): 1/3 agrees, 1/3 reverses."""
    verified = [1, 0, 0, 1, 1, 1]
    made = [(0, 0, 1), (1, 2, 3), (2, 4, 5)]
    assert online_dpo.verifier_agreement(verified, made) == dict(online_label_agrees=1 / 3,
                                                                 online_label_reverses=1 / 3)
    assert online_dpo.verifier_agreement(verified, []) == dict(online_label_agrees=0.0, online_label_reverses=0.0)


# ----------------------------------------------------------------------------------------------
# A round: the current policy's answers, labelled, paired

def test_a_rounds_pairs_are_the_current_policys(start, tmp_path, monkeypatch):
    """Round 0 samples from run.raw_model (the policy being trained); its pairs are that rollout's answers,
    the chosen one right and the rejected one wrong; the same round again gives the same pairs; after the
    policy's weights change, other pairs; round 1 draws other prompts."""
    run = online_run(start, tmp_path, max_iters=0)
    calls = captured_rollouts(monkeypatch)
    examples, figures = online_dpo.sample_round(run, run.state, 0)
    (model, roll), = calls
    assert model is run.raw_model
    G, by_response = 3, {tuple(r): i for i, r in enumerate(roll.responses)}
    made = online_dpo.best_and_worst(roll.verified.tolist(), G)
    assert len(examples) == len(made) == figures["online_pairs"] > 0
    for ex, (prompt, chosen, rejected) in zip(examples, made):
        assert tuple(ex["responses"][0]) == tuple(roll.responses[chosen]) and roll.verified[chosen] == 1
        assert tuple(ex["responses"][1]) == tuple(roll.responses[rejected]) and roll.verified[rejected] == 0
        assert by_response[tuple(ex["responses"][0])] // G == prompt == by_response[tuple(ex["responses"][1])] // G
        assert ex["prompt"] == run.tok.prompt_ids(roll.problems[chosen]["prompt"]) and len(ex["ref"]) == 2
    assert figures["online_pair_share"] == len(made) / 8 and figures["answers_sampled"] == 8 * G
    assert figures["online_sampled_acc"] == pytest.approx(float(roll.verified.mean()))
    again, _ = online_dpo.sample_round(run, run.state, 0)
    assert [ex["responses"] for ex in again] == [ex["responses"] for ex in examples]
    with torch.no_grad():
        for p in run.raw_model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    changed, _ = online_dpo.sample_round(run, run.state, 0)
    assert [ex["responses"] for ex in changed] != [ex["responses"] for ex in examples]
    assert calls[2][1].problems == calls[0][1].problems  # (the same prompts: the answers changed with the policy)
    online_dpo.sample_round(run, run.state, 1)
    assert calls[3][1].problems != calls[0][1].problems


def test_the_reference_log_probs_of_a_rounds_pairs_are_the_starting_policys(start, tmp_path):
    """At the first step the policy is π_ref: DPO's implicit rewards β·(log π_θ − log π_ref) are 0 to rounding."""
    online_run(start, tmp_path, max_iters=1)
    row = next(json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in line)
    assert abs(row["reward_chosen"]) < 1e-5 and abs(row["reward_rejected"]) < 1e-5
    assert row["loss"] == pytest.approx(0.6931472, abs=1e-5)  # −log σ(0)


@pytest.mark.parametrize("labeler", ["rm", "judge"])
def test_each_labeler_ranks_by_its_own_score(start, tmp_path, monkeypatch, labeler):
    """online_labeler=rm: chosen = the answer of highest r_φ, rejected = the lowest (the reward model read
    directly, rollouts.score_responses); =judge: by the judge's P(correct) (judge.judge_scores directly). Both
    log their agreement with the verifier over the pairs they made."""
    keys = (dict(online_labeler="rm", reward_model=write_scalar_checkpoint(tmp_path / "rm")) if labeler == "rm" else
            dict(online_labeler="judge", judge=write_checkpoint(tmp_path / "judge", seed=3, n_layer=1)))
    run = online_run(start, tmp_path, max_iters=0, **keys)
    calls = captured_rollouts(monkeypatch)
    examples, figures = online_dpo.sample_round(run, run.state, 0)
    roll = calls[0][1]
    if labeler == "rm":
        scores = score_responses(frozen(load_model(keys["reward_model"])), roll.ids, roll.mask)
    else:
        judge = frozen(load_model(keys["judge"]))
        scores = judge_scores(run, judge, roll.problems, roll.texts, seed=rollout_seed(roll.ids))[0].mean(1)
    made = online_dpo.best_and_worst(scores.tolist(), 3)
    assert [ex["responses"] for ex in examples] == [(roll.responses[i], roll.responses[j]) for _, i, j in made]
    assert all(scores[i] > scores[j] for _, i, j in made)
    assert figures == pytest.approx(dict(figures, **online_dpo.verifier_agreement(roll.verified.tolist(), made)))
    if labeler == "judge":
        assert 0 <= figures["online_judge_agree"] <= 1
    passport = open(tmp_path / "run" / "passport.md").read()
    assert ("reward model" if labeler == "rm" else "the judge") in passport


def test_the_old_spelling_runs_online_dpo_and_one_variant_at_a_time():
    """--algo dpo --pairs=online is --algo online_dpo (with a note); online DPO trains DPO's loss: the old
    combination with another loss is two variants of the lab, a one-line error."""
    assert options.make_config(dict(algo="dpo", pairs="online", online_every=3)) == options.make_config(
        dict(algo="online_dpo", online_every=3))
    with pytest.raises(ValueError, match=r"--loss='kto' \(now --algo kto\) and --algo online_dpo are no one variant"):
        options.make_config(dict(algo="dpo", pairs="online", loss="kto"))


# ----------------------------------------------------------------------------------------------
# Resume, ranks

def train_rows(out_dir):
    return [{k: v for k, v in json.loads(line).items() if "time" not in k}
            for line in open(os.path.join(out_dir, "metrics.jsonl")) if '"loss"' in line]


@pytest.mark.parametrize("stop", [2, 3])
def test_resume_equals_an_uninterrupted_run(start, tmp_path, stop):
    """5 iterations, a round every 2 (rounds at 0, 2, 4), straight; against `stop` iterations then a resume to
    5: at 2 the resumed run samples round 1 from the restored policy, at 3 it trains on round 1's saved pairs.
    The same weights, and every iteration's logged figures (the loss, the rounds') the same."""
    common = dict(max_iters=5, lr_decay_iters=5, checkpoint=True, learning_rate=0.05, min_lr=0.05)  # (a policy
    # that moves enough within a round that a round sampled a step late would hold other answers)
    straight = online_run(start, tmp_path / "straight", **common)
    online_run(start, tmp_path / "resumed", **dict(common, max_iters=stop))
    resumed = T.train(dict(algo="online_dpo", init_from="resume", out_dir=str(tmp_path / "resumed" / "run"), max_iters=5))
    for k, v in straight.raw_model.state_dict().items():
        torch.testing.assert_close(resumed.raw_model.state_dict()[k], v, rtol=0, atol=0)
    assert train_rows(tmp_path / "resumed" / "run") == train_rows(tmp_path / "straight" / "run")
    assert [r["online_round"] for r in train_rows(tmp_path / "straight" / "run")] == [0, 0, 1, 1, 2]


def _online_weights(overrides):
    envs.Arithmetic.verify = staticmethod(coin)  # (a spawned process: the stand-in set again)
    run = T.train(overrides)
    return ({k: v.detach().cpu().numpy() for k, v in run.raw_model.state_dict().items()},
            [ex["responses"] for ex in run.state.round_examples])


def test_two_processes_make_the_pairs_one_does(start, tmp_path):
    """The round's sampling shared out over 2 gloo processes gives the pairs one process samples, and the same
    training (batch_size 2 × 2 ranks = 4 × 1)."""
    common = dict(ONLINE, init_from=start, max_iters=3)
    one = _online_weights(dict(common, batch_size=4, out_dir=str(tmp_path / "one")))
    two = run_ddp(_online_weights, dict(common, batch_size=2, out_dir=str(tmp_path / "two")))
    assert two[0][1] == two[1][1] == one[1]
    for name, value in one[0].items():
        assert torch.allclose(torch.from_numpy(two[0][0][name]), torch.from_numpy(value), atol=1e-5), name


# ----------------------------------------------------------------------------------------------
# Configuration

@pytest.mark.parametrize("overrides, error", [
    (dict(online_labeler="crowd"), r"online_labeler='crowd': choose from \('verifier', 'rm', 'judge'\)"),
    (dict(online_labeler="rm"), r"online_labeler=rm needs --reward_model=DIR.*python train.py --algo rm"),
    (dict(online_labeler="judge"), r"online_labeler=judge needs --judge=DIR.*experiments/judge_agreement.py"),
    (dict(reward_model="somewhere"), "--reward_model=somewhere is read only with online_labeler=rm"),
    (dict(group_size=1), "group_size=1 answer per prompt makes no pair: at least 2"),
    (dict(pairs="style"), r"unknown config key 'pairs' for --algo online_dpo"),  # (its train pairs are the rounds')
    (dict(online_every=0), "--online_every=0 is out of range: it must be >= 1"),
])
def test_config_errors(start, tmp_path, overrides, error):
    with pytest.raises(ValueError, match=error):
        online_run(start, tmp_path, max_iters=0, **overrides)


def test_online_pairs_are_dpos_alone(start, tmp_path):
    with pytest.raises(ValueError, match=r"pairs='online': choose from .*: --algo online_dpo\)"):
        T.train(dict(TINY, algo="rm", pairs="online", init_from=start, out_dir=str(tmp_path / "rm")))


def test_a_round_without_a_pair_names_what_to_raise(start, tmp_path, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(lambda problem, response: 0.0))
    with pytest.raises(ValueError, match=r"online round 0: no pair among 8 prompts × 3 answers \(the verifier scored "
                                         r"every prompt's answers alike\): raise group_size"):
        online_run(start, tmp_path, max_iters=1)


# ----------------------------------------------------------------------------------------------
# experiments/online_dpo.py

def test_the_studys_offline_pairs_are_the_fallbacks_minus_the_demonstrations(start, tmp_path):
    """The study's offline arm (pairs.builtin_pairs with demo_fallback=False) on the same answers as dpo.py's
    pairs (the same π_ref, prompts and seed): exactly dpo.py's pairs whose chosen answer is sampled, in order;
    the prompts where dpo.py took the demonstration make none, and are counted."""
    from experiments import online_dpo as study
    config = dict(TINY, algo="dpo", init_from=start, max_iters=0, train_prompts=24, heldout_prompts=8, group_size=3,
                  max_new_tokens=10, batch_size=2)
    offline = T.train(dict(config, out_dir=str(tmp_path / "study")), algo=study.module_of("offline_dpo"))
    fallback = T.train(dict(config, out_dir=str(tmp_path / "dpo")))
    counts = json.load(open(tmp_path / "study" / study.PAIR_COUNTS))
    _, fallback_counts = pairs.builtin_pairs(fallback, fallback.state.reference, "train", 24, seed=1)
    assert fallback_counts["demo_chosen"] > 0 and fallback_counts["too_long"] == 0 and counts["train"]["demo_chosen"] == 0
    assert counts["train"]["no_right_sample"] == fallback_counts["demo_chosen"]
    assert counts["train"]["verifier"] == fallback_counts["verifier"] - fallback_counts["demo_chosen"]
    problems = fallback.env.problems("train", 24, seed=1)
    demonstrations = {tuple(fallback.tok.assistant_ids(fallback.env.solve(p))[0]) for p in problems}
    sampled = [(ex["prompt"], ex["responses"]) for ex in fallback.state.train_examples
               if tuple(ex["responses"][0]) not in demonstrations]
    assert [(ex["prompt"], ex["responses"]) for ex in offline.state.train_examples] == sampled
    for ex in offline.state.train_examples:  # every chosen answer is a sampled one the verifier accepts
        problem = next(p for p in problems if fallback.tok.prompt_ids(p["prompt"]) == ex["prompt"])
        assert fallback.env.verify(problem, response_text(fallback, ex["responses"][0])) == 1.0


def test_the_saturated_share_by_hand(start, tmp_path):
    """Two pairs whose π_ref sums are set so that z = 5.0 (σ = 0.99331, saturated) and z = 4.5 (σ = 0.98901,
    not): the share 1/2, the mean z 4.75; at z = 0 (π_θ = π_ref) none."""
    from experiments import online_dpo as study
    run = T.train(dict(TINY, algo="dpo", init_from=start, max_iters=0, train_prompts=8, heldout_prompts=4, group_size=3,
                       max_new_tokens=10, out_dir=str(tmp_path / "run")))
    examples = [dict(ex) for ex in run.state.train_examples[:2]]
    assert len(examples) == 2 and study.saturation(run, run.raw_model, examples)["train_pairs_saturated"] == 0.0
    with torch.no_grad():
        (lp_w, lp_l), _ = dpo.sequence_sums(run, run.raw_model, pairs.collate(run, examples))
    beta = run.cfg["beta"]
    for ex, z, w, l in zip(examples, (5.0, 4.5), lp_w.tolist(), lp_l.tolist()):
        ex["ref"] = (w - z / beta, l)  # z = β[(lp_w − ref_w) − (lp_l − ref_l)]
    figures = study.saturation(run, run.raw_model, examples)
    assert figures["train_pairs_saturated"] == 0.5 and figures["train_pairs_n"] == 2
    assert figures["train_pairs_z"] == pytest.approx(4.75, abs=1e-3)


def test_online_dpo_study_summary_by_hand():
    """Three seeds' final accuracies: online 0.62, 0.60, 0.58; offline 0.50, 0.55, 0.60; GRPO 0.60, 0.60, 0.60.
    online − offline per seed +0.12, +0.05, −0.02: mean 0.05, sd 0.07, band 4.303·0.07/√3 = 0.1739."""
    from experiments import online_dpo as study
    curve = lambda *accs: [dict(iter=10 * i, heldout_acc=a, heldout_work=0.5, heldout_len=20.0) for i, a in enumerate(accs)]
    results = dict(arms={arm: {str(s): dict(curve=curve(0.3, a)) for s, a in zip((1, 2, 3), accs)} for arm, accs in
                         dict(offline_dpo=(0.50, 0.55, 0.60), online_dpo=(0.62, 0.60, 0.58), grpo=(0.6, 0.6, 0.6)).items()})
    points, final, paired = study.summarise(results, 500)
    gap = next(d for d in paired if d["arms"] == "online_dpo − offline_dpo")
    assert gap["per_seed"] == pytest.approx([0.12, 0.05, -0.02]) and gap["mean"] == pytest.approx(0.05)
    assert gap["band"] == pytest.approx(4.303 * 0.07 / 3 ** 0.5)
    assert final["online_dpo"]["mean"] == pytest.approx(0.6) and final["online_dpo"]["start"] == 0.3
    # seeds that agree: the band is the binomial one of the mean (0.6 on 500 problems), not 0
    assert final["grpo"]["band"] == pytest.approx(bands.binomial(0.6, 500)) == pytest.approx(1.96 * (0.6 * 0.4 / 500) ** 0.5, rel=0.03)
    assert [p["iter"] for p in points["grpo"]] == [0, 10]


@pytest.mark.slow  # (a study script end to end at toy size, 5-10 s: with -m slow, as ood.py's)
def test_online_dpo_study_runs_at_toy_size(tmp_path):
    """--quick --grpo end to end: offline DPO (no demonstration as chosen), online DPO and GRPO from one toy SFT
    model, three seeds each, the same answers sampled per arm, evaluated at the same points; bands and paired
    differences; the DPO arms' saturated shares; the tables and plot."""
    command = [sys.executable, os.path.join(ROOT, "experiments", "online_dpo.py"), "--quick", "--grpo", f"--out={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(tmp_path / "results.json"))
    assert list(results["arms"]) == ["offline_dpo", "online_dpo", "grpo"]
    answers = {arm: [run["answers_sampled"] for run in runs.values()] for arm, runs in results["arms"].items()}
    assert len({a for per_arm in answers.values() for a in per_arm}) == 1  # equal sampled answers, every arm and seed
    for arm, runs in results["arms"].items():
        assert list(runs) == ["1337", "1338", "1339"]
        for run in runs.values():
            assert [p["iter"] for p in run["curve"]] == results["eval_iters"]
            assert all(0 <= p["heldout_acc"] <= 1 for p in run["curve"])
    assert set(results["final"]) == {"offline_dpo", "online_dpo", "grpo"}
    assert {d["arms"] for d in results["paired"]} == {"online_dpo − offline_dpo", "online_dpo − grpo",
                                                     "offline_dpo − grpo"}
    assert all(d["band"] is not None and len(d["per_seed"]) == 3 for d in results["paired"])
    assert all(0 <= r["online_pair_share"] <= 1 for r in results["rounds"]["online_dpo"]["1337"])
    for arm in ("offline_dpo", "online_dpo"):  # the saturated share at every evaluation (online: once a round exists)
        assert all(0 <= s <= 1 for p in results["points"][arm] for s in p.get("saturated", []))
        assert len([p for p in results["points"][arm] if "saturated" in p]) == len(results["eval_iters"]) - (arm != "offline_dpo")
    assert all(r["pair_counts"]["train"]["demo_chosen"] == 0 for r in results["arms"]["offline_dpo"].values())
    assert all(len(r["verdicts"]) == results["eval_problems"] for runs in results["arms"].values() for r in runs.values())
    text = (tmp_path / "online_dpo.md").read_text()
    assert "| online_dpo |" in text and "saturated" in text and (tmp_path / "online_dpo.png").exists()
