"""grpo.py and its lab (lab/rloo, dr_grpo, dapo, reinforce, one_step_off, ...): the worked examples of SPEC
§5, the estimators' gradients on a bandit, clipping, padding, degenerate groups, dynamic sampling, the KL
term, the sampler/trainer traps, DDP, the recipes."""

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
import zlib
from types import SimpleNamespace

import pytest
import torch

import envs
import grpo
from nanopost import options
import train as T
from nanopost.checkpoints import build_model
from conftest import TINY, forward_calls, run_ddp
from lab import dapo, dr_grpo, one_step_off, rloo
from model import kl_estimate, sequence_logprobs
from nanopost.rollouts import Rollout, old_logprobs_mode, score_tokens
from nanopost.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(algo="grpo", prompts_per_iter=4, group_size=4, max_new_tokens=16, checkpoint=False)


def coin_reward(problem, text):
    """A deterministic reward that varies between responses (crc32, not hash(): the same in every process)."""
    return float(zlib.crc32(text.encode()) % 2)


def some_degenerate_reward(problem, text):
    """Problems with a start divisible by 3 always score 1 (a degenerate group); the rest vary."""
    return 1.0 if problem["start"] % 3 == 0 else coin_reward(problem, text)


@contextlib.contextmanager
def patched(run, verify=coin_reward, **cfg):
    """Temporarily give the run another verifier and config values; yields the algorithm's state
    set up under them (grpo.setup chooses the family's options once, from the config)."""
    old_verify, old_cfg = run.env.verify, run.cfg
    run.env.verify, run.cfg = verify, dict(run.cfg, **cfg)
    try:
        yield grpo.setup(run, None)
    finally:
        run.env.verify, run.cfg = old_verify, old_cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A set-up grpo run on the tiny model (no iterations yet): for calling batches / loss directly."""
    return T.train(dict(TINY, **SMALL, max_iters=0, out_dir=str(tmp_path_factory.mktemp("grpo") / "run")))


def aggregates(max_len):
    """The loss aggregations of the family: GRPO's, DAPO's token mean, Dr. GRPO's sum over L_max."""
    return dict(seq_mean_token_mean=grpo.seq_mean_token_mean, token_mean=dapo.token_mean,
                seq_mean_token_sum_norm=lambda per_token, mask: dr_grpo.seq_mean_token_sum_norm(per_token, mask, max_len))


def policy_loss(logp, old, adv, mask, loss_agg="token_mean", max_len=1, ref=None, clip_eps=0.2, clip_eps_high=None,
                kl_coef=0.0):
    """grpo's loss pieces on plain tensors: the policy term, the KL term, an aggregation -> (sum, count, figures)."""
    run = SimpleNamespace(cfg=dict(clip_eps=clip_eps, kl_coef=kl_coef))
    batch = SimpleNamespace(mask=mask, old_logprobs=old, advantages=adv, ref_logprobs=ref)
    per_token, figures = grpo.policy_term(run, batch, logp, eps_high=clip_eps_high)
    per_token, kl_figures = grpo.with_kl_term(run, per_token, logp, batch)
    loss_sum, count = aggregates(max_len)[loss_agg](per_token, mask)
    return loss_sum, count, dict(figures, **kl_figures)


