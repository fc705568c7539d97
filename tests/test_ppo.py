"""PPO (ppo.py) and its lab (lab/ppo_*.py): memory anatomy, GAE, KL shaping, the clipped losses,
masking, end-to-end runs (a toy reward through the verifier hook, and a reward-model checkpoint:
ppo_rm), LoRA, resume of the adaptive β (ppo_adaptive_kl), and DDP lockstep with the early stop
(ppo_early_stop)."""

import dataclasses
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nanopost import checkpoints
import envs
import ppo
import train as T
from lab import ppo_process, ppo_rlvp, ppo_rm
from nanopost.checkpoints import load_model
from conftest import forward_calls, run_ddp
from nanopost.distributed import stage_memory_gib
from model import GPT, GPTConfig, ScalarHeadGPT, clipped_surrogate, kl_estimate, sequence_logprobs, token_logprobs
from nanopost.rollouts import old_logprobs_mode, score_responses


def ppo_config(tiny, **overrides):
    """TINY plus small PPO settings: two minibatches × two epochs per rollout batch of 8."""
    return {**tiny, **dict(algo="ppo", batch_size=4, minibatches=2, inner_epochs=2, max_new_tokens=8,
                           prompt_pool=64, learning_rate=1e-3, min_lr=1e-3, warmup_iters=0), **overrides}


def metrics_rows(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]


# ----------------------------------------------------------------------------------------------
# Memory anatomy [M14 §10]

def test_stage_memory_gib_reproduces_the_worked_example():
    n = 8.03e9
    trained, frozen = stage_memory_gib(n, ["train"]), stage_memory_gib(n, ["frozen_bf16"])
    ppo_gib = stage_memory_gib(n, ["train", "train", "frozen_bf16", "frozen_bf16"])
    dpo_gib = stage_memory_gib(n, ["train", "frozen_bf16"])
    assert f"{trained:.1f} {frozen:.2f} {ppo_gib:.1f} {dpo_gib:.1f}" == "119.7 14.96 269.2 134.6"
    assert f"{ppo_gib / dpo_gib:.2f}" == "2.00"
    assert f"{trained / ppo_gib:.0%}" == "44%"  # the critic's share of the PPO budget
    assert trained == pytest.approx(16 * n / 2**30) and ppo_gib == pytest.approx(36 * n / 2**30)
    with pytest.raises(ValueError, match="positive"):
        stage_memory_gib(float("nan"), ["train"])
    with pytest.raises(ValueError, match="unknown model state"):
        stage_memory_gib(n, ["train", "fp8"])


# ----------------------------------------------------------------------------------------------
# GAE and the reward shaping

def random_rollout_layout(rng, n_rows=5, width=12):
    """A (rows, width) mask like rollouts': prompt zeros, a contiguous response, padding zeros."""
    mask = torch.zeros(n_rows, width)
    for i in range(n_rows):
        start = int(rng.integers(1, 5))
        length = int(rng.integers(1, width - start + 1))
        mask[i, start:start + length] = 1
    return mask


def gae_by_definition(rewards, values, gamma, lam):
    """Â_t = Σ_l (γλ)^l δ_{t+l} over one response (lists), V = 0 after the last token."""
    n = len(rewards)
    deltas = [rewards[t] + gamma * (values[t + 1] if t + 1 < n else 0.0) - values[t] for t in range(n)]
    return [sum((gamma * lam) ** (l - t) * deltas[l] for l in range(t, n)) for t in range(n)]


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 0.0)])
def test_gae_matches_the_definition_on_random_rollouts(gamma, lam):
    rng = np.random.default_rng(0)
    mask = random_rollout_layout(rng)
    rewards = torch.tensor(rng.normal(size=mask.shape), dtype=torch.float32) * mask
    values = torch.tensor(rng.normal(size=mask.shape), dtype=torch.float32)  # junk off the response too
    advantages, returns = ppo.gae(rewards, values, mask, gamma, lam)
    for i in range(len(mask)):
        idx = mask[i].nonzero().flatten().tolist()
        expected = gae_by_definition(rewards[i, idx].tolist(), values[i, idx].tolist(), gamma, lam)
        assert advantages[i, idx].tolist() == pytest.approx(expected, abs=1e-5)
        assert returns[i, idx].tolist() == pytest.approx((advantages[i, idx] + values[i, idx]).tolist(), abs=1e-6)
        off = (mask[i] == 0).nonzero().flatten()
        assert torch.all(advantages[i, off] == 0)


