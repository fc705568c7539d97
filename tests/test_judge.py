"""judge.py, the generative reward model: its judgements by rule, the verdict's probability against a
hand computation, the mean over k judgements; rewards.py's vector reward (the weighted sum, each
dimension logged by GRPO); and experiments/judge_agreement.py: its measures on hand-made cases, end to end at
toy size."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import envs
from nanopost import judge
from nanopost import rewards
import train as T
from conftest import TINY
from experiments import judge_agreement as study
from lab.vector_reward import vector_reward
from model import GPT, GPTConfig, ScalarHeadGPT
from sampler import sample
from test_opd import write_checkpoint
from nanopost.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = envs.make_env("arithmetic")
TOK = Tokenizer("byte")
PROBLEM = ENV.parse_problem("What is 7 + 8 - 3 + 5?")


def write_scalar_checkpoint(directory, seed=0):
    """A random tiny reward model (ScalarHeadGPT) saved as a checkpoint of --algo rm's kind."""
    torch.manual_seed(seed)
    model = ScalarHeadGPT(GPT(GPTConfig(block_size=128, vocab_size=320, n_layer=1, n_head=2, n_embd=32)))
    os.makedirs(directory, exist_ok=True)
    torch.save(dict(model=model.state_dict(), model_args=dataclasses.asdict(model.config), kind="scalar",
                    lora_rank=0, lora_alpha=32.0, tokenizer="byte"), os.path.join(directory, "ckpt.pt"))
    return str(directory)


# ----------------------------------------------------------------------------------------------
# The judgements, by rule

@pytest.mark.parametrize("answer, expected", [
    ("7+8=15. 15-3=12. 12+5=17. Answer: 17", "7+8=15 ok. 15-3=12 ok. 12+5=17 ok. Verdict: correct"),
    ("7+8=15. 15-3=11. 11+5=16. Answer: 16", "7+8=15 ok. 15-3=12 no. 12+5=17 no. Verdict: incorrect"),
    ("7+8=15. Answer: 17", "7+8=15 ok. 15-3=12. 12+5=17. Verdict: correct"),        # one step written
    ("Answer: 17", "7+8=15. 15-3=12. 12+5=17. Verdict: correct"),                     # bare: nothing to mark
    ("Answer: 16", "7+8=15. 15-3=12. 12+5=17. Verdict: incorrect"),
    ("7+8=15. Answer: 17 Answer: 17", "7+8=15 ok. 15-3=12. 12+5=17. Verdict: incorrect"),  # two answers: wrong
])
def test_judgement_rederives_each_step_marks_the_written_ones_and_ends_in_the_verifiers_verdict(answer, expected):
    assert judge.judge_prompt(PROBLEM, answer) == f"Check 7+8-3+5: {answer}"
    assert judge.judgement(ENV, PROBLEM, answer) == expected


def test_a_long_answer_is_shown_by_its_end_and_a_word_problem_by_its_equation():
    word = ENV.parse_problem("Ann had 7 apples, got 8, gave away 3, got 5. How many now?")
    answer = "x" * 50 + " 12+5=17. Answer: 17"  # 70 characters: the judge sees the last 40 after "..."
    assert judge.judge_prompt(word, answer) == "Check 7+8-3+5: ..." + answer[-40:]
    # the marks come from what the judge sees: the one equation shown is the answer's first, not the solution's
    assert judge.judgement(ENV, word, answer) == "7+8=15 no. 15-3=12. 12+5=17. Verdict: correct"
    with pytest.raises(ValueError, match="arithmetic problems"):
        judge.problem_line({"prompt": "2+2?", "answer": 4})


