"""The model (model.py), the KV-cache sampler (sampler.py), log-probs and LoRA."""

import math

import pytest
import torch

from model import (GPT, GPTConfig, ScalarHeadGPT, apply_lora, count_parameters, gelu, merge_lora, sequence_logprobs,
                   token_logprobs, token_logprobs_and_entropy)
from model import SharedPrompts, filter_logits
from sampler import sample

CFG = GPTConfig(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32)
RAGGED = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(CFG).eval()


def test_cached_logits_equal_uncached_on_ragged_batch(model):
    """Every decode step's logits (captured at lm_head) equal a full forward of that row alone."""
    captured = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: captured.append(out[:, -1].clone()))
    tokens, _, _ = sample(model, RAGGED, max_new_tokens=40, temperature=0)  # the cache grows at step 32
    hook.remove()
    assert len(captured) == 40  # one prefill + 39 decode steps (the 40th token needs no forward)
    worst = 0.0
    for row, prompt in enumerate(RAGGED):
        for step in range(40):
            seq = torch.tensor([prompt + tokens[row][:step]])
            full = model(seq)[0, -1]
            worst = max(worst, (full - captured[step][row]).abs().max().item())
    assert worst < 1e-5


def test_rows_in_a_batch_equal_rows_alone_through_dropped_rows(model):
    """A stop token ends rows at different steps: they leave the batch, the rows kept are copied into
    the cache's second buffer and the two swap, once per step that ends a row. Every row still gets
    exactly what it gets alone, and the log-probs of a training forward."""
    free, _, _ = sample(model, RAGGED, 45, temperature=0)
    stop = free[2][9]  # row 2 stops at step 9 at the latest; other rows when they first emit it
    tokens, logprobs, _ = sample(model, RAGGED, 45, temperature=0, stop_tokens=(stop,))
    assert len({len(t) for t in tokens}) > 1  # rows ended at different steps
    for prompt, toks, lps in zip(RAGGED, tokens, logprobs):
        alone, alone_lps, _ = sample(model, [prompt], 45, temperature=0, stop_tokens=(stop,))
        assert toks == alone[0]
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(alone_lps[0]), atol=1e-5, rtol=0)
        full = sequence_logprobs(model, torch.tensor([prompt + toks]))[0, len(prompt) - 1:]
        torch.testing.assert_close(torch.tensor(lps), full, atol=1e-5, rtol=0)


def test_cached_greedy_equals_uncached_greedy(model):
    tokens, _, _ = sample(model, RAGGED, max_new_tokens=12, temperature=0)
    for prompt, out in zip(RAGGED, tokens):
        seq = list(prompt)
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert seq[len(prompt):] == out


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.8),
                                                     (1.0, 8, 0.9)])
def test_sampler_logprobs_equal_training_forward(model, temperature, top_k, top_p):
    """π_old from the sampler == a training forward's log-probs of the same distribution: softmax(logits
    / T) cut by top-k / top-p and renormalised (the distribution the tokens were drawn from), to 1e-5.
    With a cut, the whole softmax scores every sampled token lower by log(kept mass) > 0: the bias an
    uncorrected ratio carries."""
    tokens, logprobs, _ = sample(model, RAGGED, 10, temperature=temperature, top_k=top_k, top_p=top_p, seed=3)
    for prompt, toks, lps in zip(RAGGED, tokens, logprobs):
        ids = torch.tensor([prompt + toks])
        lp = sequence_logprobs(model, ids, temperature, top_k=top_k, top_p=top_p)[0, len(prompt) - 1:]
        torch.testing.assert_close(lp, torch.tensor(lps), atol=1e-5, rtol=0)
        whole = sequence_logprobs(model, ids, temperature)[0, len(prompt) - 1:]
        if top_k or top_p:
            assert bool((lp - whole > 1e-3).all())  # 3 cuts, 4 rows, 10 tokens: every one of them
        else:
            assert torch.equal(lp, whole)


def test_repeated_prompts_share_one_prefill_and_sample_independently(model):
    """GRPO asks for G samples of each prompt: the prefill runs once per distinct prompt (its first
    forward has 4 rows, not 8), yet every row's log-probs are a training forward's, greedy rows
    equal the prompt alone, and the copies of a prompt draw different samples."""
    prompts = [RAGGED[1], RAGGED[2], RAGGED[1], RAGGED[0], RAGGED[1], RAGGED[3], RAGGED[2], RAGGED[1]]
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: rows.append(out.size(0)))
    tokens, logprobs, _ = sample(model, prompts, 40, temperature=1.0, seed=5)
    hook.remove()
    assert rows[0] == 4 and rows[1] == 8
    for prompt, toks, lps in zip(prompts, tokens, logprobs):
        lp = sequence_logprobs(model, torch.tensor([prompt + toks]))[0, len(prompt) - 1:]
        torch.testing.assert_close(lp, torch.tensor(lps), atol=1e-5, rtol=0)
    assert len({tuple(tokens[i]) for i in (0, 2, 4, 7)}) == 4
    greedy, _, _ = sample(model, prompts, 12, temperature=0)
    for prompt, out in zip(prompts, greedy):
        assert out == sample(model, [prompt], 12, temperature=0)[0][0]


