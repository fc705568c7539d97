"""envs.calculator (the tool) against injection and blow-ups, and the calculator environment:
splits, solver, verifier, SFT demonstrations with masked results, process steps."""

import hashlib
import time

import pytest

import envs
from nanopost import options
import train as T
from conftest import SFT_DATA, TINY
from envs import Calculator, calculator
from nanopost.tokenizer import Tokenizer

HOSTILE = [
    "x", "__import__('os').system('ls')", "open('/etc/passwd').read()", "(1).real", "(1).__class__",
    "abs(-1)", "print(1)", "(lambda: 1)()", "lambda x: x", "[i for i in range(9)]", "{i for i in (1, 2)}",
    "(i for i in (1,))", "[1] * 10", "{1: 2}", "'a' * 9", "1 if 1 else 2", "1 < 2", "1 and 2", "~1", "1 << 99",
    "7 // 2", "7 % 2", "1; 2", "1\n2", "１２+1", "1e400", "2j", "True + 1",
    "10**100", "2**99999999", "9**9**9**9", "2**2**2**2**2**2", "(10**6)**(10**6)", "999999999999*999999999999",
    "2**-99999", "0**-1", "1/0", "1/(2-2)", "5/(3-3)*2",
    "((((((1/9)**16)**16)**16)**16)**16)**16", "(((((((((1/9)**16)**16)**16)**16)**16)**16)**16)**16)**16",
    "((((((((((((1/7)**16)**16)**16)**16)**16)**16)**16)**16)**16)**16)**16)", "((0.1**16)**16)**2", "(1/3)**16**16",
    "-" * 60 + "1", "(" * 40 + "1" + ")" * 40, "((" * 200 + "1" + "))" * 200, "1+" * 10000 + "1", "9" * 10 ** 6,
    "", "   ", "(", "1+", "*3", "1..2",
]


@pytest.mark.parametrize("expr", HOSTILE, ids=lambda e: repr(e[:20]) + f"[{len(e)}]")
def test_hostile_input_gets_a_short_error_quickly(expr):
    start = time.perf_counter()
    answer = calculator(expr)
    assert time.perf_counter() - start < 0.1
    assert answer.startswith("error: ") and len(answer) < 60


@pytest.mark.parametrize("expr,value", [("347*28", "9716"), ("9716 + 51", "9767"), ("-(3-5)", "2"), ("7/2", "3.5"),
                                        ("2**10", "1024"), ("1.5*2", "3"), ("2**-2", "0.25"), ("10/3", "3.33333"),
                                        ("(((1+2)))*3", "9"), ("2×3−1÷2", "5.5"), ("999999*999999", "999998000001")])
def test_arithmetic_is_exact(expr, value):
    assert calculator(expr) == value


def test_cost_is_bounded_by_bits_not_only_by_size():
    """Small values with long denominators: allowed while every integer formed stays within
    CALC_MAX_BITS, refused (before computing) past it."""
    assert calculator("(2/3)**16") == "0.00152244" and calculator("(1/999999)**16") == "1.00002e-96"
    assert calculator("((1/9)**16)**16") == "5.17509e-245"  # 9**256: 812 bits
    assert calculator("((1/9)**16)**16*((1/7)**16)**16") == "error: numerator or denominator over 1024 bits"
    assert calculator("(((1/9)**16)**16)**16") == "error: numerator or denominator over 1024 bits"
    assert calculator("(1/3)**16*(1/7)**16") == "6.99023e-22"


def test_tool_calls_reads_what_the_regex_read():
    """tool_calls (str.find, linear) gives exactly what the earlier regex call(.*?)end(?:result(.*?)endresult)?
    gave, on 20,000 random strings of tags and a few characters."""
    import random
    import re
    e = re.escape
    before = re.compile(e(envs.TOOL_CALL) + r"(.*?)" + e(envs.END_CALL) + r"(?:" + e(envs.TOOL_RESULT) + r"(.*?)"
                        + e(envs.END_RESULT) + r")?", re.S)
    rng = random.Random(0)
    pieces = [envs.TOOL_CALL, envs.END_CALL, envs.TOOL_RESULT, envs.END_RESULT, "1", "+", " ", "\n", "<|"]
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        expected = [(m.group(1), m.group(2), m.start() + len(envs.TOOL_CALL) + len(m.group(1)) + len(envs.END_CALL))
                    for m in before.finditer(text)]
        assert envs.tool_calls(text) == expected, repr(text)


def test_evaluation_chains_are_distinct_and_the_defaults_unchanged():
    """Held-out and OOD never repeat a chain: where the split is small enough for repeats (n_ops 1,
    8,110 held-out chains) 1,000 draws are 1,000 distinct chains, where drawn with replacement 946;
    at the default n_ops 3 no draw repeated, so the problems are the ones drawn before; train may repeat."""
    digest = lambda problems: hashlib.sha1(" | ".join(p["prompt"] for p in problems).encode()).hexdigest()[:12]
    one = Calculator(n_ops=1)
    assert len({p["prompt"] for p in one.problems("heldout", 1000)}) == 1000
    assert len({p["prompt"] for p in one.problems("train", 800)}) == 795 and digest(one.problems("train", 800)) == "b8e007c003e8"
    env = Calculator()
    assert digest(env.problems("heldout", 1000)) == "411908110322" and digest(env.problems("ood", 1000)) == "81bd511b4057"


