"""What docs/guarantees.md promises, where no other file tests it: the calculator's slowest call
within its length limit returns within a second, every pattern read from model output or data is
linear (an adversarial string of tens of thousands of characters parses within 0.1 s), and no
checkpoint loader runs pickled code."""

import ast
import glob
import heapq
import os
import random
import re
import time

import pytest
import torch

from nanopost import checkpoints as C
import envs
from envs.arithmetic import _EQUATION, _SYMBOL_FORM, _WORD_FORM, ANSWER_FORM, parse_answer
from envs.calculator import _BINARY_OP, CALC_MAX_CHARS, calculator
from envs.generalpoints import evaluate_expression
from envs.gsm8k import final_number

# ----------------------------------------------------------------------------------------------
# The calculator: bounded cost


def _timed(expr):
    start = time.perf_counter()
    answer = calculator(expr)
    seconds = time.perf_counter() - start
    assert answer.startswith("error: ") or float(answer) == float(answer), (expr, answer)  # a value or an error
    return seconds, expr


def _nested_family():
    """Every call up to CALC_MAX_CHARS that nests powers, quotients and products of small fractions,
    the shape whose integers grow fastest: ((b)**k)**k..., (b)**k**k..., ((b)**k/(c)**k)**k..., and
    the issue's three (39, 45 and 63 characters)."""
    bases = ["1/9", "2/3", "9/7", "7/11", "99/98", "1/999999", "999999/999998", "0.5", "-1/3", "0.000001",
             "1.000001", "9", "1/3+1/7", "1/9*1/7"]
    for base in bases:
        for k in ("16", "-16", "15", "2"):
            grow = [lambda e: f"({e})**{k}", lambda e: f"({e})**{k}/({base})**{k}", lambda e: f"({e})*({e})",
                    lambda e: f"({e})/({base})", lambda e: f"({e}+{base})**{k}"]
            for step in grow:
                e = f"({base})"
                while len(e) <= CALC_MAX_CHARS:
                    yield e
                    e = step(e)
            e = f"({base})"
            while len(e) <= CALC_MAX_CHARS:  # right-associative towers
                yield e
                e = f"{e}**{k}"


def _random_expression(rng, depth):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 12))), f"{rng.randint(1, 999)}/{rng.randint(1, 999)}",
                           f"0.{rng.randint(0, 999999):06d}", str(rng.randint(1, 9))])
    op = rng.choice(["+", "-", "*", "/", "**", "**"])
    left = _random_expression(rng, depth - 1)
    right = rng.choice(["16", "-16", "15", "2", "-1", "(2**4)"]) if op == "**" else _random_expression(rng, depth - 1)
    return f"({left}){op}({right})" if rng.random() < 0.7 else f"{left}{op}{right}"


def _mutate(rng, expr):
    alphabet = "0123456789.+-*/() "
    i = rng.randrange(len(expr) + 1)
    kind = rng.randrange(5)
    if kind == 0:
        expr = expr[:i] + rng.choice(alphabet) + expr[i:]
    elif kind == 1 and expr:
        expr = expr[:i] + expr[i + 1:]
    elif kind == 2 and expr:
        expr = expr[:i] + rng.choice(alphabet) + expr[i + 1:]
    elif kind == 3:
        expr = f"({expr})**16"
    else:
        expr = f"({expr})*({expr})"
    return expr[:CALC_MAX_CHARS]


def test_the_calculators_slowest_call_within_the_length_limit_returns_within_a_second():
    """An adversarial search over the calls of at most CALC_MAX_CHARS characters: the nested family,
    4,000 random expressions and 1,000 random strings of the allowed characters (seeded), then a
    hill climb of 2,000 mutations from the slowest (about 9,000 calls, under a second in all). Before each operation's cost was bounded, the
    issue's 39-character call took 31 s and its 63-character one did not finish."""
    issue = ["((((((1/9)**16)**16)**16)**16)**16)**16", "(((((((1/9)**16)**16)**16)**16)**16)**16)**16",
             "((((((((((1/9)**16)**16)**16)**16)**16)**16)**16)**16)**16)**16"]
    assert [len(e) for e in issue] == [39, 45, 63]
    rng = random.Random(0)
    calls = issue + list(_nested_family())
    calls += [e for e in (_random_expression(rng, rng.randint(1, 5)) for _ in range(4000)) if len(e) <= CALC_MAX_CHARS]
    calls += ["".join(rng.choice("0123456789.+-*/() ") for _ in range(rng.randint(1, CALC_MAX_CHARS))) for _ in range(1000)]
    assert len(calls) > 3000 and max(map(len, calls)) == CALC_MAX_CHARS
    timed = [_timed(e) for e in calls]
    slowest = heapq.nlargest(20, timed)
    heapq.heapify(slowest)  # a min-heap: slowest[0] is the fastest of the 20
    for _ in range(2000):  # each mutation from one of the 20 slowest so far
        child = _timed(_mutate(rng, rng.choice(slowest)[1]))
        timed.append(child)
        heapq.heappushpop(slowest, child)
    worst = max(timed)
    print(f"slowest of {len(timed)} calls: {worst[0] * 1e6:.0f} µs for {worst[1]!r}")
    assert worst[0] < 1.0, worst
    assert all(calculator(e) == "error: numerator or denominator over 1024 bits" for e in issue)


# ----------------------------------------------------------------------------------------------
# Linear parsing: every pattern applied to model output or data

def _within(seconds, fn, text):
    start = time.perf_counter()
    fn(text)
    took = time.perf_counter() - start
    assert took < seconds, f"{took:.2f} s on {text[:30]!r}... ({len(text)} characters)"


