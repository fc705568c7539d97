"""The Llama family (Llama, Qwen2, Qwen3): tiny random transformers models, saved to disk, must load
into our GPT with the same logits and the same greedy continuations as transformers' generate, go
back out with the same weights, and an architecture we cannot load must be an error naming it."""

import dataclasses
import json
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # a local save_pretrained directory must never touch the network
transformers = pytest.importorskip("transformers")

import export
from nanopost import options
import train as T
from nanopost.checkpoints import build_model, load_model
from conftest import random_ids
from nanopost.data import dataset_splits
from nanopost.options import config_env
from envs import GSM8K
from envs.gsm8k import final_number
from nanopost.hf import from_pretrained, to_transformers
from model import GPT, GPTConfig, sequence_logprobs
from sampler import sample

VOCAB = 96
# Llama with grouped-query attention and its own head; Qwen2 with q, k, v biases and a tied head;
# Qwen3 with QK-norm and a head_dim that is not hidden_size / heads
FAMILIES = {"llama": ("Llama", dict(tie_word_embeddings=False)),
            "qwen2": ("Qwen2", dict(tie_word_embeddings=True)),
            "qwen3": ("Qwen3", dict(tie_word_embeddings=False, head_dim=24))}


def tiny_hf(family, seed=0, vocab=VOCAB, positions=128):
    """A random 2-layer model of the family, every weight drawn at random (transformers starts
    biases at 0 and norm gains at 1, which would hide a bias or gain left behind)."""
    kind, extra = FAMILIES[family]
    config = getattr(transformers, kind + "Config")(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=positions, rope_theta=500.0, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    hf = getattr(transformers, kind + "ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return hf


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def hf_dir(request, tmp_path_factory):
    """(directory, the model in eval mode) of each family, saved with save_pretrained."""
    hf = tiny_hf(request.param)
    path = tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}"
    hf.save_pretrained(path)
    return str(path), hf



def test_logits_match_transformers(hf_dir):
    path, hf = hf_dir
    ours = from_pretrained(path).eval()
    c = ours.config
    assert (c.norm, c.mlp, c.pos, c.n_kv_head, c.tie_embeddings) == (
        "rmsnorm", "swiglu", "rope", 2, hf.config.tie_word_embeddings)
    ids = random_ids(VOCAB, 3, 40, seed=1)
    with torch.no_grad():
        expected, got = hf(ids).logits, ours(ids)
    assert got.shape == expected.shape == (3, 40, VOCAB)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # ragged rows through the sampler's positions: a left-padded row's logits are its own
    pos = (torch.arange(40) - 7).clamp(min=0)[None].expand(3, -1)
    mask = (torch.arange(40)[None, :] >= 7) & torch.ones(40, 40, dtype=torch.bool).tril()
    mask = (mask | torch.eye(40, dtype=torch.bool))[None, None]
    with torch.no_grad():
        shifted = ours(ids, pos=pos, attn_mask=mask)[:, 7:]
        alone = hf(ids[:, 7:]).logits
    torch.testing.assert_close(shifted, alone, atol=1e-4, rtol=0)
    # under bf16 autocast (the CUDA setting; here on the CPU): equal to bf16 rounding (our fused q/k/v
    # and gate/up matmuls may round differently from transformers' separate ones)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low, reference = ours(ids).float(), hf(ids).logits.float()
    assert float((low - reference).abs().max()) < 0.01 * float(reference.abs().max())


def hf_greedy(hf, prompts, new):
    """transformers' greedy generate on a left-padded batch (its attention mask and positions)."""
    P = max(map(len, prompts))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                      output_scores=True, return_dict_in_generate=True)
    logprobs = torch.stack(out.scores, 1).log_softmax(-1).gather(2, out.sequences[:, P:, None]).squeeze(2)
    return out.sequences[:, P:].tolist(), logprobs


def test_greedy_generate_matches_transformers(hf_dir):
    """The KV-cache sampler on ragged prompts (left-padded, each row's positions from 0), a prompt
    asked twice (one shared prefill): the same tokens and log-probs as transformers' generate on the
    batch (left-padded with its attention mask), and on a prompt alone."""
    path, hf = hf_dir
    ours = from_pretrained(path).eval()
    prompts = [random_ids(VOCAB, 1, 5, seed=2)[0].tolist(), random_ids(VOCAB, 1, 11, seed=3)[0].tolist(), [7],
               random_ids(VOCAB, 1, 5, seed=2)[0].tolist()]
    new = 16
    tokens, logprobs, _ = sample(ours, prompts, max_new_tokens=new, temperature=0.0)
    expected, expected_lp = hf_greedy(hf, prompts, new)
    assert tokens == expected
    torch.testing.assert_close(torch.tensor(logprobs), expected_lp, atol=1e-4, rtol=0)
    assert tokens[1] == hf_greedy(hf, [prompts[1]], new)[0][0]  # the longest prompt, alone: no padding at all


