"""
Verifiable environments, generated procedurally (no downloads). SPEC §4.

Arithmetic (the default task): chains of additions and subtractions, written as symbols
("What is 7 + 8 - 3 + 5?") or as a short word problem ("Ann had 7 apples, got 8, gave away 3, ..."). Each environment offers
- problems(split, n, seed): disjoint "train" / "heldout" splits and an "ood" split (one more digit);
- solve(problem): the worked solution ("7+8=15. 15-3=12. 12+5=17. Answer: 17");
- demonstration(problem): the SFT target: the worked solution, or for a `direct_frac` share of the
  problems (fixed per problem by a hash) only the answer ("Answer: 17");
- verify(problem, response): the reward, 1.0 or 0.0, from a strict answer parser;
- shows_work(response): whether the response writes an equation before its answer;
- corpus(n, seed): pre-training documents (bare worked equations, no question template).

Difficulty knobs: `digits` (operand size) and `n_ops` (chain length); the default is 1 digit, 3 ops,
and the OOD split (2-digit start values) is far harder. `direct_frac` (default 0.5 through
train.py's env_direct_frac) mixes two strategies in the demonstrations, both correct: the tiny model
can write the steps reliably but cannot add three numbers in one token, so SFT leaves a policy that
answers directly about half the time and mostly wrongly, and RL with the verifier has a behaviour to
select (README, "The default task"). direct_frac = 0 is the old default: every demonstration worked,
nothing to select, and RL gains little.
"""

import ast
import collections
import functools
import hashlib
import operator
import random
import re
import string
from fractions import Fraction

NAMES = ["Ann", "Bob", "Kim", "Lee", "Max", "Sam", "Zoe", "Eva"]
ITEMS = ["apples", "coins", "books", "cards", "shells", "stamps"]
HELDOUT_PERCENT = 10  # share of the problem space reserved for held-out evaluation

# Exactly one "Answer: <integer>" and nothing after it. Listing several candidate answers,
# repeating the marker or appending junk all score 0: the format cannot be gamed.
_ANSWER = re.compile(r"Answer: (-?[0-9]+)\s*$")  # [0-9], not \d: \d and int() accept "１７" too


_EQUATION = re.compile(r"-?[0-9]+[+-][0-9]+=-?[0-9]+\.")  # a written step of a worked solution, "7+8=15."


def parse_answer(response):
    """The final integer answer, or None when the response is not exactly in the expected form."""
    if response.count("Answer:") != 1:
        return None
    m = _ANSWER.search(response)
    return int(m.group(1)) if m else None


class Arithmetic:
    name = "arithmetic"

    def __init__(self, digits=1, n_ops=3, word_frac=0.5, direct_frac=0.0):
        if digits < 1 or n_ops < 1:
            raise ValueError("digits and n_ops must be >= 1")
        if not 0.0 <= direct_frac <= 1.0:
            raise ValueError(f"direct_frac must be in [0, 1], got {direct_frac}")
        self.digits, self.n_ops, self.word_frac, self.direct_frac = digits, n_ops, word_frac, direct_frac

    # -- problems ---------------------------------------------------------------------------
    def _chain(self, rng, digits, need_big):
        """Start value and (op, operand) steps; every intermediate value stays non-negative."""
        hi = 10 ** digits - 1
        lo = 10 ** (digits - 1) if need_big else 0
        start = rng.randint(lo, hi)
        steps, value = [], start
        for _ in range(self.n_ops):
            if value > 0 and rng.random() < 0.5:
                b = rng.randint(0, min(value, hi))
                steps.append(("-", b)); value -= b
            else:
                b = rng.randint(0, hi)
                steps.append(("+", b)); value += b
        return start, steps, value

    def _render(self, rng, start, steps):
        if rng.random() >= self.word_frac:
            return "What is " + str(start) + "".join(f" {op} {b}" for op, b in steps) + "?"
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        moves = ", ".join(f"got {b}" if op == "+" else f"gave away {b}" for op, b in steps)
        return f"{name} had {start} {item}, {moves}. How many now?"

    @staticmethod
    def _split_of(start, steps):
        key = f"{start}" + "".join(f"{op}{b}" for op, b in steps)
        return "heldout" if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT else "train"

    def problems(self, split, n, seed=0):
        """n problems of `split` ("train", "heldout" or "ood"). Train and held-out are disjoint by
        the underlying equation (not just the wording); "ood" has (digits+1)-digit start values."""
        if split not in ("train", "heldout", "ood"):
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        out = []
        while len(out) < n:
            if split == "ood":
                start, steps, value = self._chain(rng, self.digits + 1, need_big=True)
            else:
                start, steps, value = self._chain(rng, self.digits, need_big=False)
                if self._split_of(start, steps) != split:
                    continue
            out.append({"prompt": self._render(rng, start, steps), "answer": value,
                        "start": start, "steps": steps})
        return out

    # -- solver, verifier, corpus -------------------------------------------------------------
    @staticmethod
    def solve(problem):
        value, parts = problem["start"], []
        for op, b in problem["steps"]:
            new = value + b if op == "+" else value - b
            parts.append(f"{value}{op}{b}={new}.")
            value = new
        return " ".join(parts) + f" Answer: {value}"

    def demonstration(self, problem):
        """The SFT target: the worked solution, or for a direct_frac share of problems (fixed per
        problem by a hash) the bare final answer."""
        key = f"direct-{problem['start']}" + "".join(f"{op}{b}" for op, b in problem["steps"])
        if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 10000 < self.direct_frac * 10000:
            return f"Answer: {problem['answer']}"
        return self.solve(problem)

    @staticmethod
    def shows_work(response):
        """True when the response writes at least one equation before its answer."""
        return "=" in response.split("Answer:", 1)[0]

    @staticmethod
    def verify(problem, response):
        return 1.0 if parse_answer(response) == problem["answer"] else 0.0

    def step_rewards(self, problem, response):
        """Process signals [SPEC §3 Process vs outcome]: [(character offset just after the step, reward)]
        per verifiable step. Every written equation "a+b=c." is one: 1 when it is step i of the worked
        solution (the right value so far, the problem's operation, the right result), else 0; the
        answer scores the verifier's reward at the end of the response."""
        expected = self.solve(problem).split(" Answer:")[0].split(" ")
        steps = [(m.end(), 1.0 if i < len(expected) and m.group(0) == expected[i] else 0.0)
                 for i, m in enumerate(_EQUATION.finditer(response))]
        return steps + [(len(response), self.verify(problem, response))]

    def corpus(self, n, seed=0):
        """Pre-training text: worked equation chains from the train split, without the Q/A template."""
        return [self.solve(p).rsplit(" Answer:", 1)[0] for p in self.problems("train", n, seed)]



