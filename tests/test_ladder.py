"""The ladder end to end at a tiny size (every stage a real train.py process), skipping and --redo,
a failing stage, the missing-checkpoint message, and the loop's train_tokens count."""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from nanopost import bands
import ladder
from nanopost import options
import sft
import train as T
from conftest import SFT_DATA, TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Two iterations per stage on the tiny model, with data, pairs and rollouts shrunk to match
TINY_LADDER = ladder.command_line(dict(TINY, max_iters=2)) + [
    "--pretrain.corpus_docs=64", "--pretrain.val_examples=8", "--sft.train_problems=64", "--sft.val_examples=8",
    "--rm.train_prompts=8", "--rm.heldout_prompts=4", "--rm.eval_interval=2",  # (an evaluation: its pair accuracy)
    "--dpo.train_prompts=8", "--dpo.heldout_prompts=4", "--ppo.prompt_pool=64", "--ppo.max_new_tokens=8",
    "--grpo.prompts_per_iter=4", "--grpo.group_size=2", "--grpo.max_new_tokens=8",
    "--opd.prompts_per_iter=4", "--opd.max_new_tokens=8", "--reader.train_problems=64", "--reader.val_examples=8",
    "--opsd.prompts_per_iter=4", "--opsd.max_new_tokens=8",
    "--calc_sft.train_problems=64", "--calc_sft.val_examples=8",
    "--calc_grpo.prompts_per_iter=4", "--calc_grpo.group_size=2", "--calc_grpo.max_new_tokens=8",
    "--eval_n=8", "--eval_ood_n=4", "--eval_pass_n=4", "--eval_samples=2"]
# every stage but rft, which refuses a policy that verifies nothing (as a 2-iteration tiny model is;
# tests/test_rft.py runs it)
NAMES = [name for name, _, _ in ladder.STAGES if name != "rft"]
TINY_LADDER.append("--stages=" + ",".join(NAMES))


def checkpoint_times(root):
    return {name: os.path.getmtime(os.path.join(root, name, "ckpt.pt")) for name in NAMES
            if os.path.exists(os.path.join(root, name, "ckpt.pt"))}


@pytest.fixture
def without_html(monkeypatch):
    """The ladder's HTML report (report.py, about a second a stage) is checked once, on the first
    ladder (test_every_stage_runs_and_is_reported); the ladders run again below skip drawing it."""
    monkeypatch.setattr(ladder.report, "write_report", skipped_report)


def skipped_report(directory, order=()):
    return os.path.join(directory, "report.html")


@pytest.fixture(scope="module")
def ladder_root(tmp_path_factory):
    """One tiny ladder, shared by the tests below (they run in file order)."""
    root = str(tmp_path_factory.mktemp("ladder"))
    ladder.main(TINY_LADDER + [f"--out_root={root}"])
    return root


def test_every_stage_runs_and_is_reported(ladder_root):
    for name in NAMES:
        assert os.path.isfile(os.path.join(ladder_root, name, "ckpt.pt"))
        assert json.load(open(os.path.join(ladder_root, name, "ladder.json")))["command"].startswith("python train.py")
    report = open(os.path.join(ladder_root, "report.md")).read()
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    assert [row.split(" | ")[0][2:] for row in rows] == NAMES
    assert "pair acc" in rows[NAMES.index("rm")] and "passport.md" in report and "(answer " in report
    assert os.path.isfile(os.path.join(ladder_root, "ladder.png"))
    # and in the browser (report.py): the root's page links every stage's own, in the ladder's order
    page = open(os.path.join(ladder_root, "report.html")).read()
    assert [page.index(f"href='{name}/report.html'") for name in NAMES] == sorted(
        page.index(f"href='{name}/report.html'") for name in NAMES)
    assert all(os.path.isfile(os.path.join(ladder_root, name, "report.html")) for name in NAMES)
    # the last column: the monitors that fired in each stage's own metrics.jsonl
    assert [row.split(" | ")[-1].rstrip(" |") for row in rows] == [
        ladder.fired_monitors(os.path.join(ladder_root, name)) for name in NAMES]


