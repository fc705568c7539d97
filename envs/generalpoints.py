"""GeneralPoints: four cards, reach the target with + - * / and parentheses."""

import ast
import functools
import hashlib
import itertools
import operator
import random
import re
from fractions import Fraction

from envs.arithmetic import HELDOUT_PERCENT, Arithmetic

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

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def census(split, target=24):
        """Every solvable hand of `split` once, as sorted faces, in the order of
        itertools.combinations_with_replacement over FACES: 119 held-out hands and 182 OOD hands at
        target 24 (train: 852). Each distinct hand counts once, however often four cards dealt with
        replacement would give it."""
        rule = SPLIT_RULE[split]
        return tuple(cards for cards in itertools.combinations_with_replacement(FACES, 4)
                     if GeneralPoints._split_of(cards) == split
                     and easiest_solution(tuple(card_value(c, rule) for c in cards), target) is not None)

    def problems(self, split, n, seed=0):
        """n solvable hands of `split` ("train", "heldout" or "ood").
        "heldout" and "ood" are small, so an evaluation is a census: the split's hands (`census`) in a
        seeded shuffle, the first n of them; n at least the split's size gives every hand once, and
        no hand ever counts twice. "train" deals four cards with replacement and keeps the hands of
        its split: a hand may recur, and hands with four different faces come up more often than
        pairs (what the training run sees; seeded, so the same seed deals the same hands)."""
        if split not in SPLIT_RULE:
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        if split != "train":
            hands = list(self.census(split, self.target))
            rng.shuffle(hands)
            return [self._problem(cards, split) for cards in hands[:n]]
        out = []
        while len(out) < n:
            cards = sorted(rng.choices(FACES, k=4), key=FACES.index)
            if self._split_of(cards) == split and easiest_solution(
                    tuple(card_value(c, SPLIT_RULE[split]) for c in cards), self.target) is not None:
                out.append(self._problem(cards, split))
        return out

    def _problem(self, cards, split):
        """The problem of a solvable hand (its faces in FACES order) under its split's rule."""
        rule = SPLIT_RULE[split]
        values = [card_value(c, rule) for c in cards]
        prompt = f"Cards {' '.join(cards)} ({RULE_TEXT[rule]}): make {self.target} with +-*/ using each card once."
        return {"prompt": prompt, "cards": list(cards), "values": values, "target": self.target,
                "answer": easiest_solution(tuple(values), self.target)}

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

    @staticmethod
    def parses(response):
        """True when the response ends in exactly one "Answer: <expression>" that evaluates."""
        return response.count("Answer:") == 1 and evaluate_expression(response.split("Answer:", 1)[1]) is not None

    def corpus(self, n, seed=0):
        """Pre-training text: worked solutions of train hands, without the answer line."""
        return [self.solve(p).rsplit(". Answer:", 1)[0] for p in self.problems("train", n, seed)]