# ----------------------------------------------------------------------------------------------
# GeneralPoints [Ch7 Exp 7-11, SPEC §4]: four cards, reach the target (24) with + - * / and
# parentheses, each card exactly once. The rule variant of Chu et al. 2025 ("SFT memorises, RL
# generalises"): J, Q, K count as 10 in "train" / "heldout" and as 11, 12, 13 in "ood".

FACES = ["A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K"]
FACE_RULES = {"tens": {"J": 10, "Q": 10, "K": 10}, "ranks": {"J": 11, "Q": 12, "K": 13}}
SPLIT_RULE = {"train": "tens", "heldout": "tens", "ood": "ranks"}
RULE_TEXT = {"tens": "J,Q,K=10", "ranks": "J=11,Q=12,K=13"}
OOD_PERCENT = 20  # hands (by hash) after the held-out ones reserved for the OOD split

# Operator precedence of a rendered expression's top level: a bare number binds tightest.
NUMBER, PRODUCT, SUM = 3, 2, 1


def card_value(face, rule):
    """A card's number: A = 1, 2..10 as written, J/Q/K by the rule ("tens" or "ranks")."""
    return FACE_RULES[rule].get(face) or (1 if face == "A" else int(face))


def _operations(a, b):
    """(value, symbol, swapped) of a+b, a-b, b-a, a*b, a/b, b/a (no division by zero)."""
    yield a + b, "+", False
    yield a - b, "-", False
    yield b - a, "-", True
    yield a * b, "*", False
    if b:
        yield a / b, "/", False
    if a:
        yield b / a, "/", True


def _render(symbol, left, right):
    """(text, precedence) of `left symbol right`, each side a (text, precedence), with the fewest
    parentheses that keep the value: around a sum on either side of * and on the left of /, around
    a sum on the right of -, around anything but a number on the right of / (a-(b-c) ≠ a-b-c,
    a/(b*c) ≠ a/b*c)."""
    (tl, pl), (tr, pr) = left, right
    wrap = lambda text, prec, need: f"({text})" if prec < need else text
    if symbol == "+":
        return f"{tl}+{tr}", SUM
    if symbol == "-":
        return f"{tl}-{wrap(tr, pr, PRODUCT)}", SUM
    if symbol == "*":
        return f"{wrap(tl, pl, PRODUCT)}*{wrap(tr, pr, PRODUCT)}", PRODUCT
    return f"{wrap(tl, pl, PRODUCT)}/{wrap(tr, pr, NUMBER)}", PRODUCT


def _partners(a, target):
    """Every b for which one of a op b, b op a can equal target (> 0): the six equations solved for b."""
    found = {target - a, a - target, target + a, target * a, a / target}
    return found | {target / a} if a else found


def _combine(a_table, b_table, target=None):
    """All (value, text, precedence) of a op b and b op a for a, b of two expression tables
    ({value: {(text, precedence)}}). With a target only those equal to it, found by solving for b
    rather than trying every b: what makes the solver fast."""
    for a, a_texts in a_table.items():
        for b in b_table.keys() if target is None else _partners(a, target) & b_table.keys():
            for value, symbol, swapped in _operations(a, b):
                if target is None or value == target:
                    for x in a_texts:
                        for y in b_table[b]:
                            yield (value, *_render(symbol, *((y, x) if swapped else (x, y))))


def _splits(values):
    """The distinct ways to cut a sorted tuple into two non-empty parts, each cut once."""
    n, seen = len(values), set()
    for bits in range(1, 2 ** n - 1, 2):  # the first value always on the left: each cut once
        left = tuple(v for i, v in enumerate(values) if bits >> i & 1)
        right = tuple(v for i, v in enumerate(values) if not bits >> i & 1)
        if (left, right) not in seen:
            seen.add((left, right))
            yield left, right


