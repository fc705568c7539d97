"""DPO (dpo.py) and its family in the lab (lab/ipo.py, kto.py, simpo.py, orpo.py): SPEC §5 worked
examples, finite-difference gradients of the five losses, response-only sequence log-probs, the
reference cache, each variant ordering a toy pair, the old --loss spellings, LoRA, and a two-process
run equal to one process."""

import json
import os

import pytest
import torch

import dpo
from nanopost import options
from nanopost import pairs
import train as T
from lab import ipo, kto, orpo, simpo
from nanopost.checkpoints import build_model, load_model, load_reference
from conftest import run_ddp
from model import token_logprobs
from model import SharedPrompts
from nanopost.tokenizer import Tokenizer


VARIANTS = dict(dpo=dpo, ipo=ipo, kto=kto, simpo=simpo, orpo=orpo)  # --algo: its module


def dpo_config(tiny, algo="dpo", **overrides):
    return dict(tiny, algo=algo, **overrides)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)


def t64(*values):
    return [torch.tensor(v, dtype=torch.float64) for v in values]


def test_dpo_worked_examples():
    # SPEC §5 / M14 §7, pair I: policy (−12.0, −11.5), reference (−13.0, −10.8)
    loss, slope, ordered = dpo.dpo_loss(*t64(-12.0, -11.5, -13.0, -10.8), beta=0.1)
    z = 0.1 * ((-12.0 + 13.0) - (-11.5 + 10.8))
    assert round(z, 3) == 0.170
    assert round(loss.item(), 4) == 0.6118 and round(slope.item(), 4) == 0.4576 and bool(ordered)
    # pair II: reference (−12.8, −11.65) -> z = 0.065, slope 0.4838
    loss2, slope2, _ = dpo.dpo_loss(*t64(-12.0, -11.5, -12.8, -11.65), beta=0.1)
    assert round(torch.log(1 / torch.exp(-loss2) - 1).neg().item(), 3) == 0.065  # z recovered from L = −log σ(z)
    assert round(slope2.item(), 4) == 0.4838 and slope2 > slope  # closer to the boundary: stronger signal
    # pair I with β = 0.5 -> z = 0.85, L = 0.356, slope 0.299
    loss3, slope3, _ = dpo.dpo_loss(*t64(-12.0, -11.5, -13.0, -10.8), beta=0.5)
    assert round(loss3.item(), 3) == 0.356 and round(slope3.item(), 3) == 0.299
    # the slope is |∂L/∂z|: autograd through z agrees
    z_t = torch.tensor(0.17, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.softplus(-z_t).backward()
    assert -z_t.grad.item() == pytest.approx(slope.item(), abs=1e-12)
    with pytest.raises(ValueError, match="beta"):
        dpo.dpo_loss(*t64(-1.0, -1.0, -1.0, -1.0), beta=0.0)
    with pytest.raises(ValueError, match="finite"):
        dpo.dpo_loss(*t64(float("-inf"), -1.0, -1.0, -1.0), beta=0.1)


def test_five_losses_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(0)
    lp = lambda: (-5 * torch.rand(6, generator=g, dtype=torch.float64) - 0.5).requires_grad_()
    pw, pl, rw, rl = lp(), lp(), lp(), lp()
    desirable = torch.tensor([True, False, True, True, False, False])
    cases = {
        "dpo": (lambda a, b: dpo.dpo_loss(a, b, rw, rl, 0.3)[0], (pw, pl)),
        "ipo": (lambda a, b: ipo.ipo_loss(a, b, rw, rl, 0.3), (pw, pl)),
        "kto": (lambda a: kto.kto_loss(a, rw, desirable, 0.2, 0.7, 1.0, 1.5), (pw,)),
        "simpo": (lambda a, b: simpo.simpo_loss(a / 3, b / 5, 2.0, 0.5), (pw, pl)),
        "orpo": (lambda a, b: orpo.orpo_loss(a / 3, b / 5, 0.4), (pw, pl)),
    }
    for name, (fn, inputs) in cases.items():
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7), name


