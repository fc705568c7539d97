"""The calculator tool and the calculator environment (tool calls)."""

import ast
import operator
import random
import re
from fractions import Fraction

from envs.arithmetic import ANSWER_FORM, Arithmetic

# ----------------------------------------------------------------------------------------------
# The calculator tool [SPEC §4 multi-turn tool environment]: what a model's call runs. It never
# runs code: the text is checked against a character whitelist, parsed with ast, and only numbers,
# + - * /, ** and unary minus are evaluated, in exact rational arithmetic, under bounds that make
# every answer quick. Anything else gets a short error string back, which the model reads.
#
# A bound on a value's size is not a bound on its cost: (1/9)**16 is small, but its denominator has
# 51 bits, and ((((((1/9)**16)**16)**16)**16)**16)**16 (39 characters) would build a 53-million-bit
# one. So every operation's cost is bounded before it runs: from its operands' bit lengths, the
# longest integer it can form (numerator or denominator) is computed, and an operation that could
# pass CALC_MAX_BITS is refused. Every integer ever formed then has at most 1,024 bits, every
# operation takes microseconds, and a call (at most 64 characters) well under a millisecond
# (tests/test_guarantees.py searches for the slowest one).

CALC_MAX_CHARS = 64           # longer input: an error before any parsing
CALC_MAX_DEPTH = 12           # nesting of the parsed tree (brackets, chained operators)
CALC_MAX_EXPONENT = 16        # |exponent| of **, an integer
CALC_MAX_MAGNITUDE = 10 ** 12  # |value| of every number, intermediate or final
CALC_MAX_BITS = 1024          # bits of every numerator and denominator an operation may form
_CALC_CHARS = re.compile(r"[0-9.+\-*/() ]*")  # no letters, quotes, brackets, commas, colons: no names, calls, lambdas
_CALC_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class CalculatorError(ValueError):
    pass


def _bits(x):
    """The longer of a Fraction's numerator and denominator, in bits."""
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _check_cost(bits):
    """Refuse an operation before it runs when the integers it may form could pass CALC_MAX_BITS."""
    if bits > CALC_MAX_BITS:
        raise CalculatorError(f"numerator or denominator over {CALC_MAX_BITS} bits")


