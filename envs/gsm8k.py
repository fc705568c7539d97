"""
GSM8K (Cobbe et al., 2021: grade-school math word problems) as an environment built from a
dataset's prompts and reference answers, so that SFT, GRPO, PPO, RFT and OPD train on it with the
same code as on the built-in tasks. The rows are the dataset's own, {"question", "answer"}, where
the answer is a worked solution ending in "#### N":

    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many
     clips in May. How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n... #### 72"}

- prompt: the question and the instruction verl's GSM8K recipe uses, so that accuracies compare
  with its published table;
- verify: 1.0 when the number after the response's last "####" equals the reference's (thousands
  commas, a dollar sign and trailing zeros of a decimal ignored), else 0.0: the strict form, nothing
  else in the response is read, and a last "####" followed by no number of the dataset's form
  ("1e5", "1,2,3") is a parse error;
- demonstration (the SFT target): the dataset's worked solution, "#### N" included;
- splits: "train" and "heldout" (the caller hands both over: the hub's train and test splits, or
  a local file's rows with its last tenth held out). There is no "ood" split: evaluations skip it.

Rows the project writes itself (--env_data=arithmetic, no download): the default task's word problems
("Ann had 4 coins, got 9, gave away 2. How many now?", held-out disjoint by equation as there), each
solved in the dataset's form, a calculator annotation per step and "#### N" at the end
(written_rows): the same path on a task whose difficulty is known.
"""

import random
import re
from decimal import Decimal

from envs.arithmetic import Arithmetic

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# The dataset's answer form after "####": spaces, an optional "$" and spaces, then an integer whose
# commas (if any) group thousands, an optional decimal part, and nothing that continues the number
# ("1e5" or "1,2,3" is no number of that form: a parse error, never 1 or 123). Matched at one place,
# the start of the text after the last "####", so it is linear in the text.
_FINAL = re.compile(r"\s*(?:\$\s*)?(-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?)(?![0-9A-Za-z_,]|\.[0-9])")


def final_number(text):
    """The number after the last "####" of `text` as a Decimal (commas and "$" dropped), or None
    when there is no "####" or what follows the last one is not a number in the dataset's form."""
    if "####" not in text:
        return None
    found = _FINAL.match(text.rsplit("####", 1)[1])
    return Decimal(found.group(1).replace(",", "")) if found else None


WRITTEN = "arithmetic"  # --env_data naming the rows written here rather than a dataset
WRITTEN_ROWS = dict(train=4000, heldout=500)  # at most, each a distinct equation (GSM8K has 7,473 and 1,319)
_WHO = re.compile(r"([A-Z][a-z]+) had [0-9]+ ([a-z]+),")


def written_rows(split, digits=1, n_ops=3):
    """The arithmetic task's word problems of `split` as GSM8K rows, each a distinct equation (a held-out
    set read once, as the dataset's), solved in the dataset's form:
    {"question": "Ann had 4 coins, got 9, gave away 2. How many now?",
     "answer": "Ann got 9: 4 + 9 = <<4+9=13>>13 coins.\nAnn gave away 2: 13 - 2 = <<13-2=11>>11 coins.\n#### 11"}"""
    task, n, rows, seen = Arithmetic(digits=digits, n_ops=n_ops, word_frac=1.0), WRITTEN_ROWS[split], [], set()
    drawn = (p for draw in range(20) for p in task.problems(split, n, seed=f"gsm8k-{draw}"))  # (short chains: fewer equations)
    for problem in drawn:
        if len(rows) == n:
            break
        equation = (problem["start"], tuple(problem["steps"]))
        if equation in seen:
            continue
        seen.add(equation)
        name, item = _WHO.match(problem["prompt"]).groups()
        value, lines = problem["start"], []
        for op, b in problem["steps"]:
            new = value + b if op == "+" else value - b
            lines.append(f"{name} {'got' if op == '+' else 'gave away'} {b}: {value} {op} {b} = <<{value}{op}{b}={new}>>{new} {item}.")
            value = new
        rows.append({"question": problem["prompt"], "answer": "\n".join(lines) + f"\n#### {value}"})
    return rows


class GSM8K:
    name = "gsm8k"
    splits = ("train", "heldout")

    @staticmethod
    def check_row(row):
        """(question, solution, reference answer) of a dataset row, or ValueError naming the field."""
        for field in ("question", "answer"):
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise ValueError(f"field {field!r}: missing or not a non-empty string")
        reference = final_number(row["answer"])
        if reference is None:
            raise ValueError("field 'answer': no final number after '####'")
        return row["question"], row["answer"], reference

    def __init__(self, train_rows, heldout_rows):
        """train_rows, heldout_rows: lists of (question, solution, reference), as check_row gives them."""
        if not train_rows or not heldout_rows:
            raise ValueError("gsm8k needs train and held-out rows")
        self.rows = {"train": train_rows, "heldout": heldout_rows}

    def problems(self, split, n, seed=0):
        """n problems of `split`. "train": a shuffle that depends on the seed, cycled when n is more
        than the rows; "heldout": the first n rows in the dataset's order whatever the seed (every
        evaluation reads the same problems), never repeated."""
        if split not in self.splits:
            raise ValueError(f"gsm8k has splits {self.splits}, not {split!r}")
        rows = self.rows[split]
        if split == "heldout":
            chosen = rows[:n]
        else:
            rng, chosen = random.Random(f"gsm8k-{seed}"), []
            while len(chosen) < n:
                chosen += rng.sample(rows, len(rows))
            chosen = chosen[:n]
        return [{"prompt": f"{question} {INSTRUCTION}", "answer": str(reference), "solution": solution}
                for question, solution, reference in chosen]

    @staticmethod
    def solve(problem):
        return problem["solution"]

    def demonstration(self, problem):
        return problem["solution"]

    @staticmethod
    def verify(problem, response):
        answer = final_number(response)
        return float(answer is not None and answer == Decimal(problem["answer"]))

    @staticmethod
    def parses(response):
        """True when the response has a number after a "####" (a parse error otherwise)."""
        return final_number(response) is not None

    @staticmethod
    def shows_work(response):
        """True when something is written before the final "####"."""
        return bool(response.rsplit("####", 1)[0].strip()) and "####" in response

    def corpus(self, n, seed=0):
        """Pre-training text: train questions with their worked solutions."""
        return [f"{p['prompt']}\n{p['solution']}" for p in self.problems("train", n, seed)]
