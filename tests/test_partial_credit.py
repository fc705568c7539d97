"""Partial credit for the correct prefix, normalised over the batch (lab/partial_credit.py): its advantages
on a worked example by hand, the correct prefix on both tasks, and the study that compares it with the
outcome alone (experiments/partial_credit.py) end to end at toy size."""

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import envs
import grpo
from lab import partial_credit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Steps:
    """An environment whose steps are the response's characters: "1" a right step, "0" a wrong one."""
    name = "steps"

    @staticmethod
    def step_rewards(problem, response):
        return [(k + 1, float(c)) for k, c in enumerate(response)] + [(len(response), problem["won"])]


def batch(monkeypatch, beta, shards):
    """lab/partial_credit.batches on hand-made shards (the sampler, the figures and the minibatches
    stubbed): (advantages per shard, figures)."""
    rollouts = [SimpleNamespace(reward=torch.tensor(won), problems=[{"won": w} for w in won], texts=texts)
                for won, texts in shards]
    monkeypatch.setattr(grpo, "sample_shards", lambda run, state, model, it: rollouts)
    monkeypatch.setattr(grpo, "rollout_figures", lambda run, state, shards: {})
    monkeypatch.setattr(grpo, "keep_rollouts", lambda run, it, shards: None)
    monkeypatch.setattr(grpo, "minibatches", lambda run, shards: shards)
    run = SimpleNamespace(cfg=dict(group_size=4, partial_beta=beta), env=Steps(), raw_model=None, ddp=False)
    shards, figures = partial_credit.batches(run, None, 0)
    return [ro.advantages for ro in shards], figures


def test_partial_credit_on_a_worked_example(monkeypatch):
    """Two groups of four in two shards. Group 1 has a win: O = 1 0 0 0, prefixes Φ = 3 3 1 1 (centred
    ±1). Group 2 all fail: O = 0, Φ = 2 0 0 0 (centred 1.5, −0.5 ×3). σ² = (4·1 + 1.5² + 3·0.5²)/8 = 7/8
    over both shards, so β/σ = 0.5/√(7/8) = √(2/7) = 0.534522; Â(O) of group 1 = √3, −1/√3 ×3."""
    won = [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]
    (a1, a2), figures = batch(monkeypatch, 0.5, [(won[0], ["111", "1110", "10", "1"]), (won[1], ["11", "0", "01", ""])])
    k = math.sqrt(2 / 7)
    torch.testing.assert_close(a1, torch.tensor([3 ** 0.5 + k, -1 / 3 ** 0.5 + k, -1 / 3 ** 0.5 - k, -1 / 3 ** 0.5 - k]))
    torch.testing.assert_close(a2, k * torch.tensor([1.5, -0.5, -0.5, -0.5]))
    torch.testing.assert_close(a1, torch.tensor([2.266573, -0.042828, -1.111873, -1.111873]), atol=1e-6, rtol=0)
    # the partial credit's share of the advantage mass: Σ|β·Φ̃| = 7k = 3.741657 against Σ|Â(O)| = 2√3 = 3.464102
    assert figures["shaping_adv_share"] == pytest.approx(7 * k / (7 * k + 2 * 3 ** 0.5)) == pytest.approx(0.519259, abs=1e-6)
    assert figures["correct_prefix"] == pytest.approx((3 + 3 + 1 + 1 + 2) / 8)
    # the all-fail group: its |A| is the partial credit alone, 3k = 1.603567 of the batch's Σ|A| = 6.136714
    assert float(a2.abs().sum() / (a1.abs().sum() + a2.abs().sum())) == pytest.approx(0.261307, abs=1e-6)
    # lab/rlvp.py's z-score per group gives that group β·Σ|Â(Φ)| = √3 whatever its spread (Φ = 2 0 0 0 or
    # 1 0 0 0); here the smaller spread (Φ = 1 0 0 0: centred 0.75, −0.25 ×3) gets less: β·1.5/σ, σ² = (4 + 0.75)/8
    (_, b2), _ = batch(monkeypatch, 0.5, [(won[0], ["111", "1110", "10", "1"]), (won[1], ["1", "0", "01", ""])])
    assert float(b2.abs().sum()) == pytest.approx(0.5 * 1.5 / math.sqrt(4.75 / 8), abs=1e-6)
    assert float(b2.abs().sum()) == pytest.approx(0.973329, abs=1e-6)
    for phi in ([2.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]):  # lab/rlvp.py's β·Â(Φ) in that group
        assert float(0.5 * grpo.group_advantages(torch.tensor(phi), 4).abs().sum()) == pytest.approx(3 ** 0.5)
    # β = 0: GRPO's advantages exactly (the study's outcome arm), and no share
    (c1, c2), figures = batch(monkeypatch, 0.0, [(won[0], ["111", "1110", "10", "1"]), (won[1], ["11", "0", "01", ""])])
    assert torch.equal(c1, grpo.group_advantages(torch.tensor(won[0]), 4)) and not c2.any()
    assert figures["shaping_adv_share"] == 0.0
    # no prefix differs within any group: σ = 0, the outcome alone
    (d1, d2), figures = batch(monkeypatch, 0.5, [(won[0], ["1", "1", "1", "1"]), (won[1], ["0", "", "0", "01"])])
    assert torch.equal(d1, grpo.group_advantages(torch.tensor(won[0]), 4)) and not d2.any()


