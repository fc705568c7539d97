"""Reward model and the shared preference data: Bradley–Terry worked examples (SPEC §5), the
last-token read-out, learning a separable preference, built-in pairs, malformed rows, LoRA."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import options
import pairs
import rm
import train as T
from checkpoints import build_model, load_model
from envs import parse_answer
from rollouts import response_text, rollouts, score_responses
from tokenizer import Tokenizer


def rm_config(tiny, **overrides):
    return dict(tiny, algo="rm", **overrides)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def test_bradley_terry_worked_example():
    # SPEC §5 / M14 §5: Δr = 0.5, 1, 2, 4 -> 0.622, 0.731, 0.881, 0.982; 75% wins -> Δr = log 3 ≈ 1.099
    probs = rm.bradley_terry(torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64))
    assert [round(p, 3) for p in probs.tolist()] == [0.622, 0.731, 0.881, 0.982]
    margin = rm.bradley_terry_margin(torch.tensor(0.75, dtype=torch.float64))
    assert round(margin.item(), 3) == 1.099
    assert margin.item() == pytest.approx(math.log(3), abs=1e-12)
    assert rm.bradley_terry(margin).item() == pytest.approx(0.75, abs=1e-12)


def test_score_reads_the_last_response_token():
    # a stand-in reward model whose value at (row i, position j) is 100·i + j: the read-out position shows
    ids = torch.zeros(3, 8, dtype=torch.long)
    mask = torch.zeros(3, 7)
    mask[0, 2:5] = 1  # response tokens ids[0, 3..5] -> position 5
    mask[1, 0:7] = 1  # ends at the last column -> position 7
    mask[2, 4] = 1    # a one-token response ids[2, 5] -> position 5
    stand_in = lambda x: 100 * torch.arange(3.0)[:, None] + torch.arange(x.size(1), dtype=torch.float32)
    assert score_responses(stand_in, ids, mask).tolist() == [5.0, 107.0, 205.0]
    mask[2] = 0
    with pytest.raises(ValueError, match=r"rows \[2\] have no response token"):
        score_responses(stand_in, ids, mask)


def test_score_of_rollouts_is_the_scalar_at_the_end_token(tiny):
    # score_responses() on rollouts output picks the head's value at the last sampled token of each row
    run = T.train(rm_config(tiny, max_iters=0, pairs="style", train_prompts=4, heldout_prompts=2))
    problems = run.env.problems("heldout", 3, seed=0)
    roll = rollouts(run, run.raw_model.gpt, problems, 2, temperature=1.0, max_new_tokens=12, seed=0)
    with torch.no_grad():
        values = run.raw_model(roll.ids)
        got = score_responses(run.raw_model, roll.ids, roll.mask)
    for i in range(len(got)):
        last = len(run.tok.prompt_ids(roll.problems[i]["prompt"])) + int(roll.lengths[i]) - 1
        assert got[i].item() == pytest.approx(values[i, last].item(), abs=1e-6)


def test_builtin_pairs_verifier_style_both(tiny):
    for kind in ("verifier", "style", "both"):
        run = T.train(rm_config(tiny, max_iters=0, pairs=kind, train_prompts=12, heldout_prompts=6,
                                group_size=3, out_dir=tiny["out_dir"] + kind))
        problems = {run.tok.decode(p["prompt"]): p for split in ("train", "heldout")
                    for p in [dict(q, prompt=run.tok.prompt_ids(q["prompt"])) for q in
                              run.env.problems(split, 12 if split == "train" else 6, seed=1)]}
        train_prompts = {run.tok.decode(ex["prompt"]) for ex in run.state.train_pairs}
        heldout_prompts = {run.tok.decode(ex["prompt"]) for ex in run.state.heldout_pairs}
        assert train_prompts and heldout_prompts and not train_prompts & heldout_prompts
        n_style = 0
        for ex in run.state.train_pairs + run.state.heldout_pairs:
            problem = problems[run.tok.decode(ex["prompt"])]
            chosen, rejected = (response_text(run, r) for r in ex["responses"])
            assert run.env.verify(problem, chosen) == 1.0  # chosen is always verified correct
            style = run.env.verify(problem, rejected) == 1.0
            if style:  # a style pair: same answer, padded, longer
                assert parse_answer(rejected) == parse_answer(chosen) and len(rejected) > len(chosen) + 15
                n_style += 1
            assert len(ex["prompt"]) + max(map(len, ex["responses"])) <= run.cfg["block_size"]
        n = len(run.state.train_pairs) + len(run.state.heldout_pairs)
        assert n_style == {"verifier": 0, "style": n, "both": n_style}[kind]
        if kind == "both":  # one style pair per prompt, plus the verifier pairs
            assert n_style == 18 and n > n_style


def separable_rows(n, seed):
    """Pairs whose chosen answer ends in 'yes', rejected in 'no', on varied prompts."""
    rng = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        a, b = torch.randint(0, 50, (2,), generator=rng).tolist()
        rows.append({"prompt": f"Is {a} + {b} fine?", "chosen": f"{a + b} yes", "rejected": f"{a + b} no"})
    return rows


def test_rm_learns_a_separable_preference(tiny, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", separable_rows(80, seed=0))
    run = T.train(rm_config(tiny, data=path, max_iters=40, batch_size=8, eval_interval=40, learning_rate=3e-3))
    assert run.metrics["val_pair_acc"] == 1.0      # 8 held-out pairs, all ordered
    assert run.metrics["val_margin"] > 2.0         # P(chosen ≻ rejected) = σ(margin) > 0.88
    assert run.metrics["val_loss"] < 0.1 < math.log(2)  # log 2: the loss at margin 0
    # the checkpoint is a scalar model that T.load_model gives back with the same scores
    loaded = load_model(run.cfg["out_dir"])
    batch = pairs.collate(run, run.state.heldout_pairs)
    with torch.no_grad():
        assert torch.allclose(score_responses(loaded, batch["ids"], batch["mask"]),
                              score_responses(run.raw_model, batch["ids"], batch["mask"]), atol=1e-5)


def test_rm_with_lora(tiny, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", separable_rows(40, seed=1))
    before = build_model(options.make_config(rm_config(tiny)), Tokenizer("byte"))
    run = T.train(rm_config(tiny, data=path, max_iters=4, lora_rank=2))
    model = run.raw_model
    # frozen base weights unchanged, LoRA factors and the scalar head trained
    base = model.gpt.transformer.h[0].attn.c_attn.base.weight
    assert torch.equal(base, before.transformer.h[0].attn.c_attn.weight) and not base.requires_grad
    assert model.gpt.transformer.h[0].attn.c_attn.lora_B.abs().sum() > 0
    assert model.head.weight.requires_grad
    loaded = load_model(run.cfg["out_dir"])  # LoRA merged into W
    batch = pairs.collate(run, run.state.heldout_pairs)
    with torch.no_grad():
        assert torch.allclose(score_responses(loaded, batch["ids"], batch["mask"]),
                              score_responses(model, batch["ids"], batch["mask"]), atol=1e-5)


GOOD = {"prompt": "Say hi", "chosen": "hi", "rejected": "no"}
MALFORMED = [  # (row, field named in the error)
    ({"prompt": "Say hi", "chosen": "hi"}, "rejected"),                           # missing field
    ({"prompt": "Say hi", "chosen": "same", "rejected": "same"}, "rejected"),     # chosen identical to rejected
    ({"prompt": "Say hi", "chosen": "  ", "rejected": "no"}, "chosen"),           # empty response
    ({"prompt": "Say hi", "chosen": "hi", "rejected": "x" * 200}, "rejected"),    # too long for block_size
    ({"prompt": 7, "chosen": "hi", "rejected": "no"}, "prompt"),                  # wrong type
    ({"prompt": [{"role": "user"}], "chosen": "hi", "rejected": "no"}, "prompt[0].content"),
    ({"prompt": "Say hi", "chosen": [{"role": "user", "content": "hi"}], "rejected": "no"}, "chosen"),
]


@pytest.mark.parametrize("row,field", MALFORMED)
def test_malformed_pair_row_names_file_row_field(tiny, tmp_path, row, field):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, row, GOOD])
    with pytest.raises(ValueError) as err:
        T.train(rm_config(tiny, data=path, max_iters=1))
    message = str(err.value)
    assert path in message and "row 3" in message and f"field {field!r}" in message


def test_skip_bad_rows_counts_them(tiny, tmp_path):
    rows = [GOOD] * 12 + [row for row, _ in MALFORMED]
    rows.insert(5, {"prompt": [{"role": "user", "content": "Hi"}],
                    "chosen": [{"role": "assistant", "content": "Hello"}], "rejected": "Go"})  # messages: fine
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    run = T.train(rm_config(tiny, data=path, max_iters=1, skip_bad_rows=True))
    assert run.state.skipped_rows == len(MALFORMED)
    assert len(run.state.train_pairs) + len(run.state.heldout_pairs) == 13


def test_rm_refuses_single_examples(tiny, tmp_path):
    path = write_jsonl(tmp_path / "kto.jsonl", [{"prompt": "a", "completion": "b", "label": True}] * 3)
    with pytest.raises(ValueError, match="needs pairs"):
        T.train(rm_config(tiny, data=path, max_iters=1))
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [GOOD] * 3 + [{"prompt": "a", "completion": "b", "label": False}])
    with pytest.raises(ValueError, match="mixes pair rows"):
        T.train(rm_config(tiny, data=mixed, max_iters=1))


@pytest.mark.slow
def test_overoptimisation_experiment_runs_at_toy_size(tmp_path):
    """experiments/overoptimisation.py --quick end to end (~40 s): a proxy RM on few verifier pairs,
    Best-of-N at N = 1, 2, 4 (KL = log N − (N − 1)/N, the proxy of the kept answer never below the
    mean), PPO against the proxy binned over iterations, the table and the plot."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "experiments", "overoptimisation.py"), "--quick",
                           f"--out={tmp_path}"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    bon = results["best_of_n"]
    assert [p["N"] for p in bon] == [1, 2, 4] and bon[0]["proxy"] == pytest.approx(0.0, abs=1e-5)
    assert [p["kl"] for p in bon] == pytest.approx([0.0, math.log(2) - 0.5, math.log(4) - 0.75])
    assert all(p["proxy"] >= -1e-5 for p in bon)  # the top of N scores at least the mean
    assert [p["iters"] for p in results["ppo"]] == ["1-2", "3-4"] and results["ppo_evals"][0]["iter"] == 0
    assert "| Best-of-N | N = 4 |" in (tmp_path / "overoptimisation.md").read_text()
    assert (tmp_path / "overoptimisation.png").exists()
