"""Tool calls inside generation: rows pause and resume independently, tokens in = tokens
out across turns, a bound on calls, and the forced tool tokens carry no weight in any loss."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import dpo
import envs
import grpo
import opd
from nanopost import pairs
import ppo
import train as T
from conftest import SFT_DATA, TINY
from nanopost.data import collate
from model import GPT, GPTConfig, sequence_logprobs
from nanopost.rollouts import last_response_column, rollouts, tool_hook
from sampler import sample
from sft import loss as sft_loss
from nanopost.tokenizer import Tokenizer

TOK = Tokenizer()
PROMPTS = [TOK.prompt_ids(p["prompt"]) for p in envs.Calculator().problems("train", 5)]
PROMPTS[1] = PROMPTS[1][:9]  # ragged


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=128, vocab_size=320, n_layer=2, n_head=2, n_embd=32)).eval()


def fake_run(trigger, opener=None, tool=envs.calculator, limit=2):
    """What rollouts.tool_hook reads, with `trigger` and `opener` standing for the closing and opening
    call tags (tokens the random model writes) and a counting tool."""
    tok = Tokenizer()
    tok.special = dict(tok.special, **{"/tool_call": trigger, "tool_call": opener or tok.special["tool_call"]})
    calls = []

    def counted(call, prompt, earlier):
        calls.append(call)
        return tool(call)
    return SimpleNamespace(tok=tok, env=SimpleNamespace(tool=counted), cfg={"max_tool_calls": limit}), calls


def test_rows_pause_independently_and_equal_the_same_row_alone(model):
    free = sample(model, PROMPTS, 40, temperature=0)[0]
    trigger = max(set(free[0]), key=free[0].count)  # a token row 0 writes, others at other steps or never
    run, calls = fake_run(trigger, opener=free[0][0])
    hook = tool_hook(run, PROMPTS)
    tokens, logprobs, forced = sample(model, PROMPTS, 40, temperature=0, tool_hook=hook)
    assert any(forced) and len({tuple(f) for f in forced}) > 1  # rows paused at different steps
    for i, prompt in enumerate(PROMPTS):
        alone = sample(model, [prompt], 40, temperature=0, tool_hook=hook)
        assert (tokens[i], forced[i]) == (alone[0][0], alone[2][0])
        torch.testing.assert_close(torch.tensor(logprobs[i]), torch.tensor(alone[1][0]), atol=1e-5, rtol=0)
        # every call of a row is answered by the result tags, injected verbatim as forced tokens
        for k in range(len(tokens[i]) - 1):
            if tokens[i][k] == trigger and not forced[i][k]:
                assert tokens[i][k + 1] == run.tok.special["tool_result"] and forced[i][k + 1] == 1
    assert calls


def test_call_bound_and_hook_output():
    run, calls = fake_run(TOK.special["/tool_call"], limit=2)
    hook, s = tool_hook(run, PROMPTS), TOK.special
    call = [s["tool_call"], *TOK.encode("347*28"), s["/tool_call"]]
    result = [s["tool_result"], *TOK.encode("9716"), s["/tool_result"]]
    assert hook(0, call[:-1]) is None
    assert hook(0, call) == result and calls == ["347*28"]
    assert hook(3, call + result + call) == result  # stateless: any row, judged by its own ids
    assert hook(1, call + result + call + result + call) == [s["tool_result"], *TOK.encode("error: at most 2 calls"),
                                                              s["/tool_result"]]
    assert len(calls) == 2  # the call past the bound never ran
    assert TOK.decode(hook(0, TOK.encode("1+1") + [s["/tool_call"]])[1:-1]).startswith("error:")
    assert tool_hook(SimpleNamespace(env=envs.Arithmetic(), tok=TOK, cfg={}), PROMPTS) is None  # no tool: no hook


def test_sampled_logprobs_equal_a_training_forward_across_turns(model):
    """Tokens in = tokens out: the ids the sampler returns, tool results included, scored in one
    training forward give the sampler's log-probs on every sampled token (temperature 0.8)."""
    model, (run, _) = calling_model(model), fake_run(TOK.special["/tool_call"])
    tokens, logprobs, forced = sample(model, PROMPTS, 40, temperature=0.8, seed=1, tool_hook=tool_hook(run, PROMPTS))
    assert sum(map(sum, forced)) > 0
    for prompt, toks, lps, f in zip(PROMPTS, tokens, logprobs, forced):
        full = sequence_logprobs(model, torch.tensor([prompt + toks]), 0.8)[0, len(prompt) - 1:]
        sampled = torch.tensor(f) == 0
        torch.testing.assert_close(full[sampled], torch.tensor(lps)[sampled], atol=1e-5, rtol=0)
        assert all(lp == 0.0 for lp, x in zip(lps, f) if x)