def grpo_advantages(rewards):
    """GRPO's advantages of (P, G) or (G,) rewards, as the seed's primitive (M14 §13) gives them."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    return grpo.group_advantages(r.flatten(), r.size(-1)).view(r.shape)


def group_advantages(rewards, estimator):
    """(P, G) rewards -> (P, G) advantages of a group estimator: Dr. GRPO's r − mean, RLOO's leave-one-out."""
    G = rewards.size(1)
    advantages = dr_grpo.centred_advantages if estimator == "dr_grpo" else rloo.leave_one_out_advantages
    return advantages(rewards.flatten(), G).view(-1, G)


# ---------------------------------------------------------------------------------------------
# SPEC §5 worked examples

def test_grpo_group_example_and_ddof_factor():
    r = torch.tensor([1., 0, 0, 1, 0, 0, 1, 0])
    adv = grpo_advantages(r)
    assert round(float(r.mean()), 3) == 0.375 and round(float(r.std(correction=0)), 4) == 0.4841
    assert round(float(adv[0]), 3) == 1.291 and round(float(adv[1]), 3) == -0.775
    assert abs(float(adv.sum())) < 1e-6
    ddof1 = (r - r.mean()) / r.std(correction=1)
    assert torch.allclose(ddof1 / adv, torch.full((8,), math.sqrt(7 / 8)))


def test_grpo_advantages_degenerate_rule():
    # 0.1 * 3 rounds so that mean != 0.3 in float32: std would be ~1e-8 and the advantages huge
    rows = torch.tensor([[0.3, 0.3, 0.3], [1.0, 0.0, 0.0]])
    adv = grpo_advantages(rows)
    assert torch.equal(adv[0], torch.zeros(3))
    assert torch.allclose(adv[1], torch.tensor([2.0, -1.0, -1.0]) / math.sqrt(2.0))


def test_zero_variance_share_p03_g8():
    groups = torch.tensor(list(itertools.product([0.0, 1.0], repeat=8)))  # all 2^8 groups
    p = 0.3
    prob = p ** groups.sum(1) * (1 - p) ** (8 - groups.sum(1))
    share = float((prob * grpo.degenerate_groups(groups)).sum())
    assert round(share, 4) == 0.0577 and math.isclose(share, 0.7 ** 8 + 0.3 ** 8, rel_tol=1e-6)


@pytest.mark.parametrize("loss_agg,value,count", [("seq_mean_token_mean", 1.0, 2), ("token_mean", 0.5, 4),
                                                  ("seq_mean_token_sum_norm", 0.25, 2)])
def test_aggregation_lengths_1_and_3(loss_agg, value, count):
    """Values 2 (length 1) and 0 (length 3): per-response mean 1, token mean 0.5, Dr. GRPO with
    L_max = 4: (2 + 0) / (G·L_max) = 2 / 8 = 0.25. Padding holds garbage that must not leak."""
    values = torch.tensor([[2.0, float("nan"), 1e9], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    loss_sum, n = aggregates(4)[loss_agg](values, mask)
    assert int(n) == count and float(loss_sum) / int(n) == pytest.approx(value, abs=1e-7)


def test_group_baseline_bias_exhaustive_and_simulated():
    """a ~ Bernoulli(p = σ(θ)), reward a, score ∂log π(a)/∂θ = a − p. True gradient p(1−p) = 0.21;
    the group mean (self included) gives (G−1)p(1−p)/G = 0.18375, leave-one-out keeps 0.21."""
    p, G = 0.3, 8
    theta = torch.tensor(math.log(p / (1 - p)), requires_grad=True)
    torch.sigmoid(theta).backward()  # ∇ E[reward] = ∇σ(θ)
    assert round(float(theta.grad), 5) == 0.21
    groups = torch.tensor(list(itertools.product([0.0, 1.0], repeat=G)))
    prob = p ** groups.sum(1) * (1 - p) ** (G - groups.sum(1))
    expected = {}
    for estimator in ("dr_grpo", "rloo"):
        adv = group_advantages(groups, estimator)
        per_group = (adv * (groups - p)).mean(1)  # the REINFORCE estimate of one group
        expected[estimator] = float((prob * per_group).sum())
    assert round(expected["dr_grpo"], 5) == 0.18375 and round(expected["rloo"], 5) == 0.21
    gen = torch.Generator().manual_seed(0)
    sims = (torch.rand(100_000, G, generator=gen) < p).float()
    for estimator, truth in expected.items():
        adv = group_advantages(sims, estimator)
        per_group = (adv * (sims - p)).mean(1)
        stderr = float(per_group.std()) / math.sqrt(len(sims))
        assert abs(float(per_group.mean()) - truth) < 4 * stderr
    assert abs(expected["dr_grpo"] - expected["rloo"]) > 40 * stderr  # the simulation tells them apart


# ---------------------------------------------------------------------------------------------
# The loss: bandit gradients, clipping, padding, degenerate groups, KL

@pytest.mark.parametrize("estimator", ["reinforce", "rloo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("loss_agg", list(aggregates(1)))
def test_one_token_bandit_gradient_is_reinforce(estimator, loss_agg):
    """One token per response, ρ = 1: the loss gradient is −(1/N) Σ_i A_i ∇log π(a_i), with
    ∇_θ log softmax(θ)[a] = onehot(a) − softmax(θ)."""
    gen = torch.Generator().manual_seed(1)
    theta = torch.randn(5, generator=gen).requires_grad_()
    actions = torch.multinomial(torch.softmax(theta.detach(), 0), 8, replacement=True, generator=gen)
    rewards = torch.tensor([0.0, 1.0, 0.5, 2.0, -1.0])[actions].view(2, 4)  # two groups of four
    if estimator == "reinforce":  # (lab/reinforce.py: the batch mean)
        adv = (rewards - rewards.mean()).flatten()
    elif estimator == "grpo":
        adv = grpo_advantages(rewards).flatten()
    else:
        adv = group_advantages(rewards, estimator).flatten()
    assert not grpo.degenerate_groups(rewards).any()
    logp = torch.log_softmax(theta, 0)[actions][:, None]
    loss_sum, count, _ = policy_loss(logp, logp.detach(), adv, torch.ones(8, 1), loss_agg)
    (loss_sum / count).backward()
    score = torch.nn.functional.one_hot(actions, 5).float() - torch.softmax(theta.detach(), 0)
    assert torch.allclose(theta.grad, -(adv[:, None] * score).mean(0), atol=1e-6)


@pytest.mark.parametrize("ratio,adv,eps_high,clipped", [
    (1.3, 1.0, 0.28, True), (1.3, -1.0, 0.28, False),    # above 1 + eps_high: cut only when A > 0
    (0.7, -1.0, 0.28, True), (0.7, 1.0, 0.28, False),    # below 1 - clip_eps: cut only when A < 0
    (1.25, 1.0, 0.28, False), (1.25, 1.0, 0.2, True),    # Clip-Higher leaves room that eps = 0.2 does not
    (0.85, -1.0, 0.28, False)])
def test_clipping_stops_gradient_on_the_right_side_only(ratio, adv, eps_high, clipped):
    clip = dict(clip_eps=0.2, clip_eps_high=eps_high)  # (DAPO's Clip-Higher: lab/dapo.py)
    old, a, mask = torch.tensor([[-math.log(ratio)]]), torch.tensor([adv]), torch.ones(1, 1)
    logp = torch.zeros(1, 1, requires_grad=True)
    loss_sum, count, metrics = policy_loss(logp, old, a, mask, **clip)
    loss_sum.backward()
    assert metrics["clip_frac"] == (1.0 if clipped else 0.0)
    h = 1e-3  # central finite difference of the same loss
    f = lambda x: float(policy_loss(torch.full((1, 1), x), old, a, mask, **clip)[0])
    fd = (f(h) - f(-h)) / (2 * h)
    assert float(logp.grad) == pytest.approx(fd, abs=1e-3)
    assert float(logp.grad) == (0.0 if clipped else pytest.approx(-adv * ratio, rel=1e-5))


@pytest.mark.parametrize("loss_agg", list(aggregates(8)))
def test_padding_contributes_nothing(loss_agg):
    """Extra padded positions holding garbage change no loss, count or gradient (k3 term included)."""
    gen = torch.Generator().manual_seed(2)
    logp = -torch.rand(3, 5, generator=gen)
    old, ref = logp + 0.1 * torch.randn(3, 5, generator=gen), logp + 0.3 * torch.randn(3, 5, generator=gen)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.float)
    adv = torch.tensor([1.0, -0.5, 2.0])
    cfg = dict(loss_agg=loss_agg, max_len=8, kl_coef=0.1)
    garbage = lambda x, value: torch.cat([x, torch.full((3, 4), value)], 1)
    a = logp.clone().requires_grad_()
    b = garbage(logp, 50.0).requires_grad_()
    sa, na, _ = policy_loss(a, old, adv, mask, ref=ref, **cfg)
    sb, nb, _ = policy_loss(b, garbage(old, -50.0), adv, garbage(mask, 0.0), ref=garbage(ref, float("nan")), **cfg)
    sa.backward(), sb.backward()
    assert int(na) == int(nb) and float(sa.detach()) == pytest.approx(float(sb.detach()), abs=1e-6)
    assert torch.allclose(a.grad, b.grad[:, :5], atol=1e-7) and torch.equal(b.grad[:, 5:], torch.zeros(3, 4))
    assert torch.equal(a.grad * (1 - mask), torch.zeros(3, 5))  # prompt positions get no gradient either


def pad_columns(mb, extra, pad_id):
    """The micro-batch with `extra` more padding columns: pad ids, per-token values 0."""
    wide = {f.name: torch.cat([v, torch.zeros(len(v), extra, dtype=v.dtype)], 1) for f in dataclasses.fields(mb)
            if f.name != "ids" and torch.is_tensor(v := getattr(mb, f.name)) and v.dim() == 2}
    return dataclasses.replace(mb, ids=torch.cat([mb.ids, torch.full((len(mb.ids), extra), pad_id)], 1), **wide)


def test_padding_columns_do_not_change_the_model_loss(run):
    with patched(run) as state:
        mb = grpo.batches(run, state, 0)[0][0][0]
    padded = pad_columns(mb, 7, run.tok.pad)
    sa, na, _ = grpo.loss(run, state, run.model, mb)
    sb, nb, _ = grpo.loss(run, state, run.model, padded)
    assert float(na) == float(nb) and float(sa.detach()) == pytest.approx(float(sb.detach()), abs=1e-5)


def test_kl_term_is_zero_when_policy_equals_reference():
    logp = torch.tensor([[-0.5, -2.0, -0.1]], requires_grad=True)
    kl = kl_estimate(logp, logp.detach(), "k3")
    kl.sum().backward()
    assert torch.equal(kl.detach(), torch.zeros(1, 3)) and torch.equal(logp.grad, torch.zeros(1, 3))
    assert float(kl_estimate(torch.tensor(-0.5), torch.tensor(-1.5), "k3")) == pytest.approx(math.exp(-1) + 1 - 1)
    logp.grad = None
    s, n, m = policy_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 3), ref=logp.detach(), kl_coef=0.5)
    s.backward()
    assert float(s.detach()) == 0.0 and m["kl_k3"] == 0.0 and torch.equal(logp.grad, torch.zeros(1, 3))


def test_overlong_penalty_ramp():
    """DAPO's soft overlong penalty: 0 up to limit − L_cache tokens, then linear down to −1 at the limit."""
    ro = SimpleNamespace(lengths=torch.tensor([10, 48, 56, 63, 64]), verified=torch.zeros(5), prompt_lens=torch.tensor([4]))
    run = lambda cache: SimpleNamespace(cfg=dict(overlong_cache=cache, max_new_tokens=64),
                                        raw_model=SimpleNamespace(config=SimpleNamespace(block_size=256)))
    assert dapo.overlong_penalty(run(16), ro).tolist() == [0.0, 0.0, -0.5, -0.9375, -1.0]
    assert dapo.overlong_penalty(run(0), ro).tolist() == [0.0] * 5