def test_the_report_names_the_monitors_that_fired(tmp_path):
    """A stage's monitors cell: "none" for a healthy run, else each alarm with the first iteration it fired."""
    def stage(name, rows):
        os.makedirs(tmp_path / name)
        json.dump(dict(algo="grpo", minibatches=1, inner_epochs=1), open(tmp_path / name / "config.json", "w"))
        open(tmp_path / name / "metrics.jsonl", "w").writelines(json.dumps(r) + "\n" for r in rows)
        return ladder.fired_monitors(str(tmp_path / name))
    row = lambda it, **figures: {**dict(iter=it, loss=0.1, entropy=0.2, ratio_dev=0.0, parse_error_rate=0.0), **figures}
    assert stage("healthy", [dict(iter=0, heldout_acc=0.3), row(1), row(2), dict(iter=2, heldout_acc=0.4)]) == "none"
    assert stage("broken", [row(1), row(2, ratio_dev=0.3), row(3, entropy=0.01, ratio_dev=0.3)]) == \
        "ratio_drift (iter 2), entropy_collapse (iter 3)"


def test_done_stages_are_skipped_and_redo_reruns(ladder_root, capsys, without_html):
    before = checkpoint_times(ladder_root)
    ladder.main(TINY_LADDER + [f"--out_root={ladder_root}"])
    assert checkpoint_times(ladder_root) == before
    ladder.main(TINY_LADDER + [f"--out_root={ladder_root}", "--redo=sft"])
    after = checkpoint_times(ladder_root)
    assert after["sft"] > before["sft"] and all(after[n] == before[n] for n in NAMES if n != "sft")
    assert "sft was redone after it; --redo=grpo" in capsys.readouterr().out  # later stages: noted, not redone


def test_a_stage_whose_checkpoint_changed_is_not_done(ladder_root, capsys, without_html):
    """Another run wrote over out/sft (as `train.py --out_dir=out/sft --overwrite=True` does): the ladder
    says so, runs the stage again (its train.py gets --overwrite=True) and reuses no cached evaluation."""
    copy = os.path.join(os.path.dirname(ladder_root), "copied")
    shutil.copytree(ladder_root, copy, copy_function=shutil.copy)  # cp -r: new times, the same contents
    assert all(ladder.done(os.path.join(copy, name)) for name in NAMES)
    before = checkpoint_times(ladder_root)
    path = os.path.join(ladder_root, "sft", "ckpt.pt")
    shutil.copy(os.path.join(ladder_root, "pretrain", "ckpt.pt"), path)  # another checkpoint written over it
    os.utime(path, (before["sft"] + 5, before["sft"] + 5))
    assert ladder.changed(os.path.join(ladder_root, "sft")) and not ladder.done(os.path.join(ladder_root, "sft"))
    ladder.main(TINY_LADDER[:-1] + [f"--out_root={ladder_root}", "--stages=pretrain,sft"])
    out = capsys.readouterr().out
    assert f"[ladder] sft: {path} changed since the ladder ran this stage (another run wrote it): running it again" in out
    assert "--overwrite=True" in json.load(open(os.path.join(ladder_root, "sft", "ladder.json")))["command"]
    after = checkpoint_times(ladder_root)
    assert after["sft"] != before["sft"] + 5 and after["pretrain"] == before["pretrain"]
    assert ladder.done(os.path.join(ladder_root, "sft"))