def test_problems_splits_and_solver():
    env = Calculator()
    train, heldout = env.problems("train", 300), env.problems("heldout", 100)
    key = lambda p: (p["start"], tuple(p["steps"]))
    assert not {key(p) for p in train} & {key(p) for p in heldout}  # disjoint by equation
    assert env.problems("train", 5, seed=3) == env.problems("train", 5, seed=3)
    assert all(len(p["steps"]) == 3 and p["steps"][0][0] == "*" for p in train)
    assert all(len(p["steps"]) == 4 for p in env.problems("ood", 20))
    for p in train + heldout:
        demo = env.solve(p)
        assert env.verify(p, demo) == 1.0 and env.shows_work(demo)
        assert demo.count(envs.TOOL_CALL) == 3 and p["answer"] >= 0
    p = train[0]
    assert env.verify(p, f"Answer: {p['answer']}") == 1.0  # the outcome does not care how it was reached
    assert env.verify(p, f"Answer: {p['answer'] + 1}") == 0.0 and env.verify(p, "") == 0.0
    with pytest.raises(ValueError):
        Calculator(digits=2)
    direct = [Calculator(direct_frac=0.5).demonstration(p) for p in train]
    assert 0.35 < sum(d == f"Answer: {p['answer']}" for d, p in zip(direct, train)) / len(train) < 0.65
    assert all(d == env.solve(p) for d, p in zip(direct, train) if d.startswith(envs.TOOL_CALL))


def test_demonstration_tokens_results_masked_and_within_the_default_budget():
    """SFT's targets: the tags are special ids, each result span (tags included) has mask 0, the rest
    1; every train demonstration fits the default 64 new tokens (the compliant path is reachable)."""
    tok, env = Tokenizer(), Calculator()
    p = env.problems("train", 1)[0]
    ids, mask = tok.assistant_ids(env.solve(p))
    assert tok.decode(ids) == env.solve(p) + "<|eos|>"
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert "<|tool_result|>" not in learned and "<|tool_call|>" in learned and learned.endswith("<|eos|>")
    hidden = [i for i, m in zip(ids, mask) if not m]
    assert hidden.count(tok.special["tool_result"]) == 3 and hidden.count(tok.special["/tool_result"]) == 3
    longest = max(len(tok.assistant_ids(env.solve(q))[0]) for q in env.problems("train", 2000))
    assert longest <= options.DEFAULTS["max_new_tokens"]
    assert tok.assistant_ids("7+8=15. Answer: 15") == (tok.response_ids("7+8=15. Answer: 15"), [1] * 19)


def test_sft_on_calculator_masks_results_and_evaluates_with_the_tool(tmp_path):
    run = T.train(dict(TINY, **SFT_DATA, env="calculator", env_direct_frac=0.0, max_iters=2, eval_interval=2,
                       out_dir=str(tmp_path / "sft")))
    special = run.tok.special
    for ids, mask in run.state.train_examples[:20]:
        inside = False
        for i, m in zip(ids, mask):
            inside = inside or i == special["tool_result"]
            assert m == (0 if inside else m)
            inside = inside and i != special["/tool_result"]
        assert sum(i == special["tool_result"] for i in ids) == 3
    assert {"heldout_acc", "heldout_work", "ood_acc"} <= set(run.metrics)


def test_step_rewards_and_path_signals_of_the_solver_and_of_shortcuts():
    env = Calculator()
    p = {"start": 347, "steps": [("*", 28), ("+", 51), ("-", 86)], "answer": 9681}
    demo = env.solve(p)
    ends = [demo.index(envs.END_CALL, demo.index(expr)) + len(envs.END_CALL)
            for expr in ("347*28", "9716+51", "9767-86")]
    assert env.step_rewards(p, demo) == [(ends[0], 1.0), (ends[1], 1.0), (ends[2], 1.0), (len(demo), 1.0)]
    assert env.path_signals(p, demo) == [(e, 1.0) for e in ends] + [(len(demo), 1.0)]
    wrong = demo.replace("9716+51", "9716+15")  # a wrong second call, later calls build on the true values
    assert [r for _, r in env.step_rewards(p, wrong)] == [1.0, 0.0, 1.0, 1.0]
    shortcut = "<|tool_call|>347*28+51-86<|/tool_call|><|tool_result|>9681<|/tool_result|>Answer: 9681"
    assert env.verify(p, shortcut) == 1.0
    assert [s for _, s in env.path_signals(p, shortcut)] == [-1.0, 1.0]  # the forbidden call; the answer copied
    assert [s for _, s in env.path_signals(p, "Answer: 9681")] == [-1.0]  # answered without any tool result