# ---------------------------------------------------------------------------------------------
# Rollout batches on a real (tiny) run

def first_step_ratio_dev(run, state, temperature=None, train_mode=False):
    """max |ρ − 1| over the first optimizer step, π_θ scored at `temperature` (default: the run's)."""
    run.raw_model.eval()  # as the loop leaves it for batches() and the loss (grpo.on_policy)
    steps, _ = grpo.batches(run, state, 3)
    if train_mode:
        run.raw_model.train()
    dev = 0.0
    for mb in steps[0]:
        with torch.no_grad():
            logp = sequence_logprobs(run.model, mb.ids, temperature or run.cfg["temperature"])
        on = mb.mask > 0
        dev = max(dev, float(((logp - mb.old_logprobs).exp() - 1).abs()[on].max()))
    return dev, steps


def test_ratio_is_one_on_the_first_step_tokens_in_tokens_out(tmp_path):
    """Sampler log-probs are π_old: a training forward on the same ids gives ρ = 1 in fp32, with dropout
    in the model and a temperature of 0.7 — only because the loss scores at that temperature with dropout off."""
    run = T.train(dict(TINY, **SMALL, max_iters=0, dropout=0.2, temperature=0.7, out_dir=str(tmp_path / "r")))
    with torch.no_grad():  # sharpen the random model's logits (tied embeddings), or every temperature looks alike
        run.raw_model.transformer.wte.weight.mul_(3)
    with patched(run) as state:
        dev, steps = first_step_ratio_dev(run, state)
        assert dev < 1e-4
        assert not run.raw_model.training and grpo.on_policy  # the loop keeps dropout off in the loss
        metrics = grpo.loss(run, state, run.model, steps[0][0])[2]
        assert metrics["ratio_dev"] < 1e-4 and metrics["clip_frac"] == 0.0
        assert first_step_ratio_dev(run, state, temperature=1.0)[0] > 0.05  # the temperature trap
        assert first_step_ratio_dev(run, state, train_mode=True)[0] > 0.05   # the dropout trap
    # tokens in, tokens out: the sampled ids do not survive decode + encode, so scoring re-encoded
    # text would not give ρ = 1
    mb = steps[0][0]
    rows = [ids[(m > 0).nonzero().min() + 1:(m > 0).nonzero().max() + 2].tolist() for ids, m in zip(mb.ids, mb.mask)]
    assert any(run.tok.encode(run.tok.decode(r)) != r for r in rows)
    with patched(run, old_logprobs="recompute") as state:
        assert first_step_ratio_dev(run, state)[0] < 1e-5