def test_seeds_retrain_the_whole_ladder(ladder_root, capsys, without_html):
    """--seeds=2: pretrain, sft, grpo and opd again with seed 1338 in OUT_ROOT/seed2, each from seed
    2's own start (opd distilling seed 2's own grpo); the first seed is not run again. With two seeds
    the report gives both values and their range, no band."""
    before = checkpoint_times(ladder_root)
    ladder.main(TINY_LADDER[:-1] + [f"--out_root={ladder_root}", "--seeds=2", "--stages=pretrain,sft,grpo,opd"])
    assert checkpoint_times(ladder_root) == before
    seed2 = os.path.join(ladder_root, "seed2")
    assert sorted(os.listdir(seed2)) == ["grpo", "opd", "pretrain", "sft"]
    configs = {name: json.load(open(os.path.join(seed2, name, "config.json"))) for name in os.listdir(seed2)}
    assert {c["seed"] for c in configs.values()} == {1338}
    assert configs["sft"]["init_from"] == os.path.join(seed2, "pretrain")
    assert configs["grpo"]["init_from"] == os.path.join(seed2, "sft") and configs["opd"]["teacher"] == os.path.join(seed2, "grpo")
    record = json.load(open(os.path.join(seed2, "grpo", "ladder.json")))
    assert record["threads"] >= 1 and record["torch"] == ladder.torch.__version__
    out = capsys.readouterr().out
    assert "2 whole ladders take" in out and "[ladder] sft (seed 2): python train.py" in out
    report = open(os.path.join(ladder_root, "report.md")).read()
    rows = {line.split(" | ")[0][2:]: line for line in report.split("## Across seeds")[1].split("## The first seed")[0].splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}
    assert rows["sft"].startswith("| sft | 2 |") and rows["grpo"].startswith("| grpo | 2 |") and "(range " in rows["grpo"]
    assert "seed 2: `python train.py" in report and "seed2/grpo/passport.md" in report


def test_the_band_drawn_is_the_band_rule():
    """bands.envelope, what the studies' plots shade: mean ± the band from three seeds, the two seeds'
    range where no band is claimed, a single figure with no accuracy band as itself."""
    half = math.hypot(4.303 * 0.1 / 3 ** 0.5, bands.binomial(0.6, 1000))
    assert bands.envelope([0.5, 0.6, 0.7], 1000) == pytest.approx((0.6, 0.6 - half, 0.6 + half), abs=1e-5)
    assert bands.envelope([0.2, 0.5], 1000) == pytest.approx((0.35, 0.2, 0.5))
    assert bands.envelope([4.0], None) == (4.0, 4.0, 4.0)


def test_the_one_evaluation_band_is_wilsons_interval():
    """Worked by hand, z = 1.959964, z² = 3.841459: 0 of 100 right gives Wilson's interval 0 to
    z²/(100 + z²) = 0.036993 (the Wald band claims 0.000 ± 0.000); 50 of 100: center 0.5, half-width
    z/(1 + z²/n)·√(0.25/100 + z²/4n²) = 1.887457 · 0.050951 = 0.096168 (Wald: 0.098). As a band, p ± the
    larger side: 0 and 1 of 1,000 print ± 0.004, not ± 0.000."""
    assert bands.wilson(0.0, 100) == pytest.approx((0.0, 3.841459 / 103.841459), abs=1e-6)
    low, high = bands.wilson(0.5, 100)
    assert (low, high) == pytest.approx((0.5 - 0.096168, 0.5 + 0.096168), abs=1e-5)
    assert bands.binomial(0.5, 100) == pytest.approx(0.096168, abs=1e-5)
    assert bands.binomial(0.0, 1000) == pytest.approx(bands.binomial(1.0, 1000)) == pytest.approx(3.841459 / 1003.841459)
    assert bands.cell([0.0, 0.0, 0.0], 1000) == "0.000 ± 0.004" and bands.cell([1.0], 200) == "1.000 ± 0.019"
    assert bands.binomial(0.6, 1000) == pytest.approx(1.96 * (0.24 / 1000) ** 0.5, rel=0.02)  # near 0.5: the Wald band