@functools.lru_cache(maxsize=None)
def _expressions(values):
    """Every value reachable from a sorted tuple of at most 3 numbers, each used once -> {Fraction:
    {(text, precedence)}}. Cached: the 455 small tuples are shared by all hands."""
    if len(values) == 1:
        return {Fraction(values[0]): {(str(values[0]), NUMBER)}}
    table = {}
    for left, right in _splits(values):
        for value, text, prec in _combine(_expressions(left), _expressions(right)):
            table.setdefault(value, set()).add((text, prec))
    return table


@functools.lru_cache(maxsize=None)
def solutions(values, target=24):
    """All expressions (sorted, shortest first) that make `target` from the numbers `values`
    (a tuple), each used once, in exact rational arithmetic. Different bracketings of the same
    sum can coincide as text; a+b and b+a are both listed only when different splits give them."""
    found = set()
    for left, right in _splits(tuple(sorted(values))):
        small, large = sorted((_expressions(left), _expressions(right)), key=len)
        found.update(text for _, text, _ in _combine(small, large, Fraction(target)))
    return tuple(sorted(found, key=lambda t: (len(t), t)))


_EXPRESSION = re.compile(r"[0-9+\-*/() ]{1,80}")  # what may follow "Answer: " at all


def evaluate_expression(text, steps=None):
    """(value as a Fraction, the numbers used) of an arithmetic expression, or None when it is not
    one: parsed with ast, only non-negative integer literals, + - * / and parentheses (no names,
    calls, attributes, unary minus, ** or //). Division is exact; by zero -> None. `steps`, a list,
    collects the worked line "a op b=c" of each operation, innermost first."""
    text = text.replace("×", "*").replace("÷", "/").replace("−", "-")
    if not _EXPRESSION.fullmatch(text):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    numbers = []
    ops = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub),
           ast.Mult: ("*", operator.mul), ast.Div: ("/", operator.truediv)}

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = value(node.left), value(node.right)
            symbol, fn = ops[type(node.op)]
            if a is None or b is None or (symbol == "/" and b == 0):
                return None
            if steps is not None:  # a fraction operand in brackets: 8/(1/3), not 8/1/3
                show = lambda x: str(x) if x.denominator == 1 else f"({x})"
                steps.append(f"{show(a)}{symbol}{show(b)}={fn(a, b)}")
            return fn(a, b)
        return None  # names, calls, attributes, unary operators, other operators

    result = value(tree)
    return None if result is None else (result, numbers)


def _has_fractions(text):
    """Whether an expression passes through a non-integer (harder to write out step by step)."""
    steps = []
    evaluate_expression(text, steps)
    return any("/" in step.split("=")[1] for step in steps)


@functools.lru_cache(maxsize=None)
def easiest_solution(values, target=24):
    """The solution a demonstration shows (no fraction on the way if possible, then the shortest),
    or None for an unsolvable hand."""
    found = solutions(values, target)
    return min(found, key=lambda text: (_has_fractions(text), len(text), text)) if found else None


class GeneralPoints:
    name = "generalpoints"

    def __init__(self, target=24, direct_frac=0.0, digits=1, n_ops=3):
        # train.py passes every env the arithmetic knobs; here only their defaults make sense
        if (digits, n_ops) != (1, 3):
            raise ValueError("env_digits and env_ops set the arithmetic task; generalpoints always deals four cards")
        if not 0.0 <= direct_frac <= 1.0:
            raise ValueError(f"direct_frac must be in [0, 1], got {direct_frac}")
        if target < 1:
            raise ValueError(f"target must be a positive integer, got {target}")
        self.target, self.direct_frac = target, direct_frac

    # -- problems ---------------------------------------------------------------------------
    @staticmethod
    def _split_of(cards):
        """Splits are disjoint by hand: a hash of the sorted faces picks held-out, OOD or train.
        OOD keeps only hands with a face card, where the rule changes the values."""
        bucket = int(hashlib.sha1(" ".join(cards).encode()).hexdigest(), 16) % 100
        if bucket < HELDOUT_PERCENT:
            return "heldout"
        if bucket < HELDOUT_PERCENT + OOD_PERCENT:
            return "ood" if any(c in "JQK" for c in cards) else None
        return "train"

    def problems(self, split, n, seed=0):
        """n solvable hands of `split` ("train", "heldout" or "ood"), dealt with repetition."""
        if split not in SPLIT_RULE:
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rule = SPLIT_RULE[split]
        rng = random.Random(f"{self.name}-{split}-{seed}")
        out = []
        while len(out) < n:
            cards = sorted(rng.choices(FACES, k=4), key=FACES.index)
            if self._split_of(cards) != split:
                continue
            values = [card_value(c, rule) for c in cards]
            answer = easiest_solution(tuple(values), self.target)
            if answer is None:
                continue
            prompt = f"Cards {' '.join(cards)} ({RULE_TEXT[rule]}): make {self.target} with +-*/ using each card once."
            out.append({"prompt": prompt, "cards": cards, "values": values, "target": self.target,
                        "answer": answer})
        return out

    # -- solver, verifier, corpus -------------------------------------------------------------
    @staticmethod
    def solve(problem):
        """The first solver solution as a worked line: "8/8=1 7-1=6 6*4=24. Answer: (7-8/8)*4"."""
        steps = []
        evaluate_expression(problem["answer"], steps)
        return " ".join(steps) + f". Answer: {problem['answer']}"

    def demonstration(self, problem):
        """The SFT target: the worked solution, or for a direct_frac share of hands (fixed by a
        hash) the bare answer."""
        key = "direct-" + " ".join(problem["cards"])
        if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 10000 < self.direct_frac * 10000:
            return f"Answer: {problem['answer']}"
        return self.solve(problem)

    shows_work = staticmethod(Arithmetic.shows_work)  # the same rule: a "=" before the answer

    @staticmethod
    def verify(problem, response):
        """1.0 only for exactly one "Answer: <expression>" at the end, the expression using each
        card's value exactly once (as a multiset) and equal to the target in exact arithmetic."""
        if response.count("Answer:") != 1:
            return 0.0
        parsed = evaluate_expression(response.split("Answer:", 1)[1])
        if parsed is None:
            return 0.0
        value, numbers = parsed
        return 1.0 if sorted(numbers) == sorted(problem["values"]) and value == problem["target"] else 0.0

    def corpus(self, n, seed=0):
        """Pre-training text: worked solutions of train hands, without the answer line."""
        return [self.solve(p).rsplit(". Answer:", 1)[0] for p in self.problems("train", n, seed)]



