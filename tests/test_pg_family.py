"""experiments/pg_family.py at toy size: the family's table and plot, and --kl_test, the KL claim as a one-factor test."""

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train as T  # noqa: E402
from conftest import SFT_DATA, TINY  # noqa: E402
from experiments import pg_family  # noqa: E402


def toy_study(tmp_path, name, *args):
    """pg_family.main at toy size from a two-iteration SFT: 2 iterations, each evaluated on 4 problems."""
    sft = str(tmp_path / "sft")
    T.train(dict(TINY, **SFT_DATA, algo="sft", max_iters=2, checkpoint=True, out_dir=sft))
    out = tmp_path / name
    pg_family.main(["--sft", sft, f"--out={out}", "--iters=2", "--eval_every=1", "--eval_problems=4", "--prompts=2",
                    "--group_size=2", "--set", "max_new_tokens=8", "--set", "eval_batch_size=8", "--set", "batch_size=4",
                    *args])
    return out


def test_kl_test_changes_the_kl_term_alone(tmp_path):
    """Each pair differs in kl_coef (0: no KL term) and in nothing else, every seed runs, and
    the printed per-seed differences are the runs' own final accuracies subtracted."""
    out = toy_study(tmp_path, "kl", "--kl_test", "--seeds=1,2,3")
    config = lambda name: json.load(open(out / name / "config.json"))
    ignore = {"kl_coef", "out_dir", "seed"}
    for with_kl, without in (("grpo_1", "grpo_no_kl_1"), ("cispo_kl_1", "cispo_1")):
        a, b = config(with_kl), config(without)
        assert (a["kl_coef"], b["kl_coef"]) == (0.04, 0.0)
        assert {k for k in a if a[k] != b.get(k)} <= ignore
    text = (out / "kl_test.md").read_text()
    final = lambda name: pg_family.curve(str(out / name))[-1][2]
    per_seed = [final(f"grpo_{s}") - final(f"grpo_no_kl_{s}") for s in (1, 2, 3)]
    line = next(l for l in text.splitlines() if l.startswith("- grpo:"))
    assert [float(x) for x in re.search(r"per seed ([^)]*)\)", line).group(1).split(", ")] == pytest.approx(per_seed, abs=1e-3)
    assert (out / "kl_test.png").exists()


def test_family_table_and_plot_at_toy_size(tmp_path, capsys):
    """The main comparison at toy size: two recipes and edge sampling on GRPO, the table's rows
    (the seeds' final accuracies), results.json and the plot of each arm's seed mean."""
    out = toy_study(tmp_path, "family", "--arms=grpo,cispo", "--seeds=1,2")
    results = json.load(open(out / "results.json"))["results"]
    assert set(results) == {"grpo", "cispo", "grpo_edge"} and all(len(c) == 2 for c in results.values())
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| grpo |")]
    assert rows and f"{results['grpo'][0][-1][2]:.3f}, {results['grpo'][1][-1][2]:.3f}" in rows[0]
    assert (out / "accuracy_vs_rollout_tokens.png").exists()


def test_a_learning_rate_sweep_runs_every_arm_at_every_rate(tmp_path):
    """--learning_rates: each arm at each rate (constant: min_lr the same), named ARM_lrLR, with LoRA at
    rank 1 through --set (docs/menu.md's LoRA-without-regret command at toy size), the new recipes among them."""
    out = toy_study(tmp_path, "sweep", "--arms=grpo,sapo", "--learning_rates=1e-3,3e-3", "--seeds=1", "--edge=",
                    "--set", "lora_rank=1")
    results = json.load(open(out / "results.json"))["results"]
    assert set(results) == {"grpo_lr0.001", "grpo_lr0.003", "sapo_lr0.001", "sapo_lr0.003"}
    config = json.load(open(out / "sapo_lr0.003_1" / "config.json"))
    assert (config["algo"], config["learning_rate"], config["min_lr"], config["lora_rank"]) == ("sapo", 3e-3, 3e-3, 1)
    assert (out / "sweep.md").exists() and (out / "accuracy_vs_learning_rate.png").stat().st_size > 1000


