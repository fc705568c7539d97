"""experiments/judge_rl.py, GRPO on the judge's reward beside GRPO on the verifier's and PPO on the RM's:
its summary by hand (the paired differences by seed, the judge's over-estimate), what it needs and the
commands that make it, and the whole study at toy size (the three arms at equal answers per iteration,
the judge and the RM scoring the very answers the gold scores, the answers where they part)."""

import json
import math
import os
import subprocess
import sys

import pytest

import envs
from experiments import judge_rl
from nanopost import bands
from test_judge import write_scalar_checkpoint
from test_opd import write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def point(it, gold, judge, false_pass=0.0, rm=0.0):
    return dict(iter=it, heldout_acc=gold, heldout_judge_reward=judge, heldout_judge_false_pass=false_pass,
                heldout_rm_delta=rm, heldout_work=0.5, heldout_len=20.0)


def test_summary_by_hand():
    """Three seeds. At the last point grpo_verifier's gold is 0.5, 0.6, 0.7 and grpo_judge's 0.6, 0.8, 1.0:
    paired by seed +0.1, +0.2, +0.3, mean 0.2, sd 0.1, band t(0.975, 2)·0.1/√3 = 4.303·0.0577 = 0.2484.
    grpo_judge's judge reward 0.9, 0.9, 1.0 over its gold: +0.3, +0.1, 0.0, mean 0.1333."""
    gold_v, gold_j, judge_j = (0.5, 0.6, 0.7), (0.6, 0.8, 1.0), (0.9, 0.9, 1.0)
    results = dict(arms=dict(
        grpo_verifier={str(s): dict(curve=[point(0, 0.3, 0.4), point(10, g, 0.7)]) for s, g in zip((1, 2, 3), gold_v)},
        grpo_judge={str(s): dict(curve=[point(0, 0.3, 0.4), point(10, g, j)]) for s, g, j in zip((1, 2, 3), gold_j, judge_j)}))
    points, final, paired, gap = judge_rl.summarise(results, n=500)
    gold = next(d for d in paired if d["figure"] == "heldout_acc")
    assert gold["arms"] == "grpo_judge − grpo_verifier" and gold["per_seed"] == pytest.approx([0.1, 0.2, 0.3])
    assert gold["mean"] == pytest.approx(0.2) and gold["band"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert gap["grpo_judge"]["mean"] == pytest.approx(0.4 / 3) and gap["grpo_judge"]["per_seed"] == pytest.approx([0.3, 0.1, 0.0])
    assert final["grpo_judge"]["heldout_acc"]["mean"] == pytest.approx(0.8) and final["grpo_judge"]["heldout_acc"]["start"] == 0.3
    # gold is an accuracy: seeds that agree keep the binomial band of the mean (0.3 on 500 problems at it. 0:
    # Wilson's larger side, 0.0416, against the Wald 1.96·√(0.3·0.7/500) = 0.0402)
    assert points["grpo_verifier"]["heldout_acc"][0]["band"] == pytest.approx(bands.binomial(0.3, 500))
    assert bands.binomial(0.3, 500) == pytest.approx(1.96 * math.sqrt(0.3 * 0.7 / 500), rel=0.05)
    assert points["grpo_verifier"]["heldout_judge_reward"][0]["band"] == pytest.approx(0.0, abs=1e-12)  # no floor: the t band of equal seeds


@pytest.mark.parametrize("missing, maker", [("judge", "experiments/judge_agreement.py"),
                                            ("reward_model", "python train.py --algo rm --init_from=out/sft")])
def test_it_names_the_command_that_makes_what_is_missing(tmp_path, capsys, missing, maker):
    given = dict(init_from=write_checkpoint(tmp_path / "sft", seed=0), judge=write_checkpoint(tmp_path / "judge", seed=1),
                 reward_model=write_scalar_checkpoint(tmp_path / "rm"))
    given[missing] = str(tmp_path / "nowhere")
    with pytest.raises(SystemExit):
        judge_rl.main([f"--{k}={v}" for k, v in given.items()] + [f"--out={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert f"--{missing}='{tmp_path / 'nowhere'}' holds no checkpoint" in err and maker in err


def test_a_judge_and_a_reward_model_given_the_wrong_way_round(tmp_path, capsys):
    lm, rm = write_checkpoint(tmp_path / "lm", seed=0), write_scalar_checkpoint(tmp_path / "rm")
    with pytest.raises(SystemExit):
        judge_rl.main([f"--init_from={lm}", f"--judge={rm}", f"--reward_model={lm}", f"--out={tmp_path / 'out'}"])
    assert "must be a language model (a judge)" in capsys.readouterr().err


@pytest.mark.slow  # (a study script end to end at toy size, 5-10 s: with -m slow, as ood.py's)
def test_judge_rl_study_runs_at_toy_size(tmp_path):
    """--quick end to end (a toy SFT model, itself standing in for the judge, and a toy RM): three arms × three
    seeds, the same answers per iteration in each, evaluated at the same points; the judge and the RM score
    the very greedy answers the verifier scores (heldout_gold = heldout_acc); the answers listed where they
    part are wrong and rated P > 0.5, highest first; bands, paired differences, the table and the plot."""
    command = [sys.executable, os.path.join(ROOT, "experiments", "judge_rl.py"), "--quick", f"--out={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(tmp_path / "results.json"))
    assert list(results["arms"]) == ["grpo_verifier", "grpo_judge", "ppo_rm"]
    per_iter = {}
    for arm, runs in results["arms"].items():
        assert list(runs) == ["1337", "1338", "1339"]
        for run in runs.values():
            cfg = json.load(open(os.path.join(run["out_dir"], "config.json")))
            per_iter[arm] = (cfg["prompts_per_iter"] * cfg["group_size"] if cfg["algo"] in ("grpo", "judge_reward") else
                             cfg["minibatches"] * cfg["gradient_accumulation_steps"] * cfg["batch_size"])
            assert [p["iter"] for p in run["curve"]] == results["eval_iters"] == [0, 1, 2]
            assert all(p["heldout_gold"] == p["heldout_acc"] for p in run["curve"])
            assert run["curve"][0]["heldout_rm_delta"] == 0.0
            for p in run["curve"]:
                assert p["heldout_judge_false_pass"] <= 1 - p["heldout_acc"] + 1e-9 and 0 <= p["heldout_judge_reward"] <= 1
            env = envs.make_env("arithmetic")
            assert [e["p_correct"] for e in run["examples"]] == sorted((e["p_correct"] for e in run["examples"]), reverse=True)
            assert len(run["examples"]) <= 5 and all(e["p_correct"] > 0.5 and env.verify(e["problem"], e["answer"]) == 0
                                                      for e in run["examples"])
    assert set(per_iter.values()) == {8}  # equal answers per iteration: GRPO 2 prompts × 4, PPO 2 minibatches × 4
    assert results["judge_samples"] == 2 and json.load(open(os.path.join(
        results["arms"]["grpo_judge"]["1337"]["out_dir"], "config.json")))["algo"] == "judge_reward"
    assert {(d["arms"], d["figure"]) for d in results["paired"]} == {
        (f"{arm} − grpo_verifier", key) for arm in ("grpo_judge", "ppo_rm") for key in judge_rl.FIGURES}
    assert all(d["band"] is not None for d in results["paired"])
    table = (tmp_path / "judge_rl.md").read_text()
    assert "| grpo_judge |" in table and "### Where they part" in table and (tmp_path / "judge_rl.png").exists()