def test_the_correct_prefix_counts_the_right_steps_before_the_first_wrong_one():
    """Φ on the two tasks: the worked chain's equations (a wrong one ends the prefix, even if later ones
    are right) and the treasure hunt's calls that bring the chest one action nearer."""
    arithmetic = envs.Arithmetic(n_ops=3)
    p = {"prompt": "What is 7 + 8 - 3 + 5?", "answer": 17, "start": 7, "steps": [("+", 8), ("-", 3), ("+", 5)]}
    treasure = envs.Treasure()
    m = treasure.problems("train", 1)[0]
    plan = m["answer"].split(", ")
    from test_treasure import play
    rows = [(arithmetic, p, "7+8=15. 15-3=12. 12+5=17. Answer: 17", 3), (arithmetic, p, "7+8=15. 15-3=11. 11+5=16. Answer: 16", 1),
            (arithmetic, p, "7+8=14. 15-3=12. 12+5=17. Answer: 17", 0), (arithmetic, p, "Answer: 17", 0),
            (treasure, m, treasure.solve(m), 11), (treasure, m, play(m, plan[:2] + ["fight"] + plan[2:]), 2),
            (treasure, m, play(m, plan[:5]), 5)]
    for env, problem, text, prefix in rows:
        run = SimpleNamespace(env=env)
        ro = SimpleNamespace(problems=[problem], texts=[text], reward=torch.zeros(1))
        assert partial_credit.correct_prefixes(run, ro).tolist() == [prefix], text


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study at toy size, once: --quick, every task, three seeds."""
    out = tmp_path_factory.mktemp("partial_credit")
    subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "partial_credit.py"), "--quick", f"--out={out}"],
                   check=True, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return out, json.load(open(out / "results.json"))


def test_the_study_runs_at_toy_size_and_pairs_the_arms_on_the_same_problems(study):
    out, results = study
    assert (out / "partial_credit.md").is_file() and (out / "partial_credit.png").stat().st_size > 0
    assert list(results["tasks"]) == ["chains5", "chains6", "treasure"] and results["seeds"] == [1337, 1338, 1339]
    for task, tr in results["tasks"].items():
        n = tr["problems"]
        assert n == 4 and len(tr["start"]["sampled"]) == n and len(tr["start"]["greedy"]) == n
        assert all(v in (0.0, 0.5, 1.0) for v in tr["start"]["sampled"])  # the mean of 2 samples per problem
        for arm, seeds in tr["arms"].items():
            assert list(seeds) == ["1337", "1338", "1339"]
            for seed, r in seeds.items():
                assert len(r["sampled"]) == n and all(len(r["curve"][key]) == 2 for key in r["curve"])  # 2 iterations
                assert all(0.0 <= v <= 1.0 for v in r["curve"]["shaping_adv_share"])
                if arm == "outcome":
                    assert r["curve"]["shaping_adv_share"] == [0.0, 0.0]  # β = 0: no partial credit, by construction
                config = json.load(open(out / f"{task}_{arm}_{seed}" / "config.json"))
                assert config["partial_beta"] == dict(outcome=0.0, partial=0.5)[arm]
                assert config["env_midstart_frac"] == (0.5 if task == "treasure" else 0.0)
                assert config["env_ops"] == dict(chains5=5, chains6=6, treasure=3)[task]
        # the paired difference per seed is partial's mean minus outcome's on the same problems
        mean = lambda values: sum(values) / len(values)
        per_seed = [mean(tr["arms"]["partial"][s]["sampled"]) - mean(tr["arms"]["outcome"][s]["sampled"])
                    for s in ("1337", "1338", "1339")]
        assert tr["summary"]["partial − outcome"]["sampled"]["per_seed"] == pytest.approx(per_seed)
        assert tr["summary"]["verdict"] in ("partial higher", "partial lower", "null (within the band)")
    # the chains' held-out problems are distinct equations; the treasure hunt's are census maps
    from experiments.partial_credit import heldout
    problems = heldout(envs.Arithmetic(n_ops=5), 256)
    assert len({(p["start"], tuple(p["steps"])) for p in problems}) == 256
    assert {tuple(p["names"].values()) for p in heldout(envs.Treasure(), 87)} == set(envs.Treasure.census())
