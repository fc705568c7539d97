"""The benchmark scripts run at a tiny size (their figures mean nothing here): experiments/gpu_check.py
on the CPU, and the project's side of experiments/peers.py on the peer workloads in experiments/peer_bench."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "experiments", "peer_bench")


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_on_cpu_at_quick_size(tmp_path):
    """Every part a CPU can run (all but the torchrun rows), each row on disk as it is measured."""
    pytest.importorskip("transformers")
    gpu_check = load_script("gpu_check")
    rows = gpu_check.main(["--device=cpu", "--quick", f"--out={tmp_path / 'gpu_check.jsonl'}"])
    kinds = [r["row"] for r in rows]
    assert kinds == ["machine", "decode", "decode", "numerics"] + ["algorithm"] * 7 + ["sampling"] * 2 + ["done"]
    assert all(r["ok"] for r in rows if "ok" in r), [r for r in rows if not r.get("ok", True)]
    assert [r["algo"] for r in rows if r["row"] == "algorithm"] == list(gpu_check.ALGOS)
    numerics = rows[3]
    assert numerics["ratio_dev"] == 0.0 and numerics["sampler_gap"] < 1e-5  # fp32 on a CPU
    assert all(r["ours_tok_s"] > 0 and r["transformers_tok_s"] > 0 for r in rows if r["row"] == "sampling")
    import envs
    assert envs.Arithmetic.verify({"answer": 3}, "Answer: 3") == 1.0  # the real verifier is back


def test_peers_rewrites_its_block_of_the_page_with_targets_and_the_previous_run(tmp_path):
    """experiments/peers.py's page block: each ratio beside its target (met or **no**) and the previous
    run's ratio; a second run replaces the block and keeps the page around it."""
    peers = load_script("peers")
    row = lambda workload, ratio: dict(workload=workload, unit="tok/s", project=2000.0, peer=1000.0, ratio=ratio,
                                       ratio_min=ratio - 0.1, ratio_max=ratio + 0.1, pairs=3)
    box = dict(cpu="Some CPU", cores=2, capability="AVX512", capability_env="", torch="2.13.0")
    first = dict(rows=[row("sampling batch 64, 1 thread", 1.7)], date="2026-12-04", repeats=3, minutes=21.0, machine=box)
    second = dict(first, date="2026-12-06", rows=[row("sampling batch 64, 1 thread", 1.9),
                                                  row("dpo vs TRL DPOTrainer (reference cached)", 3.2),
                                                  row("grpo 2x8x32 vs TRL GRPOTrainer, no KL", 2.0)])
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nabove\n")
    peers.write_doc(str(page), first, None)
    open(page, "a").write("\nbelow\n")
    peers.write_doc(str(page), second, first)
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nabove\n") and text.endswith("\nbelow\n") and text.count(peers.BEGIN) == 1
    assert "on 2026-12-06: Some CPU, 2 cores, torch 2.13.0 with CPU capability AVX512" in text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[0].endswith("| previous (2026-12-04, AVX512) |")
    assert lines[1:] == [
        "| sampling batch 64, 1 thread | tok/s | 2,000.0 | 1,000.0 | 1.90 [1.80..2.00] (3) | ≥ 2× | **no** | 1.70 [1.60..1.80] |",
        "| dpo vs TRL DPOTrainer (reference cached) | tok/s | 2,000.0 | 1,000.0 | 3.20 [3.10..3.30] (3) | ≥ 3× | yes | – |",
        "| grpo 2x8x32 vs TRL GRPOTrainer, no KL | tok/s | 2,000.0 | 1,000.0 | 2.00 [1.90..2.10] (3) | – | – | – |"]


def test_profile_phases_split_the_loop_and_bookkeeping_is_the_rest(tmp_path):
    """experiments/profile_loop.py: sampling inside batches() is its own phase, the rest of batches()
    another, and what the named phases leave of the loop is bookkeeping; per iteration. A start
    checkpoint is copied with model_args cut to the profiled checkout's GPTConfig (here all of them)."""
    profile = load_script("profile_loop")
    raw = dict(loop=10.0, spent={"batches": 3.0, "sampling": 2.0, "loss": 1.5, "backward": 2.5, "optimizer": 0.5,
                                 "evaluate": 1.0, "eval sampling": 0.8, "save_checkpoint": 0.2, "plot_metrics": 0.3})
    per = profile.phases(raw, iters=10)
    assert per == pytest.approx({"sampling": 0.2, "batches rest": 0.1, "forward": 0.15, "backward": 0.25,
                                 "optimizer": 0.05, "evaluation": 0.1, "checkpoint": 0.02, "plot": 0.03,
                                 "bookkeeping": 0.1})
    assert list(per) == profile.PHASES
    import torch
    from test_opd import write_checkpoint
    start = write_checkpoint(tmp_path / "sft", seed=1, n_layer=1, n_embd=64)
    copy = profile.converted(ROOT, start, str(tmp_path / "copy"))
    before, after = (torch.load(os.path.join(d, "ckpt.pt"), weights_only=False) for d in (start, copy))
    assert after["model_args"] == before["model_args"] and all(torch.equal(after["model"][k], v) for k, v in before["model"].items())