def test_gae_with_lambda_1_gamma_1_is_reward_to_go_minus_value():
    rng = np.random.default_rng(1)
    mask = random_rollout_layout(rng)
    rewards = torch.tensor(rng.normal(size=mask.shape), dtype=torch.float32) * mask
    values = torch.tensor(rng.normal(size=mask.shape), dtype=torch.float32)
    advantages, returns = ppo.gae(rewards, values, mask, 1.0, 1.0)
    reward_to_go = rewards.flip(1).cumsum(1).flip(1)  # Σ_{k ≥ t} r_k (rewards are 0 off the response)
    on = mask.bool()
    assert torch.allclose(advantages[on], (reward_to_go - values)[on], atol=1e-5)
    assert torch.allclose(returns[on], reward_to_go[on], atol=1e-5)


def test_kl_penalty_sits_on_response_tokens_and_the_score_on_the_last():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    logp = torch.tensor([[-9., -9., -1.0, -2.0, -0.5, -9.], [-9., -0.2, -3.0, -9., -9., -9.]])
    ref = torch.tensor([[-1., -1., -1.5, -1.0, -0.5, -1.], [-1., -0.7, -2.0, -1., -1., -1.]])
    kl = kl_estimate(logp, ref, "k1") * mask
    rewards = ppo.shaped_rewards(torch.tensor([1.0, -2.0]), kl, mask, kl_coef=0.1)
    # row 0: −0.1·(0.5, −1, 0), score 1 at column 4; row 1: −0.1·(0.5, −1), score −2 at column 2
    expected = torch.tensor([[0, 0, -0.05, 0.1, 1.0, 0], [0, -0.05, 0.1 - 2.0, 0, 0, 0]])
    assert torch.allclose(rewards, expected, atol=1e-7)


def test_every_reward_variant_carries_one_kl_penalty(monkeypatch):
    """ppo, ppo_process and ppo_rlvp (and its Φ alone): −β·k_t once on every response token, plus
    the variant's own channel; the rewards are read where batches() hands them to GAE."""
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    kl = torch.tensor([[0.0, 0.5, -1.0, 2.0], [1.0, 0.25, 0.0, 0.0]]) * mask
    steps = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    path = torch.tensor([[0.0, -1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    penalty = -0.1 * kl
    outcome = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0]])
    given = []
    monkeypatch.setattr(ppo, "gae", lambda rewards, *rest: given.append(rewards) or (rewards, rewards))
    monkeypatch.setattr(ppo, "whitened_steps", lambda *args: ([], {}))
    monkeypatch.setattr(ppo, "sample_and_score", lambda run, state, it: [ppo.Batch(
        ids=None, mask=mask, old_logprobs=kl, old_values=torch.zeros_like(mask), reward=torch.tensor([1.0, 0.0]),
        ref_logprobs=torch.zeros_like(mask))])
    monkeypatch.setattr(ppo_process, "token_rewards", lambda run, roll, signals: (steps, None))
    monkeypatch.setattr(ppo_rlvp, "token_rewards", lambda run, roll, signals: (path, None))
    run, state = SimpleNamespace(cfg=dict(gamma=1.0, lam=1.0, rlvp_beta=0.5, rlvp_penalty=1.0, rlvp_bonus=1.0),
                                 env=SimpleNamespace(step_rewards=None)), \
        SimpleNamespace(kl_coef=0.1)
    for module, outcome_kept, channel in ((ppo, True, outcome), (ppo_process, True, steps), (ppo_rlvp, True, outcome + 0.5 * path),
                                          (ppo_rlvp, False, path)):
        run.cfg["rlvp_outcome"] = outcome_kept
        module.batches(run, state, 0)
        assert torch.allclose(given[-1], penalty + channel, atol=1e-7), module.__name__
    assert float(given[-1][0, 2]) == pytest.approx(0.1 + 1.0)