def test_shared_prompts_give_the_same_scores_loss_and_gradients(run):
    """share_prompt: π_ref's scores, the loss, its figures and the gradient of every parameter equal
    one full row per response, on a micro-batch of three groups with prompts of different lengths,
    extra padding columns and off-policy π_old (so that some ratios are clipped)."""
    with patched(run, kl_coef=0.1) as state:
        mb = Rollout.cat([row for mbs in grpo.batches(run, state, 0)[0] for row in mbs][:3], run.tok.pad)
        full = sequence_logprobs(state.reference, mb.ids) * mb.mask
        assert torch.allclose(score_tokens(run, state.reference, mb.ids, mb.prompt_lens) * mb.mask, full, atol=1e-5)
    assert len(set(mb.prompt_lens.tolist())) > 1
    mb = dataclasses.replace(
        mb, old_logprobs=mb.old_logprobs + 0.3 * torch.randn(mb.mask.shape, generator=torch.Generator().manual_seed(0)),
        advantages=torch.randn(len(mb.ids), generator=torch.Generator().manual_seed(1)))
    mb = pad_columns(mb, 3, run.tok.pad)
    params = [p for p in run.raw_model.parameters() if p.requires_grad]
    results = []
    for share in (False, True):
        with patched(run, kl_coef=0.1, share_prompt=share) as state:
            loss_sum, count, metrics = grpo.loss(run, state, run.model, mb)
        results.append((float(loss_sum.detach()), int(count), {k: float(v) for k, v in metrics.items()},
                        torch.autograd.grad(loss_sum, params)))
    (full, n_full, m_full, g_full), (shared, n_shared, m_shared, g_shared) = results
    assert m_full["clip_frac"] > 0 and n_shared == n_full and shared == pytest.approx(full, rel=1e-5)
    assert all(m_shared[k] == pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in m_full.items())
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_full, g_shared))
    position_0 = g_shared[[p is run.raw_model.transformer.wpe.weight for p in params].index(True)][0]
    assert position_0.abs().sum() > 0  # a prompt-only position: its gradient came through the shared keys and values