@pytest.mark.slow  # a script's smoke run at toy size: `-m slow`
def test_peers_project_side_runs_the_peer_workloads(tmp_path):
    """The project's side of each peer workload, as the driver runs it: sampling beside transformers'
    generate on the peer model's weights; GRPO on the peers' random-text task makes exactly L tokens per
    response (as the peers' min_new_tokens), with KL on; SFT trains on the peers' 16 x 128 rows."""
    pytest.importorskip("transformers")
    env = dict(os.environ, PERF_DIR=str(tmp_path), PROJECT_DIR=ROOT, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    os.makedirs(tmp_path / "data")
    subprocess.run([sys.executable, os.path.join(BENCH, "side_by_side", "prep.py")], env=env, check=True,
                   capture_output=True, timeout=300)
    results = {}
    side = subprocess.run([sys.executable, "gen_side.py", "1"], cwd=os.path.join(BENCH, "side_by_side"), env=env,
                          capture_output=True, text=True, timeout=300)  # the sampling pairs: both sides in one process
    assert side.returncode == 0, side.stderr[-2000:]
    cases = json.loads(side.stdout.strip().splitlines()[-1])["cases"]
    assert sorted(cases) == ["b1", "b64", "b8"] and all(c["project_median_tok_s"] > 0 for c in cases.values())
    for workload in ("grpo_kl:2x8x32", "sft"):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "peers.py"), f"--worker={workload}",
                               f"--perf_dir={tmp_path}", "--tiny"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        results[workload] = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in open(tmp_path / "out" / "grpo_kl_2x8x32" / "metrics.jsonl")]
    assert all(r["len_mean"] == 32 for r in rows) and rows[-1]["iter"] == 4
    assert json.load(open(tmp_path / "out" / "grpo_kl_2x8x32" / "config.json"))["kl"] == "k3_loss"
    assert results["grpo_kl:2x8x32"]["completion_tokens_per_s"] > 0
    assert results["sft"]["tokens_per_s"] > 0 and len(results["sft"]["steady_periods"]) == 3


@pytest.mark.slow  # a script's smoke run at toy size: `-m slow`
def test_bench_loop_dpo_and_shared_prompt_figures_at_tiny_size(tmp_path):
    """experiments/bench.py's train_loop pairs a bare step with every shared iteration after the warm-up,
    dpo_step times DPO with and without shared prompts, and rl_shared_prompt samples G copies of
    each prompt against as many distinct prompts; allocator runs SFT in fresh processes with malloc's
    thresholds raised and not, to the same losses."""
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "bench.py"), "train_loop", "dpo_step", "rl_shared_prompt", "allocator",
                           "sampler_against", f"--against={os.path.join(ROOT, 'sampler.py')}", "--tiny", f"--out={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    measurements = json.load(open(out))["measurements"]
    against = [r for r in measurements if r.get("bench") == "sampler_against" and "case" in r]
    assert len(against) == 3 and all(r["same_tokens"] and r["max_logprob_gap"] == 0 for r in against)  # itself
    rows = {r["bench"]: r for r in measurements if "bench" in r and "seconds" not in r}
    loop = rows["train_loop"]
    assert loop["pairs_timed"] == 2 and loop["shared_vs_bare"] > 0 and loop["bare_iter_ms"] > 0  # 4 iterations, 1 warm-up
    assert rows["dpo_step"]["dpo_shared_prompt_step_ms"] > 0 and rows["dpo_step"]["dpo_vs_sft"] > 0
    prefill = rows["rl_shared_prefill"]
    assert prefill["distinct_prompts"] < prefill["responses"] and prefill["repeated_ms"] > 0
    assert rows["allocator"]["losses_equal"] and rows["allocator"]["iters_timed"] == 2
