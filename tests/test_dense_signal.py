"""experiments/dense_signal.py: its fixed rules on worked examples (the levels from a start and a
teacher, a miss, the best GRPO rate, the speed-up and its bounds, the verdict), the table and the
figure from a hand-written record, and a --quick run end to end."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import dense_signal as D  # noqa: E402


def curve(accs, per_eval):
    """Evaluations every 2 iterations, `per_eval` rollout tokens between two of them."""
    return [dict(iter=2 * i, acc=a, tokens=per_eval * i, seconds=float(i)) for i, a in enumerate(accs)]


def test_levels_are_fractions_of_the_measured_gap_floored_by_the_start_band():
    lv = D.levels(0.5, 0.9, 500)
    # 10% of the gap is 0.04, inside the start's Wilson band (0.0437 at 0.5 of 500): the band is the level
    assert abs(lv[0.1] - 0.5437) < 1e-4 and abs(lv[0.25] - 0.6) < 1e-12 and abs(lv[0.5] - 0.7) < 1e-12
    assert D.levels(0.2, 0.8, 500)[0.1] == pytest.approx(0.26)  # 0.06 > the band at 0.2 (0.035)
    assert D.levels(0.5, 0.53, 500) == {}  # a teacher inside the start's band: no gap, no level


def test_a_run_that_never_holds_a_level_is_a_miss():
    points = curve([0.5, 0.62, 0.55, 0.61, 0.63], 1000.0)
    assert D.tokens_to(points, 0.6) == 3000.0  # not 1000: it fell back at the next evaluation
    assert D.tokens_to(points, 0.63) is None  # the last evaluation alone confirms nothing


def test_best_grpo_rate_and_the_speed_up_with_its_bounds():
    reach, miss = curve([0.5, 0.5, 0.65, 0.66], 1000.0), curve([0.5, 0.5, 0.5, 0.5], 1000.0)
    runs = dict(opd={"1": curve([0.5, 0.65, 0.66, 0.7], 1000.0), "2": miss, "3": miss, "4": curve([0.5, 0.65, 0.7, 0.7], 500.0)},
                grpo_lr1={"1": reach, "2": reach, "3": miss, "4": miss},
                grpo_lr2={s: miss for s in "1234"})
    # lr1: (2000 + 2000 + 3000 + 3000) / 4 (its misses at their run's 3,000 tokens) beats lr2's 3000
    assert D.best_grpo(runs, 0.6) == "grpo_lr1"
    s = D.speedups(runs, "opd", "grpo_lr1", 0.6)
    assert s["1"] == (2.0, "=")  # 2000 / 1000
    assert s["2"] == (2000 / 3000, "≤")  # OPD missed: counted at its 3,000, so the speed-up is at most that
    assert s["3"] == (None, "miss")
    assert s["4"] == (3000 / 500, "≥")  # GRPO missed: at least 3,000 / 500


def test_the_verdict_rule():
    even = {"1": (1.0, "="), "2": (0.9, "="), "3": (1.1, "=")}
    fast = {"1": (8.0, "="), "2": (7.0, "="), "3": (9.0, "=")}
    assert D.verdict(even, fast).startswith("GROWS")
    assert D.verdict(fast, even).startswith("SHRINKS")
    assert D.verdict(even, {"1": (1.2, "="), "2": (0.8, "="), "3": (1.0, "=")}).startswith("NOT SHOWN")  # overlap
    # a bound counts only where the true figure lies further in the verdict's direction: "≥" at the longest L, not "≤"
    assert D.verdict(even, dict(fast, **{"1": (8.0, "≥")})).startswith("GROWS")
    assert D.verdict(even, dict(fast, **{"1": (8.0, "≤")})).startswith("NOT SHOWN")
    assert D.verdict(dict(even, **{"1": (1.0, "≥")}), fast).startswith("NOT SHOWN")
    assert D.verdict(even, dict(fast, **{"1": (None, "miss")})).startswith("NOT MEASURABLE")
    assert D.verdict({}, fast).startswith("NOT MEASURABLE")
    assert D.verdict({"1": (1.0, "="), "2": (1.1, "=")}, {"1": (8.0, "="), "2": (9.0, "=")}).startswith("NOT SHOWN")


def hand_written_record():
    """L = 2: OPD and the best GRPO rate both hold 10% of the gap at their first evaluation (speed-up
    about 1); L = 6: OPD at its first evaluation, GRPO only after 8,000 tokens (speed-up about 8).
    process_reward is the best GRPO rate's curve at both L (speed-up 1, twice)."""
    scale = {"1": 1000.0, "2": 1100.0, "3": 900.0}  # OPD's tokens per evaluation, per seed
    short = {"opd": {s: curve([0.5, 0.56, 0.62, 0.63], scale[s]) for s in "12"},
             "grpo_lr0.0001": {s: curve([0.5, 0.55, 0.56, 0.56], 1000.0) for s in "123"},
             "grpo_lr3e-05": {s: curve([0.5, 0.5, 0.5, 0.5], 1000.0) for s in "123"}}
    short["opd"]["3"] = curve([0.5, 0.56, 0.72, 0.71], scale["3"])  # the one seed that holds 50% (0.7)
    short["process_reward"] = short["grpo_lr0.0001"]
    long = {"opd": {s: curve([0.2, 0.27, 0.36, 0.37], scale[s]) for s in "123"},
            "grpo_lr0.0001": {s: curve([0.2, 0.2, 0.27, 0.28], 4000.0) for s in "123"},
            "grpo_lr3e-05": {s: curve([0.2, 0.2, 0.2, 0.2], 4000.0) for s in "123"}}
    long["process_reward"] = long["grpo_lr0.0001"]
    return dict(settings=dict(cap=6, eval_problems=500, quick=False),
                lengths={"2": dict(start=0.5, teacher=0.9, distinct=210, arms=short),
                         "6": dict(start=0.2, teacher=0.8, distinct=499, arms=long)})