def test_tool_hook_and_gqa_cache_with_rotary_positions(hf_dir):
    """Tokens a tool hook injects take their positions like sampled ones: after the injection the
    sampler continues as transformers does from the prompt, the sampled token and the tool's."""
    from sampler import KVCache
    path, hf = hf_dir
    ours = from_pretrained(path).eval()
    prompts = [random_ids(VOCAB, 1, 6, seed=6)[0].tolist(), random_ids(VOCAB, 1, 3, seed=7)[0].tolist()]
    hook = lambda row, generated: [11, 12, 13] if len(generated) == 1 else None
    tokens, _, forced = sample(ours, prompts, max_new_tokens=12, temperature=0.0, tool_hook=hook)
    for prompt, got, f in zip(prompts, tokens, forced):
        assert got[1:4] == [11, 12, 13] and f[:5] == [0, 1, 1, 1, 0]
        assert got[4:] == hf_greedy(hf, [prompt + got[:4]], 8)[0][0]
    cache = KVCache(ours.config, torch.ones(1, 5, dtype=torch.bool), 9)
    with torch.no_grad():
        ours(random_ids(VOCAB, 1, 5, seed=8), cache=cache)
    assert cache.k.shape == (2, 1, 2, 9, ours.config.head_dim or 8)  # (layers, B, n_kv_head = 2 of 4, ...)


def test_export_round_trip(hf_dir, tmp_path):
    path, hf = hf_dir
    ours = from_pretrained(path).eval()
    back = to_transformers(ours)
    assert type(back) is type(hf)
    ids = random_ids(VOCAB, 2, 30, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)
    back.save_pretrained(tmp_path / "again")
    again = from_pretrained(str(tmp_path / "again"))
    assert again.config == ours.config
    for (name, p), (_, q) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), name


def test_shared_prompt_logprobs_match_plain(hf_dir):
    """Rotary positions through SharedPrompts (GRPO's G answers of one prompt, DPO's pair): the
    same log-probs as scoring each row alone."""
    ours = from_pretrained(hf_dir[0]).eval()
    ids = random_ids(VOCAB, 4, 20, seed=5)
    ids[1, :6] = ids[0, :6]  # rows 0 and 1 share a 6-token prompt
    lens = torch.tensor([6, 6, 3, 9])
    with torch.no_grad():
        plain, shared = sequence_logprobs(ours, ids), sequence_logprobs(ours, ids, prompt_lens=lens)
    keep = torch.arange(19)[None] >= (lens - 1)[:, None]
    torch.testing.assert_close(shared[keep], plain[keep], atol=1e-5, rtol=0)


def test_unsupported_architecture_is_an_error_naming_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba"}))
    with pytest.raises(ValueError, match="MambaForCausalLM.*supported: GPT2LMHeadModel, LlamaForCausalLM, "
                                         "Qwen2ForCausalLM"):
        from_pretrained(str(tmp_path))
    cfg = dict(init_from=str(tmp_path), block_size=64, dropout=0.0)
    with pytest.raises(ValueError, match="MambaForCausalLM"):
        build_model(cfg, None)
    # a hub name that cannot be reached (offline here) is a one-line error too, for weights, tokenizer, dataset
    from nanopost.tokenizer import make_tokenizer
    for load in (from_pretrained, make_tokenizer, lambda name: dataset_splits(name, GSM8K.check_row)):
        with pytest.raises(ValueError, match="nobody/nothing.*(no transformers checkpoint|cannot load it)"):
            load("nobody/nothing")


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    """Llama 3.1/3.2's rescaled rotary frequencies (factor 8, blended between wavelengths of 16/4 and
    16/1 positions here, so that the tiny model's 64 positions cover all three regimes)."""
    hf = tiny_hf("llama", positions=64)
    hf.config.rope_parameters = dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=16)
    hf = type(hf)(hf.config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path / "llama3")
    ours = from_pretrained(str(tmp_path / "llama3")).eval()
    assert ours.config.rope_llama3 == (8.0, 1.0, 4.0, 16.0)
    ids = random_ids(VOCAB, 2, 60, seed=9)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(to_transformers(ours)(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)
    plain = GPT(dataclasses.replace(ours.config, rope_llama3=()))
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (plain.eval()(ids) - hf(ids).logits).abs().max() > 1e-2  # the rescaling matters at these lengths


def test_rope_scaling_is_an_error(tmp_path):
    hf = tiny_hf("llama")
    hf.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    hf.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="rope scaling 'linear'"):
        from_pretrained(str(tmp_path))