def test_the_one_evaluation_band_covers_by_enumeration():
    """The coverage of p ± h, summed exactly over the binomial outcomes k = 0..n, for true p on a grid of
    0.005 to 0.995 (the Wald band's is the known failure: 0.18 at p = 0.01, n = 20, and 0.39 at n = 50,
    since 0 right claims ± 0): the band keeps at least 0.92 at every p and 0.95 on average."""
    def coverage(n, p, half):
        return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1) if abs(k / n - p) <= half(k / n, n))

    def wald(q, n):
        return 1.96 * math.sqrt(q * (1 - q) / n)
    for n, wald_at_001 in ((20, 0.18205), (50, 0.39485)):
        grid = [i / 200 for i in range(1, 200)]
        band = [coverage(n, p, bands.binomial) for p in grid]
        assert min(band) > 0.92 and sum(band) / len(band) > 0.95
        assert coverage(n, 0.01, wald) == pytest.approx(wald_at_001, abs=1e-5) and coverage(n, 0.01, bands.binomial) > 0.99
        assert min(coverage(n, p, wald) for p in grid) < 0.25


def test_the_band_rule_on_known_answers():
    """bands.across_seeds: t(0.975, 2)·s/√3 for three seeds (values 0.5, 0.6, 0.7: s = 0.1, 4.303 · 0.1 / √3
    = 0.24843) and the binomial band of the mean (0.03069 at 0.6 of 1,000) added in variance:
    √(0.24843² + 0.03069²) = 0.25032; values 0.600, 0.610, 0.605: √(0.01242² + 0.03065²) = 0.03307, where a
    max() of the two would say 0.03065; two seeds claim no band; one seed is the binomial band."""
    mean, half = bands.across_seeds([0.5, 0.6, 0.7], 1000)
    assert mean == pytest.approx(0.6) and half == pytest.approx(0.25032, abs=1e-5)
    assert bands.across_seeds([0.60, 0.61, 0.605], 1000)[1] == pytest.approx(0.03307, abs=1e-5)
    assert bands.across_seeds([0.60, 0.61], 1000) == (pytest.approx(0.605), None)
    assert bands.cell([0.60, 0.61], 1000) == "0.600, 0.610 (range 0.010)"
    assert bands.across_seeds([0.5], 100)[1] == pytest.approx(0.096168, abs=1e-5)
    assert bands.across_seeds([4.0, 5.0, 6.0], None)[1] == pytest.approx(4.303 / 3 ** 0.5)  # no accuracy: the t band
    assert bands.t_975(1) == 12.706 and bands.t_975(31) == pytest.approx(2.0395, abs=2e-4)
    assert bands.t_975(120) == pytest.approx(1.9799, abs=2e-4)
    runs = [(k, None, dict(acc=v)) for k, v in enumerate((0.5, 0.6, 0.7), 1)]
    assert ladder.across_seeds(runs, "acc", 1000) == bands.across_seeds([0.5, 0.6, 0.7], 1000)


def test_the_seed_band_covers_when_seeds_share_their_problems():
    """A simulation (numpy seed 0, 4,000 trials): n = 200 problems of latent difficulty u_i ~ U(0, 1)
    drawn once per trial and shared by 3 seeds, seed s right where u_i < θ_s, θ_s = 0.6 + 0.02·N(0, 1):
    the seeds agree closely, and the problems' draw is most of the error. The band adding the two errors
    in variance covers the truth 0.6 in 0.971 of the trials; the max() of the two covered 0.944."""
    rng = np.random.default_rng(0)
    hits = [0, 0]
    for _ in range(4000):
        u = rng.random(200)
        values = [float((u < theta).mean()) for theta in 0.6 + 0.02 * rng.standard_normal(3)]
        mean, half = bands.across_seeds(values, 200)
        old = max(4.303 * float(np.std(values, ddof=1)) / 3 ** 0.5, 1.96 * math.sqrt(mean * (1 - mean) / 200))
        hits[0] += abs(mean - 0.6) <= half
        hits[1] += abs(mean - 0.6) <= old
    assert hits == [3884, 3777]  # 0.971 against 0.944