def test_kl_estimators_worked_value_and_exact_expectation():
    assert float(kl_estimate(torch.tensor(-1.0), torch.tensor(-1.5), "k3")) == pytest.approx(0.106531, abs=1e-6)
    # on a categorical, E_π[k1] and E_π[k3] over tokens drawn from π both equal KL(π‖π_ref)
    torch.manual_seed(0)
    logp, ref = torch.randn(7).log_softmax(0), torch.randn(7).log_softmax(0)
    kl = float((logp.exp() * (logp - ref)).sum())
    for name in ("k1", "k3"):
        assert float((logp.exp() * kl_estimate(logp, ref, name)).sum()) == pytest.approx(kl, rel=1e-5)
    assert bool((kl_estimate(logp, ref, "k3") >= 0).all())
    with pytest.raises(ValueError, match="k1 or k3"):
        kl_estimate(logp, ref, "k2")


# ----------------------------------------------------------------------------------------------
# The clipped losses

def test_clipped_surrogate_worked_values_and_gradients():
    old = torch.zeros(4)
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    logp = ratio.log().requires_grad_()
    loss, clipped = clipped_surrogate(torch.exp(logp - old), adv, torch.ones(4, dtype=torch.bool), 0.2, 0.2)
    # min(ρÂ, clip(ρ)Â): 1.2 (clipped), 0.5, −1.5, −0.8 (clipped); the loss is its negative
    assert loss.tolist() == pytest.approx([-1.2, -0.5, 1.5, 0.8])
    assert clipped.tolist() == [True, False, False, True]
    loss.sum().backward()
    # ∂(−ρÂ)/∂log ρ = −ρÂ where unclipped, 0 where the clipped term is active
    assert logp.grad.tolist() == pytest.approx([0.0, -0.5, 1.5, 0.0])


def test_clipped_value_loss_worked_values_and_gradients():
    old = torch.tensor([0.5, 0.5, 0.5])
    new = torch.tensor([1.0, 0.8, 0.6], requires_grad=True)
    ret = torch.tensor([0.0, 1.0, 1.0])
    loss = ppo.clipped_value_loss(new, old, ret, 0.2)
    # row 0: ½·max(1.0², 0.7²) = 0.5 (unclipped wins, gradient V − R = 1)
    # row 1: ½·max(0.2², 0.3²) = 0.045 (the clipped value 0.7 wins, no gradient)
    # row 2: inside the clip range, ½·0.4² = 0.08, gradient V − R = −0.4
    assert loss.tolist() == pytest.approx([0.5, 0.045, 0.08])
    loss.sum().backward()
    assert new.grad.tolist() == pytest.approx([1.0, 0.0, -0.4])


def tiny_policy_and_critic():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=2, n_embd=16))
    critic = ScalarHeadGPT(GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=2, n_embd=16)))
    return ppo.PolicyAndCritic(gpt, critic)