def test_options_build_from_scratch_and_grow_an_untied_head():
    """The options alone (no transformers checkpoint): a rotary GQA model without wpe, with its own
    head, whose resize_vocab keeps every old logit; a misspelt option is an error."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=32, bias=False, norm="rmsnorm",
                    mlp="swiglu", mlp_hidden=40, pos="rope", n_kv_head=1, qk_norm=True, tie_embeddings=False)
    model = GPT(cfg).eval()
    assert "transformer.wpe.weight" not in model.state_dict()
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids)
        model.resize_vocab(70)
        after = model(ids)
    assert after.shape == (2, 12, 70)
    torch.testing.assert_close(after[..., :64], before, atol=0, rtol=0)
    with pytest.raises(ValueError, match="pos='alibi'"):
        GPT(GPTConfig(pos="alibi"))


# ----------------------------------------------------------------------------------------------
# The checkpoint's own tokenizer and chat template

# ChatML as Qwen writes it, with a default system message when the conversation has none
CHAT_TEMPLATE = (
    "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set rest = messages[1:] %}{% else %}{% set system = 'Be brief.' %}{% set rest = messages %}{% endif %}"
    "<|im_start|>system\n{{ system }}<|im_end|>\n"
    "{% for m in rest %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_VOCAB = 300  # the 256 bytes, some merges, the specials


def write_chat_tokenizer(path):
    """A byte-level BPE of CHAT_VOCAB ids trained here on a few sentences, with ChatML's special tokens and
    CHAT_TEMPLATE, saved as a transformers tokenizer directory."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = ["What is 12 plus 30? The answer is 42.", "Natalia sold clips to 48 of her friends.",
              "Be brief. The capital of France is Paris. Then Rome."] * 20
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=CHAT_VOCAB, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>",
                                              pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "tok"
    return str(path), write_chat_tokenizer(path)


CONVERSATION = [{"role": "user", "content": "What is 12 plus 30?"}, {"role": "assistant", "content": "42."},
                {"role": "user", "content": "The capital of France?"}, {"role": "assistant", "content": "Paris."}]