def test_sequence_logprob_counts_response_tokens_only(tiny):
    run = T.train(dpo_config(tiny, "simpo", max_iters=0, pairs="style", train_prompts=4, heldout_prompts=2,
                             block_size=128))
    model = run.raw_model
    examples = run.state.train_examples[:3]
    batch = pairs.collate(run, examples)
    (lp_w, lp_l), (len_w, len_l) = dpo.sequence_sums(run, model, batch)
    for i, ex in enumerate(examples):  # each row alone, no padding: sum log π(response token | prefix)
        for j, total in ((0, lp_w), (1, lp_l)):
            ids = torch.tensor([ex["prompt"] + ex["responses"][j]])
            logp = torch.log_softmax(model(ids[:, :-1]), -1)[0]
            expected = sum(logp[t - 1, ids[0, t]] for t in range(len(ex["prompt"]), ids.size(1)))
            assert total[i].item() == pytest.approx(expected.item(), abs=1e-4)
            assert (len_w, len_l)[j][i].item() == len(ex["responses"][j])
    # padding ids are irrelevant: replace them and nothing changes
    changed = dict(batch, ids=batch["ids"].masked_fill(batch["ids"] == run.tok.pad, 7))
    assert (changed["ids"] != batch["ids"]).any()
    (lp_w2, lp_l2), _ = dpo.sequence_sums(run, model, changed)
    assert torch.allclose(lp_w2, lp_w, atol=1e-6) and torch.allclose(lp_l2, lp_l, atol=1e-6)
    # prompt-token targets and padding get no gradient: ∂(Σ m·log p)/∂logits is zero outside responses
    logits = model(batch["ids"][:, :-1]).detach().requires_grad_()
    (token_logprobs(logits, batch["ids"][:, 1:]) * batch["mask"]).sum().backward()
    touched = logits.grad.abs().sum(-1) > 0
    assert torch.equal(touched, batch["mask"] > 0)


@pytest.mark.parametrize("algo", ["dpo", "kto"])
def test_shared_prompts_give_the_same_loss_and_gradients(tiny, algo, monkeypatch):
    """share_prompt runs each example's prompt once for its two rows: the same loss, metrics and
    gradient of every parameter as one full row each, on ragged prompts with padding (the policy
    moved off the reference first, so that the loss has a gradient beyond its value at z = 0)."""
    run = T.train(dpo_config(tiny, algo, max_iters=0, pairs="style", train_prompts=8, heldout_prompts=2))
    batch = pairs.collate(run, run.state.train_examples[:6])
    monkeypatch.setattr(SharedPrompts, "saves_work", staticmethod(lambda *a: True))  # the shared layout, whatever it costs
    assert len(set(batch["prompt_lens"].tolist())) > 1 and (batch["ids"] == run.tok.pad).any()
    with torch.no_grad():
        for p in run.raw_model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.02)
    params = [p for p in run.raw_model.parameters() if p.requires_grad]
    results = []
    for share in (False, True):
        run.cfg = dict(run.cfg, share_prompt=share)
        loss_sum, count, metrics = VARIANTS[algo].loss(run, run.state, run.raw_model, batch)
        results.append((float(loss_sum.detach()), count, {k: float(v) for k, v in metrics.items()},
                        torch.autograd.grad(loss_sum, params)))
    (full, n_full, m_full, g_full), (shared, n_shared, m_shared, g_shared) = results
    assert n_full == n_shared and shared == pytest.approx(full, rel=1e-5)
    assert all(m_shared[k] == pytest.approx(v, rel=1e-4, abs=1e-5) for k, v in m_full.items())
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_full, g_shared))
    position_0 = g_shared[[p is run.raw_model.transformer.wpe.weight for p in params].index(True)][0]
    assert position_0.abs().sum() > 0  # a prompt-only position: its gradient came through the shared keys and values


def test_prompts_are_shared_only_where_that_runs_fewer_positions(tiny):
    """Pairs of rows per prompt: prompts of 20 and 60 tokens in a 90-column batch run 2·59 + 4·70 = 398
    positions shared against 4·89 = 356 plain, so DPO runs them plain; equal prompts of 40 run
    2·39 + 4·30 = 198 against 276 and are shared. Either way the log-prob sums are the same."""
    assert not SharedPrompts.saves_work(torch.tensor([20, 60, 20, 60]), 90, 2)
    assert SharedPrompts.saves_work(torch.tensor([40, 40, 40, 40]), 70, 2)
    run = T.train(dpo_config(tiny, max_iters=0, pairs="style", train_prompts=8, heldout_prompts=2))
    batch = pairs.collate(run, run.state.train_examples[:6])
    sums = []
    for share in (False, True):
        run.cfg = dict(run.cfg, share_prompt=share)
        with torch.no_grad():
            sums.append(torch.cat(dpo.sequence_sums(run, run.raw_model, batch)[0]))
    assert torch.allclose(sums[0], sums[1], atol=1e-4)


