"""
Verifiable environments, generated procedurally (no downloads). SPEC §4. The entry point:
`make_env(name)`, and the names listed below, so that `from envs import ...` reaches every
environment (a name another file uses goes into that list).

    arithmetic.py     the default task: chains of + and -, symbols or a word problem
    generalpoints.py  24 with four cards (exact-rational solver; J, Q, K re-ranked in "ood")
    calculator.py     the safe calculator tool, and the tool-using calculator task
    treasure.py       the treasure hunt: the game (qlearn.py's) and the multi-turn tool task
    gsm8k.py          GSM8K, built from the dataset's rows (options.config_env reads them; no ood split), or
                      from the default task's word problems written in its form

Each environment offers
- problems(split, n, seed): disjoint "train" / "heldout" splits and an "ood" split; training draws
  may repeat a problem, evaluations on small splits do not: GeneralPoints' held-out and OOD hands and
  the treasure hunt's held-out maps are a census (every problem of the split once, in a seeded order,
  the first n), the calculator's and the treasure hunt's larger splits never repeat a draw, gsm8k's
  held-out rows are read in order; the default task draws with replacement (docs/log.md, 2026-12-06);
- solve(problem): the worked solution;
- demonstration(problem): the SFT target (the worked solution, or for a share only the answer);
- verify(problem, response): the reward, 1.0 or 0.0, from a strict answer parser;
- shows_work(response): whether the response shows its work before its answer;
- corpus(n, seed): pre-training documents.
"""

from envs.arithmetic import HELDOUT_PERCENT, Arithmetic, parse_answer
from envs.calculator import END_CALL, END_RESULT, TOOL_CALL, TOOL_RESULT, Calculator, calculator, tool_calls
from envs.gsm8k import GSM8K, WRITTEN, written_rows
from envs.generalpoints import FACES, SPLIT_RULE, GeneralPoints, card_value, solutions
from envs.treasure import ROOM_NAMES, ROOMS, START, Treasure, actions, actions_to_win, describe, shortest_solution, step

__all__ = ["ENVS", "make_env", "PRIVILEGED", "privileged_prompt", "HELDOUT_PERCENT", "Arithmetic", "parse_answer", "END_CALL", "END_RESULT", "TOOL_CALL",
           "TOOL_RESULT", "Calculator", "calculator", "tool_calls", "FACES", "SPLIT_RULE", "GeneralPoints", "card_value",
           "solutions", "ROOM_NAMES", "ROOMS", "START", "Treasure", "actions", "actions_to_win", "describe", "shortest_solution", "step", "GSM8K", "WRITTEN", "written_rows"]

ENVS = {"arithmetic": Arithmetic, "generalpoints": GeneralPoints,
        "calculator": Calculator, "treasure": Treasure, "gsm8k": GSM8K}


# A problem shown with what a learner may not see: OPSD's teacher context (opd.py) and the rows that teach
# a student to read a reference (sft.py's reader_frac). The worked solution names every operand and
# operation, so it stands in for the problem's text: problem + solution + answer would not fit 128 tokens.
PRIVILEGED = dict(answer="{prompt}\n(Reference answer: {answer})",
                  solution="(Reference solution: {solution})")


def privileged_prompt(env, problem, privileged):
    """The user message of `problem` with the PRIVILEGED context `privileged` (answer | solution)."""
    return PRIVILEGED[privileged].format(prompt=problem["prompt"], answer=problem["answer"], solution=env.solve(problem))


def make_env(name="arithmetic", **kwargs):
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; choose from {sorted(ENVS)}")
    return ENVS[name](**kwargs)