def test_masked_tokens_contribute_nothing():
    model = tiny_policy_and_critic()
    run = SimpleNamespace(cfg=dict(temperature=0.7, clip_eps=0.2, value_clip=0.2, vf_coef=0.5))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (3, 10), generator=g)
    mask = random_rollout_layout(np.random.default_rng(2), n_rows=3, width=9)
    batch = ppo.Batch(ids=ids, mask=mask, old_logprobs=-torch.rand(3, 9, generator=g) * mask,
                 old_values=torch.randn(3, 9, generator=g) * mask, advantages=torch.randn(3, 9, generator=g) * mask,
                 returns=torch.randn(3, 9, generator=g) * mask)

    def loss_and_grads(batch):
        model.zero_grad()
        loss_sum, count, _ = ppo.loss(run, None, model, batch)
        loss_sum.backward()
        return float(loss_sum.detach()), float(count), [p.grad.clone() for p in model.parameters()]

    before = loss_and_grads(batch)
    off = mask == 0
    noisy = dataclasses.replace(batch, **{k: torch.where(off, torch.randn(3, 9, generator=g) * 5, getattr(batch, k))
                                          for k in ("old_logprobs", "old_values", "advantages", "returns")})
    after_response = torch.zeros_like(ids, dtype=torch.bool)  # padding tokens after each response
    for i in range(3):
        last = int(mask[i].nonzero().max()) + 1  # ids index of the last response token
        after_response[i, last + 1:] = True
    noisy.ids = torch.where(after_response, torch.randint(0, 64, ids.shape, generator=g), ids)
    after = loss_and_grads(noisy)
    assert after[1] == before[1] == float(mask.sum())
    assert after[0] == pytest.approx(before[0], rel=1e-6)
    for a, b in zip(after[2], before[2]):
        assert torch.allclose(a, b, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# End-to-end runs

def ascii_share(problem, response):
    """A toy reward a random policy can raise in a few PPO steps: the share of ASCII characters
    (about half of a random tiny model's bytes; the rest are high bytes and unused ids)."""
    return sum(ord(c) < 128 for c in response) / max(len(response), 1)


def test_end_to_end_ppo_raises_a_toy_reward(tiny, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(ascii_share))
    run = T.train(ppo_config(tiny, max_iters=10, batch_size=8, kl_coef=0.0, learning_rate=1e-2, min_lr=1e-2,
                             checkpoint=False))
    rewards = [r["verifier_acc"] for r in metrics_rows(run.cfg["out_dir"]) if "verifier_acc" in r]
    assert len(rewards) == 10
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.2, rewards
    row = metrics_rows(run.cfg["out_dir"])[-1]
    for key in ("clip_frac", "entropy", "value_loss", "explained_var", "len_mean", "work_frac", "approx_kl"):
        assert math.isfinite(row[key]), key
    assert row["ppo_steps"] == 4


def test_rollouts_score_the_reference_only_when_the_kl_penalty_is_on(tiny, monkeypatch):
    """π_old is the sampler's (auto on CPU: only the critic runs, with the values the joint forward
    gives); π_ref runs only when β > 0."""
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(ascii_share))
    run = T.train(ppo_config(tiny, max_iters=0, kl_coef=0.0))
    assert old_logprobs_mode(run) == "sampler"
    with forward_calls(policy=run.raw_model.policy, critic=run.raw_model.critic, reference=run.state.reference) as calls:
        steps, figures = ppo.batches(run, run.state, 0)
        micro = steps[0]
        assert calls == ["critic"] * run.cfg["minibatches"]  # one forward per micro-batch of rollouts
        assert "kl_ref" not in figures and 0 <= figures["work_frac"] <= 1
        run.state.kl_coef = 0.05
        _, figures = ppo.batches(run, run.state, 0)
        assert sorted(set(calls)) == ["critic", "reference"] and "kl_ref" in figures
    for mb in micro:  # the sampler's log-probs are π_old: what the loss's forward gives before an update
        with torch.no_grad():
            logits, values = run.raw_model(mb.ids[:, :-1])
        logprobs = token_logprobs(logits, mb.ids[:, 1:], run.cfg["temperature"]) * mb.mask
        assert torch.allclose(logprobs, mb.old_logprobs, atol=1e-5)
        assert torch.equal(values * mb.mask, mb.old_values)


def test_beta_zero_trains_exactly_as_when_the_reference_is_scored(tiny, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(ascii_share))
    cfg = ppo_config(tiny, max_iters=2, kl_coef=0.0, checkpoint=False)
    skipped = T.train(dict(cfg, out_dir=tiny["out_dir"] + "_skipped"))
    unscored = ppo.score_micro_batch

    def scored_micro_batch(run, state, problems, seed):  # π_ref read although β = 0
        mb = unscored(run, state, problems, seed)
        with torch.no_grad():
            mb.ref_logprobs = sequence_logprobs(state.reference, mb.ids, run.cfg["temperature"]) * mb.mask
        return mb
    monkeypatch.setattr(ppo, "score_micro_batch", scored_micro_batch)
    scored = T.train(cfg)
    assert "kl_ref" in metrics_rows(scored.cfg["out_dir"])[-1]
    assert "kl_ref" not in metrics_rows(skipped.cfg["out_dir"])[-1]
    for (name, a), b in zip(skipped.raw_model.state_dict().items(), scored.raw_model.state_dict().values()):
        assert torch.equal(a, b), name