def test_the_sweep_pairs_each_arm_with_the_first_at_the_same_rate(tmp_path):
    """sweep's table: per seed, the arm's last held-out verdicts minus the first arm's at the same rate, on
    the same problems; over 3 seeds the mean and bands.paired_across_seeds' band (a worked example)."""
    verdicts = {("grpo", 1): [1, 0, 1, 0], ("grpo", 2): [1, 1, 0, 0], ("grpo", 3): [0, 0, 1, 0],
                ("sapo", 1): [1, 1, 1, 0], ("sapo", 2): [1, 1, 0, 0], ("sapo", 3): [1, 1, 1, 1]}
    results = {}
    for (arm, seed), v in verdicts.items():
        os.makedirs(tmp_path / f"{arm}_lr0.001_{seed}")
        with open(tmp_path / f"{arm}_lr0.001_{seed}" / "answers.jsonl", "w") as f:
            for it, answers in ((0, [0, 0, 0, 0]), (30, v)):  # the last evaluation is the one compared
                f.write(json.dumps({"iter": it, "split": "heldout", "answers": [{"verdict": x} for x in answers]}) + "\n")
        results.setdefault(f"{arm}_lr0.001", []).append([(0, 0, 0.0, 0, 0), (30, 1, sum(v) / 4, 0, 0)])
    pg_family.sweep(results, ["grpo", "sapo"], [1e-3], [1, 2, 3], 4, str(tmp_path))
    row = (tmp_path / "sweep.md").read_text().splitlines()[2]
    # per seed: +0.25, 0, +0.75; mean 1/3; t(0.975, 2)·SE = 4.303·0.3819/√3 = 0.949, and the per-problem
    # bands (1.96·sd/√4 of the differences: 0.490, 0, 0.490) add in variance: √(0.949² + 0.160) = 1.030
    assert row.startswith("| sapo | +0.333 ± 1.030 (per seed +0.250, +0.000, +0.750)"), row


def test_lora_regret_pairs_lora_at_ten_times_full_rate(tmp_path):
    """experiments/lora_regret.py's comparisons on a worked example: LoRA at 1e-3 against full at 1e-4 (the
    tenfold pair, and here the best against the best), paired per seed on the same problems, the rule's word."""
    from argparse import Namespace
    from experiments import lora_regret
    verdicts = {("full", 1): [1, 0, 1, 0], ("full", 2): [1, 1, 0, 0], ("full", 3): [0, 0, 1, 0],
                ("r1", 1): [1, 1, 1, 0], ("r1", 2): [1, 1, 0, 0], ("r1", 3): [1, 1, 1, 1]}
    for (name, seed), v in verdicts.items():
        run_dir = tmp_path / name / f"grpo_lr{1e-3 if name == 'r1' else 1e-4:g}_{seed}"
        os.makedirs(run_dir)
        with open(run_dir / "answers.jsonl", "w") as f:
            f.write(json.dumps({"iter": 30, "split": "heldout", "answers": [{"verdict": x} for x in v]}) + "\n")
    text = lora_regret.report(Namespace(out=str(tmp_path)), [("r1", 1, [1e-3]), ("full", 0, [1e-4])], [1, 2, 3])
    rows = [line for line in text.splitlines() if line.startswith("| r1 at 0.001 − full at 0.0001")]
    # the same differences as the sweep's worked example: +0.333 ± 1.030, too wide a band to say "matches"
    assert rows == [f"| r1 at 0.001 − full at 0.0001 ({kind}) | +0.333 ± 1.030 | +0.250, +0.000, +0.750 | "
                    f"a null (the band is too wide to say it matches) |" for kind in ("tenfold", "best against best")]
    # the columns are the rates 1e-4, 1e-3: r1 only at 1e-3 (3, 2, 4 of 4 right), full only at 1e-4 (2, 2, 1)
    assert "| r1 |  | 0.750 ± " in text and "| full | 0.417 ± " in text and " |  |\n" in text