def test_chat_template_ids_and_exact_mask(chat_dir):
    from nanopost.tokenizer import ChatTemplateTokenizer, make_tokenizer
    path, hf = chat_dir
    tok = make_tokenizer(path)
    assert isinstance(tok, ChatTemplateTokenizer)
    assert tok.n_vocab == CHAT_VOCAB and tok.eos == hf.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad == hf.convert_tokens_to_ids("<|endoftext|>")
    ids, mask = tok.render_chat(CONVERSATION)
    expected = hf(hf.apply_chat_template(CONVERSATION, tokenize=False), add_special_tokens=False)["input_ids"]
    assert ids == expected
    # learned: each answer and its end of turn, nothing else (not the "\n" the template adds after it)
    assert hf.decode([i for i, m in zip(ids, mask) if m]) == "42.<|im_end|>Paris.<|im_end|>"
    assert sum(mask) == len(tok.encode("42.")) + len(tok.encode("Paris.")) + 2
    # RL's layout (the sampler's prompt, then the answer it samples) is the template's, token for token
    prompt = tok.prompt_ids("What is 12 plus 30?")
    assert prompt == hf(hf.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"]
    first_turn = tok.render_chat(CONVERSATION[:2])[0]
    assert first_turn[:len(prompt) + len(tok.response_ids("42."))] == prompt + tok.response_ids("42.")
    # plain text never becomes a special token
    assert tok.eos not in tok.encode("a <|im_end|> b") and tok.decode(tok.encode("a <|im_end|> b")) == "a <|im_end|> b"


# ----------------------------------------------------------------------------------------------
# GSM8K and the conversational preference set: the recipes' data paths on local files in the
# datasets' schemas, with a tiny Qwen2 and the chat tokenizer above standing in for the hub's

def test_gsm8k_verifier_and_splits(tmp_path):
    problem = {"answer": "1234"}
    for response, reward in [("48/2 = 24, so 1,234 in all.\n#### 1,234", 1.0), ("#### $1234.00", 1.0),
                             ("#### 71\nno, wait\n#### 1234", 1.0), ("#### 1234\n#### 71", 0.0),
                             ("The answer is 1234.", 0.0), ("#### 1233", 0.0)]:
        assert GSM8K.verify(problem, response) == reward, response
    rows = [GSM8K.check_row(row) for row in gsm8k_rows(12)]
    env = GSM8K(rows[:10], rows[10:])
    assert [p["answer"] for p in env.problems("heldout", 5, seed=3)] == ["15", "16"]  # in order, never repeated
    train = env.problems("train", 25, seed=1)
    assert len(train) == 25 and sorted(p["answer"] for p in train[:10]) == sorted(str(r[2]) for r in rows[:10])
    assert train == env.problems("train", 25, seed=1) != env.problems("train", 25, seed=2)
    assert train[0]["prompt"].endswith('output the final answer after "####".')
    assert env.verify(train[0], env.demonstration(train[0])) == 1.0
    assert env.parses("so #### 7") and not env.parses("so 7") and env.shows_work("3+4=7 #### 7")
    # the dataset's form exactly: thousands commas only, no exponent, nothing that continues the number
    assert [final_number(t) for t in ("#### 1,234", "#### 1,234,567", "#### -7 apples", "#### 72.")] == [1234, 1234567, -7, 72]
    for text in ("#### 1e5", "#### 1,2,3", "#### 12,34", "#### 3.5.1", "#### 5\n#### 1e5"):
        assert final_number(text) is None and not env.parses(text), text  # (the last "####" counts)
    path = write_jsonl(tmp_path / "bad.jsonl", gsm8k_rows(3)[:2] + [{"question": "Q?", "answer": "4"}])
    with pytest.raises(ValueError, match="bad.jsonl: row 3: field 'answer': no final number after '####'"):
        config_env(options.make_config(dict(env="gsm8k", env_data=path)))
    with pytest.raises(ValueError, match="--algo grpo takes its prompts from the environment, not --data"):
        options.make_config(dict(algo="grpo", data=path))
    options.check_start(dict(algo="grpo", init_from="Qwen/Qwen2.5-0.5B-Instruct"))  # a hub name: RL may start from it
    with pytest.raises(ValueError, match="has no ckpt.pt; make it with `python train.py --algo sft"):
        options.check_start(dict(algo="grpo", init_from="no_such_out/sft"))  # owner/name-shaped, but the ladder's path


def gsm8k_rows(n):
    return [{"question": f"Tom has {a} apples and gets 3 more. How many?", "answer": f"{a}+3=<<{a}+3={a + 3}>>{a + 3}.\n#### {a + 3}"}
            for a in range(2, 2 + n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A tiny Qwen2 and the chat tokenizer in one directory, as a hub checkpoint holds them."""
    path = tmp_path_factory.mktemp("qwen") / "tiny-qwen2-instruct"
    tiny_hf("qwen2", vocab=320, positions=512).save_pretrained(path)
    write_chat_tokenizer(path)
    return str(path)


def recipe(name, init_from, tokenizer, out_dir, **overrides):
    """A config/ recipe as the command line reads it, pointed at the tiny local model, at a tiny size."""
    cfg = options.parse_args([f"config/{name}.py"])
    cfg.update(init_from=init_from, tokenizer=tokenizer, out_dir=str(out_dir), device="cpu", plot=False,
               block_size=256, max_iters=1, batch_size=2, gradient_accumulation_steps=1, eval_interval=1,
               eval_problems=2, eval_batch_size=4, max_new_tokens=6, log_interval=1, warmup_iters=0)
    cfg.update(overrides)
    return cfg


def test_gsm8k_recipes_sft_then_grpo(chat_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(12))
    run = T.train(recipe("gsm8k_sft", chat_model_dir, chat_model_dir, tmp_path / "sft", env_data=data, train_problems=8, val_examples=2))
    tok = run.tok
    ids, mask = run.state.train_examples[0]
    problem = run.env.problems("train", 8, seed=0)[0]
    prompt = tok.prompt_ids(problem["prompt"])
    assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
    assert tok.hf.decode([i for i, m in zip(ids, mask) if m]) == problem["solution"] + "<|im_end|>"
    assert "heldout_acc" in run.metrics and "ood_acc" not in run.metrics
    sft_dir = str(tmp_path / "sft")
    grpo = T.train(recipe("gsm8k_grpo", sft_dir, chat_model_dir, tmp_path / "grpo", env_data=data, prompts_per_iter=2,
                          group_size=2))
    assert grpo.raw_model.config.pos == "rope" and "heldout_acc" in grpo.metrics
    # LoRA through the same path (SFT: its gradient is never 0), then the merged checkpoint out to
    # transformers (export.py): the same logits, and the tokenizer's chat template with it
    T.train(recipe("gsm8k_sft", chat_model_dir, chat_model_dir, tmp_path / "lora", env_data=data, train_problems=8,
                   val_examples=2, lora_rank=2, learning_rate=0.05, eval_interval=0))
    merged, base = load_model(str(tmp_path / "lora")), from_pretrained(chat_model_dir)
    moved = (merged.transformer.h[0].attn.c_attn.weight - base.transformer.h[0].attn.c_attn.weight).abs().max()
    assert moved > 1e-3 and torch.equal(merged.transformer.wte.weight, base.transformer.wte.weight)
    export.export(str(tmp_path / "lora"), str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert type(hf).__name__ == "Qwen2ForCausalLM" and hf.generation_config.eos_token_id == tok.eos
    ids = torch.tensor([tok.prompt_ids(problem["prompt"])])
    assert ids[0].tolist() == hf_tok.apply_chat_template([{"role": "user", "content": problem["prompt"]}],
                                                         add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, merged(ids), atol=1e-4, rtol=0)
    ppo = T.train(recipe("gsm8k_ppo", sft_dir, chat_model_dir, tmp_path / "ppo", env_data=data, prompt_pool=8,
                         minibatches=1, inner_epochs=1))
    assert "heldout_acc" in ppo.metrics
    # OPD (the SFT model as its teacher) takes the dataset's prompts through the same environment
    opd = T.train(dict(algo="opd", env="gsm8k", env_data=data, init_from=sft_dir, tokenizer=chat_model_dir, teacher=sft_dir,
                       out_dir=str(tmp_path / "opd"), device="cpu", plot=False, block_size=256, max_iters=1, batch_size=2,
                       prompts_per_iter=2, eval_interval=1, eval_problems=2, eval_batch_size=4, max_new_tokens=6,
                       eval_samples=0))
    assert "heldout_acc" in opd.metrics and "ood_acc" not in opd.metrics


CHOSEN_REJECTED = [("What is 12 plus 30?", "42.", "43."), ("The capital of France?", "Paris.", "Rome."),
                   ("Be brief: 48 friends?", "48.", "Then 48 clips.")]


def test_preference_recipes_rm_then_dpo_on_implicit_prompts(chat_model_dir, tmp_path):
    from nanopost.pairs import encode_row
    rows = [{"chosen": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q},
                        {"role": "assistant", "content": good}],
             "rejected": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q},
                          {"role": "assistant", "content": bad}], "score_chosen": 9.0, "score_rejected": 2.0}
            for q, good, bad in CHOSEN_REJECTED * 4]
    data = write_jsonl(tmp_path / "prefs.jsonl", rows)
    rm = T.train(recipe("pref_rm", chat_model_dir, chat_model_dir, tmp_path / "rm", data=data, heldout_prompts=2))
    kind, pair = encode_row(rm, rows[0])
    whole, whole_mask = rm.tok.render_chat(rows[0]["chosen"])
    assert kind == "pair" and pair["prompt"] + pair["responses"][0] == whole
    assert rm.tok.hf.decode([i for i, m in zip(pair["responses"][0], pair["masks"][0]) if m]) == "42.<|im_end|>"
    assert pair["prompt"] == rm.tok.render_chat(rows[0]["chosen"][:2], add_generation_prompt=True)[0]
    assert rm.tok.hf.decode(pair["responses"][1]) == "43.<|im_end|>\n"
    # SFT on the same conversations as message lists: the template's ids and mask, row by row
    messages = write_jsonl(tmp_path / "messages.jsonl", [{"messages": row["chosen"]} for row in rows])
    sft = T.train(recipe("gsm8k_sft", chat_model_dir, chat_model_dir, tmp_path / "sft", env="arithmetic", data=messages,
                         eval_interval=0))
    assert sorted(sft.state.train_examples + sft.state.val_examples) == sorted(
        tuple(sft.tok.render_chat(row["chosen"])) for row in rows)
    dpo = T.train(recipe("pref_dpo", chat_model_dir, chat_model_dir, tmp_path / "dpo", data=data, heldout_prompts=2))
    assert dpo.raw_model.config.qkv_bias and dpo.metrics
    with pytest.raises(ValueError, match="row 1: field 'rejected': shares no prompt message"):
        T.train(recipe("pref_dpo", chat_model_dir, chat_model_dir, tmp_path / "bad", heldout_prompts=2, skip_bad_rows=False, data=write_jsonl(
            tmp_path / "bad.jsonl", [{"chosen": rows[0]["chosen"][2:], "rejected": rows[0]["rejected"][2:]}] * 4)))
