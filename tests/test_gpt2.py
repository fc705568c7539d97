"""GPT-2 compatibility: a random transformers GPT2LMHeadModel, saved to disk, must load into our GPT
with the same logits and the same greedy continuations, and train.py must start from it offline;
a trained checkpoint must go back out (export.py) with the same logits and token ids."""

import json
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # a local save_pretrained directory must never touch the network
transformers = pytest.importorskip("transformers")

import export
from nanopost import options
import train as T
from nanopost.checkpoints import build_model, load_tokenizer
from conftest import SFT_DATA, TINY, random_ids
from nanopost.hf import from_pretrained, to_transformers
from model import GPT
from sampler import sample
from sft import masked_nll
from nanopost.tokenizer import Tokenizer, gpt2_byte_chars

VOCAB = 100  # smaller than the byte tokenizer's 266 ids: init_from must grow the embedding


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random 2-layer GPT-2 saved with save_pretrained; returns (directory, the model in eval mode)."""
    torch.manual_seed(0)
    # initializer_range above GPT-2's 0.02 spreads the logits, so greedy argmaxes are far from ties
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                     initializer_range=0.2, bos_token_id=None, eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(config).eval()
    path = tmp_path_factory.mktemp("gpt2") / "tiny-gpt2"
    hf.save_pretrained(path)
    return str(path), hf



def test_logits_match_transformers(hf_dir):
    path, hf = hf_dir
    ours = from_pretrained(path).eval()
    assert (ours.config.n_layer, ours.config.n_embd, ours.config.block_size) == (2, 32, 128)
    ids = random_ids(VOCAB, 3, 50, seed=1)
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape == (3, 50, VOCAB)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_greedy_generate_matches_transformers(hf_dir):
    path, hf = hf_dir
    ours = from_pretrained(path).eval()
    # ragged prompts in one batch: ours left-pads them, transformers decodes each one alone
    prompts = [random_ids(VOCAB, 1, 5, seed=2)[0].tolist(), random_ids(VOCAB, 1, 11, seed=3)[0].tolist(), [7]]
    new = 20
    tokens, logprobs, _ = sample(ours, prompts, max_new_tokens=new, temperature=0.0)
    for prompt, got, got_lp in zip(prompts, tokens, logprobs):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)
        expected = out.sequences[0, len(prompt):].tolist()
        assert got == expected
        # the sampler reports each greedy token's temperature-1 log-prob under the same model
        expected_lp = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, expected)]
        torch.testing.assert_close(torch.tensor(got_lp), torch.tensor(expected_lp), atol=1e-4, rtol=0)


def test_resize_vocab_keeps_old_logits(hf_dir):
    path, _ = hf_dir
    model = from_pretrained(path).eval()
    ids = random_ids(VOCAB, 2, 30, seed=4)
    with torch.no_grad():
        before = model(ids)
        model.resize_vocab(VOCAB + 12)
        after = model(ids)
    assert after.shape == (2, 30, VOCAB + 12) and model.config.vocab_size == VOCAB + 12
    torch.testing.assert_close(after[..., :VOCAB], before, atol=1e-5, rtol=0)
    # a new token's embedding is the mean of the old ones, so its logit is the mean old logit
    mean_old = before.mean(-1, keepdim=True).expand(-1, -1, 12)
    torch.testing.assert_close(after[..., VOCAB:], mean_old, atol=1e-5, rtol=0)
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied after resizing


def test_train_starts_from_hf_directory(hf_dir, tmp_path):
    path, hf = hf_dir
    cfg = options.make_config(dict(TINY, algo="sft", init_from=path, max_iters=2, checkpoint=False,
                             out_dir=str(tmp_path / "run")))
    tok = Tokenizer(cfg["tokenizer"])
    start = build_model(cfg, tok).eval()
    # the byte tokenizer's ids run past GPT-2's vocabulary: the embedding grew, the old logits stayed
    assert start.config.vocab_size == tok.n_vocab and start.config.block_size == 128
    ids = random_ids(VOCAB, 2, 40, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(start(ids)[..., :VOCAB], hf(ids).logits, atol=1e-4, rtol=0)

    run = T.train(cfg)
    trained = run.raw_model
    assert isinstance(trained, GPT) and trained.config.vocab_size == tok.n_vocab
    rows = [json.loads(line) for line in open(os.path.join(cfg["out_dir"], "metrics.jsonl"))]
    assert [r["iter"] for r in rows if "loss" in r] == [1, 2]
    # the first logged loss is the masked NLL of the GPT-2 weights on iteration 0's batch
    (ids0, mask0), = run.algo.batches(run, run.state, 0)[0][0]
    with torch.no_grad():
        loss_sum, count = masked_nll(start, ids0, mask0)
    assert rows[0]["loss"] == pytest.approx((loss_sum / count).item(), rel=1e-4)
    moved = max((p.detach() - q).abs().max().item()
                for p, q in zip(trained.parameters(), start.parameters()))
    assert moved > 1e-4  # two AdamW steps changed the GPT-2 weights


def write_gpt2_vocab(path, merges):
    """A small GPT-2-format tokenizer directory (vocab.json, merges.txt, as save_pretrained writes):
    the 256 byte tokens in GPT-2's order and spelling, then one token per merge, then <|endoftext|>.
    (transformers' GPT2Tokenizer reads these files with its own byte alphabet: the test below
    would catch a wrong gpt2_byte_chars.)"""
    chars = gpt2_byte_chars()  # GPT-2 numbers its byte tokens in this order
    vocab = {c: i for i, c in enumerate(sorted(chars.values()))}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return vocab


MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"),
          ("Ġwor", "ld"), ("l", "d"), ("Ġ", "t"), ("Ġt", "he"), ("1", "2"), ("Ã", "©")]


def test_local_gpt2_tokenizer_encodes_like_transformers(tmp_path):
    """--tokenizer=DIR: GPT-2's BPE from a local vocab.json, offline. Same ids as transformers'
    GPT2Tokenizer on the same files; <|endoftext|> keeps its place after the merges, the chat
    specials come after it, and the chat template's mask works on it."""
    vocab = write_gpt2_vocab(tmp_path / "gpt2-tok", MERGES)
    tok = Tokenizer(str(tmp_path / "gpt2-tok"))
    reference = transformers.GPT2Tokenizer(str(tmp_path / "gpt2-tok" / "vocab.json"), str(tmp_path / "gpt2-tok" / "merges.txt"))
    for text in ["hello world", "the hello, world!  12 1212", "café naïve — ünïcödé ✓", "\n\n  tabs\tand spaces  "]:
        ids = tok.encode(text)
        assert ids == reference.encode(text)
        assert tok.decode(ids) == text
    assert tok.encode("hello world") == [vocab["hello"], vocab["Ġworld"]]
    assert tok.special["endoftext"] == vocab["<|endoftext|>"] == 256 + len(MERGES)
    assert tok.bos == vocab["<|endoftext|>"] + 1 and tok.n_vocab == vocab["<|endoftext|>"] + 11
    ids, mask = tok.render_chat([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the world"}])
    assert [i for i, m in zip(ids, mask) if m] == tok.response_ids("the world")


def test_local_gpt2_tokenizer_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="vocab.json"):
        Tokenizer(str(tmp_path))  # no vocab.json there
    path = tmp_path / "bad"
    vocab = write_gpt2_vocab(path, MERGES)
    vocab["a b"] = len(vocab)  # a space is not in GPT-2's byte alphabet
    (path / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match=r"bad/vocab.json: token 'a b'"):
        Tokenizer(str(path))


def test_train_and_checkpoint_with_local_gpt2_tokenizer(hf_dir, tmp_path):
    """GPT-2 weights and GPT-2's tokenizer, both from local directories: the run trains, and its
    checkpoint names the tokenizer so that later scripts rebuild the same one."""
    path, _ = hf_dir
    write_gpt2_vocab(tmp_path / "tok", MERGES)
    cfg = dict(TINY, algo="sft", init_from=path, tokenizer=str(tmp_path / "tok"), max_iters=1,
               out_dir=str(tmp_path / "run"))
    run = T.train(cfg)
    assert run.raw_model.config.vocab_size == run.tok.n_vocab == 256 + len(MERGES) + 11
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    again = Tokenizer(ckpt["tokenizer"])
    assert again.encode("hello world") == run.tok.encode("hello world") and again.eos == run.tok.eos


def test_gpt2_config_trains_offline_on_a_local_copy_of_its_dataset(hf_dir, tmp_path):
    """config/gpt2.py as written (its hub dataset's layout, skip_bad_rows, its optimisation keys), with
    only the downloads swapped for local stand-ins and the sizes shrunk: a directory of jsonl files
    in no_robots' layout goes through `datasets` as a hub dataset would, too-long rows are skipped."""
    path, _ = hf_dir
    write_gpt2_vocab(tmp_path / "tok", MERGES)
    data = tmp_path / "no_robots"
    data.mkdir()
    rows = [dict(prompt="hello", prompt_id=str(i), category="Chat",
                 messages=[dict(role="system", content="be brief"), dict(role="user", content="hello world " * (i % 3 + 1)),
                           dict(role="assistant", content="hello" + " world" * (i % 4 + 1))]) for i in range(40)]
    rows.append(dict(rows[0], messages=[dict(role="user", content="hi"), dict(role="assistant", content="world " * 200)]))
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = options.parse_args([os.path.join(os.path.dirname(os.path.dirname(__file__)), "config", "gpt2.py")])
    assert (overrides["init_from"], overrides["tokenizer"], overrides["skip_bad_rows"]) == ("gpt2", "gpt2", True)
    cfg = dict(overrides, init_from=path, tokenizer=str(tmp_path / "tok"), data=str(data), block_size=128,
               batch_size=2, gradient_accumulation_steps=2, max_iters=2, eval_interval=2, eval_batch_size=4,
               val_examples=4, compile=False, device="cpu", plot=False, out_dir=str(tmp_path / "run"))
    run = T.train(cfg)
    assert run.state.skipped_rows == 1 and run.raw_model.config.vocab_size == run.tok.n_vocab
    assert 0 < run.metrics["val_loss"] < 20


# -- export: our checkpoints as transformers GPT-2 directories ---------------------------------------

def test_import_export_import_is_identity(hf_dir, tmp_path):
    path, hf = hf_dir
    ours = from_pretrained(path)
    to_transformers(ours).save_pretrained(tmp_path / "again")
    again = from_pretrained(str(tmp_path / "again"))
    assert again.config == ours.config
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    exported = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "again").state_dict()
    for name, value in hf.state_dict().items():  # and transformers' own weights come back unchanged
        assert torch.equal(exported[name], value), name


