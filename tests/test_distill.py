"""experiments/distill.py and experiments/opsd.py: the evaluation schedule, the plateau rule, the
token roles of the KL profile on numbers, --help, and a --quick run of each on tiny random models."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import distill  # noqa: E402
import opsd  # noqa: E402
import train as T  # noqa: E402
from test_opd import write_checkpoint  # noqa: E402


def test_schedule_is_finer_early_and_ends_at_the_cap():
    assert distill.schedule(120) == [2, 4, 6, 8, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120]
    assert distill.schedule(45) == [2, 4, 6, 8, 10, 15, 20, 25, 30, 40, 45]
    assert distill.schedule(4) == [2, 4]


def test_plateau_is_no_gain_beyond_the_band_over_three_evaluations():
    points = lambda accs, step=10: [dict(iter=i * step, acc=a) for i, a in enumerate(accs)]
    assert round(distill.band(0.5, 500), 4) == 0.0447
    # best before the last three: 0.60, band 0.0438; 0.64 is within it, 0.65 is not
    assert distill.plateaued(points([0.3, 0.5, 0.6, 0.62, 0.64, 0.58]), 500, 30)
    assert not distill.plateaued(points([0.3, 0.5, 0.6, 0.62, 0.65, 0.58]), 500, 30)
    assert not distill.plateaued(points([0.3, 0.5, 0.6, 0.6, 0.6, 0.6], step=2), 500, 30)  # before min_iters
    assert not distill.plateaued(points([0.3, 0.3, 0.3]), 500, 0)  # three evaluations and nothing before them


def test_char_roles_of_a_worked_and_a_bare_answer():
    text = "7+9=16. 16-4=12. Answer: -3"
    roles = distill.char_roles(text)
    by = lambda role: "".join(c for c, r in zip(text, roles) if r == role)
    assert by("operand") == "79164" and by("operator") == "+=-=" and by("result") == "1612"
    assert by("answer") == "-3" and by("other") == ". . Answer: "
    assert distill.char_roles("Answer: 5") == ["other"] * 8 + ["answer"]


def test_help_names_the_preparation_and_the_quick_run(capsys):
    for main in (distill.main, opsd.main):
        with pytest.raises(SystemExit):
            main(["--help"])
    out = capsys.readouterr().out
    assert "python train.py config/teacher.py" in out and "--quick" in out and "--anchor_coef" in out


def test_a_missing_teacher_names_the_command_that_makes_it(tmp_path):
    student = write_checkpoint(tmp_path / "student", seed=0)
    with pytest.raises(SystemExit, match="config/teacher.py"):
        distill.main(["--student", student, "--teacher", str(tmp_path / "none"), "--quick"])


@pytest.mark.slow
def test_distill_quick_runs_every_arm_and_writes_results(tmp_path):
    student = write_checkpoint(tmp_path / "student", seed=0)
    teacher = write_checkpoint(tmp_path / "teacher", seed=1, n_layer=1, n_embd=64)
    out = tmp_path / "out"
    distill.main(["--student", student, "--teacher", teacher, "--out", str(out), "--quick"])
    results = json.load(open(out / "results.json"))
    assert set(results["arms"]) == set(distill.DEFAULT_ARMS) and (out / "distill.png").exists()
    for name, seeds in results["arms"].items():
        points = seeds[0]["points"]
        assert [p["iter"] for p in points] == [0, 2, 4]
        assert 0 < points[1]["tokens"] < points[2]["tokens"], name  # rollout tokens accumulate
    assert set(results["kl_profiles"]) == {"student", *distill.DEFAULT_ARMS}
    shares = results["kl_profiles"]["student"]["by_role"]
    assert abs(sum(r["share"] for r in shares.values()) - 1) < 1e-6
    assert set(results["goal"]) >= {"grpo_end_acc", "opd_full", "opd_sampled"}


@pytest.mark.slow
def test_opsd_quick_runs_every_arm_and_grades_every_solution_position(tmp_path):
    student = write_checkpoint(tmp_path / "student", seed=0)
    out = tmp_path / "out"
    opsd.main(["--student", student, "--out", str(out), "--quick"])
    results = json.load(open(out / "results.json"))
    assert set(results["arms"]) == set(opsd.ARMS) and (out / "opsd.png").exists()
    assert set(results["privileged_greedy"]) == {"answer", "solution", "reader: solution"} and results["reader"]
    assert json.load(open(out / "reader" / "config.json"))["init_from"] == str(out / "reader_sft")
    assert results["arms"]["solution"]["ungraded_frac"] == 0.0
    assert results["arms"]["solution_anchor"]["anchor_coef"] == 1.0 and results["arms"]["answer"]["anchor_coef"] == 0
    rows = [json.loads(line) for line in open(out / "solution_anchor" / "metrics.jsonl")]
    assert all("anchor_kl" in r for r in rows if "loss" in r)


def test_reader_rows_alternate_the_sft_task_and_the_solution_context(tmp_path):
    run = T.train(dict(algo="opd", teacher="self", init_from=write_checkpoint(tmp_path / "s", seed=0), max_iters=0,
                       eval_interval=0, checkpoint=False, plot=False, out_dir=str(tmp_path / "run")))
    rows = opsd.reader_rows(run, 40)
    problems = run.env.problems("train", 40, seed=7)
    for i, (row, problem) in enumerate(zip(rows, problems)):
        if i % 2:  # the reference solution, and the worked answer that copies it (the verifier accepts it)
            assert row["prompt"].startswith("(Reference solution: ") and row["completion"] in row["prompt"]
            assert run.env.verify(problem, row["completion"]) == 1.0 and run.env.shows_work(row["completion"])
        else:  # the SFT task itself, bare or worked as in SFT
            assert row == dict(prompt=problem["prompt"], completion=run.env.demonstration(problem))
    assert sum(not run.env.shows_work(r["completion"]) for r in rows[::2]) > 0  # SFT's bare answers are kept
