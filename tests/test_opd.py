"""opd.py and its lab (opd_sampled, opd_topk, opd_teacher_samples, opsd): the reverse-KL estimators on
numbers (zero at student = teacher, finite differences, expectations on an enumerated vocabulary,
masking, temperature), the teacher's scores and gradients, the vocabulary check, OPSD, and the
shared loop (metrics, resume, LoRA, DDP)."""

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import envs
import opd
import train as T
from lab import opd_sampled, opd_teacher_samples, opd_topk, opsd
from conftest import TINY, run_ddp
from model import GPT, GPTConfig
from nanopost.tokenizer import Tokenizer

SMALL = dict(algo="opd", prompts_per_iter=4, group_size=2, max_new_tokens=16, checkpoint=False,
             eval_samples=2, learning_rate=1e-3, warmup_iters=0)


def write_checkpoint(directory, seed, n_layer=2, n_embd=32, vocab_size=None, block_size=128):
    """A random tiny GPT saved as a checkpoint directory (what load_model and --init_from read)."""
    vocab_size = vocab_size or -(-Tokenizer("byte").n_vocab // 64) * 64
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=2, n_embd=n_embd))
    os.makedirs(directory, exist_ok=True)
    torch.save(dict(model=model.state_dict(), model_args=dataclasses.asdict(model.config), kind="lm",
                    lora_rank=0, lora_alpha=32.0, tokenizer="byte"), os.path.join(directory, "ckpt.pt"))
    return str(directory)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A student and a (differently shaped) teacher checkpoint: (student_dir, teacher_dir)."""
    root = tmp_path_factory.mktemp("opd_models")
    return write_checkpoint(root / "student", seed=0), write_checkpoint(root / "teacher", seed=1, n_layer=1, n_embd=64)


def opd_run(models, tmp_path, **overrides):
    student, teacher = models
    return T.train(dict(TINY, **SMALL, init_from=student, teacher=teacher, out_dir=str(tmp_path / "run")) | overrides)


LOSSES = dict(full=opd, sampled=opd_sampled, topk=opd_topk, teacher_samples=opd_teacher_samples, opsd=opsd)


def distillation_loss(logits, targets, teacher_logprobs, mask, estimator, temperature=1.0, topk=16, anchor=None,
                      anchor_coef=0.0):
    """(loss_sum, count, metrics) of the loss of opd (estimator "full") or of its lab variant on these
    student logits (B, T, V), the sampled tokens targets (B, T) and the teacher's log-probs: its own
    loss(), the model a stand-in that returns the logits."""
    run = SimpleNamespace(cfg=dict(temperature=temperature, kl_topk=topk, anchor_coef=anchor_coef))
    batch = SimpleNamespace(ids=torch.cat([targets[:, :1], targets], 1), mask=mask, teacher_logprobs=teacher_logprobs,
                            ref_logprobs=anchor)
    return LOSSES[estimator].loss(run, None, lambda ids: logits, batch)


# ---------------------------------------------------------------------------------------------
# The estimators on numbers

def test_kl_and_its_gradient_are_zero_when_student_equals_teacher():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7, requires_grad=True)
    teacher = F.log_softmax(logits.detach() / 0.7, dim=-1)
    targets, mask = torch.randint(7, (2, 3)), torch.ones(2, 3)
    for estimator in ("full", "sampled", "topk"):  # teacher_samples is a cross-entropy: the teacher's entropy
        loss_sum, count, metrics = distillation_loss(logits, targets, teacher, mask, estimator, 0.7, topk=3)
        reverse_kl = metrics["reverse_kl"]
        grad, = torch.autograd.grad(loss_sum, logits)
        assert abs(float(loss_sum.detach())) < 1e-6 and abs(float(reverse_kl)) < 1e-6 and int(count) == 6, estimator
        assert grad.abs().max() < 1e-6, estimator


def test_full_kl_gradient_matches_finite_differences():
    torch.manual_seed(1)
    logits = torch.randn(1, 2, 5, requires_grad=True)
    teacher = F.log_softmax(torch.randn(1, 2, 5), dim=-1)
    targets, mask = torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2)
    kl = lambda x: distillation_loss(x, targets, teacher, mask, "full", temperature=1.3)[0]
    grad, = torch.autograd.grad(kl(logits), logits)
    eps, numeric = 1e-2, torch.zeros_like(grad)
    for index in range(logits.numel()):
        step = torch.zeros(logits.numel())
        step[index] = eps
        step = step.view_as(logits)
        numeric.view(-1)[index] = (kl(logits.detach() + step) - kl(logits.detach() - step)) / (2 * eps)
    torch.testing.assert_close(grad, numeric, atol=1e-3, rtol=1e-3)


def test_sampled_and_topk_agree_with_full_in_expectation():
    """One position, V = 6, every token enumerated: E_{y~p}[∇ sampled] = ∇ full and E[log p − log q]
    = KL; topk with k = V is full; with k < V it is the KL between the renormalised restrictions."""
    torch.manual_seed(2)
    V, tau = 6, 0.8
    logits = torch.randn(1, 1, V, requires_grad=True)
    teacher = F.log_softmax(torch.randn(1, 1, V) / tau, dim=-1)
    mask = torch.ones(1, 1)
    p = F.softmax(logits.detach() / tau, dim=-1).flatten()
    full, _, metrics = distillation_loss(logits, torch.zeros(1, 1, dtype=torch.long), teacher, mask, "full", tau)
    exact = metrics["reverse_kl"]
    full_grad, = torch.autograd.grad(full, logits)

    expected_grad, expected_k1 = torch.zeros_like(full_grad), 0.0
    for y in range(V):
        y_tensor = torch.full((1, 1), y)
        sampled = distillation_loss(logits, y_tensor, teacher, mask, "sampled", tau)[0]
        expected_grad += p[y] * torch.autograd.grad(sampled, logits)[0]
        expected_k1 += float(p[y] * (torch.log(p[y]) - teacher.flatten()[y]))
    torch.testing.assert_close(expected_grad, full_grad, atol=1e-6, rtol=1e-5)
    assert expected_k1 == pytest.approx(float(exact), abs=1e-6) and float(full.detach()) == pytest.approx(float(exact))

    topk_all = distillation_loss(logits, y_tensor, teacher, mask, "topk", tau, topk=V)[0]
    torch.testing.assert_close(topk_all, full)
    torch.testing.assert_close(torch.autograd.grad(topk_all, logits)[0], full_grad)
    k = 3
    top = teacher.flatten().topk(k).indices
    p_k, q_k = p[top] / p[top].sum(), teacher.flatten()[top].exp() / teacher.flatten()[top].exp().sum()
    topk = distillation_loss(logits, y_tensor, teacher, mask, "topk", tau, topk=k)[0]
    assert float(topk.detach()) == pytest.approx(float((p_k * (p_k / q_k).log()).sum()), abs=1e-6)


def test_teacher_samples_is_the_cross_entropy_and_follows_the_forward_kl():
    """Off-policy distillation: ℓ = −log p(y) of the teacher's token (printed digits), and over y ~ q
    enumerated its expected gradient is ∇ KL(q‖p), the forward KL."""
    logits = torch.tensor([[[1.0, 0.0, -1.0]]], requires_grad=True)
    q = torch.tensor([0.2, 0.5, 0.3])
    teacher, mask = q.log().view(1, 1, 3), torch.ones(1, 1)
    loss = distillation_loss(logits, torch.tensor([[1]]), teacher, mask, "teacher_samples")[0]
    assert round(float(loss.detach()), 4) == 1.4076  # −log softmax([1, 0, −1])[1] = log(e + 1 + 1/e)
    expected = sum(q[y] * torch.autograd.grad(distillation_loss(logits, torch.tensor([[y]]), teacher, mask,
                                                                 "teacher_samples")[0], logits)[0]
                   for y in range(3))
    forward_kl = (q * (q.log() - F.log_softmax(logits[0, 0], -1))).sum()
    torch.testing.assert_close(expected, torch.autograd.grad(forward_kl, logits)[0])


def test_anchor_pulls_to_the_geometric_mixture_of_teacher_and_start():
    """OPSD's full + β·KL(p‖r) has the gradient of (1 + β)·KL(p ‖ m), m ∝ q^(1/(1+β)) r^(β/(1+β)); the
    anchor's own figure is KL(p‖r), token mean; β = 0 is opd's loss."""
    torch.manual_seed(3)
    logits = torch.randn(1, 2, 5, requires_grad=True)
    q, r = F.log_softmax(torch.randn(1, 2, 5), -1), F.log_softmax(torch.randn(1, 2, 5), -1)
    targets, mask, beta = torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), 0.5
    loss, _, metrics = distillation_loss(logits, targets, q, mask, "opsd", anchor=r, anchor_coef=beta)
    m = F.log_softmax((q + beta * r) / (1 + beta), -1)
    p = F.log_softmax(logits, -1)
    mixture = (1 + beta) * (p.exp() * (p - m)).sum()
    torch.testing.assert_close(torch.autograd.grad(loss, logits)[0], torch.autograd.grad(mixture, logits)[0])
    torch.testing.assert_close(metrics["anchor_kl"], (p.exp() * (p - r)).sum().detach() / 2)
    plain = distillation_loss(logits, targets, q, mask, "opsd", anchor=r, anchor_coef=0.0)[0]
    torch.testing.assert_close(plain, distillation_loss(logits, targets, q, mask, "full")[0])


def test_prompt_and_padding_positions_contribute_nothing():
    torch.manual_seed(3)
    V = 7
    logits = torch.randn(2, 4, V)
    teacher = F.log_softmax(torch.randn(2, 4, V), dim=-1)
    targets = torch.randint(V, (2, 4))
    mask = torch.tensor([[0.0, 1, 1, 0], [0, 0, 1, 1]])
    off = (mask == 0)[..., None]
    garbage_logits = torch.where(off, 1e4 * torch.randn(2, 4, V), logits)
    garbage_teacher = torch.where(off, -1e4 * torch.rand(2, 4, V), teacher)
    garbage_targets = torch.where(mask == 0, (targets + 1) % V, targets)
    for estimator in LOSSES:
        results = []
        for x, t, y in ((logits, teacher, targets), (garbage_logits, garbage_teacher, garbage_targets)):
            x = x.clone().requires_grad_(True)
            loss_sum, count, metrics = distillation_loss(x, y, t, mask, estimator, topk=3, anchor=t.roll(1, -1),
                                                         anchor_coef=0.5)
            results.append((loss_sum.detach(), metrics["reverse_kl"], torch.autograd.grad(loss_sum, x)[0]))
            assert int(count) == 4
        (a, kl_a, grad_a), (b, kl_b, grad_b) = results
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(kl_a, kl_b)
        torch.testing.assert_close(grad_a, grad_b)
        assert float(grad_a.masked_select(off).abs().max()) == 0.0


# ---------------------------------------------------------------------------------------------
# The teacher: its scores, its gradient, its vocabulary, OPSD

def test_teacher_gets_no_gradient_and_the_student_does(models, tmp_path):
    run = opd_run(models, tmp_path, max_iters=0)
    assert not any(p.requires_grad for p in run.state.teacher.parameters())
    (micro_batches,) = opd.batches(run, run.state, 0)[0]
    for batch in micro_batches:
        assert not batch.teacher_logprobs.requires_grad
        loss_sum, count, metrics = opd.loss(run, run.state, run.model, batch)
        loss_sum.backward()
        assert metrics["tokens"] == float(count) == float(batch.mask.sum())
    assert all(p.grad is None for p in run.state.teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in run.raw_model.parameters())


@pytest.mark.parametrize("teacher", ["dir", "self"])
def test_temperature_reaches_teacher_and_student(models, tmp_path, teacher):
    """Row by row, against a plain forward: the teacher's log-probs at τ on its own prompt (under
    OPSD the privileged one) + the student's answer, and the student's KL at τ."""
    tau = 2.0
    run = opd_run(models, tmp_path, max_iters=0, temperature=tau, **({"algo": "opsd", "teacher": "self"} if teacher == "self" else {}))
    ro, ungraded = run.algo.rollout_shard(run, run.state, 0, 0)
    for i in range(len(ro.ids)):
        problem = ro.problems[i]
        prompt_text = problem["prompt"] + (f"\n(Reference answer: {problem['answer']})" if teacher == "self" else "")
        prompt = run.tok.prompt_ids(prompt_text)
        answer = ro.ids[i, 1:][ro.mask[i] > 0].tolist()
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            expected = F.log_softmax(run.state.teacher(ids[:, :-1])[0, len(prompt) - 1:] / tau, dim=-1)
        torch.testing.assert_close(ro.teacher_logprobs[i][ro.mask[i] > 0], expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        logits = run.raw_model(ro.ids[:, :-1])
    p = F.log_softmax(logits / tau, dim=-1)
    manual = ((p.exp() * (p - ro.teacher_logprobs)).sum(-1) * ro.mask).sum()
    got = distillation_loss(logits, ro.ids[:, 1:], ro.teacher_logprobs, ro.mask, "full", tau)[0]
    torch.testing.assert_close(got, manual)
    assert not torch.allclose(got, distillation_loss(logits, ro.ids[:, 1:], ro.teacher_logprobs, ro.mask, "full", 1.0)[0])


def test_opsd_grades_only_what_fits_the_teachers_context(models, tmp_path):
    """A context of 96 positions: the privileged prompt (problem + reference answer) leaves less room
    than some answers take, and they are graded only as far as the teacher sees (96 + 1 with the target)."""
    student = write_checkpoint(tmp_path / "short", seed=0, block_size=96)
    run = opd_run((student, models[1]), tmp_path, max_iters=0, algo="opsd", teacher="self", prompts_per_iter=8)
    ro, ungraded = run.algo.rollout_shard(run, run.state, 0, 0)
    for i, problem in enumerate(ro.problems):
        prompt = run.tok.prompt_ids(f"{problem['prompt']}\n(Reference answer: {problem['answer']})")
        assert int(ro.mask[i].sum()) == max(0, min(int(ro.lengths[i]), 97 - len(prompt)))
    assert ungraded == float(ro.lengths.sum() - ro.mask.sum()) > 0


def test_opsd_solution_grades_every_answer_position_at_the_default_context(models, tmp_path):
    """At block_size 128 the solution's privileged prompt leaves room for a full max_new_tokens = 64
    answer on every train problem, and a run's answers are graded at every position; the answer's
    prompt (problem + answer) leaves room for every worked demonstration, not for 64 tokens."""
    run = opd_run(models, tmp_path, max_iters=0, algo="opsd", teacher="self", privileged="solution", max_new_tokens=64)
    problems = run.env.problems("train", 2000)
    solution = lambda p: envs.privileged_prompt(run.env, p, "solution")
    longest = max(len(run.tok.prompt_ids(solution(p))) for p in problems)
    assert longest + 64 <= 128 + 1, longest
    ro, ungraded = run.algo.rollout_shard(run, run.state, 0, 0)
    assert ungraded == 0 and float(ro.mask.sum()) == float(ro.lengths.sum())
    assert solution(problems[0]) == f"(Reference solution: {run.env.solve(problems[0])})"
    answer = lambda p: envs.privileged_prompt(run.env, p, "answer")
    needed = [len(run.tok.prompt_ids(answer(p))) + len(run.tok.response_ids(run.env.solve(p))) for p in problems]
    assert max(needed) <= 128 + 1 < max(len(run.tok.prompt_ids(answer(p))) for p in problems) + 64


def test_a_checkpoint_teacher_reads_the_privileged_prompt_when_asked(models, tmp_path):
    """opsd with --teacher=DIR (a frozen snapshot) given privileged=solution grades the same tokens the
    snapshot would write after the solution; opsd reads the answer by default, and a privileged
    context that is none is refused (that is opd)."""
    frozen = opd_run(models, tmp_path, max_iters=0, algo="opsd", privileged="solution")
    assert frozen.state.teacher is not frozen.raw_model
    ro, _ = frozen.algo.rollout_shard(frozen, frozen.state, 0, 0)
    i = 0
    prompt = frozen.tok.prompt_ids(f"(Reference solution: {frozen.env.solve(ro.problems[i])})")
    answer = ro.ids[i, 1:][ro.mask[i] > 0]
    with torch.no_grad():
        direct = F.log_softmax(frozen.state.teacher(torch.tensor([prompt + answer.tolist()])).float(), -1)[0]
    torch.testing.assert_close(ro.teacher_logprobs[i][ro.mask[i] > 0], direct[len(prompt) - 1:-1])
    assert opd_run(models, tmp_path, max_iters=0, algo="opsd", teacher="self").cfg["privileged"] == "answer"
    with pytest.raises(ValueError, match="privileged='none'"):
        opd_run(models, tmp_path, max_iters=0, algo="opsd", teacher="self", privileged="none")


def test_offpolicy_rollouts_are_the_teachers_and_the_anchor_starts_at_zero(models, tmp_path):
    """opd_teacher_samples: the sampler's log-probs are the teacher's on its own prompt, not the
    student's. opsd's anchor_coef: π_init is a frozen copy, so before any step the anchor KL is 0."""
    run = opd_run(models, tmp_path, max_iters=0, algo="opd_teacher_samples")
    ro, _ = run.algo.rollout_shard(run, run.state, 0, 0)
    with torch.no_grad():
        scored = {name: F.log_softmax(m(ro.ids[:, :-1]), -1).gather(-1, ro.ids[:, 1:, None])[..., 0]
                  for name, m in (("teacher", run.state.teacher), ("student", run.raw_model))}
    on = ro.mask > 0
    torch.testing.assert_close(ro.old_logprobs[on], scored["teacher"][on], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ro.old_logprobs[on], scored["student"][on], atol=1e-2)
    run = opd_run(models, tmp_path, max_iters=0, algo="opsd", teacher="self", anchor_coef=0.5)
    assert not any(p.requires_grad for p in run.state.reference.parameters())
    batch = run.algo.batches(run, run.state, 0)[0][0][0]
    _, _, metrics = run.algo.loss(run, run.state, run.model, batch)
    assert abs(metrics["anchor_kl"]) < 1e-6


def test_vocabulary_mismatch_is_refused_naming_both_sizes(models, tmp_path):
    teacher = write_checkpoint(tmp_path / "big_vocab", seed=1, vocab_size=384)
    with pytest.raises(ValueError, match="384 tokens, the student 320"):
        opd_run(models, tmp_path, max_iters=0, teacher=teacher)
    with pytest.raises(ValueError, match="--teacher"):
        opd_run(models, tmp_path, max_iters=0, teacher="")
    with pytest.raises(ValueError, match="kl_estimator"):
        opd_run(models, tmp_path, max_iters=0, kl_estimator="forward")
    with pytest.raises(ValueError, match="anchor_coef"):
        opd_run(models, tmp_path, max_iters=0, algo="opsd", anchor_coef=-1.0)


# ---------------------------------------------------------------------------------------------
# The shared loop: metrics, resume, LoRA, DDP

@pytest.mark.parametrize("algo,extra", [("opd", {}), ("opd_sampled", {}), ("opd_topk", {"kl_topk": 4}),
                                        ("opd_teacher_samples", {}), ("opsd", {"teacher": "self", "lora_rank": 2}),
                                        ("opsd", {"teacher": "self", "anchor_coef": 0.5})])
def test_trains_logs_and_evaluates(models, tmp_path, algo, extra):
    run = opd_run(models, tmp_path, algo=algo, max_iters=2, eval_interval=2, **extra)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["iter"] for r in train_rows] == [1, 2]
    for key in ("reverse_kl", "entropy", "tokens", "verifier_acc", "len_mean", "work_frac", "rollout_tokens",
                "ungraded_frac", "time_decode", "time_teacher", "time_update") + (("anchor_kl",) if algo == "opsd" else ()):
        assert all(key in r for r in train_rows), key
    assert train_rows[0]["reverse_kl"] > 0
    assert {"heldout_acc", "heldout_sampled_acc", "heldout_pass@2", "ood_acc"} <= set(run.metrics)
    passport = open(tmp_path / "run" / "passport.md").read()  # what the ladder's report links
    assert f"`--algo {algo}`" in passport
    assert ("OPSD" in passport) == (algo == "opsd")


def test_resume_continues_exactly(models, tmp_path):
    straight = opd_run(models, tmp_path / "a", max_iters=2, lr_decay_iters=2, checkpoint=True, eval_interval=0)
    opd_run(models, tmp_path / "b", max_iters=1, lr_decay_iters=2, checkpoint=True, eval_interval=0)  # (the schedule of 2)
    resumed = T.train(dict(algo="opd", init_from="resume", out_dir=str(tmp_path / "b" / "run"), max_iters=2))
    for k, v in straight.raw_model.state_dict().items():
        torch.testing.assert_close(resumed.raw_model.state_dict()[k], v)


def final_weights(overrides):
    run = T.train(overrides)
    return {k: v.detach().numpy().copy() for k, v in run.raw_model.state_dict().items()}


def test_ddp_two_ranks_equal_one_process(models, tmp_path):
    """Shards of 2 prompts × 2 answers: each rank samples one, one process both; micro-batches of 3
    rows (3 + 1 per rank, 3 + 1 + 3 + 1 alone) make the same global step. OPSD, the subtle teacher."""
    base = dict(TINY, **dict(SMALL, algo="opsd"), init_from=models[0], rollout_prompts=2, batch_size=3, max_iters=2)
    w0, w1 = run_ddp(final_weights, dict(base, out_dir=str(tmp_path / "ddp")))
    single = final_weights(dict(base, out_dir=str(tmp_path / "one")))
    start = torch.load(os.path.join(models[0], "ckpt.pt"))["model"]
    assert any(not torch.allclose(torch.from_numpy(single[k]), start[k]) for k in single)  # it did train
    assert all((w0[k] == w1[k]).all() for k in w0)
    assert all(torch.allclose(torch.from_numpy(w0[k]), torch.from_numpy(single[k]), atol=1e-5) for k in w0)


def test_reader_rows_read_the_solution_and_write_it_out(tmp_path):
    """sft's reader_frac = 0.5 (the ladder's reader stage): about half the training rows are the worked
    solution as the prompt and that worked answer as the target, the other half the task's own rows
    unchanged; the validation rows are the task's; with --data it is an error, not ignored."""
    base = dict(TINY, algo="sft", train_problems=400, val_examples=8, max_iters=0, eval_interval=0)
    plain = T.train(dict(base, out_dir=str(tmp_path / "plain")))
    reader = T.train(dict(base, reader_frac=0.5, out_dir=str(tmp_path / "reader")))
    problems = reader.env.problems("train", 400, seed=0)
    prompts = [reader.tok.prompt_ids(envs.privileged_prompt(reader.env, p, "solution")) for p in problems]
    reading = [i for i, (ids, _) in enumerate(reader.state.train_examples) if ids[:len(prompts[i])] == prompts[i]]
    assert 160 <= len(reading) <= 240, len(reading)
    for i in reading:
        ids, mask = reader.state.train_examples[i]
        assert reader.tok.decode([t for t, m in zip(ids, mask) if m]).startswith(reader.env.solve(problems[i]))
    for i in set(range(400)) - set(reading):
        assert reader.state.train_examples[i] == plain.state.train_examples[i]
    assert reader.state.val_examples == plain.state.val_examples
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "2+2?", "completion": "4"}\n' * 40)
    with pytest.raises(ValueError, match="reader_frac"):
        T.train(dict(base, reader_frac=0.5, data=str(data), out_dir=str(tmp_path / "data")))


def test_old_opd_options_name_their_variant():
    from nanopost import options
    assert options.make_config(dict(algo="opd", teacher="self"))["algo"] == "opsd"
    assert options.make_config(dict(algo="opd", teacher="self", privileged="solution"))["privileged"] == "solution"
    for estimator in ("sampled", "topk", "teacher_samples"):
        assert options.make_config(dict(algo="opd", kl_estimator=estimator))["algo"] == f"opd_{estimator}"
    with pytest.raises(ValueError, match="'anchor_coef' for --algo opd; it is an option of --algo opsd"):
        options.make_config(dict(algo="opd", anchor_coef=1.0))
    with pytest.raises(ValueError, match="\\(now --algo opd_sampled\\) and --algo opsd are no one variant"):
        options.make_config(dict(algo="opd", teacher="self", kl_estimator="sampled"))
    assert not {"kl_estimator", "kl_topk", "anchor_coef", "privileged"} & set(options.make_config(dict(algo="opd")))
