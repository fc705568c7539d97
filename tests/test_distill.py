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


def test_a_level_counts_where_it_holds_for_two_evaluations():
    points = [dict(iter=i, acc=a, tokens=100.0 * i, seconds=float(i)) for i, a in enumerate([0.3, 0.62, 0.55, 0.61, 0.63, 0.6])]
    assert distill.first_reaching(points, 0.6) == dict(iter=3, tokens=300.0, seconds=3.0)  # not 1: it fell back at 2
    assert distill.first_reaching(points, 0.62) is None  # 0.62 and 0.63 never two in a row
    assert distill.first_reaching(points[:5], 0.63) is None  # the last evaluation alone confirms nothing
    assert distill.best_held(points) == 0.61  # max of min(0.61, 0.63), min(0.63, 0.6), ...
    assert distill.end_accuracy(points) == (0.61 + 0.63 + 0.6) / 3


def test_efficiency_is_against_grpo_of_the_same_seed_at_its_own_best():
    curve = lambda seed, accs: dict(seed=seed, points=[dict(iter=i, acc=a, tokens=1000.0 * i, seconds=2.0 * i)
                                                       for i, a in enumerate(accs)])
    results = dict(grpo=[curve(1, [0.3, 0.5, 0.6, 0.6, 0.58]), curve(2, [0.3, 0.4, 0.5, 0.52, 0.5])],
                   opd_full=[curve(1, [0.3, 0.62, 0.64, 0.7, 0.7]), curve(2, [0.3, 0.45, 0.52, 0.48, 0.49])])
    fair = distill.efficiency(results)
    one, two = fair["opd_full"]
    assert [r["token_ratio"] for r in fair["grpo"]] == [1.0, 1.0]
    assert one["level"] == 0.6 and one["grpo_reached"]["tokens"] == 2000 and one["reached"]["tokens"] == 1000
    assert one["token_ratio"] == 0.5 and one["seconds_ratio"] == 0.5
    assert abs(one["end_gap"] - ((0.64 + 0.7 + 0.7) - (0.6 + 0.6 + 0.58)) / 3) < 1e-12
    assert two["level"] == 0.5 and two["reached"] is None and two["token_ratio"] is None  # 0.52 once, then 0.48


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
    fair = results["efficiency"]  # every arm against GRPO of its seed, at GRPO's own best held level
    assert set(fair) == set(distill.DEFAULT_ARMS) and all(r["seed"] == 1 for rows in fair.values() for r in rows)
    assert fair["grpo"][0]["end_gap"] == 0.0
    record = json.load(open(out / "results.json"))
    distill.main(["--out", str(out), "--report"])  # the tables again, from results.json alone
    assert json.load(open(out / "results.json"))["efficiency"] == record["efficiency"]


@pytest.mark.slow
def test_opsd_quick_runs_every_arm_and_grades_every_solution_position(tmp_path):
    student = write_checkpoint(tmp_path / "student", seed=0)
    out = tmp_path / "out"
    opsd.main(["--student", student, "--out", str(out), "--quick"])
    results = json.load(open(out / "results.json"))
    assert set(results["arms"]) == set(opsd.ARMS) and (out / "opsd.png").exists()
    assert set(results["privileged_greedy"]) == {"answer", "solution"} and results["readers"]["1"]["solution_context"]
    seed = out / "seed1"  # each seed makes its own reader, and every reader arm of the seed starts from it
    for arm in ("reader", "reader_sft", "reader_grpo"):
        assert json.load(open(seed / arm / "config.json"))["init_from"] == str(seed / "reader_model")
    arms = {name: runs[0] for name, runs in results["arms"].items()}
    assert arms["solution"]["ungraded_frac"] == 0.0 and arms["reader_sft"]["ungraded_frac"] is None
    assert arms["solution_anchor"]["anchor_coef"] == 1.0 and arms["answer"]["anchor_coef"] == 0
    assert [p["iter"] for p in arms["reader_sft"]["points"]] == [p["iter"] for p in arms["reader"]["points"]] == [0, 2, 4]
    rows = [json.loads(line) for line in open(seed / "solution_anchor" / "metrics.jsonl")]
    assert all("anchor_kl" in r for r in rows if "loss" in r)


def test_the_sft_control_trains_on_the_problems_opsd_draws(tmp_path, monkeypatch):
    """solution_rows: the problems an OPSD run of the same seed samples, in its order, each -> its
    verified worked solution; then held-out rows, exactly the ones sft.py keeps for validation."""
    import opd
    student = write_checkpoint(tmp_path / "s", seed=0)
    keys = dict(algo="opsd", privileged="solution", init_from=student, prompts_per_iter=4, rollout_prompts=2,
                max_new_tokens=8, batch_size=4, eval_interval=0, checkpoint=False, plot=False, seed=5)
    drawn, sample = [], opd.rollouts
    monkeypatch.setattr(opd, "rollouts", lambda run, model, problems, *a, **k: drawn.extend(problems) or sample(run, model, problems, *a, **k))
    T.train(dict(keys, max_iters=3, out_dir=str(tmp_path / "opsd")))
    run = T.train(dict(keys, max_iters=0, out_dir=str(tmp_path / "start")))
    path = str(tmp_path / "rows.jsonl")
    n_train, n_val = opsd.solution_rows(run, 3, path)
    rows = [json.loads(line) for line in open(path)]
    assert n_train == len(drawn) == 12 and len(rows) == 12 + n_val
    assert [r["prompt"] for r in rows[:12]] == [p["prompt"] for p in drawn]
    assert all(run.env.verify(p, r["completion"]) == 1.0 and run.env.shows_work(r["completion"]) for p, r in zip(drawn, rows))
    sft = T.train(dict(algo="sft", data=path, val_examples=n_val, init_from=student, max_iters=0, eval_interval=0,
                       checkpoint=False, plot=False, out_dir=str(tmp_path / "sft")))
    assert len(sft.state.train_examples) == 12 and len(sft.state.val_examples) == n_val


def test_reader_rows_alternate_the_sft_task_and_the_solution_context(tmp_path):
    run = T.train(dict(algo="opsd", init_from=write_checkpoint(tmp_path / "s", seed=0), max_iters=0,
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
