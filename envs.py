"""
Verifiable environments, generated procedurally (no downloads). SPEC §4.

Arithmetic (the default task): chains of additions and subtractions, written as symbols
("What is 7 + 8 - 3 + 5?") or as a short word problem ("Ann had 7 apples, got 8, gave away 3, ..."). Each environment offers
- problems(split, n, seed): disjoint "train" / "heldout" splits and an "ood" split (one more digit);
- solve(problem): a worked demonstration for SFT ("7+8=15. 15-3=12. 12+5=17. Answer: 17");
- verify(problem, response): the reward, 1.0 or 0.0, from a strict answer parser;
- corpus(n, seed): pre-training documents (bare worked equations, no question template).

Difficulty knobs: `digits` (operand size) and `n_ops` (chain length). The default (1 digit, 3 ops)
is learnt only partly by the tiny model in a few CPU minutes (about half the held-out problems),
leaving headroom for RL; the OOD split (2-digit start values) is far harder.
"""

import hashlib
import random
import re

NAMES = ["Ann", "Bob", "Kim", "Lee", "Max", "Sam", "Zoe", "Eva"]
ITEMS = ["apples", "coins", "books", "cards", "shells", "stamps"]
HELDOUT_PERCENT = 10  # share of the problem space reserved for held-out evaluation

# Exactly one "Answer: <integer>" and nothing after it. Listing several candidate answers,
# repeating the marker or appending junk all score 0: the format cannot be gamed.
_ANSWER = re.compile(r"Answer: (-?[0-9]+)\s*$")  # [0-9], not \d: \d and int() accept "１７" too


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

    def corpus(self, n, seed=0):
        """Pre-training text: worked equation chains from the train split, without the Q/A template."""
        return [self.solve(p).rsplit(" Answer:", 1)[0] for p in self.problems("train", n, seed)]


ENVS = {"arithmetic": Arithmetic}


def make_env(name="arithmetic", **kwargs):
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; choose from {sorted(ENVS)}")
    return ENVS[name](**kwargs)