def test_judge_rows_fit_the_block_or_name_the_row():
    answers = ["7+8=15. 15-3=12. 12+5=17. Answer: 17", "Answer: 9"]
    run = SimpleNamespace(cfg=dict(block_size=128), tok=TOK, env=ENV)
    rows = judge.judge_rows(run, [PROBLEM, PROBLEM], answers)
    assert [r["label"] for r in rows] == [1.0, 0.0] and rows[1]["completion"].endswith("Verdict: incorrect")
    # the longest row of the default task: every operand 9, an answer cut to its last 40 characters, every step
    # marked, the longer verdict: a prompt of 4 + 58 tokens and a judgement of 53 + the end token, within 129
    nines = ENV.parse_problem("What is 9 + 9 + 9 + 9?")
    longest = judge.judge_rows(run, [nines], ["xx9+9=19. 19+9=28. 28+9=37. Answer: 37 !!!"])[0]
    assert longest["completion"] == "9+9=18 no. 18+9=27 no. 27+9=36 no. Verdict: incorrect"
    assert len(TOK.prompt_ids(longest["prompt"])) + len(TOK.response_ids(longest["completion"])) == 62 + 54
    with pytest.raises(ValueError, match=r"judge row 2: prompt and judgement are 107 tokens, more than block_size\+1=101"):
        judge.judge_rows(SimpleNamespace(cfg=dict(block_size=100), tok=TOK, env=ENV), [PROBLEM, PROBLEM],
                         ["Answer: 17", answers[0]])


def test_cut_at_verdict():
    wrote = TOK.encode("7+8=15 ok. Verdict: correct") + [TOK.eos]
    assert judge.cut_at_verdict(TOK, wrote) == (TOK.encode("7+8=15 ok. Verdict:"), True)
    # no "Verdict:" written (an end token, or the length limit): " Verdict:" appended to what it wrote
    assert judge.cut_at_verdict(TOK, TOK.encode("7+8=15 ok.") + [TOK.eos]) == (TOK.encode("7+8=15 ok. Verdict:"), False)
    assert judge.cut_at_verdict(TOK, TOK.encode("7+8")) == (TOK.encode("7+8 Verdict:"), False)


# ----------------------------------------------------------------------------------------------
# The verdict's probability, and the mean over k judgements

class ConstantLogits(nn.Module):
    """A 'judge' whose next-token distribution is the same at every position: log_probs (V,)."""

    def __init__(self, log_probs):
        super().__init__()
        self.log_probs = nn.Parameter(log_probs)

    def forward(self, idx):
        return self.log_probs.expand(*idx.shape, -1)


def test_verdict_probability_by_hand():
    """With one distribution p at every position, " incorrect" is " " + "in" + "correct": ℓ_incorrect =
    ℓ_correct + log p(i) + log p(n), so P(correct) = σ(ℓ_correct − ℓ_incorrect) = 1 / (1 + p(i)·p(n))."""
    probs = torch.full((320,), 0.4 / 318)
    probs[ord("i")], probs[ord("n")] = 0.1, 0.5
    p = judge.verdict_probabilities(ConstantLogits(probs.log()), TOK, [TOK.encode("Check: x. Verdict:"), [5]])
    assert p.tolist() == pytest.approx([1 / 1.05, 1 / 1.05], rel=1e-5)