def test_reference_cache_equals_recomputed_and_key_tracks_the_reference(tiny):
    overrides = dpo_config(tiny, max_iters=0, train_prompts=6, heldout_prompts=3)
    run = T.train(overrides)
    reference = load_reference(run)
    recomputed = dpo.reference_sums(run, reference, run.state.train_examples)
    cached = torch.tensor([ex["ref"] for ex in run.state.train_examples])
    assert torch.allclose(cached, recomputed, atol=1e-6) and cached.shape == (len(run.state.train_examples), 2)
    assert os.path.isfile(run.state.ref_cache_path)
    # a second run finds the file and uses it (a planted value shows it was read, not recomputed)
    saved = torch.load(run.state.ref_cache_path)
    saved["values"][0][0, 0] = -123.0
    torch.save(saved, run.state.ref_cache_path)
    again = T.train(overrides)
    assert again.state.ref_cache_path == run.state.ref_cache_path and again.state.train_examples[0]["ref"][0] == -123.0
    # the key changes with the reference weights, the token ids (template) and the tokenizer
    sets = [run.state.train_examples, run.state.heldout_examples]
    key = dpo.cache_key(run, reference, sets)
    assert dpo.cache_key(run, load_reference(run), sets) == key
    with torch.no_grad():
        reference.transformer.h[0].mlp.c_fc.weight[0, 0] += 1e-3
    assert dpo.cache_key(run, reference, sets) != key
    with torch.no_grad():
        reference.transformer.h[0].mlp.c_fc.weight[0, 0] -= 1e-3
    edited = [dict(ex) for ex in run.state.train_examples]
    edited[0]["prompt"] = edited[0]["prompt"][:-1] + [run.tok.special["user"]]
    assert dpo.cache_key(run, reference, [edited, run.state.heldout_examples]) != key
    run.tok.name = "other"
    assert dpo.cache_key(run, reference, sets) != key


def toy_rows():
    """Two toy pairs, repeated; the last two rows (a tenth of the file) are held out."""
    pairs = [{"prompt": "Pick a letter", "chosen": "A", "rejected": "B"},
             {"prompt": "Pick a digit", "chosen": "7", "rejected": "3"}]
    return pairs * 9 + [{"prompt": "Held out", "chosen": "x", "rejected": "y"},
                        {"prompt": "Also held out", "chosen": "u", "rejected": "v"}]


@pytest.mark.parametrize("algo", list(VARIANTS))
def test_each_variant_orders_a_toy_pair(tiny, tmp_path, algo):
    path = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    run = T.train(dpo_config(tiny, algo, data=path, max_iters=12, batch_size=2, learning_rate=3e-3))
    batch = pairs.collate(run, run.state.train_examples[:4])  # (both toy pairs, or KTO: their four answers)
    with torch.no_grad():
        sums, lengths = dpo.sequence_sums(run, run.raw_model, batch)
    if algo == "kto":  # desirable examples rise above the reference, undesirable ones fall below it
        reward, desirable = sums[0] - batch["ref"][:, 0], batch["label"] > 0
        assert reward[desirable].min() > 0 > reward[~desirable].max()
    else:  # the chosen answer's reward (in the variant's own units) above the rejected one's
        with torch.no_grad():
            figures = VARIANTS[algo].pair_losses(run, run.raw_model, batch)[1]
        assert figures["pref_acc"] == len(batch["label"]), figures


def test_old_loss_spellings_run_their_variant(tiny, capsys):
    """--loss=X (the old way) is --algo X of the lab, with a note; --pairs=online is --algo online_dpo; the
    plain value --loss=dpo is dropped; two variants at once are an error, and the RM's own --pairs stays its own."""
    assert options.renamed(dict(algo="dpo", loss="ipo", beta=0.2)) == dict(algo="ipo", beta=0.2)
    assert "--loss='ipo' is now --algo ipo (lab/ipo.py)" in capsys.readouterr().out
    assert options.renamed(dict(algo="dpo", loss="dpo")) == dict(algo="dpo")
    assert options.renamed(dict(pairs="online", algo="dpo", loss="dpo")) == dict(algo="online_dpo")
    with pytest.raises(ValueError, match=r"--pairs='online' \(now --algo online_dpo\) and --algo kto are no one variant"):
        options.renamed(dict(algo="dpo", loss="kto", pairs="online"))
    # another algorithm's option of the same name stays its own: the RM's --pairs names its pairs
    assert options.renamed(dict(algo="rm", pairs="online")) == dict(algo="rm", pairs="online")  # (its setup refuses it)
    cfg = options.make_config(dpo_config(tiny, loss="orpo", orpo_lambda=0.2))
    assert cfg["algo"] == "orpo" and cfg["orpo_lambda"] == 0.2 and "loss" not in cfg


def test_plain_dpo_lists_only_its_own_keys():
    """--algo dpo's options are the loop's and plain DPO's: the variants' keys appear with their --algo only."""
    own = set(dpo.defaults) - set(options.DEFAULTS)
    assert own == {"beta", "share_prompt", "pairs", "train_prompts", "heldout_prompts", "group_size", "pair_temperature"}
    assert {"simpo_beta", "simpo_gamma"} <= set(simpo.defaults) and "orpo_lambda" in orpo.defaults
    assert {"kto_desirable_weight", "kto_undesirable_weight"} <= set(kto.defaults) and "beta" not in simpo.defaults