def test_degenerate_groups_drop_or_zeros(run):
    """DAPO drops a degenerate group: its rows are masked out of every sum and count (the loss equals the loss
    without them); GRPO keeps it in the count with A = 0."""
    with patched(run, some_degenerate_reward, dynamic_sampling_rounds=0, overlong_cache=0, mask_truncated=False,
                 clip_eps_high=0.2) as state:
        batch, _, _ = dapo.sample_informative_groups(run, state, run.raw_model, 7, 0)
        plain = grpo.sample_groups(run, state, run.raw_model, 7, 0)
    G = run.cfg["group_size"]
    degenerate = grpo.degenerate_groups(plain.reward.view(-1, G)).repeat_interleave(G)
    assert 0 < degenerate.sum() < len(degenerate)
    trained = batch.mask.sum(1) > 0  # the informative groups first, then the degenerate ones masked out
    assert trained.tolist() == sorted((~degenerate).tolist(), reverse=True)
    assert not grpo.degenerate_groups(batch.reward[trained].view(-1, G)).any()
    kept = batch.select(trained.nonzero().squeeze(1))
    surrogate = lambda b, agg: policy_loss(b.old_logprobs - 0.1 * b.mask, b.old_logprobs, b.advantages, b.mask, agg,
                                           max_len=16, ref=b.ref_logprobs, kl_coef=0.04)
    for agg in aggregates(16):
        (s_all, n_all, _), (s_kept, n_kept, _) = surrogate(batch, agg), surrogate(kept, agg)
        assert int(n_all) == int(n_kept) and float(s_all) == pytest.approx(float(s_kept), abs=1e-6)
    assert torch.equal(plain.advantages[degenerate], torch.zeros(int(degenerate.sum())))
    n_zeros = grpo.seq_mean_token_mean(plain.mask, plain.mask)[1]
    assert int(n_zeros) == len(degenerate)  # every response counts, degenerate ones included