T, E, R, ER = envs.TOOL_CALL, envs.END_CALL, envs.TOOL_RESULT, envs.END_RESULT
ADVERSARIAL = [  # (what reads it, the hostile text)
    ("gsm8k", "####" + " " * 30000), ("gsm8k", "#### " + "1," * 20000), ("gsm8k", "#" * 50000),
    ("gsm8k", "#### $" + " " * 30000), ("gsm8k", "####" + " " * 15000 + "$" + " " * 15000), ("gsm8k", "####" * 12500),
    ("gsm8k", "#### -" + "\n\t " * 10000), ("gsm8k", "#### 1" + ".1" * 20000), ("gsm8k", "#### " * 10000 + " " * 20000),
    ("tool_calls", T * 20000), ("tool_calls", (T + "1" + E + R) * 5000), ("tool_calls", T + "1" * 50000),
    ("tool_calls", (T + E) * 10000), ("tool_calls", (T + "1" + E + R + "2") * 5000 + ER),
    ("binary_op", "1" + " " * 30000), ("binary_op", "1 " * 30000), ("binary_op", ")" * 30000 + "x"),
    ("answer", "Answer: 1" + " " * 30000 + "x"), ("answer", "Answer: " + "1" * 30000 + "x"),
    ("symbol_form", "What is 1" + " + 1" * 10000 + "x"), ("symbol_form", "What is " + "1" * 30000),
    ("word_form", "Ann had 1 apples, " + "got 1, " * 10000 + "x"), ("word_form", "A" + "a" * 30000),
    ("generalpoints", "1+" * 30000), ("calculator", "9" * 10 ** 6), ("calculator", "(" * 30000),
]
READERS = {"gsm8k": final_number, "tool_calls": envs.tool_calls, "binary_op": _BINARY_OP.findall,
           "answer": lambda t: (parse_answer(t), ANSWER_FORM.search(t)), "symbol_form": _SYMBOL_FORM.fullmatch,
           "word_form": _WORD_FORM.fullmatch, "generalpoints": evaluate_expression, "calculator": calculator}


@pytest.mark.parametrize("reader,text", ADVERSARIAL, ids=lambda x: x if len(x) < 20 else f"{x[:8]!r}[{len(x)}]")
def test_parsing_is_linear_on_adversarial_text(reader, text):
    _within(0.1, READERS[reader], text)


def test_treasure_reads_hostile_calls_and_maps_quickly():
    """The treasure game: a hostile call (an injection, or 100,000 characters) is one of the game's
    refusals within 0.1 s (a call is compared with the action list, linear), and the map pattern on a
    hostile prompt answers within 0.1 s."""
    game = envs.Treasure()
    prompt = game.problems("train", 1)[0]["prompt"]
    for call in ["go " + "a" * 100000, "x" * 100000, "go " * 30000, "__import__('os').system('ls')", "open chest; take",
                 "go {hall}", "go " + "\n" * 100000, " " * 100000 + "craft"]:
        start = time.perf_counter()
        answer = game.tool(call, prompt, ["take"] * 16)
        assert time.perf_counter() - start < 0.1
        assert answer.startswith(("error: ", "cannot go to ", "crafting needs")), answer[:80]
    _within(0.1, lambda t: game.tool("take", t, []), "Paths: " + "hall-" * 20000)


def test_arithmetic_step_pattern_is_linear_and_finds_what_the_old_one_found():
    """envs/arithmetic.py's _EQUATION once began `-?[0-9]+`, which retried from every digit of a long run
    (20,000 digits: 4.4 s); a match now starts only at a '-' or where a run of digits starts."""
    _within(0.1, lambda t: list(_EQUATION.finditer(t)), "1" * 20000)
    old = re.compile(r"-?[0-9]+[+-][0-9]+=-?[0-9]+\.")
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice("0123456789+-=. x") for _ in range(rng.randint(0, 30)))
        assert [m.group() for m in _EQUATION.finditer(text)] == [m.group() for m in old.finditer(text)], text


# ----------------------------------------------------------------------------------------------
# Safe loading

class _Payload:
    """What a hostile ckpt.pt would hold: unpickling it calls open(path, "w"), creating a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    os.makedirs(tmp_path / "evil")
    torch.save(dict(format=C.CHECKPOINT_FORMAT, model=_Payload(str(marker))), tmp_path / "evil" / "ckpt.pt")
    for load in (C.read_checkpoint, C.load_model, C.load_tokenizer):
        with pytest.raises(ValueError, match=r"evil/ckpt\.pt: refused: loading it would run code \(io\.open\)") as e:
            load(str(tmp_path / "evil"))
        assert "\n" not in str(e.value) and "weights_only" not in str(e.value)  # one line, no advice to unlock it
    assert not marker.exists()


def test_every_torch_load_in_the_code_is_weights_only():
    """Every torch.load call outside tests/ passes weights_only=True (checkpoints.safe_load, which
    read_checkpoint and the DPO reference cache use)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
             if not os.path.relpath(f, root).startswith(("tests", ".")) and "site-packages" not in f]
    calls = []
    for f in files:
        for node in ast.walk(ast.parse(open(f).read())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                calls.append(os.path.relpath(f, root))
                assert any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords), \
                    f"{os.path.relpath(f, root)}:{node.lineno}: torch.load without weights_only=True"
    assert os.path.join("nanopost", "checkpoints.py") in calls  # safe_load at least: the scan sees it