def test_paired_band_on_known_answers():
    """Arms that agree on 90 of 100 problems and differ on 10 (a right on 8 of them, b on 2): the mean
    difference 0.06 with 1.96·sd/√n, sd of the d_i ∈ {1 ×8, −1 ×2, 0 ×90} = √((0.1 − 0.0036)·100/99).
    Over seeds: differences 0.05, 0.07, 0.06 (s = 0.01, t band 4.303 · 0.01/√3 = 0.02484) with per-problem
    bands 0.03, 0.04, 0.05 (root mean square 0.04082): √(0.02484² + 0.04082²) = 0.04779."""
    a = [1] * 8 + [0] * 2 + [1] * 50 + [0] * 40
    b = [0] * 8 + [1] * 2 + [1] * 50 + [0] * 40
    mean, half = bands.paired(a, b)
    sd = ((10 * 1 - 100 * 0.06 ** 2) / 99) ** 0.5  # Σd² = 10, n·mean² = 0.36
    assert mean == pytest.approx(0.06) and half == pytest.approx(1.96 * sd / 10)
    assert half < bands.binomial(0.58, 100) + bands.binomial(0.52, 100)  # far tighter than two independent bands
    assert bands.paired_across_seeds([0.05, 0.07, 0.06], [0.03, 0.04, 0.05]) == (pytest.approx(0.06), pytest.approx(0.04779, abs=1e-5))
    assert bands.paired_across_seeds([0.05, 0.07, 0.06], None) == (pytest.approx(0.06), pytest.approx(4.303 * 0.01 / 3 ** 0.5))
    assert bands.paired_cell([0.05, 0.07, 0.06], None) == ("+0.060 ± 0.025 (t band alone: no per-problem floor) "
                                                           "(per seed +0.050, +0.070, +0.060)")
    assert bands.paired_cell([0.05, 0.07], [0.03, 0.04]) == "+0.060 (per seed +0.050, +0.070)"
    with pytest.raises(ValueError, match="share their problems"):
        bands.paired([1, 0], [1])


def test_the_paired_seed_band_covers_when_seeds_share_their_problems():
    """A simulation (numpy seed 0, 2,000 trials): 200 shared problems u_i ~ U(0, 1), per seed arm a right
    where u_i < 0.62 + 0.005·N(0, 1), arm b where u_i < 0.58 + 0.005·N(0, 1) (true difference 0.04). The
    seeds' differences agree, so their t band alone covers the truth in 0.704 of the trials; floored by
    the per-problem paired band, in 0.950."""
    rng = np.random.default_rng(0)
    hits = [0, 0]
    for _ in range(2000):
        u = rng.random(200)
        a, b = 0.62 + 0.005 * rng.standard_normal(3), 0.58 + 0.005 * rng.standard_normal(3)
        per_seed = [bands.paired((u < x).astype(int).tolist(), (u < y).astype(int).tolist()) for x, y in zip(a, b)]
        d = [m for m, _ in per_seed]
        for i, floor in enumerate(([h for _, h in per_seed], None)):
            mean, half = bands.paired_across_seeds(d, floor)
            hits[i] += abs(mean - 0.04) <= half
    assert hits == [1899, 1407]  # 0.950 against 0.704


def test_a_failing_stage_stops_the_ladder_and_keeps_the_others(ladder_root, without_html):
    """grpo from a directory without ckpt.pt: train.py's one-line error ends the ladder."""
    before = checkpoint_times(ladder_root)
    missing = os.path.join(ladder_root, "nowhere")
    with pytest.raises(SystemExit) as failed:
        ladder.main(TINY_LADDER + [f"--out_root={ladder_root}", "--redo=grpo", f"--grpo.init_from={missing}"])
    message = str(failed.value)
    assert "stage grpo failed" in message and f"--init_from={missing} has no ckpt.pt" in message
    assert "`python train.py --algo sft" in message and "Traceback" not in message
    assert checkpoint_times(ladder_root) == before  # nothing else ran, nothing was lost
    assert not os.path.exists(os.path.join(ladder_root, "grpo", "ladder.json"))  # not done: rerun next time
    report = open(os.path.join(ladder_root, "report.md")).read()
    assert "| sft |" in report and "| grpo |" not in report