def test_dynamic_sampling_refills_and_never_trains_on_degenerate_groups(run):
    rare = lambda p, text: coin_reward(p, text) if p["start"] % 4 == 0 else 0.0  # most groups all-wrong
    G, n = run.cfg["group_size"], run.cfg["prompts_per_iter"]
    dapo_keys = dict(overlong_cache=0, mask_truncated=False, clip_eps_high=0.28)
    with patched(run, rare, dynamic_sampling_rounds=6, **dapo_keys) as state:
        batch, extra, _ = dapo.sample_informative_groups(run, state, run.raw_model, 11, 0)
        steps, figures = dapo.batches(run, state, 11)
    kept = batch.mask.sum(1) > 0
    assert kept.any() and extra > 0 and extra % (n * G) == 0 and len(batch.ids) == n * G
    assert not grpo.degenerate_groups(batch.reward[kept].view(-1, G)).any()
    assert figures["extra_rollouts"] == extra and figures["kept_groups_frac"] == float(kept.sum()) / (n * G)
    with patched(run, lambda p, text: 1.0, dynamic_sampling_rounds=3, **dapo_keys) as state:
        solved, extra, _ = dapo.sample_informative_groups(run, state, run.raw_model, 11, 0)
        solved_steps, _ = dapo.batches(run, state, 11)
    assert extra == 3 * n * G
    assert float(solved.mask.sum()) == 0.0  # nothing to learn from, and nothing learnt from it
    # the same number of optimizer steps and micro-batches either way: DDP ranks cannot diverge
    assert [len(s) for s in steps] == [len(s) for s in solved_steps]


def test_first_iteration_from_scratch_logs_zero_kl_and_every_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin_reward))
    T.train(dict(TINY, **SMALL, max_iters=1, minibatches=1, out_dir=str(tmp_path / "r")))
    row = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")][-1]
    for key in ("reward", "entropy", "kl_ref", "kl_k3", "clip_frac", "degenerate_frac", "len_mean", "len_std",
                "time_decode", "time_verify", "time_update", "time_score", "loss"):
        assert key in row and math.isfinite(row[key]), key
    assert abs(row["kl_ref"]) < 1e-5 and row["kl_k3"] < 1e-4  # π = π_ref before the first update
    assert 0 < row["reward"] < 1 and row["time_update"] > 0
    assert "each response's token mean" in open(tmp_path / "r" / "passport.md").read()


def test_no_kl_term_runs_no_forward_besides_the_sampler(run):
    """kl_coef=0: π_ref is never scored, and π_old is the sampler's own log-probs (auto on CPU)."""
    assert old_logprobs_mode(run) == "sampler"
    with patched(run, kl_coef=0.0) as state, forward_calls(policy=run.raw_model, reference=state.reference) as calls:
        steps, figures = grpo.batches(run, state, 0)
    with patched(run, kl_coef=0.0) as state:
        _, _, loss_figures = grpo.loss(run, state, run.model, steps[0][0])
    assert calls == [] and steps[0][0].ref_logprobs is None and "kl_ref" not in figures and "kl_k3" not in loss_figures
    with patched(run) as state, forward_calls(policy=run.raw_model, reference=state.reference) as calls:
        _, figures = grpo.batches(run, state, 0)  # the KL term: π_ref scores the rollouts (one chunk of batch_size rows)
    assert set(calls) == {"reference"} and "kl_ref" in figures


def test_evaluation_logs_the_kl_to_the_reference(run):
    """heldout_kl_ref, on the policy's samples whatever the kl key: 0 while π = π_ref (no update yet)."""
    with patched(run, kl_coef=0.0, eval_samples=1) as state:
        metrics = grpo.evaluate(run, state, 0)
    assert abs(metrics["heldout_kl_ref"]) < 1e-4