def test_reward_model_path_scores_rollouts_with_rm_score(tiny, monkeypatch, capsys):
    # a tiny reward-model checkpoint from --algo rm (one step is enough: only the plumbing is tested)
    rm_dir = os.path.join(tiny["out_dir"], "rm")
    T.train(dict(tiny, algo="rm", out_dir=rm_dir, max_iters=1, train_prompts=4, heldout_prompts=2,
                 group_size=1, max_new_tokens=8))
    calls = []
    real_score = score_responses

    def recording_score(reward_model, ids, mask):
        out = real_score(reward_model, ids, mask)
        calls.append((reward_model, ids.clone(), mask.clone(), out.clone()))
        return out

    monkeypatch.setattr(ppo_rm, "score_responses", recording_score)
    real_load, loaded = load_model, []
    monkeypatch.setattr(checkpoints, "load_model", lambda ckpt_dir, *a: loaded.append(ckpt_dir) or real_load(ckpt_dir, *a))
    run = T.train(ppo_config(tiny, algo="ppo_rm", max_iters=1, reward_model=rm_dir, critic_init="reward_model"))
    assert loaded.count(rm_dir) == 2  # the frozen reward, and the critic's start
    reward_model = real_load(rm_dir)
    assert len(calls) == 2  # one per micro-batch of the rollout batch
    for model, ids, mask, out in calls:
        assert model is run.state.reward_model
        with torch.no_grad():
            values = reward_model(ids)  # the scalar at each row's last response token, found by hand
            expected = [float(values[i, int(mask[i].nonzero().max()) + 1]) for i in range(len(ids))]
        assert out.tolist() == pytest.approx(expected, abs=1e-5)
    assert metrics_rows(run.cfg["out_dir"])[-1]["rm_score"] == pytest.approx(float(torch.cat([c[3] for c in calls]).mean()), abs=1e-6)
    for name, p in reward_model.state_dict().items():  # the frozen RM did not move; the critic (its copy) did
        assert torch.equal(p, run.state.reward_model.state_dict()[name])
    assert not torch.equal(run.raw_model.critic.head.weight, reward_model.head.weight)
    # the memory anatomy printed at setup, for this run's four roles (two trained, two frozen)
    sizes = [sum(p.numel() for p in m.state_dict().values()) - m.config.n_embd * m.config.vocab_size
             for m in (run.raw_model.policy, run.raw_model.critic, run.state.reference, run.state.reward_model)]  # tied: once
    expected = sum(stage_memory_gib(n, [kind]) for n, kind in zip(sizes, ["train", "train", "frozen_bf16",
                                                                            "frozen_bf16"]))
    printed = capsys.readouterr().out
    assert f"= {expected:.4g} GiB; critic {stage_memory_gib(sizes[1], ['train']) / expected:.0%}" in printed


def test_bad_reward_settings_are_clear_errors(tiny):
    with pytest.raises(ValueError, match="unknown config key 'reward' for --algo ppo"):
        T.train(ppo_config(tiny, reward="human"))
    with pytest.raises(ValueError, match="--reward_model"):
        T.train(ppo_config(tiny, reward="rm"))  # the old spelling of --algo ppo_rm
    sft_dir = os.path.join(tiny["out_dir"], "sft")
    T.train(dict(tiny, algo="sft", out_dir=sft_dir, max_iters=1))
    with pytest.raises(ValueError, match="not a reward model"):
        T.train(ppo_config(tiny, reward="rm", reward_model=sft_dir))


def test_lora_trains_policy_and_critic_adapters_and_the_critic_head(tiny):
    run = T.train(ppo_config(tiny, max_iters=1, lora_rank=2, learning_rate=1e-2, min_lr=1e-2))
    trainable = {n for n, p in run.raw_model.named_parameters() if p.requires_grad}
    assert any(n.startswith("policy.") and "lora_A" in n for n in trainable)
    assert any(n.startswith("critic.") and "lora_B" in n for n in trainable)
    assert {"critic.head.weight", "critic.head.bias"} <= trainable
    assert all("lora_" in n or n.startswith("critic.head") for n in trainable)
    exported = load_model(run.cfg["out_dir"])  # the policy alone, LoRA merged
    assert isinstance(exported, GPT)
    ids = torch.randint(0, 256, (2, 12))
    assert torch.allclose(exported(ids), run.raw_model.policy(ids), atol=1e-5)