def test_verdict_probability_of_ragged_prefixes_equals_each_one_alone():
    """Batched, right-padded prefixes of different lengths give what each gives alone, which is
    σ(ℓ_correct − ℓ_incorrect) from the model's log-softmax read token by token."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=320, n_layer=1, n_head=2, n_embd=32)).eval()
    prefixes = [TOK.encode("Check 1+2: Answer: 3. Verdict:"), TOK.encode("ok. Verdict:")]
    batched = judge.verdict_probabilities(model, TOK, prefixes)

    def by_hand(prefix):
        ell = []
        for word in (" correct", " incorrect"):
            ids = prefix + TOK.encode(word)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].float(), -1)
            ell.append(sum(float(logp[t - 1, ids[t]]) for t in range(len(prefix), len(ids))))
        return 1 / (1 + math.exp(ell[1] - ell[0]))
    assert batched.tolist() == pytest.approx([by_hand(p) for p in prefixes], abs=1e-5)


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory):
    """(a run-like object for judge_scores, a random tiny GPT as the judge)."""
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=128, vocab_size=320, n_layer=1, n_head=2, n_embd=32)).eval()
    run = SimpleNamespace(tok=TOK, device="cpu", cfg=dict(eval_batch_size=4), autocast=torch.autocast("cpu", enabled=False))
    return run, model


def test_judge_scores_greedy_and_sampled(tiny_judge):
    run, model = tiny_judge
    answers = ["7+8=15. 15-3=12. 12+5=17. Answer: 17", "Answer: 16", "Answer: 3"]
    greedy, wrote = judge.judge_scores(run, model, [PROBLEM] * 3, answers)
    assert greedy.shape == wrote.shape == (3, 1) and not wrote.any()  # a random judge never writes "Verdict:"
    # greedy = the verdict's probability after the greedy judgement, cut (and completed) at "Verdict:"
    prompt = TOK.prompt_ids(judge.judge_prompt(PROBLEM, answers[1]))
    tokens = sample(model, [prompt], 128, temperature=0.0, stop_tokens=(TOK.eos,), pad_id=TOK.pad).tokens[0]
    room = 128 - max(len(TOK.prompt_ids(judge.judge_prompt(PROBLEM, a))) for a in answers) - len(" Verdict: incorrect")
    cut, _ = judge.cut_at_verdict(TOK, tokens[:room])
    assert float(greedy[1, 0]) == pytest.approx(float(judge.verdict_probabilities(model, TOK, [prompt + cut])[0]), abs=1e-6)
    sampled, _ = judge.judge_scores(run, model, [PROBLEM] * 3, answers, samples=4, seed=7)
    again, _ = judge.judge_scores(run, model, [PROBLEM] * 3, answers, samples=4, seed=7)
    assert sampled.shape == (3, 4) and torch.equal(sampled, again) and ((sampled > 0) & (sampled < 1)).all()
    small = GPT(GPTConfig(block_size=40, vocab_size=320, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match="leaves no room for a judgement"):
        judge.judge_scores(run, small, [PROBLEM], answers[:1])


def test_the_judge_reward_is_the_mean_over_k_judgements(monkeypatch):
    """r = (1/k) Σ_i P(correct | j_i); judge_agree: r > 0.5 against the verifier; judge_verdict_written:
    the share of the answer's judgements that wrote "Verdict:"."""
    p = torch.tensor([[0.9, 0.6, 0.3], [0.2, 0.4, 0.3], [0.5, 0.5, 0.5]])
    wrote = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    asked = {}

    def scores(run, model, problems, texts, samples, temperature, seed):
        asked.update(samples=samples, temperature=temperature)
        return p, wrote
    monkeypatch.setattr(rewards, "judge_scores", scores)
    run = SimpleNamespace(env=ENV, cfg=dict(judge="dir", judge_samples=3, judge_temperature=0.7, max_new_tokens=64))
    ro = SimpleNamespace(problems=[PROBLEM] * 3, texts=["a", "b", "c"], verified=torch.tensor([1.0, 1.0, 0.0]),
                         ids=torch.zeros(3, 4, dtype=torch.long), lengths=torch.tensor([1, 1, 1]))
    r, logged = rewards.judged_reward(run, "a judge", ro)  # (lab/judge_reward.py's reward)
    assert r.tolist() == pytest.approx([0.6, 0.3, 0.5]) and asked == dict(samples=3, temperature=0.7)
    assert logged["judge_agree"].tolist() == [1.0, 0.0, 1.0]  # 0.5 is not above 0.5: "incorrect", as the verifier
    assert logged["judge_verdict_written"].tolist() == pytest.approx([2 / 3, 1.0, 0.0])


# ----------------------------------------------------------------------------------------------
# The vector reward

def test_vector_reward_is_the_weighted_sum_of_its_named_dimensions():
    """r = 1·correct + 0.5·short + 0.25·worked: worked answer, right, 38 tokens of 64; bare answer, wrong,
    11 tokens; a junk answer that does not parse."""
    run = SimpleNamespace(env=ENV, cfg=dict(max_new_tokens=64))
    ro = SimpleNamespace(texts=["7+8=15. 15-3=12. 12+5=17. Answer: 17", "Answer: 16", "7+8=15 so 15"],
                         verified=torch.tensor([1.0, 0.0, 0.0]), lengths=torch.tensor([38, 11, 64]))
    r, logged = vector_reward(run, ro, rewards.reward_weights("correct=1, short=0.5,worked=0.25,parses=0"))
    short = [1 - 38 / 64, 1 - 11 / 64, 0.0]
    assert logged["short"].tolist() == pytest.approx(short)
    assert logged["worked"].tolist() == [1.0, 0.0, 1.0] and logged["parses"].tolist() == [1.0, 1.0, 0.0]
    assert logged["correct"].tolist() == [1.0, 0.0, 0.0]
    assert r.tolist() == pytest.approx([1 + 0.5 * short[0] + 0.25, 0.5 * short[1], 0.25])


