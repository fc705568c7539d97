"""GeneralPoints: solver, verifier, rule variant, splits, demonstrations that fit the context; the SFT vs
RL experiment script at toy size."""

import hashlib
import itertools
import json
import os
import subprocess
import sys

import pytest

from envs import FACES, SPLIT_RULE, GeneralPoints, card_value, make_env, solutions
from nanopost.tokenizer import Tokenizer

HAND = {"cards": ["4", "7", "8", "8"], "values": [4, 7, 8, 8], "target": 24}


def test_solver_finds_known_solutions_and_none_for_unsolvable_hands():
    assert "4*(7-8/8)" in solutions((4, 7, 8, 8))  # (7-8/8)*4 = 24
    assert solutions((3, 3, 8, 8)) == ("8/(3-8/3)",)  # needs a fraction on the way
    assert solutions((1, 1, 1, 1)) == () and solutions((1, 1, 1, 2)) == ()
    assert solutions((1, 2, 3, 4), target=10)


@pytest.mark.parametrize("values", [(4, 7, 8, 8), (3, 3, 8, 8), (1, 5, 5, 5), (2, 10, 10, 12), (6, 6, 6, 6)])
def test_verifier_accepts_every_solver_solution(values):
    problem = {"values": list(values), "target": 24}
    found = solutions(values)
    assert found
    for text in found:
        assert GeneralPoints.verify(problem, f"Answer: {text}") == 1.0, text


@pytest.mark.parametrize("response,reward", [
    ("Answer: (7-8/8)*4", 1.0),
    ("8/8=1 7-1=6 6*4=24. Answer: (7 - 8/8) * 4", 1.0),
    ("Answer: (7−8÷8)×4", 1.0),           # the typeset symbols
    ("Answer: (7-8/8)*4*1", 0.0),         # an extra number
    ("Answer: 7*4-4", 0.0),               # a card missing, another reused
    ("Answer: (7-8/8)*8", 0.0),           # 8 used three times, 4 missing
    ("Answer: 8*(7-4)", 0.0),             # 24, but a card missing
    ("Answer: 7+8+8+4", 0.0),             # every card once, wrong value (27)
    ("Answer: (7-8//8)*4", 0.0),          # floor division
    ("Answer: -(4-7)*8*8/8", 0.0),        # unary minus, and an extra 8
    ("Answer: (7-8/8)*4 Answer: 24", 0.0),
    ("(7-8/8)*4", 0.0),                   # no marker
    ("Answer: (7-8/8)*4 so 24", 0.0),     # junk after the expression
    ("Answer: 08*(7-4)", 0.0),
])
def test_verifier_checks_cards_value_and_form(response, reward):
    assert GeneralPoints.verify(HAND, response) == reward


@pytest.mark.parametrize("attack", ["__import__('os')", "abs(24)", "(24).real", "x*4", "[24][0]", "24 if 1 else 0",
                                    "4**2+8", "eval('24')", "2" * 1000])
def test_verifier_rejects_names_calls_and_attributes(attack):
    assert GeneralPoints.verify(HAND, f"Answer: {attack}") == 0.0


def test_division_is_exact_and_by_zero_is_wrong():
    problem = {"values": [3, 3, 8, 8], "target": 24}
    assert GeneralPoints.verify(problem, "Answer: 8/(3-8/3)") == 1.0  # 8 / (1/3) = 24, not 23.99999
    assert GeneralPoints.verify({"values": [8, 8, 3, 3], "target": 24}, "Answer: 8/(3-3)+8") == 0.0


def test_rule_variant_changes_face_card_values():
    assert [card_value(c, "tens") for c in ("A", "7", "10", "J", "Q", "K")] == [1, 7, 10, 10, 10, 10]
    assert [card_value(c, "ranks") for c in ("J", "Q", "K")] == [11, 12, 13]
    env = GeneralPoints()
    for split in ("train", "heldout", "ood"):
        for p in env.problems(split, 200):
            assert p["values"] == [card_value(c, SPLIT_RULE[split]) for c in p["cards"]]
            assert ("J=11" in p["prompt"]) == (split == "ood")
    assert all(set(p["cards"]) & {"J", "Q", "K"} for p in env.problems("ood", 200))