def test_config_errors(run):
    for bad, match in [(dict(prompts_per_iter=5, rollout_prompts=2), "shards"), (dict(minibatches=99), "minibatches"),
                       (dict(old_logprobs="engine"), "old_logprobs")]:
        with pytest.raises(ValueError, match=match):
            grpo.check_config(with_config(run, **bad))
    with pytest.raises(ValueError, match="shards"):
        grpo.check_config(with_config(run, prompts_per_iter=4, rollout_prompts=4, world_size=2))
    for old, match in [(dict(estimator="rloo", loss_agg="token_mean"), "no one variant"), (dict(kl="off"), "kl_coef=0"),
                       (dict(break_it="kl_twice"), "experiments/failures.py"), (dict(tis_cap=2.0), "--algo tis")]:
        with pytest.raises(ValueError, match=match):
            options.make_config(dict(algo="grpo", **old))
    assert options.make_config(dict(algo="grpo", estimator="rloo", eps_low=0.1))["algo"] == "rloo"  # (and says so)
    assert options.make_config(dict(algo="grpo", eps_low=0.1))["clip_eps"] == 0.1


def with_config(run, world_size=1, **cfg):
    """The run's environment and ranks, with these config values."""
    return SimpleNamespace(cfg=dict(run.cfg, **cfg), env=run.env, world_size=world_size, fsdp=False, lockstep=False)


# ---------------------------------------------------------------------------------------------
# DDP and the recipes end to end

DDP_RUN = dict(TINY, **SMALL, rollout_prompts=2, inner_epochs=2, minibatches=2, batch_size=3, max_iters=2,
               learning_rate=1e-3, warmup_iters=0)


def train_and_report(overrides):
    """(optimizer steps and micro-batches per iteration, final weights) of one training run."""
    algo = options.algo_module(overrides["algo"])
    shapes, original, verify = [], algo.batches, envs.Arithmetic.__dict__["verify"]  # the staticmethod itself

    def counted(run, state, it):
        steps, figures = original(run, state, it)
        shapes.append([len(s) for s in steps])
        return steps, figures

    algo.batches, envs.Arithmetic.verify = counted, staticmethod(coin_reward)
    try:
        run = T.train(overrides)
    finally:
        algo.batches, envs.Arithmetic.verify = original, verify
    return shapes, {k: v.detach().numpy().copy() for k, v in run.raw_model.state_dict().items()}


@pytest.mark.parametrize("algo", ["grpo", "one_step_off"])
def test_ddp_two_ranks_equal_one_process_on_the_same_global_batch(tmp_path, algo):
    """Each rank samples one shard of 2 prompts; one process samples both shards: the same global
    batch, then 2 epochs x 2 minibatches with uneven micro-batches (3 + 1 per rank, 3 + 3 + 2 alone).
    With one_step_off each rank's sampler thread runs beside the update's all-reduces."""
    cfg = dict(DDP_RUN, algo=algo)
    (shapes0, w0), (shapes1, w1) = run_ddp(train_and_report, dict(cfg, out_dir=str(tmp_path / "ddp")))
    single_shapes, single = train_and_report(dict(cfg, out_dir=str(tmp_path / "one")))
    assert shapes0 == shapes1 == [[2, 2, 2, 2]] * 2 and single_shapes == [[3, 3, 3, 3]] * 2
    assert all((w0[k] == w1[k]).all() for k in w0)
    cfg = options.make_config(DDP_RUN)
    start = build_model(cfg, Tokenizer(cfg["tokenizer"])).state_dict()
    assert any(not torch.allclose(torch.from_numpy(single[k]), start[k]) for k in single)  # it did train
    # equal up to rounding: the two summation orders differ in the last bits, and Adam's normalisation
    # turns that into ~1e-6 steps at lr 1e-3 (most on the attention key bias, whose true gradient is 0)
    assert all(torch.allclose(torch.from_numpy(w0[k]), torch.from_numpy(single[k]), atol=1e-5) for k in w0)


# ---------------------------------------------------------------------------------------------
# Staleness: one-step-off rollouts