def test_exported_checkpoints_give_transformers_the_same_logits_and_ids(tmp_path):
    """An SFT run with LoRA (merged at export) and a PPO run (its policy, not the critic), each
    exported with export.py: GPT2LMHeadModel gives the trained model's logits, transformers'
    tokenizer the byte tokenizer's ids, and Tokenizer(dir) reads the files back."""
    sft_run = T.train(dict(TINY, **SFT_DATA, algo="sft", lora_rank=2, learning_rate=1e-2, max_iters=2,
                           out_dir=str(tmp_path / "sft")))
    ppo_run = T.train(dict(TINY, algo="ppo", init_from=str(tmp_path / "sft"), max_iters=1,
                           out_dir=str(tmp_path / "ppo")))
    ids = torch.randint(0, sft_run.tok.n_vocab, (2, 40), generator=torch.Generator().manual_seed(0))
    text = "Ann had 7 apples, got 8. How many now? café ✓"
    for name, trained in (("sft", sft_run.raw_model), ("ppo", ppo_run.raw_model.policy)):
        out = str(tmp_path / f"{name}-hf")
        export.export(str(tmp_path / name), out)
        hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
        with torch.no_grad():
            torch.testing.assert_close(hf(ids).logits, trained.eval()(ids), atol=1e-4, rtol=0)
        tok, hf_tok = load_tokenizer(str(tmp_path / name)), transformers.AutoTokenizer.from_pretrained(out)
        assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)
        assert [hf_tok.convert_tokens_to_ids(f"<|{s}|>") for s in tok.special] == list(tok.special.values())
        assert (hf_tok.eos_token_id, hf_tok.pad_token_id, hf.config.eos_token_id) == (tok.eos, tok.pad, tok.eos)
        again = Tokenizer(out)
        assert again.encode(text) == tok.encode(text) and again.special == tok.special


def test_exported_gpt2_tokenizer_keeps_its_merges(tmp_path):
    """A BPE tokenizer with merges (a local GPT-2 vocab.json) written back out: transformers and
    Tokenizer(dir) encode like the original (merges.txt rebuilt from the merge ranks)."""
    write_gpt2_vocab(tmp_path / "tok", MERGES)
    tok = Tokenizer(str(tmp_path / "tok"))
    tok.save_pretrained(str(tmp_path / "out"))
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    again = Tokenizer(str(tmp_path / "out"))
    for text in ["hello world", "the hello, world!  12 1212", "café naïve — ünïcödé ✓"]:
        assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text) == again.encode(text)
    assert again.special == tok.special