def test_splits_are_disjoint_by_hand_solvable_and_fit_the_context():
    env, tok = GeneralPoints(), Tokenizer("byte")
    hands = {split: {tuple(p["cards"]) for p in env.problems(split, 1500)} for split in ("train", "heldout", "ood")}
    assert all(hands.values())
    assert not hands["train"] & hands["heldout"] and not hands["train"] & hands["ood"] and not hands["heldout"] & hands["ood"]
    # every hand of every split: solvable under its rule, and prompt + demonstration within block_size 128
    for cards in itertools.combinations_with_replacement(FACES, 4):
        split = GeneralPoints._split_of(list(cards))
        if split is None:
            continue
        values = tuple(card_value(c, SPLIT_RULE[split]) for c in cards)
        assert solutions(values) or tuple(cards) not in hands[split]
    for p in env.problems("train", 300) + env.problems("ood", 300) + env.problems("heldout", 300):
        assert GeneralPoints.verify(p, env.demonstration(p)) == 1.0
        assert len(tok.prompt_ids(p["prompt"])) + len(tok.response_ids(env.solve(p))) <= 129
    assert env.problems("train", 5, seed=1) == env.problems("train", 5, seed=1) != env.problems("train", 5, seed=2)


def prompts_digest(problems):
    """A short fingerprint of a list of problems (their prompts, in order)."""
    return hashlib.sha1(" | ".join(p["prompt"] for p in problems).encode()).hexdigest()[:12]


def test_heldout_and_ood_are_a_census_of_distinct_hands():
    """Held-out and OOD: every solvable hand of the split once. The census's size is a brute-force
    count over all 13^4 ordered deals; n below it gives n distinct hands (the first n of the whole
    split's seeded order), n above it every hand once; the train split deals as it always did."""
    env = GeneralPoints()
    for split, size in (("heldout", 119), ("ood", 182)):
        hands = {tuple(sorted(deal, key=FACES.index)) for deal in itertools.product(FACES, repeat=4)}
        brute = [h for h in hands if GeneralPoints._split_of(h) == split
                 and solutions(tuple(card_value(c, SPLIT_RULE[split]) for c in h))]
        assert len(GeneralPoints.census(split)) == len(set(GeneralPoints.census(split))) == len(brute) == size
        everything = env.problems(split, 1000)
        assert len(everything) == size and sorted(tuple(p["cards"]) for p in everything) == sorted(brute)
        some = env.problems(split, 50, seed=3)
        assert len({tuple(p["cards"]) for p in some}) == 50 and some == env.problems(split, 1000, seed=3)[:50]
        assert some != env.problems(split, 50, seed=4)
    # 200 draws with replacement, as evaluations dealt before the census, held 88 distinct held-out hands
    assert len({tuple(p["cards"]) for p in env.problems("heldout", 200)}) == 119
    train = env.problems("train", 500)
    assert [" ".join(p["cards"]) for p in train[:4]] == ["4 8 10 10", "2 4 7 8", "5 8 8 9", "5 7 9 10"]
    assert prompts_digest(train) == "71a48d7a626a"  # the same hands, in the same order, as before the census
    assert len({tuple(p["cards"]) for p in train}) < 500  # training deals may repeat a hand


def test_demonstrations_worked_or_direct_and_env_knobs():
    p = {"cards": ["3", "3", "8", "8"], "values": [3, 3, 8, 8], "target": 24, "answer": "8/(3-8/3)"}
    assert GeneralPoints.solve(p) == "8/3=8/3 3-(8/3)=1/3 8/(1/3)=24. Answer: 8/(3-8/3)"
    assert GeneralPoints.shows_work(GeneralPoints.solve(p)) and not GeneralPoints.shows_work("Answer: 8/(3-8/3)")
    assert GeneralPoints(direct_frac=1.0).demonstration(p) == "Answer: 8/(3-8/3)"
    assert all("Answer" not in d for d in GeneralPoints().corpus(5))
    assert isinstance(make_env("generalpoints", digits=1, n_ops=3, direct_frac=0.0), GeneralPoints)
    with pytest.raises(ValueError, match="env_digits"):
        make_env("generalpoints", digits=2, n_ops=3)
    with pytest.raises(ValueError, match="split"):
        GeneralPoints().problems("test", 1)


@pytest.mark.slow  # a script's smoke run at toy size: `-m slow`
def test_sft_vs_rl_experiment_runs_at_toy_size_with_sft_matched_to_rl_time(tmp_path):
    """experiments/generalpoints.py --quick end to end: both arms from one SFT start, evaluated at
    the start and the end, SFT given round(RL's training seconds / SFT's seconds per iteration)
    iterations, the table and the plot written."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "experiments", "generalpoints.py"), "--quick",
                           f"--out={tmp_path}"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    rl, sft = results["arms"]["rl"], results["arms"]["sft"]
    assert [p["iter"] for p in rl] == [0, 2] and rl[0]["ood_acc"] == sft[0]["ood_acc"]  # one start
    times = [json.loads(line)["iter_time"] for line in open(tmp_path / "init" / "metrics.jsonl") if '"loss"' in line]
    assert sft[-1]["iter"] == max(1, round(rl[-1]["seconds"] / (sum(times) / len(times))))
    assert "| sft |" in (tmp_path / "generalpoints.md").read_text() and (tmp_path / "generalpoints.png").exists()