def weights_hash(model):
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("staleness", [0, 1])
def test_rollouts_of_each_iteration_come_from_the_right_weights(staleness, tmp_path, monkeypatch):
    """A hash of the sampling weights, taken with every rollout shard, against the trained weights at
    the start of each iteration: grpo samples iteration k with the weights of k; one_step_off (staleness 1)
    samples k + 1 with those of k (during k's update) and the first iteration with its own. The loss
    then sees ρ = π_θ/π_old ≠ 1 from the first step of every later iteration: π_old is the sampler's."""
    algo = one_step_off if staleness else grpo
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin_reward))
    at_start, sampled = {}, []
    batches, sample_groups = algo.batches, grpo.sample_groups

    def recorded_batches(run, state, it):
        at_start[it] = weights_hash(run.raw_model)
        return batches(run, state, it)

    def recorded_shard(run, state, model, it, shard):
        sampled.append((it, weights_hash(model)))  # (list.append is atomic: the sampler thread may call it)
        return sample_groups(run, state, model, it, shard)

    monkeypatch.setattr(algo, "batches", recorded_batches)
    monkeypatch.setattr(grpo, "sample_groups", recorded_shard)
    out = tmp_path / "run"
    T.train(dict(TINY, **SMALL, max_iters=4, learning_rate=1e-3, out_dir=str(out)) | dict(algo=algo.__name__.split(".")[-1]))
    assert len(set(at_start.values())) == 4  # the weights moved at every update
    sampler_iter = [0, 0, 1, 2] if staleness else [0, 1, 2, 3]
    assert sorted(sampled) == sorted((it, at_start[k]) for it, k in enumerate(sampler_iter))
    rows = [json.loads(line) for line in open(out / "metrics.jsonl") if "loss" in line]
    assert rows[0]["ratio_dev"] < 1e-4
    assert all((r["ratio_dev"] > 1e-3) == bool(staleness) for r in rows[1:])
    assert [r.get("staleness", 0) for r in rows] == [0] + [staleness] * 3


def test_staleness_1_resumes_exactly_with_lora_and_enforces_its_bound(tmp_path, monkeypatch):
    """The checkpoint holds the sampler's weights, so 2 iterations + resume to 4 equal 4 straight
    (bit for bit); a rollout batch more than one update old is an error."""
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin_reward))
    cfg = dict(TINY, **dict(SMALL, checkpoint=True, algo="one_step_off"), learning_rate=1e-3, lora_rank=2)
    straight = T.train(dict(cfg, max_iters=4, lr_decay_iters=4, out_dir=str(tmp_path / "straight")))
    T.train(dict(cfg, max_iters=2, lr_decay_iters=4, out_dir=str(tmp_path / "resumed")))  # (the schedule of 4)
    resumed = T.train(dict(algo="one_step_off", init_from="resume", max_iters=4, out_dir=str(tmp_path / "resumed")))
    assert weights_hash(resumed.raw_model) == weights_hash(straight.raw_model)
    resumed.state.sampler_iter = 2
    with pytest.raises(RuntimeError, match="staleness 2 > 1"):
        one_step_off.batches(resumed, resumed.state, 4)


@pytest.mark.parametrize("recipe", ["grpo", "dapo", "dr_grpo", "rloo", "gspo", "cispo"])
def test_recipe_configs_train_and_evaluate(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr(envs.Arithmetic, "verify", staticmethod(coin_reward))
    overrides = options.parse_args([os.path.join(ROOT, "config", f"{recipe}.py")])
    overrides.update(TINY, **{k: v for k, v in SMALL.items() if k != "algo"}, max_iters=2, eval_interval=2, eval_problems=4, eval_samples=2,
                     out_dir=str(tmp_path / recipe))
    if recipe == "dapo":
        overrides["overlong_cache"] = 4
    run = T.train(overrides)
    assert {"heldout_acc", "heldout_pass@2", "heldout_sampled_acc", "ood_acc"} <= set(run.metrics)
    rows = [json.loads(line) for line in open(tmp_path / recipe / "metrics.jsonl")]
    assert [r["iter"] for r in rows if "loss" in r] == [1, 2]
    assert "=== iter 2 ===" in open(tmp_path / recipe / "samples.txt").read()
    assert f"--algo {recipe}`" in open(tmp_path / recipe / "passport.md").read()