# ----------------------------------------------------------------------------------------------
# The calculator tool [SPEC §4 multi-turn tool environment]: what a model's call runs. It never
# runs code: the text is checked against a character whitelist, parsed with ast, and only numbers,
# + - * /, ** and unary minus are evaluated, in exact rational arithmetic, under bounds that make
# every answer quick. Anything else gets a short error string back, which the model reads.

CALC_MAX_CHARS = 64           # longer input: an error before any parsing
CALC_MAX_DEPTH = 12           # nesting of the parsed tree (brackets, chained operators)
CALC_MAX_EXPONENT = 16        # |exponent| of **, an integer
CALC_MAX_MAGNITUDE = 10 ** 12  # |value| of every number, intermediate or final
_CALC_CHARS = re.compile(r"[0-9.+\-*/() ]*")  # no letters, quotes, brackets, commas, colons: no names, calls, lambdas
_CALC_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class CalculatorError(ValueError):
    pass


def _calc_value(node, depth=0):
    """The exact value (a Fraction) of a parsed node, or CalculatorError."""
    if depth > CALC_MAX_DEPTH:
        raise CalculatorError("too deeply nested")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(str(node.value))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = -_calc_value(node.operand, depth + 1)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _calc_value(node.left, depth + 1), _calc_value(node.right, depth + 1)
        if exponent.denominator != 1 or abs(exponent) > CALC_MAX_EXPONENT:
            raise CalculatorError(f"exponent must be an integer up to {CALC_MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise CalculatorError("division by zero")
        value = base ** int(exponent)  # bounded: |base| <= 1e12, |exponent| <= 16
    elif isinstance(node, ast.BinOp) and type(node.op) in _CALC_OPS:
        a, b = _calc_value(node.left, depth + 1), _calc_value(node.right, depth + 1)
        if isinstance(node.op, ast.Div) and b == 0:
            raise CalculatorError("division by zero")
        value = _CALC_OPS[type(node.op)](a, b)
    else:
        raise CalculatorError("only numbers, + - * / ** and parentheses")
    if abs(value) > CALC_MAX_MAGNITUDE:
        raise CalculatorError("number too large")
    return value


def calculator(expr: str) -> str:
    """The tool: an arithmetic expression -> its value as text ("9716", "2.5", "0.333333"), or
    "error: ..." for anything else (names, attributes, calls, lambdas, too long, too deep, too large,
    division by zero). Safe by construction: a whitelist, ast.parse of at most 64 characters, and an
    evaluator that knows five operators."""
    expr = expr.replace("×", "*").replace("÷", "/").replace("−", "-")
    if len(expr) > CALC_MAX_CHARS:
        return f"error: longer than {CALC_MAX_CHARS} characters"
    if not _CALC_CHARS.fullmatch(expr):
        return "error: only numbers, + - * / ** and parentheses"
    try:
        value = _calc_value(ast.parse(expr.strip(), mode="eval").body)
    except CalculatorError as e:
        return f"error: {e}"
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return "error: not an expression"
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


# ----------------------------------------------------------------------------------------------
# Calculator (--env=calculator): multi-step arithmetic with a 3-digit × 2-digit product and then
# 2-digit additions and subtractions ("What is 347*28+51-86?"), numbers the tiny model cannot
# multiply in its head; the reliable path is one tool call per step. The call and result tags are
# the tokenizer's chat specials; the sampler runs a call when a row writes the closing call tag and
# feeds the result back as forced tokens (common.tool_hook), which no loss trains on.
#
#   <|tool_call|>347*28<|/tool_call|><|tool_result|>9716<|/tool_result|><|tool_call|>9716+51 ...  Answer: 9681
#
# Rewards: verify (the outcome); step_rewards (process: each call that computes the next step of
# the problem, and the answer); path_signals (RLVP's rule engine, below).

TOOL_CALL, END_CALL, TOOL_RESULT, END_RESULT = "<|tool_call|>", "<|/tool_call|>", "<|tool_result|>", "<|/tool_result|>"
_CALL = re.compile(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(END_CALL)
                   + r"(?:" + re.escape(TOOL_RESULT) + r"(.*?)" + re.escape(END_RESULT) + r")?", re.S)
_BINARY_OP = re.compile(r"(?<=[0-9.)])\s*(?:\*\*|[-+*/×÷−])")  # an operator after an operand: not a unary minus


def tool_calls(response):
    """[(expression, result or None, character offset just after the call's closing tag)] in order."""
    return [(m.group(1), m.group(2), m.start() + len(TOOL_CALL) + len(m.group(1)) + len(END_CALL))
            for m in _CALL.finditer(response)]


def answer_span(response):
    """(the parsed answer, offset just after it) or None: parse_answer's strict form."""
    m = _ANSWER.search(response) if response.count("Answer:") == 1 else None
    return (int(m.group(1)), m.end(1)) if m else None


class Calculator:
    name = "calculator"

    @staticmethod
    def tool(call, prompt, earlier):
        """What common.tool_hook runs for every call a row writes: the calculator, which needs
        neither the prompt nor the earlier calls."""
        return calculator(call)

    def __init__(self, digits=1, n_ops=3, direct_frac=0.0):
        # train.py passes every env the arithmetic knobs; n_ops is the number of steps here
        if digits != 1:
            raise ValueError("env_digits sets the arithmetic task; calculator operands are fixed (a 3-digit start, "
                             "2-digit operands)")
        if n_ops < 1 or not 0.0 <= direct_frac <= 1.0:
            raise ValueError(f"need n_ops (the number of steps) >= 1 and direct_frac in [0, 1], got {n_ops}, {direct_frac}")
        self.n_ops, self.direct_frac = n_ops, direct_frac

    # -- problems ---------------------------------------------------------------------------
    def problems(self, split, n, seed=0):
        """n problems of `split`: a 3-digit start times a 2-digit number, then n_ops − 1 additions or
        subtractions of 2-digit numbers (the value never goes below 0); "ood" has one step more.
        Train and held-out are disjoint by equation."""
        if split not in ("train", "heldout", "ood"):
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        out = []
        while len(out) < n:
            start = rng.randint(100, 999)
            steps = [("*", rng.randint(10, 99))]
            steps += [(rng.choice("+-"), rng.randint(10, 99)) for _ in range(self.n_ops - 1 + (split == "ood"))]
            if split != "ood" and Arithmetic._split_of(start, steps) != split:
                continue
            values = self.values(start, steps)
            out.append({"prompt": "What is " + str(start) + "".join(f"{op}{b}" for op, b in steps) + "?",
                        "answer": values[-1], "start": start, "steps": steps})
        return out

    @staticmethod
    def values(start, steps):
        """The value before the first step and after each one."""
        values = [start]
        for op, b in steps:
            values.append(values[-1] * b if op == "*" else values[-1] + b if op == "+" else values[-1] - b)
        return values

    # -- solver, verifier, signals ------------------------------------------------------------
    def solve(self, problem):
        """One call per step, each result copied into the next call, then the answer."""
        values = self.values(problem["start"], problem["steps"])
        calls = [f"{TOOL_CALL}{a}{op}{b}{END_CALL}{TOOL_RESULT}{calculator(f'{a}{op}{b}')}{END_RESULT}"
                 for a, (op, b) in zip(values, problem["steps"])]
        return "".join(calls) + f"Answer: {values[-1]}"

    # The SFT target, Arithmetic's rule: the tool-using solution, or for a direct_frac share of problems
    # (fixed by a hash) the bare answer, the corner RLVP's rule engine penalises (an answer no tool
    # computed). SFT masks the results it holds (tokenizer.assistant_ids).
    demonstration = Arithmetic.demonstration

    @staticmethod
    def shows_work(response):
        """True when the response calls the tool before its answer."""
        return TOOL_CALL in response.split("Answer:", 1)[0]

    verify = staticmethod(Arithmetic.verify)  # exactly one "Answer: <integer>" at the end, equal to the answer

    def step_rewards(self, problem, response):
        """Process signals [SPEC §3 Process vs outcome]: [(character offset just after the step, reward)]
        per verifiable step: the i-th call scores 1 when it computes step i of the problem ("a op b" with a
        the right value so far: the previous result copied correctly), else 0; the answer scores the
        verifier's reward at the end of the response."""
        values = self.values(problem["start"], problem["steps"])
        expected = [f"{a}{op}{b}" for a, (op, b) in zip(values, problem["steps"])]
        steps = [(end, 1.0 if i < len(expected) and expr.replace(" ", "") == expected[i] else 0.0)
                 for i, (expr, _, end) in enumerate(tool_calls(response))]
        return steps + [(len(response), self.verify(problem, response))]

    def path_signals(self, problem, response):
        """RLVP's rule engine [SPEC §3 RLVP, §4]: [(character offset just after the action, ±1)], −1 for
        each machine-detectable bad action and +1 for its paired compliant one (the algorithm weighs
        them: −λ and +μ):
          a call       several operations in one call (a shortcut: the whole problem at once) −λ;
                       one operation that computes the next step of the problem +μ (progress);
          the answer   a number no tool call returned (answered from the head) −λ;
                       the last call's result +μ.
        Both constraints are outcome-neutral: verify accepts a right answer however it was reached.
        Nothing is penalised for being absent (no "no progress" penalty): a response that does
        nothing gets no signal at all."""
        values = self.values(problem["start"], problem["steps"])
        calls, signals, step = tool_calls(response), [], 0
        for expr, _, end in calls:
            if len(_BINARY_OP.findall(expr)) > 1:
                signals.append((end, -1.0))
            elif step < len(problem["steps"]) and expr.replace(" ", "") == "{}{}{}".format(values[step], *problem["steps"][step]):
                signals.append((end, 1.0))
                step += 1
        answer = answer_span(response)
        if answer is not None:
            results = [result for _, result, _ in calls]
            if calls and results[-1] == str(answer[0]):
                signals.append((answer[1], 1.0))
            elif str(answer[0]) not in results:
                signals.append((answer[1], -1.0))
        return signals

    def corpus(self, n, seed=0):
        """Pre-training text: tool-using solutions of train problems."""
        return [self.solve(p) for p in self.problems("train", n, seed)]



# ----------------------------------------------------------------------------------------------
# The treasure hunt [SPEC §3 Q-learning, §4; Ch7 Exp 7-1]: qlearn.py's tabular agent and the
# language-model agent (--env=treasure, below) play this one game. Six rooms, named by their role:
# a red key lies in the hall, a sword in the armory; the red door from the armory opens the forge,
# where ore lies and the sword can be crafted into a great sword. Only the great sword beats the
# guardian of the lair (fighting it with less is death: the game ends with reward 0); the beaten
# guardian drops the blue key of the vault, whose chest is the treasure: reward 1 for opening it,
# 0 for everything else. The library is a dead end.
#
#     hall ── armory ══red door══ forge
#      │  ╲                         │
#   library  ╲──── lair ────────────┘
#                   ║ blue door
#                 vault (chest)
#
# The shortest win is 11 actions (take, go armory, take, go forge, take, craft, go lair, fight,
# take, go vault, open chest); shortest_solution proves it by breadth-first search. Text in, text
# out: `names` maps each role to the name the player reads and writes ("go crypt"); without it a
# room is called by its role.

ROOMS = ("hall", "armory", "library", "forge", "lair", "vault")
EXITS = {"hall": ("armory", "library", "lair"), "armory": ("hall", "forge"), "library": ("hall",),
         "forge": ("armory", "lair"), "lair": ("hall", "forge", "vault"), "vault": ("lair",)}
DOORS = {frozenset(("armory", "forge")): "red_key", frozenset(("lair", "vault")): "blue_key"}  # key needed
ROOM_ITEMS = {"hall": "red_key", "armory": "sword", "forge": "ore"}  # the lair's blue key appears when the guardian falls
WEAPONS = ("no weapon", "a sword", "a great sword")
BY_ROLE = {room: room for room in ROOMS}

# A state is immutable and hashable (a Q-table key): where the player is, what it carries, what is done.
State = collections.namedtuple("State", "room red_key weapon ore guardian_down blue_key")
START = State(room="hall", red_key=False, weapon=0, ore=False, guardian_down=False, blue_key=False)


def actions(names=BY_ROLE):
    """The commands a player may write."""
    return tuple(f"go {names[room]}" for room in ROOMS) + ("take", "craft", "fight", "open chest")


def item_here(state):
    """The item lying in the player's room, or None (taken items are in the inventory)."""
    if state.room == "lair":
        return "blue_key" if state.guardian_down and not state.blue_key else None
    item = ROOM_ITEMS.get(state.room)
    taken = {None: True, "red_key": state.red_key, "sword": state.weapon > 0, "ore": state.ore or state.weapon == 2}
    return None if taken[item] else item


def describe(state, names=BY_ROLE):
    """The observation a player reads on entering a room: its name and what is in it ("lair: guardian")."""
    things = [item_here(state)] + [state.room == "lair" and not state.guardian_down and "guardian",
                                   state.room == "vault" and "chest"]
    return f"{names[state.room]}: " + (", ".join(t.replace("_", " ") for t in things if t) or "nothing")


def step(state, action, names=BY_ROLE):
    """(next state, reward, done, observation text). An action that cannot be done here changes
    nothing (the turn is spent); fighting the guardian without the great sword ends the game."""
    if action.startswith("go "):
        room = {name: role for role, name in names.items()}.get(action[3:])
        if room not in EXITS[state.room]:
            return state, 0.0, False, f"cannot go to {action[3:]} from here"
        key = DOORS.get(frozenset((state.room, room)))
        if key and not getattr(state, key):
            return state, 0.0, False, f"locked: needs the {key.replace('_', ' ')}"
        state = state._replace(room=room)
        return state, 0.0, False, describe(state, names)
    if action == "take":
        item = item_here(state)
        if item is None:
            return state, 0.0, False, "nothing to take"
        state = state._replace(weapon=1) if item == "sword" else state._replace(**{item: True})
        return state, 0.0, False, f"took {item.replace('_', ' ')}"
    if action == "craft":
        if state.room != "forge" or state.weapon != 1 or not state.ore:
            return state, 0.0, False, "crafting needs the sword and ore at the forge"
        return state._replace(weapon=2, ore=False), 0.0, False, "forged a great sword"
    if action == "fight":
        if state.room != "lair" or state.guardian_down:
            return state, 0.0, False, "nothing to fight"
        if state.weapon < 2:
            return state, 0.0, True, f"you fight with {WEAPONS[state.weapon]} and fall. Game over"
        state = state._replace(guardian_down=True)
        return state, 0.0, False, "guardian beaten. " + describe(state, names)
    if action == "open chest":
        if state.room != "vault":
            return state, 0.0, False, "no chest here"
        return state, 1.0, True, "chest open: you win"
    raise ValueError(f"unknown action {action!r}; choose from {actions(names)}")


def shortest_solution(start=START, names=BY_ROLE):
    """The shortest winning action sequence, by breadth-first search over every reachable state
    (so its length is the optimum: no shorter win exists)."""
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        state = queue.popleft()
        for action in actions(names):
            nxt, reward, done, _ = step(state, action, names)
            if reward > 0:  # the first win found by BFS is a shortest one
                path = [action]
                while parent[state] is not None:
                    state, previous_action = parent[state]
                    path.append(previous_action)
                return path[::-1]
            if not done and nxt not in parent:
                parent[nxt] = (state, action)
                queue.append(nxt)
    return None



# ----------------------------------------------------------------------------------------------
# Treasure (--env=treasure): the treasure hunt as a multi-turn game for the language model, played
# through the tool machinery. The prompt is the map; each action is a call, and the game's
# observation comes back as its result (forced tokens, never trained on); the response ends after
# the chest opens:
#
#   <|tool_call|>take<|/tool_call|><|tool_result|>took red key<|/tool_result|><|tool_call|>go arsenal<|/tool_call|>
#   <|tool_result|>arsenal: sword<|/tool_result|> ... <|tool_call|>open chest<|/tool_call|><|tool_result|>chest open: you win<|/tool_result|>
#
# No game state is kept anywhere: each call replays the response's earlier calls from the start the
# prompt's map describes (Treasure.tool, given the prompt and the earlier calls by common.tool_hook),
# so rows pause and resume independently and a transcript alone determines its episode.
#
# What varies is the rooms' names. Each role has three (ROOM_NAMES), 3^6 = 729 maps; "train" and
# "heldout" are disjoint by map (a hash holds out 10%), so a held-out map is a combination of names
# never trained on. "ood" names every room from another role's three (the sword in the "crypt"), so
# only reading the map, not a name's usual role, wins there. The map's shape and the items' places,
# and so the shape of the plan, are the same in every problem.

ROOM_NAMES = {"hall": ("hall", "yard", "porch"), "armory": ("armory", "arsenal", "barracks"),
              "library": ("library", "study", "attic"), "forge": ("forge", "smelter", "smithy"),
              "lair": ("lair", "den", "cave"), "vault": ("vault", "crypt", "cellar")}
MAP_TEXT = ("Paths: {hall}-{armory}, {hall}-{library}, {hall}-{lair}, {armory}-{forge} (red door), {forge}-{lair}, "
            "{lair}-{vault} (blue door). {hall}: red key. {armory}: sword. {forge}: ore. {lair}: guardian. "
            "{vault}: chest. You are in the {hall}.")


def _map_pattern(text):
    """A regex that reads the names back out of a map written from `text`: each role's first place
    captures its name, the later ones must repeat it."""
    pattern, seen = "", set()
    for literal, role, _, _ in string.Formatter().parse(text):
        pattern += re.escape(literal)
        if role:
            pattern += f"(?P={role})" if role in seen else f"(?P<{role}>[a-z]+)"
            seen.add(role)
    return re.compile(pattern)


_MAP = _map_pattern(MAP_TEXT)


@functools.lru_cache(maxsize=None)
def actions_to_win(state):
    """The fewest actions that still win from `state` (BFS over the game; rooms by role, so one table
    serves every map); None once no win is reachable."""
    path = shortest_solution(start=state)
    return None if path is None else len(path)


@functools.lru_cache(maxsize=None)
def optimal_episode(names):
    """[(action, observation)] of the shortest win (BFS), rooms called by `names` (a tuple in ROOMS
    order); cached: a map's solution is searched once."""
    names, state, out = dict(zip(ROOMS, names)), START, []
    for action in shortest_solution(names=names):
        state, _, _, observation = step(state, action, names)
        out.append((action, observation))
    return tuple(out)


class Treasure:
    name = "treasure"
    # train.py's defaults under --env=treasure (the command line still overrides them): a map of about
    # 200 tokens and the 11-call win with its observations, about 270 (538 at most, with the longest
    # names); every demonstration plays, there is no bare answer to mix in
    train_defaults = dict(block_size=576, max_new_tokens=320, max_tool_calls=16, env_direct_frac=0.0)

    def __init__(self, digits=1, n_ops=3, direct_frac=0.0):
        # train.py passes every env the arithmetic knobs; the treasure hunt has no use for them
        if (digits, n_ops, direct_frac) != (1, 3, 0.0):
            raise ValueError("env_digits, env_ops and env_direct_frac set the arithmetic task; the treasure hunt "
                             "has one map shape, and a bare answer is no way to play it")

    # -- problems ---------------------------------------------------------------------------
    @staticmethod
    def _split_of(names):
        key = " ".join(names[room] for room in ROOMS)
        return "heldout" if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT else "train"

    def problems(self, split, n, seed=0):
        """n maps of `split`: "train" / "heldout" (each role named from its own three, disjoint by
        map) or "ood" (each role named from another role's three)."""
        if split not in ("train", "heldout", "ood"):
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        everything = sorted(name for names in ROOM_NAMES.values() for name in names)
        out = []
        while len(out) < n:
            if split == "ood":
                names = dict(zip(ROOMS, rng.sample(everything, len(ROOMS))))
                if any(names[room] in ROOM_NAMES[room] for room in ROOMS):
                    continue
            else:
                names = {room: rng.choice(ROOM_NAMES[room]) for room in ROOMS}
                if self._split_of(names) != split:
                    continue
            plan = [action for action, _ in optimal_episode(tuple(names[room] for room in ROOMS))]
            out.append({"prompt": MAP_TEXT.format(**names), "names": names, "answer": ", ".join(plan)})
        return out

    # -- the game as a tool, solver, verifier -------------------------------------------------
    @staticmethod
    def _act(state, done, call, names):
        """(state, done, observation, reward) of one call: an action, or an error that spends the turn."""
        call = call.strip()
        if done:
            return state, True, "error: the game is over", 0.0
        if call not in actions(names) and not call.startswith("go "):  # (a room not on the map: step says so)
            return state, False, "error: write go ROOM, take, craft, fight or open chest", 0.0
        state, reward, done, observation = step(state, call, names)
        return state, done, observation, reward

    def tool(self, call, prompt, earlier):
        """The observation for `call`: the map read from the prompt, the earlier calls replayed from
        the start (common.tool_hook gives all three, each row's own)."""
        found = _MAP.search(prompt)
        if found is None:
            return "error: no map in the prompt"
        names, state, done = found.groupdict(), START, False
        for previous in earlier:
            state, done, _, _ = self._act(state, done, previous, names)
        return self._act(state, done, call, names)[2]

    @staticmethod
    def solve(problem):
        """The optimal play (BFS): every action of shortest_solution as a call with its observation."""
        episode = optimal_episode(tuple(problem["names"][room] for room in ROOMS))
        return "".join(f"{TOOL_CALL}{action}{END_CALL}{TOOL_RESULT}{observation}{END_RESULT}"
                       for action, observation in episode)

    def demonstration(self, problem):
        """The SFT target: the optimal play."""
        return self.solve(problem)

    @staticmethod
    def shows_work(response):
        """True when the response plays (writes a call)."""
        return TOOL_CALL in response

    def verify(self, problem, response):
        """1.0 when the calls, replayed from the start, open the chest, and every result up to that call
        is the one the game gives: a call the sampler refused (past max_tool_calls) or a result the
        model wrote itself never counts. The response may end there or go on; nothing after counts."""
        names, state, done = problem["names"], START, False
        for call, result, _ in tool_calls(response):
            state, done, observation, reward = self._act(state, done, call, names)
            if result != observation:
                return 0.0
            if reward > 0:
                return 1.0
        return 0.0

    # -- the rule engine: step rewards (process) and path signals (RLVP) ---------------------------
    def judge_calls(self, problem, response):
        """[(character offset just after the call, +1, 0 or −1)] for every call, the calls replayed
        from the start (SPEC §3 RLVP, Process vs outcome; each judgement is a fact of the game):
          +1 progress: an action the game accepts that brings the chest one action nearer (the fewest
             actions left to win, by BFS, falls by one): taking the red key, the sword, the ore or the
             blue key, crafting, beating the guardian, each room toward the next goal (through a door
             once its key is held), opening the chest;
          −1 a refused action (the game answers "cannot go", "locked", "nothing to take", an error,
             or a call after the game ended), a result that is not the game's (a call past
             max_tool_calls), a wasted action (back to a state already visited in this episode: a
             loop), and the fatal fight without the great sword;
           0 anything else: an accepted action into a new state that is no nearer (the dead-end
             library). No call, no judgement: absence of progress is never penalised."""
        names, state, done, seen, out = problem["names"], START, False, {START}, []
        for call, result, end in tool_calls(response):
            after, done_after, observation, reward = self._act(state, done, call, names)
            if result != observation or after == state and not done_after or done_after and reward == 0 or done:
                sign = -1.0  # refused, not the game's result, fatal, or after the end (the state is kept)
            elif reward > 0:
                sign = 1.0  # the chest
            elif after in seen:
                sign = -1.0  # a loop: wasted, even where it undoes a detour
            else:
                sign = 1.0 if actions_to_win(after) == actions_to_win(state) - 1 else 0.0
            if result == observation:
                state, done = after, done_after
                seen.add(state)
            out.append((end, sign))
        return out

    def step_rewards(self, problem, response):
        """Process rewards (V-IRL's shape): each call's judgement (+1 progress, −1 refused, wasted or
        fatal, 0 otherwise), and the verifier's reward at the end of the response."""
        return self.judge_calls(problem, response) + [(len(response), self.verify(problem, response))]

    def path_signals(self, problem, response):
        """RLVP's rule engine: the calls judged +1 (verifiable progress, paired with the penalty of
        its opposite) or −1 (a machine-detectable bad action); the algorithm weighs them +μ / −λ."""
        return [(end, sign) for end, sign in self.judge_calls(problem, response) if sign != 0]

    def corpus(self, n, seed=0):
        """Pre-training text: optimal plays of train maps."""
        return [self.solve(p) for p in self.problems("train", n, seed)]


ENVS = {"arithmetic": Arithmetic, "generalpoints": GeneralPoints,
        "calculator": Calculator, "treasure": Treasure}


def make_env(name="arithmetic", **kwargs):
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; choose from {sorted(ENVS)}")
    return ENVS[name](**kwargs)
