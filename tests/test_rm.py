"""Reward model and the shared preference data: Bradley–Terry worked examples (SPEC §5), the
last-token read-out, learning a separable preference, built-in pairs, malformed rows, LoRA."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from nanopost import bands
from nanopost import options
from nanopost import pairs
import rm
import train as T
from nanopost.checkpoints import build_model, load_model
from envs import parse_answer
from nanopost.rollouts import response_text, rollouts, score_responses
from nanopost.tokenizer import Tokenizer


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


def test_overoptimisation_paired_bootstrap_and_turning_points():
    """experiments/overoptimisation.py's pure functions on hand-made numbers where the answer is known:
    the per-prompt bootstrap of a paired fall (clearly above 0, and centred on 0), Best-of-N's kept
    answers (N = 1: every sample; the largest N: each prompt's top proxy), the paired turning point,
    PPO's across-seeds rule (a t band from 3 seeds, none from 2) and the gold-wrong examples."""
    from experiments import overoptimisation as oo
    # a fall on 60 of 100 prompts, none on 40: mean 0.6, SE 0.049, the interval ~ [0.50, 0.70]
    mean, low, high = oo.paired_bootstrap(torch.tensor([1.0] * 60 + [0.0] * 40))
    assert mean == pytest.approx(0.6) and 0.48 < low < 0.53 and 0.67 < high < 0.72
    assert oo.paired_bootstrap(torch.tensor([1.0] * 60 + [0.0] * 40)) == (mean, low, high)  # a fixed seed
    # as many rises as falls: centred on 0, the interval ~ ±0.196 holds it
    mean, low, high = oo.paired_bootstrap(torch.tensor([1.0, -1.0] * 50))
    assert mean == 0 and -0.25 < low < -0.15 and 0.15 < high < 0.25

    # 4 samples per prompt, the proxy rising with the sample's index; half the prompts right only at
    # sample 1, half only at sample 3
    P = 40
    proxy = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * P) + torch.arange(P).unsqueeze(1)  # offsets: relative per prompt
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0]] * (P // 2) + [[0.0, 0.0, 0.0, 1.0]] * (P // 2))
    index = torch.arange(4.0).expand(P, 4)
    length, worked = 10 * (index + 1), index % 2  # samples 1 and 3 show their work
    points, per_prompt = oo.best_of_n(proxy, gold, length, worked)
    assert [p["N"] for p in points] == [1, 2, 4]
    assert torch.equal(per_prompt[1], gold.mean(1))  # N = 1 keeps every sample: each prompt's mean gold
    assert [p["gold"] for p in points] == pytest.approx([0.25, 0.5, 0.5])  # N = 2 keeps samples 1 and 3
    assert per_prompt[4].tolist() == [0.0] * (P // 2) + [1.0] * (P // 2)  # N = 4 keeps sample 3
    assert points[0]["proxy"] == pytest.approx(0.0) and points[2]["proxy"] == pytest.approx(1.5)
    assert points[2]["proxy_band"] == pytest.approx(0.0)  # the same lift on every prompt
    assert [p["length"] for p in points] == pytest.approx([25.0, 30.0, 40.0])
    assert [p["worked"] for p in points] == pytest.approx([0.5, 1.0, 1.0])
    turn = oo.bon_turning_point(points, per_prompt)  # peak at N = 2; to N = 4: +0.5 on half, −0.5 on half
    assert turn["N"] == 2 and not turn["significant"] and len(turn["drops"]) == 1
    assert turn["drops"][0]["low"] < 0 < turn["drops"][0]["high"]
    gold[P // 2:] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # now every prompt right only at sample 1
    points, per_prompt = oo.best_of_n(proxy, gold, length, worked)
    turn = oo.bon_turning_point(points, per_prompt)  # peak at N = 2, 0.5 lower at N = 4 on every prompt
    assert turn["N"] == 2 and turn["significant"] and turn["drops"][0]["low"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="power of two"):
        oo.best_of_n(proxy[:, :3], gold[:, :3], length[:, :3], worked[:, :3])

    # PPO: seeds whose gold falls by ~0.1 after the second bin, each seed by a different amount
    def seed_run(seed, golds):
        return dict(seed=seed, evals=[], curve=[dict(iters=f"{k}", kl=float(k), proxy=float(k), gold=g, len_mean=20.0,
                                                      work_frac=0.5, rollouts=512) for k, g in enumerate(golds)])
    runs = [seed_run(1337, [0.30, 0.40, 0.31]), seed_run(1338, [0.32, 0.42, 0.30]), seed_run(1339, [0.31, 0.41, 0.32])]
    mean = oo.ppo_mean(runs)
    assert [p["gold"] for p in mean] == pytest.approx([0.31, 0.41, 0.31])
    assert mean[1]["gold_band"] >= 1.96 * math.sqrt(0.41 * 0.59 / 512)  # floored by the binomial band of a bin
    assert mean[0]["len_mean_band"] == 0.0 and mean[0]["gold_per_seed"] == [0.30, 0.32, 0.31]
    turn = oo.ppo_turning_point(runs, mean)
    assert turn["iters"] == "1" and turn["drops"][0]["per_seed"] == pytest.approx([0.09, 0.12, 0.09])
    assert turn["significant"] and turn["drops"][0]["band"] == pytest.approx(4.303 * math.sqrt(0.0003) / math.sqrt(3), rel=1e-3)
    two = oo.ppo_turning_point(runs[:2], oo.ppo_mean(runs[:2]))  # two seeds: no band, nothing claimed
    assert two["drops"][0]["band"] is None and not two["significant"]

    # examples: at the largest N each prompt's top-proxy sample; only the gold-wrong ones, highest first
    problems = [dict(prompt=f"p{i}", answer=i) for i in range(4)]
    proxy = torch.tensor([[0.0, 5.0], [9.0, 1.0], [2.0, 3.0], [7.0, 0.0]])
    gold = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    texts = [f"answer {i}.{j}" for i in range(4) for j in range(2)]
    examples = oo.wrong_examples(problems, texts, proxy, gold, k=5)
    assert [(e["prompt"], e["answer"], e["proxy_raw"], e["correct"]) for e in examples] == [
        ("p3", "answer 3.0", 7.0, 3), ("p0", "answer 0.1", 5.0, 0), ("p2", "answer 2.1", 3.0, 2)]
    assert examples[0]["proxy"] == pytest.approx(7.0 - float(proxy.mean()))
    assert len(oo.wrong_examples(problems, texts, proxy, gold, k=2)) == 2


@pytest.mark.slow
def test_overoptimisation_experiment_runs_at_toy_size(tmp_path):
    """experiments/overoptimisation.py --quick end to end (~10 s): a proxy RM on few verifier pairs,
    Best-of-N at N = 1, 2, 4 on the same samples (KL = log N − (N − 1)/N, the proxy of the kept answer
    never below the mean), three PPO seeds against the proxy binned over iterations and their mean,
    the turning-point tests, gold-wrong examples, the table and the plot; run again, the finished
    PPO runs are read, not rerun."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, os.path.join(root, "experiments", "overoptimisation.py"), "--quick", f"--out={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    bon = results["best_of_n"]
    assert [p["N"] for p in bon] == [1, 2, 4] and bon[0]["proxy"] == pytest.approx(0.0, abs=1e-5)
    assert [p["kl"] for p in bon] == pytest.approx([0.0, math.log(2) - 0.5, math.log(4) - 0.75])
    assert all(p["proxy"] >= -1e-5 for p in bon)  # the top of N scores at least the mean
    assert all(0 < p["length"] <= 16 and 0 <= p["worked"] <= 1 for p in bon)  # max_new_tokens=16 at --quick
    per_prompt = results["best_of_n_per_prompt"]
    assert sorted(per_prompt, key=int) == ["1", "2", "4"] and all(len(g) == results["bon_prompts"] == 4 for g in per_prompt.values())
    # N = 1 keeps every sample: its gold is the mean over all the samples, prompt by prompt
    assert bon[0]["gold"] == pytest.approx(results["bon_sample_gold"]) == pytest.approx(sum(per_prompt["1"]) / 4)
    turn = results["turning_points"]["best_of_n"]
    later = [p["N"] for p in bon if p["N"] > turn["N"]]
    assert [d["N"] for d in turn["drops"]] == later and all(d["low"] <= d["drop"] <= d["high"] for d in turn["drops"])
    assert results["bootstrap_resamples"] == 2000

    runs = results["ppo"]["runs"]
    assert [r["seed"] for r in runs] == [1337, 1338, 1339]
    assert all([p["iters"] for p in r["curve"]] == ["1-2", "3-4"] and r["evals"][0]["iter"] == 0 for r in runs)
    assert all(0 < p["len_mean"] <= 16 and 0 <= p["work_frac"] <= 1 for r in runs for p in r["curve"])
    mean = results["ppo"]["mean"]
    assert len(mean) == 2 and all(p["seeds"] == 3 and len(p["gold_per_seed"]) == 3 for p in mean)
    assert mean[0]["proxy"] == pytest.approx(sum(r["curve"][0]["proxy"] for r in runs) / 3)
    assert all(len(d["per_seed"]) == 3 and d["band"] is not None for d in results["turning_points"]["ppo"]["drops"])

    examples = results["examples"]
    assert len(examples) <= 5 and [e["proxy"] for e in examples] == sorted((e["proxy"] for e in examples), reverse=True)
    assert all(parse_answer(e["answer"]) != e["correct"] for e in examples)  # gold-wrong (arithmetic's verifier)
    table = (tmp_path / "overoptimisation.md").read_text()
    assert "| Best-of-N | N = 4 |" in table and "| PPO | iterations 3-4 |" in table
    assert "High-proxy answers the verifier marks wrong" in table and "bootstrap" in table
    assert (tmp_path / "overoptimisation.png").exists()

    stamps = [os.path.getmtime(tmp_path / f"ppo_{seed}" / "metrics.jsonl") for seed in (1337, 1338, 1339)]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert [os.path.getmtime(tmp_path / f"ppo_{seed}" / "metrics.jsonl") for seed in (1337, 1338, 1339)] == stamps
    assert json.load(open(tmp_path / "results.json"))["ppo"] == results["ppo"]


def test_rm_size_compares_the_largest_size_with_the_smallest():
    """experiments/rm_size.py's comparison on hand-made studies: Best-of-N's gold at the largest N paired
    per prompt (bands.paired), PPO's last bin paired by seed (the t band), the verdict by the band's
    sign, and the table carrying every size's turning points."""
    from experiments import rm_size

    def study(gold_top, ppo_last, pair_acc):
        peak = dict(N=4, kl=0.64, gold=0.4, significant=True)
        curve = lambda last: [dict(gold=0.3), dict(gold=last)]
        return dict(rm_val_pair_acc=pair_acc, bon_max=8, best_of_n_per_prompt={"8": gold_top},
                    best_of_n=[dict(kl=0.0, gold=0.3, gold_band=0.1), dict(kl=1.2, gold=sum(gold_top) / len(gold_top),
                                                                            gold_band=0.05)],
                    turning_points=dict(best_of_n=peak, ppo=dict(iters="9-16", kl=1.0, gold=0.35, significant=False)),
                    ppo=dict(runs=[dict(curve=curve(g)) for g in ppo_last],
                             mean=[dict(kl=0.1, gold=0.3, gold_band=0.2), dict(kl=2.0, gold=sum(ppo_last) / 3, gold_band=None)]))
    small = study([0.0] * 20 + [1.0] * 20, [0.20, 0.25, 0.30], 0.65)
    large = study([1.0] * 40, [0.30, 0.30, 0.40], 0.75)  # 20 prompts won, none lost
    out = rm_size.compare({256: small, 4096: large, 1024: small})
    assert out["sizes"] == [256, 1024, 4096] and (out["small"], out["large"]) == (256, 4096)
    diff, band = bands.paired([1.0] * 40, [0.0] * 20 + [1.0] * 20)
    assert out["bon"]["diff"] == pytest.approx(0.5) == pytest.approx(diff) and out["bon"]["band"] == pytest.approx(band)
    assert band == pytest.approx(1.96 * math.sqrt(40 * 0.25 / 39) / math.sqrt(40))  # d: twenty 1s, twenty 0s
    assert out["verdict"] == "more data holds gold up"
    assert out["curves"][4096]["bon"] == [(0.0, 0.3, 0.1), (1.2, 1.0, 0.05)]  # (KL, gold, its band), for the figure
    assert out["curves"][256]["ppo"][1] == (2.0, pytest.approx(0.25), None)
    assert out["ppo"]["per_seed"] == pytest.approx([0.10, 0.05, 0.10])
    sd = math.sqrt(((0.10 - 0.25 / 3) ** 2 * 2 + (0.05 - 0.25 / 3) ** 2) / 2)
    assert out["ppo"]["band"] == pytest.approx(4.303 * sd / math.sqrt(3), rel=1e-3)
    assert rm_size.compare({256: large, 4096: small})["verdict"] == "more data lowers gold"
    assert rm_size.compare({256: small, 4096: small})["verdict"] == "null (within the band)"
    text = rm_size.table(out)
    assert "| 4,096 | 0.750 | N = 4 (0.64), 0.400 | yes | 1.000 |" in text and "+0.500 ± " in text


@pytest.mark.slow
def test_rm_size_runs_at_toy_size(tmp_path):
    """experiments/rm_size.py --quick end to end: one SFT for both sizes, overoptimisation.py once per
    size into --out/rm<size>, the comparison, table and plot; run again, the finished sizes are read."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, os.path.join(root, "experiments", "rm_size.py"), "--quick", "--sizes=16,32", f"--out={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    assert results["sizes"] == [16, 32] and sorted(results["per_size"]) == ["16", "32"]
    # --quick trains both proxies alike (16 prompts each, the same seed): the same samples, the same choices
    assert results["bon"]["diff"] == 0.0 and results["verdict"] == "null (within the band)"
    assert (tmp_path / "rm_size.png").exists() and "Verdict" in (tmp_path / "rm_size.md").read_text()
    stamp = os.path.getmtime(tmp_path / "rm16" / "results.json")
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert again.returncode == 0 and os.path.getmtime(tmp_path / "rm16" / "results.json") == stamp