def test_a_stage_needs_its_start_and_teacher(tmp_path):
    """OPD distils the GRPO stage: asking for it without GRPO is an error before anything runs."""
    root = str(tmp_path / "ladder")
    with pytest.raises(ValueError, match="stage opd needs grpo, which has not run"):
        ladder.main(TINY_LADDER + [f"--out_root={root}", "--stages=pretrain,sft,opd"])
    with pytest.raises(ValueError, match="stage calc_grpo needs calc_sft, which has not run"):
        ladder.main(TINY_LADDER + [f"--out_root={root}", "--stages=calc_grpo"])
    assert not os.path.exists(os.path.join(root, "pretrain"))
    assert ladder.kl_reference("calc_grpo") == "calc_sft" and ladder.kl_reference("opd") == "sft"
    assert ladder.stage_arguments(root, "opd", dict(teacher="{out_root}/grpo"), "sft", {}, {})["teacher"] == \
        os.path.join(root, "grpo")


def test_missing_start_checkpoint_names_the_command(tmp_path):
    """(The command line's one-line form of the error: the failing-stage test above.)"""
    with pytest.raises(ValueError, match="--algo grpo starts from a trained policy.*`python train.py --algo sft"):
        options.check_start(dict(algo="grpo"))
    options.check_start(dict(algo="sft"))  # SFT may start from scratch
    missing = str(tmp_path / "pretrain")
    with pytest.raises(ValueError, match=f"--init_from={missing} has no ckpt.pt; make it with "
                                         f"`python train.py --algo pretrain --out_dir={missing}`"):
        options.check_start(dict(algo="sft", init_from=missing))


def test_train_tokens_sums_the_masked_targets(tiny):
    """SFT: the running total equals the loss-weighted target tokens of every batch, across a resume."""
    cfg = dict(tiny, **SFT_DATA, algo="sft", max_iters=2)
    T.train(cfg)
    run = T.train(dict(cfg, init_from="resume", max_iters=4))
    expected = sum(float(mask[:, 1:].sum()) for it in range(4) for step in sft.batches(run, run.state, it)[0] for _, mask in step)
    rows = [json.loads(line) for line in open(os.path.join(tiny["out_dir"], "metrics.jsonl"))]
    assert rows[-1]["train_tokens"] == expected and rows[-1]["tokens"] < expected


def test_the_readmes_commands_after_the_ladder(ladder_root, tmp_path):
    """The README's `python train.py --algo dpo ...` after `python ladder.py` starts from out/sft and
    writes out/my_dpo; `--init_from=resume` then continues that run (not the ladder's stage)."""
    os.symlink(ladder_root, tmp_path / "out")
    tiny = ["--train_prompts=8", "--heldout_prompts=4", "--batch_size=4", "--eval_interval=0", "--plot=False"]
    run = lambda *args: subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=tmp_path,
                                       capture_output=True, text=True)
    first = run("--algo", "dpo", "--beta=0.2", "--max_iters=2", *tiny)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "--init_from=out/sft" in first.stdout and "--out_dir=out/my_dpo" in first.stdout
    resumed = run("--algo", "dpo", "--init_from=resume", "--max_iters=3")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "my_dpo" / "metrics.jsonl")]
    assert [r["iter"] for r in rows if "loss" in r] == [2, 3]  # (logged at the end of each run: log_interval 10)
    assert json.load(open(tmp_path / "out" / "my_dpo" / "config.json"))["beta"] == 0.2