def test_adaptive_kl_coef_moves_and_resumes_exactly(tiny, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(ascii_share))  # a reward with a gradient
    cfg = ppo_config(tiny, algo="ppo_adaptive_kl", max_iters=3, kl_target=1e-4, kl_coef=0.1)
    straight = T.train(dict(cfg, out_dir=tiny["out_dir"] + "_straight"))
    T.train(dict(cfg, max_iters=2))
    resumed = T.train(dict(algo="ppo_adaptive_kl", out_dir=tiny["out_dir"], init_from="resume", max_iters=3))
    # β ← β·(1 + 0.1·clip(KL/target − 1, ±0.2)) after each iteration, from the batch's KL per response
    rows = [r for r in metrics_rows(straight.cfg["out_dir"]) if "kl_coef" in r]
    betas = [r["kl_coef"] for r in rows] + [straight.state.kl_coef]
    for beta, kl, after in zip(betas, [r["kl_ref"] for r in rows], betas[1:]):
        assert after == pytest.approx(beta * (1 + 0.1 * float(np.clip(kl / 1e-4 - 1, -0.2, 0.2))), rel=1e-12)
    assert betas[1] == pytest.approx(0.098) and betas != pytest.approx([0.1] * 4)
    assert resumed.state.kl_coef == pytest.approx(straight.state.kl_coef, rel=1e-12)
    for (name, a), b in zip(straight.raw_model.state_dict().items(), resumed.raw_model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


# ----------------------------------------------------------------------------------------------
# DDP

def report(run):
    return dict(state={k: v.numpy().copy() for k, v in run.raw_model.state_dict().items()},
                kl_coef=run.state.kl_coef, steps=metrics_rows(run.cfg["out_dir"])[-1]["ppo_steps"])


def train_with_ascii_reward(overrides):
    envs.Arithmetic.verify = staticmethod(ascii_share)  # in a spawned worker: nothing to restore
    return report(T.train(overrides))


def test_two_processes_equal_one_process_and_stay_identical(tiny, monkeypatch):
    # early_stop_kl this small stops every iteration after its second step, on both ranks alike
    cfg = ppo_config(tiny, algo="ppo_early_stop", max_iters=2, batch_size=2, early_stop_kl=1e-9, checkpoint=False)
    ranks = run_ddp(train_with_ascii_reward, dict(cfg, out_dir=tiny["out_dir"] + "_ddp", gradient_accumulation_steps=1))
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(ascii_share))
    single = report(T.train(dict(cfg, gradient_accumulation_steps=2)))
    assert ranks[0]["steps"] == ranks[1]["steps"] == single["steps"] == 2
    assert ranks[0]["kl_coef"] == ranks[1]["kl_coef"] == pytest.approx(single["kl_coef"], rel=1e-9)
    for name, value in single["state"].items():
        assert np.array_equal(ranks[0]["state"][name], ranks[1]["state"][name]), name
        assert np.allclose(ranks[0]["state"][name], value, atol=1e-5), name


# ----------------------------------------------------------------------------------------------
# Old spellings: each option that became a variant of the lab runs it, with a note

def test_old_ppo_options_name_their_variant(capsys):
    from nanopost import options
    assert options.make_config(dict(algo="ppo", reward="rm", reward_model="out/rm"))["algo"] == "ppo_rm"
    assert options.make_config(dict(algo="ppo", kl_estimator="k3"))["algo"] == "ppo_k3"
    assert options.make_config(dict(algo="ppo", kl_estimator="k1"))["algo"] == "ppo"
    assert options.make_config(dict(algo="ppo", ppo_epochs=3))["inner_epochs"] == 3
    assert "--reward='rm' is now --algo ppo_rm" in capsys.readouterr().out
    with pytest.raises(ValueError, match="'kl_target' for --algo ppo; it is an option of --algo ppo_adaptive_kl"):
        options.make_config(dict(algo="ppo", kl_target=0.5))
    with pytest.raises(ValueError, match="\\(now --algo ppo_k3\\) and --algo ppo_rm are no one variant"):
        options.make_config(dict(algo="ppo", reward="rm", kl_estimator="k3"))
    plain = set(options.make_config(dict(algo="ppo")))  # the variants' keys are theirs alone
    assert not {"reward_model", "critic_init", "kl_target", "early_stop_kl", "rlvp_beta", "kl_estimator"} & plain