def shared_prompt_rows():
    """Right-padded rows of ragged prompts and responses: three rows share the prefix [1, 2, 3, 4] (one
    with another last prompt token), two share [6], one prompt is a single token (no prefix).
    Returns (ids, prompt_lens, response mask aligned with ids[:, 1:])."""
    prompts = [[1, 2, 3, 4, 5], [6, 7], [1, 2, 3, 4, 5], [8], [6, 7], [1, 2, 3, 4, 9]]
    responses = [[10, 11, 12], [13], [14, 15, 16, 17, 18, 19], [20, 21], [22, 23, 24], [25]]
    T = max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids = torch.zeros(len(prompts), T, dtype=torch.long)
    mask = torch.zeros(len(prompts), T - 1)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p) - 1:len(p) - 1 + len(r)] = 1
    return ids, torch.tensor([len(p) for p in prompts]), mask


def test_shared_prompts_give_the_same_logprobs_and_gradients(model):
    """Each distinct prefix runs once (3 for 6 rows), and the response log-probs and the gradient of
    every parameter (through the prompts' keys and values, summed over the rows that share them)
    equal one full forward per row; with LoRA too."""
    ids, lens, mask = shared_prompt_rows()
    assert SharedPrompts(ids, lens).prefix_ids.size(0) == 3
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    for lora in (False, True):
        if lora:
            apply_lora(model, 2, 4)
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.1)  # B = 0 at init would leave A without gradient
        params = [p for p in model.parameters() if p.requires_grad]
        results = []
        for shared_lens in (None, lens):
            logp = sequence_logprobs(model, ids, temperature=0.7, prompt_lens=shared_lens)
            grads = torch.autograd.grad((logp * weights).sum(), params)
            results.append((logp.detach() * mask, grads))
        (full, full_grads), (shared, shared_grads) = results
        assert torch.allclose(shared, full, atol=1e-5) and (full != 0).sum() == mask.sum()
        for p, a, b in zip(params, full_grads, shared_grads):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), p.shape
        if not lora:  # position 0 is in prompts only: its gradient came through the shared keys and values
            assert shared_grads[[p is model.transformer.wpe.weight for p in params].index(True)][0].abs().sum() > 0
        else:
            assert all(float(g.abs().sum()) > 0 for g in shared_grads)  # every adapter


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy_from_one_log_softmax(temperature):
    """The log-probs and their gradient are token_logprobs'; the entropy, taken a few rows at a time
    (chunks of 2 rows here), is −Σ p log p of softmax(logits / T) at every position, in float64, and
    carries no gradient."""
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 7, 50, generator=gen)).requires_grad_()
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    logp, entropy = token_logprobs_and_entropy(logits, targets, temperature, max_elements=100)
    (grad,) = torch.autograd.grad(logp.sum(), logits)
    expected = token_logprobs(logits, targets, temperature)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    assert torch.allclose(logp, expected, atol=1e-6) and torch.allclose(grad, expected_grad, atol=1e-6)
    p = torch.softmax(logits.detach().double() / temperature, -1)
    assert torch.allclose(entropy.double(), -(p * p.log()).sum(-1), atol=1e-5) and not entropy.requires_grad
    assert entropy.shape == (3, 7) and float(entropy.min()) > 0


def test_gelu_is_gpt2_tanh_gelu_in_either_form():
    """Without autograd, on 64 rows of 512 or more, gelu takes the x·σ(2u) form: the values of the
    tanh form to float rounding. With autograd it is F.gelu itself, gradient included."""
    x = 4 * torch.randn(64, 3, 512, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    exact = torch.nn.functional.gelu(x.double(), approximate="tanh")
    with torch.no_grad():
        assert (gelu(x).double() - exact).abs().max() < 2e-6
        assert not torch.equal(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))  # the other form ran
        assert torch.equal(gelu(x[:2]), torch.nn.functional.gelu(x[:2], approximate="tanh"))  # small: F.gelu
    xg = x.clone().requires_grad_()
    assert torch.equal(gelu(xg), torch.nn.functional.gelu(x, approximate="tanh"))


