"""Golden trajectories: every algorithm runs three iterations on the tiny model from a fixed start, and
every figure it logs (losses, rewards, advantages, KLs, gradient norms, held-out accuracy) must equal
the values stored in tests/golden.json. A change that does not mean to change results (a refactor, a
speed-up) must pass this unchanged. A new run's entry is added, and only an entry that a change means to
change is rewritten, on purpose:

    GOLDEN_WRITE=1 python -m pytest -q tests/test_golden.py        # adds the missing entries; the others are compared
    GOLDEN_WRITE=rewrite python -m pytest -q tests/test_golden.py -k NAME   # rewrites NAME's entry
    git diff tests/golden.json                                     # then review

Tolerance (mismatches): 1e-4 of the figure plus 1e-3 of its key's largest value in the run plus 1e-5. Across x86
CPU kernels (ATEN_CPU_CAPABILITY=default, avx2 and avx512 on one AVX-512 machine, 1 thread) the figures
differ by at most 4e-5 relative, except those that are differences of near-equal numbers (DPO's
implicit rewards near zero, up to 3e-3 relative; an RM's offset, 7e-4; a ratio's deviation from 1
at the first step, 7e-7 against 5e-7), which the other two terms cover;
a change of one constant in a loss moves them by far more (test_a_changed_loss_constant_fails).
Timings are not compared. The start is 30 seeded SFT iterations; the verifier is replaced by a fixed coin
(crc32 of the answer), so that every group has rewards to rank whatever the random model writes."""

import json
import math
import os
import zlib

import pytest

import envs
import train as T
from conftest import SFT_DATA, TINY
from test_opd import write_checkpoint

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
RTOL, ATOL, FLOOR = 1e-4, 1e-3, 1e-5  # of the figure, of its key's largest |value|, absolute (mismatches)
RL = dict(prompts_per_iter=4, max_new_tokens=12, eval_samples=2, warmup_iters=0)
RUNS = {  # name: the run's overrides on top of TINY (3 iterations, one evaluation at the end)
    "pretrain": dict(algo="pretrain", **SFT_DATA),
    "sft": dict(algo="sft", **SFT_DATA),
    "rm": dict(algo="rm", train_prompts=16, heldout_prompts=8, warmup_iters=0),
    "dpo": dict(algo="dpo", train_prompts=16, heldout_prompts=8, warmup_iters=0),
    "ppo": dict(algo="ppo", batch_size=4, minibatches=2, inner_epochs=2, max_new_tokens=12, prompt_pool=64,
                learning_rate=1e-3, min_lr=1e-3, warmup_iters=0, eval_samples=2),
    "grpo": dict(algo="grpo", group_size=4, learning_rate=1e-3, min_lr=1e-3, **RL),
    # (with DAPO's token-mean loss: composed in trajectory)
    "grpo_rloo": dict(algo="rloo", group_size=4, minibatches=2, learning_rate=1e-3, min_lr=1e-3, **RL),
    "grpo_cispo": dict(algo="cispo", clip_eps=1.0, clip_eps_high=0.28, kl_coef=0.0, group_size=4,
                       minibatches=2, learning_rate=1e-3, min_lr=1e-3, **RL),
    # the menu (docs/menu.md): Muon for SFT and pre-training, DFT, MaxRL, SAPO and DPPO (two minibatches: the ratio acts)
    "muon": dict(algo="muon", **SFT_DATA),
    "muon_pretrain": dict(algo="muon", pretrain=True, **SFT_DATA),
    "dft": dict(algo="dft", **SFT_DATA),
    "grpo_maxrl": dict(algo="maxrl", group_size=4, learning_rate=1e-3, min_lr=1e-3, **RL),
    "grpo_sapo": dict(algo="sapo", group_size=4, minibatches=2, learning_rate=1e-3, min_lr=1e-3, **RL),
    "grpo_dppo": dict(algo="dppo", group_size=4, minibatches=2, learning_rate=1e-3, min_lr=1e-3, **RL),
    # partial credit for the correct prefix, normalised over the batch (lab/partial_credit.py; docs/rlvp.md)
    "grpo_partial_credit": dict(algo="partial_credit", group_size=4, learning_rate=1e-3, min_lr=1e-3, **RL),
    "opd": dict(algo="opd", group_size=2, learning_rate=1e-3, min_lr=1e-3, **RL),
    "rft": dict(algo="rft", rounds=1, round_prompts=8, group_size=4, per_prompt_cap=2, max_new_tokens=12,
                eval_samples=2, warmup_iters=0),
}
# One name per idea: figures renamed since golden.json was written, {run: {stored name: logged name}},
# and figures a plain algorithm no longer logs (OPD's anchor_kl, always 0 without lab/opsd.py's anchor)
RENAMED_FIGURES = {"opd": {"reward": "verifier_acc"}, "rft": {"cand_acc": "verifier_acc"}}
DROPPED_FIGURES = {"opd": ("anchor_kl",)}
STARTS_FROM_A_POLICY = ("rm", "dpo", "ppo", "grpo", "grpo_rloo", "grpo_cispo", "grpo_maxrl", "grpo_sapo", "grpo_dppo",
                        "grpo_partial_credit", "opd", "rft")
# Figures the GRPO family logged of every run, that plain GRPO no longer logs: their value in a run without
# DAPO's dynamic sampling or reward shaping (lab/dapo.py logs them), filled in before the comparison
PLAIN_GRPO_FIGURES = dict(reward_shaped=lambda row: row["reward"], kept_groups_frac=lambda row: 1.0,
                          extra_rollouts=lambda row: 0.0)