def test_the_table_and_the_figure_from_a_hand_written_record(tmp_path):
    record = hand_written_record()
    figures = D.analyse(record)
    assert figures[2]["best"][0.1] == figures[6]["best"][0.1] == "grpo_lr0.0001"
    assert [r for r, _ in figures[6]["speedups"][0.1]["opd"].values()] == pytest.approx([8.0, 8000 / 1100, 8000 / 900])
    assert figures[2]["speedups"][0.1]["opd"]["2"] == (1000 / 1100, "=")
    assert figures[2]["end_gap"][0] == "grpo_lr0.0001"
    text = D.table(record)
    assert "| 2 | opd | " in text and "miss in 2 of 3 (miss, miss, 1,800)" in text  # to 50%: one seed of three
    assert "| 2 | grpo_lr3e-05 | 0.500 ± 0.044 | miss in 3 of 3 (miss, miss, miss) |" in text
    assert "| 6 | opd | 0.333 ± 0.042 | 1,000 ± 248 | 2,000 ± 497 |" in text  # 4.303 · sd 100 / √3 = 248
    assert "| 6 | 10% | grpo_lr0.0001 | 8.0" in text
    assert "- opd's speed-up over the best GRPO rate: GROWS" in text
    assert "- process_reward's speed-up over the best GRPO rate: NOT SHOWN" in text
    D.plot(record, str(tmp_path / "dense_signal.png"))
    assert (tmp_path / "dense_signal.png").stat().st_size > 10_000


@pytest.mark.slow  # (a study script end to end at toy size, 15-30 s: with -m slow, as distill.py's)
def test_quick_runs_every_length_and_arm_and_reads_finished_runs(tmp_path, monkeypatch):
    out = tmp_path / "out"
    D.main(["--quick", "--out", str(out)])
    record = json.load(open(out / "results.json"))
    assert set(record["lengths"]) == {"2", "4", "6"}
    for L, entry in record["lengths"].items():
        assert set(entry["arms"]) == set(D.ARMS) and 0 < entry["distinct"] <= 16
        assert json.load(open(out / f"L{L}" / "student" / "config.json"))["env_ops"] == int(L)
        assert json.load(open(out / f"L{L}" / "opd_1" / "config.json"))["teacher"] == str(out / f"L{L}" / "teacher")
        for name, seeds in entry["arms"].items():
            points = seeds["1"]
            assert [p["iter"] for p in points] == [0, 2, 4]
            assert 0 < points[1]["tokens"] < points[2]["tokens"], name  # rollout tokens from the run's log accumulate
    assert (out / "dense_signal.md").exists() and (out / "dense_signal.png").exists()
    monkeypatch.setattr(D, "train_arm", lambda *a, **k: pytest.fail("a finished run was trained again"))
    D.main(["--quick", "--out", str(out)])
    with pytest.raises(SystemExit, match="another --out"):
        D.main(["--out", str(out)])  # other settings into the same --out
    # a model made again (another machine) must measure what its finished runs started from
    (out / "L2" / "student" / "ckpt.pt").unlink()
    D.main(["--quick", "--lengths=2", "--out", str(out)])  # the same student again: its runs are kept
    assert json.load(open(out / "results.json")) == record
    tampered = dict(record, lengths=dict(record["lengths"], **{"2": dict(record["lengths"]["2"], start=0.123)}))
    (out / "results.json").write_text(json.dumps(tampered))
    with pytest.raises(SystemExit, match="other models"):
        D.main(["--quick", "--lengths=2", "--out", str(out)])


def test_a_study_split_across_two_outs_joins_into_one(tmp_path):
    record = hand_written_record()
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    first = dict(record, lengths={"2": record["lengths"]["2"], "6": dict(record["lengths"]["6"], arms={"opd": record["lengths"]["6"]["arms"]["opd"]})})
    second = dict(record, lengths={"6": dict(record["lengths"]["6"], arms={a: s for a, s in record["lengths"]["6"]["arms"].items() if a != "opd"})})
    one.write_text(json.dumps(first))
    two.write_text(json.dumps(second))
    D.main(["--cap=6", "--report", f"--out={tmp_path / 'joined'}", f"--join={one},{two}"])
    assert json.load(open(tmp_path / "joined" / "results.json")) == json.loads(json.dumps(record))
    two.write_text(json.dumps(dict(second, lengths={"6": dict(second["lengths"]["6"], teacher=0.9)})))
    with pytest.raises(SystemExit, match="other models"):
        D.main(["--cap=6", "--report", f"--out={tmp_path / 'again'}", f"--join={one},{two}"])