@pytest.mark.parametrize("text, error", [
    ("correct=1,shrot=0.5", "no dimension 'shrot' \\(did you mean short\\?\\)"),
    ("correct=1,correct=2", "'correct' given twice"),
    ("correct", "is not name=weight"),
    ("correct=one", "is not a number"),
    ("correct=1,short=-1", "finite and >= 0"),
    ("correct=0", "every weight is 0"),
])
def test_reward_weights_errors(text, error):
    with pytest.raises(ValueError, match=error):
        rewards.reward_weights(text)


def test_reward_weights_parse():
    assert rewards.reward_weights("") == {"correct": 1.0}
    assert rewards.reward_weights(" short = 0.5 , correct=2") == {"short": 0.5, "correct": 2.0}


def test_grpo_logs_each_dimension_and_the_judges_figures(tmp_path):
    """A vector reward (lab/vector_reward.py): every iteration logs each dimension, and the logged reward is
    their weighted sum (a mean of a weighted sum is the weighted sum of the means); a judge's reward
    (lab/judge_reward.py): its figures, the judge fingerprinted, the passport says where the reward comes from."""
    common = dict(TINY, prompts_per_iter=2, group_size=2, max_new_tokens=8, max_iters=2)
    T.train(dict(common, algo="vector_reward", reward_weights="correct=1,short=0.5", out_dir=str(tmp_path / "vector")))
    rows = [json.loads(line) for line in open(tmp_path / "vector" / "metrics.jsonl") if '"loss"' in line]
    assert len(rows) == 2
    for row in rows:
        assert row["reward"] == pytest.approx(row["reward_correct"] + 0.5 * row["reward_short"], abs=1e-6)
        assert 0 <= row["reward_correct"] <= 1 and 0 <= row["reward_short"] <= 1
    judge_dir = write_checkpoint(tmp_path / "judge", seed=3, n_layer=1)
    r = T.train(dict(common, algo="judge_reward", judge=judge_dir, judge_samples=2, out_dir=str(tmp_path / "run")))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in line]
    assert all(0 < row["reward"] < 1 and 0 <= row["judge_agree"] <= 1 and 0 <= row["judge_verdict_written"] <= 1
               for row in rows)
    assert r.frozen["judge"]["directory"] == judge_dir  # fingerprinted: a resumed run must find the same judge
    passport = open(tmp_path / "run" / "passport.md").read()
    assert f"the judge `{judge_dir}`" in passport and "each of 2 judgements sampled at T = 1.0, their mean" in passport


@pytest.mark.parametrize("overrides, error", [
    (dict(algo="judge_reward"), "needs --judge="),
    (dict(algo="grpo", judge="somewhere"), "it is an option of --algo judge_reward"),
    (dict(algo="grpo", reward_weights="correct=1"), "it is an option of --algo vector_reward"),
    (dict(algo="vector_reward", reward_weights="loud=1"), "no dimension 'loud'"),
    (dict(algo="judge_reward", judge_samples=-1), "judge_samples=-1 is out of range"),
])
def test_grpo_reward_config_errors(tmp_path, overrides, error):
    with pytest.raises(ValueError, match=error):
        T.train(dict(TINY, prompts_per_iter=2, group_size=2, max_iters=0, out_dir=str(tmp_path / "run"), **overrides))


def test_a_reward_model_is_no_judge(tmp_path):
    rm = write_scalar_checkpoint(tmp_path / "rm")
    with pytest.raises(ValueError, match="is a scalar model"):
        T.train(dict(TINY, algo="grpo", prompts_per_iter=2, group_size=2, max_iters=0, reward="judge", judge=rm,  # (old spelling)
                     out_dir=str(tmp_path / "run")))


# ----------------------------------------------------------------------------------------------
# experiments/judge_agreement.py