def test_kto_rows_and_their_errors(tiny, tmp_path):
    tiny = dict(tiny, overwrite=True)  # every run below writes to one out_dir
    good = [{"prompt": f"Q{i}", "completion": f"A{i}", "label": i % 2 == 0} for i in range(12)]
    run = T.train(dpo_config(tiny, "kto", data=write_jsonl(tmp_path / "kto.jsonl", good), max_iters=1))
    assert {ex["label"] for ex in run.state.train_examples} == {0.0, 1.0}
    for ex in run.state.train_examples:  # the mismatched completion comes from another prompt
        assert ex["responses"][1] != ex["responses"][0]
    bad_label = write_jsonl(tmp_path / "bad.jsonl", good[:3] + [{"prompt": "Q", "completion": "A", "label": "yes"}])
    with pytest.raises(ValueError, match=r"bad.jsonl: row 4: field 'label': expected bool"):
        T.train(dpo_config(tiny, "kto", data=bad_label, max_iters=1))
    with pytest.raises(ValueError, match=r"row 4: field 'completion': missing"):
        T.train(dpo_config(tiny, "kto", data=write_jsonl(tmp_path / "b2.jsonl", good[:3] + [{"prompt": "Q", "label": True}]),
                           max_iters=1))
    with pytest.raises(ValueError, match="only with --algo kto"):
        T.train(dpo_config(tiny, data=write_jsonl(tmp_path / "k.jsonl", good), max_iters=1))
    run = T.train(dpo_config(tiny, "kto", data=write_jsonl(tmp_path / "k2.jsonl", good + [good[0] | {"completion": " "}]),
                             max_iters=1, skip_bad_rows=True))
    assert run.state.skipped_rows == 1


def test_dpo_with_lora(tiny, tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    before = build_model(options.make_config(dpo_config(tiny)), Tokenizer("byte"))
    run = T.train(dpo_config(tiny, data=path, max_iters=4, batch_size=2, lora_rank=2))
    layer = run.raw_model.transformer.h[1].mlp.c_fc
    assert torch.equal(layer.base.weight, before.transformer.h[1].mlp.c_fc.weight)  # W frozen
    assert layer.lora_B.abs().sum() > 0                                              # B·A trained
    loaded = load_model(run.cfg["out_dir"])  # merged: the same log-probs as the LoRA model
    batch = pairs.collate(run, run.state.train_examples)
    with torch.no_grad():
        assert torch.allclose(torch.cat(dpo.sequence_sums(run, loaded, batch)[0]),
                              torch.cat(dpo.sequence_sums(run, run.raw_model, batch)[0]), atol=1e-4)


def test_builtin_run_logs_env_and_kl(tiny):
    run = T.train(dpo_config(tiny, max_iters=2, eval_interval=2, pairs="both", train_prompts=8,
                             heldout_prompts=4, block_size=128))
    rows = [json.loads(line) for line in open(os.path.join(run.cfg["out_dir"], "metrics.jsonl"))]
    first = rows[0]
    for key in ("heldout_acc", "heldout_len", "ood_acc", "heldout_kl_ref", "heldout_sampled_len", "val_pref_acc",
                "val_margin", "val_len_chosen"):
        assert key in first and key in run.metrics, key
    assert first["iter"] == 0 and abs(first["heldout_kl_ref"]) < 1e-3  # the policy is still the reference
    assert first["val_margin"] == pytest.approx(0.0, abs=1e-5)
    train_row = next(r for r in rows if "loss" in r)
    for key in ("reward_chosen", "reward_rejected", "margin", "pref_acc", "logp_chosen", "logp_rejected"):
        assert key in train_row, key


def _ddp_params(overrides):
    run = T.train(overrides)
    return {k: v.detach().cpu().numpy() for k, v in run.raw_model.state_dict().items()}


def test_two_processes_equal_one(tiny, tmp_path):
    common = dpo_config(tiny, max_iters=3, train_prompts=16, heldout_prompts=4, group_size=2)
    one = _ddp_params(dict(common, batch_size=4, out_dir=str(tmp_path / "one")))
    two = run_ddp(_ddp_params, dict(common, batch_size=2, out_dir=str(tmp_path / "two")))
    for name, value in one.items():
        assert torch.allclose(torch.from_numpy(two[0][name]), torch.from_numpy(value), atol=1e-5), name
        assert (two[0][name] == two[1][name]).all(), name