def coin(problem, response):
    """The verifier's stand-in: 0 or 1, fixed by the answer's text (the same in every process)."""
    return float(zlib.crc32(response.encode()) % 2)


def coin_steps(env, problem, response):
    """The step judge's stand-in (for partial credit, whose random-model answers hold no right
    equation): a step every 3 characters, right or wrong by the coin of the text so far; the outcome last."""
    return [(k, coin(problem, response[:k])) for k in range(3, len(response) + 1, 3)] + [(len(response), coin(problem, response))]


@pytest.fixture(scope="module")
def starts(tmp_path_factory):
    """(the policy every run after SFT starts from: 30 SFT iterations from scratch, so that some answers
    end; a random teacher of another shape for OPD)."""
    root = tmp_path_factory.mktemp("golden")
    T.train(dict(TINY, **SFT_DATA, algo="sft", max_iters=30, batch_size=8, learning_rate=3e-3, out_dir=str(root / "sft")))
    return str(root / "sft"), write_checkpoint(root / "teacher", seed=1, n_layer=1, n_embd=64)


def figures(out_dir):
    """Every logged figure but the timings: [{key: value}] per metrics.jsonl row."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return [{k: v for k, v in row.items() if not any(w in k for w in ("time", "per_s")) and isinstance(v, (int, float))} for row in rows]


def trajectory(name, starts, out_dir, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin))
    if name == "grpo_partial_credit":
        monkeypatch.setattr(envs.Arithmetic, "step_rewards", coin_steps)
    policy, teacher = starts
    overrides = dict(TINY, **RUNS[name], max_iters=3, eval_interval=3, eval_at_start=False, out_dir=str(out_dir))
    if name in STARTS_FROM_A_POLICY:
        overrides["init_from"] = policy
    if name == "opd":
        overrides["teacher"] = teacher
    if name == "grpo_rloo":  # RLOO's advantages with DAPO's token-mean loss
        import grpo
        from lab.dapo import token_mean
        monkeypatch.setattr(grpo, "seq_mean_token_mean", token_mean)
    T.train(overrides)
    rows = figures(out_dir)
    if name.startswith("grpo"):
        for row in rows:
            row.update({key: value(row) for key, value in PLAIN_GRPO_FIGURES.items() if "reward" in row})
    return rows


def as_logged_now(name, rows):
    """The stored rows of run `name` under today's figure names (RENAMED_FIGURES, DROPPED_FIGURES)."""
    renamed, dropped = RENAMED_FIGURES.get(name, {}), DROPPED_FIGURES.get(name, ())
    return [{renamed.get(k, k): v for k, v in row.items() if k not in dropped} for row in rows]


def mismatches(got, want):
    """Where two trajectories differ beyond the tolerance: a list of 'row k: key got vs want'. A figure
    matches when |got - want| <= RTOL·|want| + ATOL·(its largest |value| over the stored rows) + FLOOR:
    the second term covers figures that are differences of near-equal numbers (DPO's implicit
    rewards, β·(log π_θ - log π_ref) with log-probs near -200; an RM's arbitrary offset), whose
    rounding error is set by the numbers they are made of, not by their own size."""
    out = [f"{len(got)} rows, {len(want)} stored"] if len(got) != len(want) else []
    scale = {key: max(abs(row[key]) for row in want if key in row) for row in want for key in row}
    for k, (g, w) in enumerate(zip(got, want)):
        for key in sorted(set(g) | set(w)):
            a, b = g.get(key), w.get(key)
            if key == "pref_acc" and abs(w.get("margin", 1.0)) < 1e-4:
                continue  # π_θ = π_ref (DPO's first step): each margin is rounding noise, its sign a coin
            if a is None or b is None or not (abs(a - b) <= RTOL * abs(b) + ATOL * scale[key] + FLOOR
                                              or (math.isnan(a) and math.isnan(b))):
                out.append(f"row {k} (iter {g.get('iter')}): {key} {a!r} vs stored {b!r}")
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_trajectory(name, starts, tmp_path, monkeypatch):
    got = trajectory(name, starts, tmp_path / name, monkeypatch)
    stored = json.load(open(GOLDEN)) if os.path.exists(GOLDEN) else {}
    if os.environ.get("GOLDEN_WRITE") == "rewrite" or (os.environ.get("GOLDEN_WRITE") and name not in stored):
        stored[name] = got
        with open(GOLDEN, "w") as f:
            json.dump(dict(sorted(stored.items())), f, indent=0)
        pytest.skip("tests/golden.json written")
    assert name in stored, f"no stored trajectory for {name}: GOLDEN_WRITE=1 python -m pytest tests/test_golden.py"
    assert len(got) >= 4 and any(row.get("loss") for row in got)  # three logged iterations and an evaluation
    want = as_logged_now(name, stored[name])
    assert not mismatches(got, want), "\n".join(mismatches(got, want)[:20])


def test_a_changed_loss_constant_fails(starts, tmp_path, monkeypatch):
    """The comparison can fail: PPO with the value loss's coefficient c_v moved from 0.5 to 0.49 (one
    constant of its loss) no longer matches its stored trajectory."""
    monkeypatch.setitem(RUNS, "ppo", dict(RUNS["ppo"], vf_coef=0.49))
    got = trajectory("ppo", starts, tmp_path / "changed", monkeypatch)
    assert mismatches(got, json.load(open(GOLDEN))["ppo"])
