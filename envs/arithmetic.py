"""
Arithmetic, the default task: chains of additions and subtractions, written as symbols
("What is 7 + 8 - 3 + 5?") or as a short word problem ("Ann had 7 apples, got 8, gave away 3, ...").
The worked solution is "7+8=15. 15-3=12. 12+5=17. Answer: 17"; a demonstration is that, or for a
`direct_frac` share of the problems (fixed per problem by a hash) only the answer ("Answer: 17").

Difficulty knobs: `digits` (operand size) and `n_ops` (chain length); the default is 1 digit, 3 ops,
and the OOD split (a 2-digit start, 10-99, and every operand drawn from 0-99) is far harder.
`direct_frac` (default 0.5 through train.py's env_direct_frac) mixes two strategies in the
demonstrations, both correct: the tiny model can write the steps reliably but cannot add three
numbers in one token, so SFT leaves a policy that answers directly about half the time and mostly
wrongly, and RL with the verifier has a behaviour to select (README, "The default task"). direct_frac = 0 is the old default: every demonstration worked,
nothing to select, and RL gains little.

The splits: "train" and "heldout" are disjoint by the underlying equation (not just the wording: a
hash of it puts HELDOUT_PERCENT of the equations in held-out); "ood" draws a (digits+1)-digit start
and every operand from 0 to 10^(digits+1) - 1 (a subtraction never below 0). Every split is drawn
with replacement from the generator's distribution (an evaluation estimates accuracy under it; docs/log.md
says why distinct draws were tried and reverted); with `train_pool` = N (train.py's env_train_pool)
every training draw comes from N fixed problems.

parse_answer and the held-out share are shared by the other environments.
"""

import hashlib
import random
import re

NAMES = ["Ann", "Bob", "Kim", "Lee", "Max", "Sam", "Zoe", "Eva"]
ITEMS = ["apples", "coins", "books", "cards", "shells", "stamps"]
HELDOUT_PERCENT = 10  # share of the problem space reserved for held-out evaluation

# Exactly one "Answer: <integer>" and nothing after it. Listing several candidate answers,
# repeating the marker or appending junk all score 0: the format cannot be gamed.
ANSWER_FORM = re.compile(r"Answer: (-?[0-9]+)\s*$")  # [0-9], not \d: \d and int() accept "１７" too


# The two phrasings of a question (Arithmetic._render), read back by Arithmetic.parse_problem
_SYMBOL_FORM = re.compile(r"What is ([0-9]+)((?: [+-] [0-9]+)+)\?")
_WORD_FORM = re.compile(r"[A-Z][a-z]+ had ([0-9]+) [a-z]+, ((?:got|gave away) [0-9]+(?:, (?:got|gave away) [0-9]+)*)\. How many now\?")
_EQUATION = re.compile(r"(?:-|(?<![0-9]))[0-9]+[+-][0-9]+=-?[0-9]+\.")  # a written step of a worked solution, "7+8=15."


def parse_answer(response):
    """The final integer answer, or None when the response is not exactly in the expected form."""
    if response.count("Answer:") != 1:
        return None
    m = ANSWER_FORM.search(response)
    return int(m.group(1)) if m else None


class Arithmetic:
    name = "arithmetic"

    def __init__(self, digits=1, n_ops=3, word_frac=0.5, direct_frac=0.0, train_pool=0):
        if digits < 1 or n_ops < 1 or not 0.0 <= direct_frac <= 1.0:
            raise ValueError(f"need digits >= 1, n_ops >= 1 and direct_frac in [0, 1], got {digits}, {n_ops}, {direct_frac}")
        self.digits, self.n_ops, self.word_frac, self.direct_frac = digits, n_ops, word_frac, direct_frac
        # train_pool = N: every draw of "train" repeats N fixed problems, a small set to memorise (docs/ood.md)
        self.pool = Arithmetic(digits, n_ops, word_frac).problems("train", train_pool, seed="pool") if train_pool else None

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
    def parse_problem(prompt):
        """The problem a question in either of this task's phrasings asks ({prompt, answer, start,
        steps}, as problems() gives it), or None for any other text: so a question typed by hand
        (sample.py) gets the verifier's verdict."""
        prompt = prompt.strip()
        if m := _SYMBOL_FORM.fullmatch(prompt):
            parts = m.group(2).split()
            steps = [(op, int(b)) for op, b in zip(parts[::2], parts[1::2])]
        elif m := _WORD_FORM.fullmatch(prompt):
            steps = [("+" if move.startswith("got") else "-", int(move.rsplit(" ", 1)[1]))
                     for move in m.group(2).split(", ")]
        else:
            return None
        start = value = int(m.group(1))
        for op, b in steps:
            value = value + b if op == "+" else value - b
        return {"prompt": prompt, "answer": value, "start": start, "steps": steps}

    @staticmethod
    def _split_of(start, steps):
        key = f"{start}" + "".join(f"{op}{b}" for op, b in steps)
        return "heldout" if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT else "train"

    def problems(self, split, n, seed=0):
        """n problems of `split` ("train", "heldout" or "ood"), train and held-out disjoint by equation
        (not just wording); "ood" has a (digits+1)-digit start and operands from 0 to 10^(digits+1) - 1."""
        if split not in ("train", "heldout", "ood"):
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        if split == "train" and self.pool:  # n draws from the fixed pool (copies: a caller may reword them)
            rng = random.Random(f"{self.name}-pool-draw-{seed}")
            return [dict(rng.choice(self.pool)) for _ in range(n)]
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

    @staticmethod
    def parses(response):
        """True when the response ends in exactly one "Answer: <integer>" (a parse error otherwise, SPEC §6)."""
        return parse_answer(response) is not None

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