def test_agreement_and_pair_accuracy_grow_with_k_on_a_hand_made_case():
    """One problem, a correct and an incorrect answer, two judgements each:
        correct answer:   P = 0.9, 0.2        incorrect answer:   P = 0.3, 0.6
    k = 1: each judgement alone agrees half the time (0.9 yes, 0.2 no; 0.3 yes, 0.6 no) and ranks the
    pair right in block 1 (0.9 > 0.3), wrong in block 2 (0.2 < 0.6): 0.5 and 0.5.
    k = 2: the means 0.55 and 0.45 agree on both answers and rank the pair right: 1 and 1."""
    p = torch.tensor([[0.9, 0.2], [0.3, 0.6]])
    points = study.scaling(p, torch.tensor([1.0, 0.0]), problems=1)
    assert [pt["k"] for pt in points] == [1, 2]
    assert [pt["agreement"] for pt in points] == [0.5, 1.0] and [pt["pair_acc"] for pt in points] == [0.5, 1.0]
    assert points[1]["gain_vs_1"] == 0.5
    assert points[0]["reward_correct"] == pytest.approx(0.55) and points[1]["reward_incorrect"] == pytest.approx(0.45)


def test_auroc_and_balanced_accuracy_do_not_count_the_base_rate():
    """Four answers, labels 1, 0, 1, 0, P = 0.9, 0.2, 0.4, 0.4: AUROC over the 4 (correct, incorrect) pairs
    (0.9 > 0.2, 0.9 > 0.4, 0.4 > 0.2, 0.4 = 0.4: a tie, 1/2) = 3.5/4 = 0.875; at 0.5 the correct answers are
    passed 1 of 2, the incorrect failed 2 of 2: balanced accuracy 0.75. A judge that says "incorrect" to
    everything (P = 0.1) on 78 wrong answers of 100 agrees 0.78, but its AUROC and balanced accuracy are 0.5."""
    auroc, balanced = study.threshold_free(torch.tensor([[0.9], [0.2], [0.4], [0.4]]), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert auroc == pytest.approx(0.875) and balanced == pytest.approx(0.75)
    labels = torch.tensor([1.0] * 22 + [0.0] * 78)
    point = study.measure(torch.full((100, 1), 0.1), labels, problems=100)
    assert point["agreement"] == pytest.approx(0.78) and point["auroc"] == 0.5 and point["balanced_acc"] == 0.5
    assert study.threshold_free(torch.full((3, 1), 0.7), torch.ones(3)) == (None, None)


def test_pair_scores_count_a_tie_as_half_and_skip_problems_without_a_pair():
    labels = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    scores = torch.tensor([[[0.7], [0.7], [0.1]], [[0.2], [0.3], [0.4]]])
    assert study.pair_scores(labels, scores) == [0.75, None]  # (tie 0.5 + right 1) / 2 pairs


@pytest.mark.slow  # (a study script end to end at toy size, 5-10 s: with -m slow, as ood.py's)
def test_judge_experiment_runs_at_toy_size(tmp_path):
    """experiments/judge_agreement.py --quick end to end (a few seconds): a toy policy's answers, the judge's rows
    (each judgement ending in the verifier's verdict), a judge trained on them, the greedy and the sampled
    judgements measured for k = 1, 2, 4, a Bradley–Terry RM scored on the same pairs, the table and the plot."""
    rm = write_scalar_checkpoint(tmp_path / "rm")
    command = [sys.executable, os.path.join(ROOT, "experiments", "judge_agreement.py"), "--quick", f"--out={tmp_path}",
               f"--reward_model={rm}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "judge_data.jsonl")]
    assert len(rows) == 16  # 8 train problems × 2 answers
    assert all(r["completion"].endswith("Verdict: correct" if r["label"] else "Verdict: incorrect") for r in rows)
    results = json.load(open(tmp_path / "results.json"))
    assert results["data"]["rows"] == 16 and results["heldout"]["problems"] == 4
    assert [p["k"] for p in results["sampled"]] == [1, 2, 4]
    for point in [results["greedy"]] + results["sampled"]:
        assert 0 <= point["agreement"] <= 1 and 0 <= point["verdict_written"] <= 1
        assert len(point["per_problem_agreement"]) == 4
    assert results["reward_model"]["path"] == rm and results["reward_model"]["own_val_pair_acc"] is None
    table = (tmp_path / "judge.md").read_text()
    assert "| k = 4 sampled |" in table and "| greedy |" in table and "Bradley–Terry RM" in table
    assert len(results["examples"]) == 4 and (tmp_path / "judge.png").exists()


@pytest.mark.slow  # (a study script end to end at toy size, 5-10 s: with -m slow, as ood.py's)
def test_reward_weights_experiment_runs_at_toy_size(tmp_path):
    """experiments/reward_weights.py --quick end to end (a few seconds): one GRPO run per setting, every
    dimension logged each iteration, the logged reward each setting's weighted sum of them, the table and
    the plot."""
    command = [sys.executable, os.path.join(ROOT, "experiments", "reward_weights.py"), "--quick", f"--out={tmp_path}",
               "--weights=correct=1", "--weights=correct=1,short=2,parses=0.5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    assert [a["weights"] for a in results["arms"]] == ["correct=1", "correct=1,short=2,parses=0.5"]
    for a, weights in zip(results["arms"], ({"correct": 1}, {"correct": 1, "short": 2, "parses": 0.5})):
        assert [p["iter"] for p in a["iterations"]] == [1, 2]
        for p in a["iterations"]:
            assert p["reward"] == pytest.approx(sum(w * p[f"reward_{d}"] for d, w in weights.items()), abs=1e-6)
            assert all(0 <= p[f"reward_{d}"] <= 1 for d in rewards.DIMENSIONS)
        assert 0 <= a["heldout"]["acc"] <= 1
    assert "| `correct=1,short=2,parses=0.5` |" in (tmp_path / "reward_weights.md").read_text()
    assert (tmp_path / "reward_weights.png").exists()


def test_judge_size_pairs_the_judges_per_problem():
    """experiments/judge_size.py's comparison on hand-made studies: pair accuracy at the largest k paired
    per problem over the problems where both judges have a pair (bands.paired), agreement paired over
    every problem, the verdict by the band's sign, and a judge pair with no shared pair reported as such."""
    from experiments import judge_size
    from nanopost import bands

    def study(pairs, agreement):
        point = dict(k=8, pair_acc=0.7, agreement=0.8, auroc=0.75, balanced_acc=0.7, per_problem_pairs=pairs,
                     per_problem_agreement=agreement)
        return dict(judge="j", greedy=dict(pair_acc=0.7), sampled=[dict(point, k=1), point],
                    heldout=dict(problems=len(pairs)))
    none = [None] * 10
    worked = study([0.5] * 20 + none, [0.75] * 30)
    large = study([1.0] * 20 + none, [1.0] * 30)
    policy = study([0.5] * 10 + [0.0] * 10 + none, [0.5] * 30)
    out = judge_size.compare(dict(policy=policy, worked=worked, large=large))
    size, recipe, both = out["comparisons"]
    assert (size["a"], size["b"], size["problems"]) == ("large", "worked", 20)
    assert size["pair_acc"] == pytest.approx(0.5) and size["pair_acc_band"] == 0.0  # +0.5 on every problem
    assert out["verdict"] == "the larger judge ranks better"
    assert recipe["pair_acc"] == pytest.approx(0.25)
    assert (recipe["pair_acc"], recipe["pair_acc_band"]) == pytest.approx(bands.paired([0.5] * 20, [0.5] * 10 + [0.0] * 10))
    assert both["agreement"] == pytest.approx(0.5) and both["agreement_band"] == 0.0
    assert judge_size.compare(dict(policy=policy, worked=large, large=worked))["verdict"] == "the larger judge ranks worse"
    mixed = study([1.0, 0.0] * 10 + none, [0.75] * 30)  # +0.5 and −0.5 against worked: mean 0, inside its band
    assert judge_size.compare(dict(policy=policy, worked=worked, large=mixed))["verdict"] == "null (within the band)"
    apart = study([None] * 20 + [1.0] * 10, [0.75] * 30)  # its pairs on other problems than worked's
    out = judge_size.compare(dict(policy=policy, worked=worked, large=apart))
    assert out["comparisons"][0]["problems"] == 0 and out["verdict"].startswith("not measurable")
    assert "| large − worked | – | 0 |" in judge_size.table(out)