def calling_model(model, bias=3.0):
    """The random model with an untied output layer whose bias favours the closing call tag (and
    the opening one), so that sampled rollouts call the calculator now and then."""
    model = GPT(model.config)
    head = nn.Linear(model.config.n_embd, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[TOK.special["tool_call"]] = head.bias[TOK.special["/tool_call"]] = bias
        head.bias[TOK.eos] = -5.0
    model.lm_head = head
    return model


@contextlib.contextmanager
def perturbed_logits(module, where):
    """Add noise to `module`'s output (B, T, ...) at the positions where `where` (B, T) is True."""
    def hook(_, args, out):
        noise = 5 * torch.randn_like(out)
        keep = where[:, :out.size(1)].reshape(*where[:, :out.size(1)].shape, *([1] * (out.dim() - 2)))
        return out + noise * keep
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def loss_and_grads(loss_fn, model):
    model.zero_grad(set_to_none=True)
    loss_sum, count, _ = loss_fn()
    loss_sum.backward()
    return float(loss_sum.detach()), float(count), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_forced_weightless(loss_fn, model, modules, forced):
    """loss and gradient are the same when the logits (and values) on forced positions change."""
    torch.manual_seed(1)
    base = loss_and_grads(loss_fn, model)
    with contextlib.ExitStack() as stack:
        for m in modules:
            stack.enter_context(perturbed_logits(m, forced > 0))
        moved = loss_and_grads(loss_fn, model)
    assert base[:2] == pytest.approx(moved[:2], abs=1e-6)
    for a, b in zip(base[2], moved[2]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # and the same noise on sampled positions does move the loss (the check can fail)
    with perturbed_logits(modules[0], forced == 0):
        assert loss_and_grads(loss_fn, model)[0] != pytest.approx(base[0], abs=1e-4)


def tool_run(tmp_path, **cfg):
    run = T.train(dict(TINY, env="calculator", max_iters=0, checkpoint=False, max_new_tokens=96,
                       out_dir=str(tmp_path / cfg["algo"]), **cfg))
    policy = run.raw_model.policy if cfg["algo"].startswith("ppo") else run.raw_model
    policy.lm_head = calling_model(policy).lm_head
    return run, policy


def test_grpo_rollouts_mask_tool_tokens_and_they_carry_no_weight(tmp_path):
    # share_prompt=False: the perturbation below addresses logits by their position in ids, which a
    # shared-prompt forward does not keep (tests/test_grpo.py shows both forwards give equal losses)
    run, policy = tool_run(tmp_path, algo="process_reward", prompts_per_iter=2, group_size=4, learning_rate=1e-3,
                           share_prompt=False)
    roll = rollouts(run, policy, run.env.problems("train", 2), 4, seed=0)
    assert roll.forced.sum() > 0 and not bool((roll.forced * roll.mask).any())
    assert bool(((roll.forced > 0) <= (roll.old_logprobs == 0)).all())
    for i, (toks, start) in enumerate(zip(roll.responses, roll.prompt_lens.tolist())):  # ids hold every token
        assert roll.ids[i, start:start + len(toks)].tolist() == toks
    step = run.algo.batches(run, run.state, 0)[0][0]
    for mb in step:
        forced = (mb.mask == 0) & (torch.arange(mb.mask.size(1)) < last_response_column(mb.mask)[:, None])
        forced &= torch.arange(mb.mask.size(1)) >= (mb.mask > 0).float().argmax(1, keepdim=True)
        if forced.any():
            assert_forced_weightless(lambda: grpo.loss(run, run.state, run.model, mb), policy, [policy.lm_head], forced)
            break
    else:
        pytest.fail("no minibatch with tool tokens inside a response")


def test_ppo_and_sft_and_opd_give_tool_tokens_no_weight(tmp_path):
    run, policy = tool_run(tmp_path, algo="ppo_rlvp", batch_size=4, minibatches=1)
    mb = run.algo.batches(run, run.state, 0)[0][0][0]
    forced = (mb.mask == 0) & (mb.ids[:, 1:] != run.tok.pad)
    forced &= torch.arange(mb.mask.size(1)) >= (mb.mask > 0).float().argmax(1, keepdim=True)
    assert forced.any()
    assert_forced_weightless(lambda: ppo.loss(run, run.state, run.model, mb), run.raw_model,
                             [policy.lm_head, run.raw_model.critic.head], forced)

    sft = T.train(dict(TINY, **SFT_DATA, env="calculator", env_direct_frac=0.0, max_iters=0,
                       out_dir=str(tmp_path / "sft")))
    ids, mask = collate(sft.state.train_examples[:4], sft.tok.pad, "cpu")
    results = (mask[:, 1:] == 0) & (ids[:, 1:] != sft.tok.pad) & (mask.cumsum(1)[:, 1:] > 0)
    assert results.any()
    assert_forced_weightless(lambda: sft_loss(sft, sft.state, sft.raw_model, (ids, mask)), sft.raw_model,
                             [sft.raw_model.lm_head], results)

    # OPD: the teacher reads the tool's tokens but grades only sampled ones
    run, policy = tool_run(tmp_path, algo="opsd")
    roll = rollouts(run, policy, run.env.problems("train", 4), 1, seed=0)
    prompts = [envs.privileged_prompt(run.env, problem, run.cfg["privileged"]) for problem in roll.problems]
    logprobs, graded = opd.teacher_logprobs(run, run.state.teacher, roll, prompts)
    assert bool((graded <= roll.mask).all())
    tool_before = roll.forced.cumsum(1) > 0  # a graded token with tool tokens before it
    i, col = (graded.bool() & tool_before).nonzero()[-1].tolist()
    k = col - (int(roll.prompt_lens[i]) - 1)  # its index in the response
    seq = run.tok.prompt_ids(prompts[i]) + roll.responses[i][:k + 1]
    expected = torch.log_softmax(run.state.teacher(torch.tensor([seq[:-1]]))[0, -1], -1)
    torch.testing.assert_close(logprobs[i, col], expected, atol=1e-5, rtol=0)


def test_preference_pairs_give_tool_results_no_weight(tmp_path):
    # RM and DPO on tool transcripts: the style pairs of --env=calculator hold the tool's results
    # (as tags in the demonstration); they are context, not something either answer is credited for
    run = T.train(dict(TINY, algo="dpo", env="calculator", env_direct_frac=0.0, pairs="style", train_prompts=6,
                       heldout_prompts=2, max_iters=0, checkpoint=False, share_prompt=False,  # (as above)
                       out_dir=str(tmp_path / "dpo")))
    batch = pairs.collate(run, run.state.train_examples[:4])
    results = (batch["mask"] == 0) & (batch["ids"][:, 1:] != run.tok.pad) & (batch["mask"].cumsum(1) > 0)
    assert results.any()
    assert bool((batch["ids"][:, 1:][results] != run.tok.special["tool_call"]).all())  # calls are the model's
    open_tag, close_tag = run.tok.special["tool_result"], run.tok.special["/tool_result"]
    for ex in run.state.train_examples[:4]:
        for ids, mask in zip(ex["responses"], ex["masks"]):
            expected, inside = [], False
            for token in ids:  # 0 from each opening result tag through its closing tag
                inside = inside or token == open_tag
                expected.append(0 if inside else 1)
                inside = inside and token != close_tag
            assert mask == expected and 0 in mask
    assert_forced_weightless(lambda: dpo.loss(run, run.state, run.model, batch), run.raw_model, [run.raw_model.lm_head], results)