def _calc_value(node, depth=0):
    """The exact value (a Fraction) of a parsed node, or CalculatorError."""
    if depth > CALC_MAX_DEPTH:
        raise CalculatorError("too deeply nested")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(str(node.value))  # at most 64 characters: far under CALC_MAX_BITS
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = -_calc_value(node.operand, depth + 1)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _calc_value(node.left, depth + 1), _calc_value(node.right, depth + 1)
        if exponent.denominator != 1 or abs(exponent) > CALC_MAX_EXPONENT:
            raise CalculatorError(f"exponent must be an integer up to {CALC_MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise CalculatorError("division by zero")
        _check_cost(abs(int(exponent)) * _bits(base))  # (n/d)**k: k·bits(n) and k·bits(d) at most
        value = base ** int(exponent)
    elif isinstance(node, ast.BinOp) and type(node.op) in _CALC_OPS:
        a, b = _calc_value(node.left, depth + 1), _calc_value(node.right, depth + 1)
        if isinstance(node.op, ast.Div) and b == 0:
            raise CalculatorError("division by zero")
        _check_cost(_bits(a) + _bits(b) + 1)  # a/b op c/d forms a·d ± c·b and b·d at most
        value = _CALC_OPS[type(node.op)](a, b)
    else:
        raise CalculatorError("only numbers, + - * / ** and parentheses")
    if abs(value) > CALC_MAX_MAGNITUDE:
        raise CalculatorError("number too large")
    return value


def calculator(expr: str) -> str:
    """The tool: an arithmetic expression -> its value as text ("9716", "2.5", "0.333333"), or
    "error: ..." for anything else (names, attributes, calls, lambdas, too long, too deep, too large,
    too many digits, division by zero). Safe by construction: a whitelist, ast.parse of at most 64
    characters, and an evaluator that knows five operators and bounds each one's cost before running it."""
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
# feeds the result back as forced tokens (rollouts.tool_hook), which no loss trains on.
#
#   <|tool_call|>347*28<|/tool_call|><|tool_result|>9716<|/tool_result|><|tool_call|>9716+51 ...  Answer: 9681
#
# Rewards: verify (the outcome); step_rewards (process: each call that computes the next step of
# the problem, and the answer); path_signals (RLVP's rule engine, below).

TOOL_CALL, END_CALL, TOOL_RESULT, END_RESULT = "<|tool_call|>", "<|/tool_call|>", "<|tool_result|>", "<|/tool_result|>"
_BINARY_OP = re.compile(r"(?<=[0-9.)])\s*(?:\*\*|[-+*/×÷−])")  # an operator after an operand: not a unary minus


def tool_calls(response):
    """[(expression, result or None, character offset just after the call's closing tag)] in order: each
    call tag to the first closing tag after it, and the result right after, to the first closing result
    tag. Read with str.find, each stretch of the text once: linear in the response (a regex,
    call(.*?)end, scans to the end from every unclosed tag: 20,000 of them took a minute)."""
    out, pos, results_may_close = [], 0, True
    while (start := response.find(TOOL_CALL, pos)) >= 0:
        end = response.find(END_CALL, start + len(TOOL_CALL))
        if end < 0:
            break  # no closing tag after this call, so none after any later one
        pos, result = end + len(END_CALL), None
        if results_may_close and response.startswith(TOOL_RESULT, pos):
            close = response.find(END_RESULT, pos + len(TOOL_RESULT))
            if close >= 0:
                result, pos = response[pos + len(TOOL_RESULT):close], close + len(END_RESULT)
            results_may_close = close >= 0  # none later either: never search again
        out.append((response[start + len(TOOL_CALL):end], result, end + len(END_CALL)))
    return out


def answer_span(response):
    """(the parsed answer, offset just after it) or None: parse_answer's strict form."""
    m = ANSWER_FORM.search(response) if response.count("Answer:") == 1 else None
    return (int(m.group(1)), m.end(1)) if m else None


class Calculator:
    name = "calculator"
    # Most SFT demonstrations answer bare, a minority call the tool: SFT's greedy answer is bare on every
    # problem, with a wide margin, and GRPO has a minority behaviour to select. At 0.5 the first token was
    # a near tie between calling the tool and answering, and the same on every problem (they all begin
    # alike), so the CPU's rounding decided the whole stage's greedy accuracy (docs/ladder.md).
    train_defaults = dict(env_direct_frac=0.7)

    @staticmethod
    def tool(call, prompt, earlier):
        """What rollouts.tool_hook runs for every call a row writes: the calculator, which needs
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
        Train and held-out are disjoint by equation. Every chain of a split is equally likely, and
        "heldout" and "ood" never repeat one (a repeat is drawn again): an evaluation's n chains are
        distinct, a sample without replacement of a split too large to enumerate (900 × 90 × 180^(n_ops−1)
        chains, a tenth of them held out: at n_ops 3, 1,000 draws hold no repeat to drop; at n_ops 1
        the held-out split is 8,110 chains, and n must stay below that). "train" may repeat a chain."""
        if split not in ("train", "heldout", "ood"):
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        out, seen = [], set()
        while len(out) < n:
            start = rng.randint(100, 999)
            steps = [("*", rng.randint(10, 99))]
            steps += [(rng.choice("+-"), rng.randint(10, 99)) for _ in range(self.n_ops - 1 + (split == "ood"))]
            if split != "ood" and Arithmetic._split_of(start, steps) != split:
                continue
            if split != "train":
                if (start, *steps) in seen:
                    continue
                seen.add((start, *steps))
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
    parses = staticmethod(Arithmetic.parses)

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