def test_seed_reproducible_and_stop_tokens_per_row(model):
    a = sample(model, RAGGED, 20, temperature=1.0, seed=7)
    b = sample(model, RAGGED, 20, temperature=1.0, seed=7)
    c = sample(model, RAGGED, 20, temperature=1.0, seed=8)
    assert a == b and a[0] != c[0]
    stop = a[0][1][2]  # a token row 1 produced at step 2: with it as stop token row 1 ends there
    tokens, logprobs, _ = sample(model, RAGGED, 20, temperature=1.0, seed=7, stop_tokens=(stop,))
    assert tokens[1] == a[0][1][:a[0][1].index(stop) + 1]  # identical up to and including its stop token
    for toks in tokens:  # a row ends at its first stop token (included) or at max_new_tokens
        assert stop not in toks[:-1] and (toks[-1] == stop or len(toks) == 20)
    assert [len(t) for t in tokens] == [len(lp) for lp in logprobs]
    assert sample(model, RAGGED, 20, temperature=1.0, seed=7, stop_tokens=(stop,))[:2] == (tokens, logprobs)


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert torch.isfinite(filter_logits(logits, 2, None)).tolist() == [[True, True, False, False, False]]
    # nucleus 0.8: 0.5 + 0.2 = 0.7 < 0.8, so the third token (cumulative 0.85) is still needed
    assert torch.isfinite(filter_logits(logits, None, 0.8)).tolist() == [[True, True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, None, 0.5)).tolist() == [[True, False, False, False, False]]


def test_sampler_frequencies_follow_the_distribution():
    """A one-step 'model' with known probabilities: empirical frequencies of 4000 draws match."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=8, vocab_size=4, n_layer=1, n_head=1, n_embd=8)).eval()
    prompts = [[0]] * 4000
    tokens, logprobs, _ = sample(m, prompts, 1, temperature=1.0, seed=0)
    p = torch.tensor(logprobs[0]).exp().item()
    counts = torch.bincount(torch.tensor([t[0] for t in tokens]), minlength=4).float() / 4000
    expected = m(torch.tensor([[0]]))[0, -1].softmax(-1)
    assert (counts - expected).abs().max() < 0.03
    assert math.isclose(p, expected[tokens[0][0]].item(), rel_tol=1e-5)


def test_prompt_too_long_is_a_clear_error(model):
    with pytest.raises(ValueError, match="block_size"):
        sample(model, [[1] * 64], 5)


def test_scalar_head_shape(model):
    values = ScalarHeadGPT(model)(torch.tensor(RAGGED[1:2]))
    assert values.shape == (1, 7)


def test_lora_zero_change_at_init_then_only_lora_trains_and_merge_is_exact(model):
    ids = torch.tensor([RAGGED[1]])
    before = model(ids).detach()
    base_weights = {k: v.clone() for k, v in model.state_dict().items()}
    n_trainable, n_total = apply_lora(model, rank=4, alpha=8)
    assert torch.equal(model(ids), before)  # B = 0 at init
    # 2 blocks x (c_attn 32->96, attn c_proj 32->32, c_fc 32->128, mlp c_proj 128->32), rank 4
    assert n_trainable == 2 * 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert n_total == count_parameters(model)[1]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        opt.zero_grad()
        (-sequence_logprobs(model, ids).mean()).backward()
        opt.step()
    model.eval()
    state = model.state_dict()
    for k, v in base_weights.items():
        key = k.replace("weight", "base.weight").replace("bias", "base.bias") if k not in state else k
        assert torch.equal(state[key], v), f"frozen {k} changed"
    tuned = model(ids).detach()
    assert not torch.allclose(tuned, before)
    merge_lora(model)
    assert not any("lora" in k for k in model.state_dict())
    torch.testing.assert_close(model(ids), tuned, atol=1e-5, rtol=0)


def test_tool_hook_injects_tokens_that_later_steps_condition_on(model):
    """A row that emits a trigger gets the tool's ids fed in (forced=1, log-prob 0); what it samples
    afterwards is what an uncached forward over the whole sequence predicts."""
    free, _, _ = sample(model, RAGGED, 8, temperature=0)
    trigger = free[0][1]
    injected = [40, 41, 42]
    hook = lambda row, generated: injected if row == 0 and generated[-1] == trigger and len(generated) == 2 else None
    tokens, logprobs, forced = sample(model, RAGGED, 10, temperature=0, tool_hook=hook)
    assert tokens[0][:5] == free[0][:2] + injected and forced[0][:5] == [0, 0, 1, 1, 1]
    assert logprobs[0][2:5] == [0.0] * 3
    seq = list(RAGGED[0]) + tokens[0][:5]
    for _ in range(5):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert tokens[0] == seq[len(RAGGED[0]):]
    assert tokens[1][:8] == free[1] and forced[1] == [0] * 10
