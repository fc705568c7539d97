"""The built-in arithmetic environment: splits, solver, verifier."""

import pytest

from envs import Arithmetic, make_env, parse_answer


def _equation(p):
    return (p["start"], tuple(p["steps"]))


def test_splits_are_disjoint_and_ood_has_more_digits():
    env = Arithmetic(digits=1, n_ops=3)
    train = {_equation(p) for p in env.problems("train", 3000)}
    heldout = {_equation(p) for p in env.problems("heldout", 300)}
    assert train and heldout and not train & heldout
    assert all(p["start"] >= 10 for p in env.problems("ood", 200))
    assert env.problems("train", 5, seed=1) == env.problems("train", 5, seed=1)
    assert env.problems("train", 5, seed=1) != env.problems("train", 5, seed=2)


def test_solver_answers_are_verified_and_intermediates_non_negative():
    env = Arithmetic(digits=2, n_ops=3)
    for p in env.problems("train", 500) + env.problems("ood", 100):
        value = p["start"]
        for op, b in p["steps"]:
            value = value + b if op == "+" else value - b
            assert value >= 0
        assert value == p["answer"] and env.verify(p, env.solve(p)) == 1.0
    p = {"start": 47, "steps": [("+", 8), ("-", 23)], "answer": 32}
    assert env.solve(p) == "47+8=55. 55-23=32. Answer: 32"


@pytest.mark.parametrize("response,reward", [
    ("47+8=55. 55-23=32. Answer: 32", 1.0),
    ("Answer: 32", 1.0),
    ("Answer: 32  ", 1.0),
    ("Answer: 31", 0.0),
    ("Answer: 31 Answer: 32", 0.0),      # several answers: the marker must appear once
    ("Answer: 32 or 31", 0.0),           # trailing junk after the number
    ("Answer: 32, 31", 0.0),
    ("32", 0.0),                         # no marker
    ("Answer: 3232", 0.0),               # the answer repeated inside one number
    ("Answer: 32.5", 0.0),
    ("Answer: -32", 0.0),
])
def test_verifier_is_not_fooled_by_format_exploits(response, reward):
    assert Arithmetic.verify({"answer": 32}, response) == reward


def test_parse_answer_and_corpus():
    assert parse_answer("x Answer: -4") == -4 and parse_answer("Answer:4") is None
    docs = Arithmetic().corpus(10)
    assert len(docs) == 10 and all("Answer" not in d and "=" in d for d in docs)
    with pytest.raises(ValueError, match="unknown env"):
        make_env("chess")
    with pytest.raises(ValueError, match="split"):
        Arithmetic().problems("test", 1)


def test_verifier_accepts_only_ascii_digits():
    assert parse_answer("Answer: 17") == 17 and parse_answer("Answer: -3") == -3
    # full-width, Arabic-Indic, mixed, extended Arabic-Indic: \d and int() read them all as 17
    for lookalike in ["Answer: １７", "Answer: ١٧", "Answer: 1７", "Answer: ۱۷"]:
        assert parse_answer(lookalike) is None, lookalike
    assert Arithmetic.verify({"answer": 17}, "Answer: １７") == 0.0


def test_direct_frac_mixes_two_correct_strategies_fixed_per_problem():
    """The default task's demonstrations: a direct_frac share of the problems answered bare, the
    rest worked, both verified correct; the choice depends only on the problem (not on the call)."""
    problems = Arithmetic().problems("train", 4000)
    for frac in (0.0, 0.5, 1.0):
        env = Arithmetic(direct_frac=frac)
        demos = [env.demonstration(p) for p in problems]
        direct = [not env.shows_work(d) for d in demos]
        assert abs(sum(direct) / len(demos) - frac) < 0.03
        assert all(env.verify(p, d) == 1.0 for p, d in zip(problems, demos))
        assert all(d == f"Answer: {p['answer']}" for p, d, bare in zip(problems, demos, direct) if bare)
        assert all(d == env.solve(p) for p, d, bare in zip(problems, demos, direct) if not bare)
        assert demos == [env.demonstration(p) for p in problems]  # deterministic
    half, more = Arithmetic(direct_frac=0.5), Arithmetic(direct_frac=0.7)  # one hash: 0.5's bare set ⊂ 0.7's
    assert all(not more.shows_work(more.demonstration(p)) for p in problems
               if not half.shows_work(half.demonstration(p)))
    with pytest.raises(ValueError, match="direct_frac"):
        Arithmetic(direct_frac=1.5)


def test_shows_work_reads_only_what_precedes_the_answer():
    env = Arithmetic()
    assert env.shows_work("7+8=15. 15-3=12. Answer: 12")
    assert not env.shows_work("Answer: 12")
    assert not env.shows_work("I think so. Answer: 3=3")  # an '=' after the marker is not work
    assert not env.shows_work("")


def test_the_task_reads_back_both_of_its_phrasings():
    """parse_problem gives back every generated problem, symbol form and word problem alike; sample.py's
    verdict uses it, so the word problem of its own docstring is judged; other text gets no verdict."""
    import sample
    env = Arithmetic(digits=2, n_ops=4, word_frac=0.5)
    problems = env.problems("train", 200, seed=3) + env.problems("ood", 50, seed=3)
    assert {p["prompt"].startswith("What is") for p in problems} == {True, False}
    for p in problems:
        assert env.parse_problem(p["prompt"]) == {**p, "steps": list(p["steps"])}
    question = "Ann had 4 coins, got 9, gave away 2, got 1. How many now?"
    assert env.parse_problem(question)["answer"] == 12
    assert sample.verdict(env, question, "4+9=13. 13-2=11. 11+1=12. Answer: 12") == "  [correct]"
    assert sample.verdict(env, question, "Answer: 11") == "  [wrong]"
    assert sample.verdict(env, "What is 7 + 8 - 3 + 5?", "Answer: 17") == "  [correct]"
    assert env.parse_problem("What is 7 * 8?") is None and sample.verdict(env, "Hello?", "Answer: 1") == ""


# ----------------------------------------------------------------------------------------------
# GSM8K's answer pattern (the dataset and the tiny Qwen2 runs are in test_llama.py)

def test_gsm8k_reads_the_number_after_the_last_marker():
    from envs import GSM8K
    problem = {"answer": "1234"}
    for response, reward in [("48/2 = 24, so 1,234 in all.\n#### 1,234", 1.0), ("#### $1234.00", 1.0),
                             ("#### 71\nno, wait\n#### 1234", 1.0), ("#### 1234\n#### 71", 0.0),
                             ("The answer is 1234.", 0.0), ("#### 1233", 0.0), ("####  $ \n 1234", 1.0),
                             ("#### $$1234", 0.0), ("#### -1234", 0.0), ("#### 1234 dollars", 1.0)]:
        assert GSM8K.verify(problem, response) == reward, response


def test_gsm8k_reads_a_number_only_where_the_earlier_pattern_read_the_same_one():
    """On 20,000 random short strings of the characters that matter: wherever final_number reads a number
    (the dataset's form right after the last "####"), the earlier, laxer pattern read the same number
    there; it is stricter, never different (the strings it refuses are tests/test_llama.py's)."""
    import random
    import re
    from decimal import Decimal

    from envs.gsm8k import final_number
    before = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
    rng, pieces = random.Random(0), ["####", "#", "$", " ", "\n", "\t", "-", "1", "7", ",", ".", "a"]
    read = 0
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        number = final_number(text)
        if number is not None:
            old = before.match("####" + text.rsplit("####", 1)[1])
            assert old and Decimal(old.group(1).replace(",", "")) == number, repr(text)
            read += 1
    assert read > 1000  # (the strings do reach numbers)


def test_gsm8k_rows_written_from_the_default_task(tmp_path):
    """--env=gsm8k --env_data=arithmetic: the default task's word problems in GSM8K's form, no download:
    every row passes the dataset's check and its solution verifies, one line and one calculator
    annotation per step, each equation once, held-out disjoint from train; --env_ops reaches it; SFT
    runs on it."""
    import train as T
    from conftest import TINY
    from nanopost import options
    from envs.gsm8k import INSTRUCTION
    from nanopost.options import config_env
    env = config_env(options.make_config(dict(env="gsm8k", env_data="arithmetic")))
    train, heldout = env.problems("train", 4000), env.problems("heldout", 500)
    assert (len(env.rows["train"]), len(env.rows["heldout"])) == (4000, 500)
    for p in train + heldout:
        assert env.verify(p, env.demonstration(p)) == 1.0 and env.verify(p, env.demonstration(p) + "1") == 0.0
        assert p["solution"].count("<<") == 3 == p["solution"].count("\n")
    def equations(problems):
        asked = [Arithmetic.parse_problem(p["prompt"].removesuffix(" " + INSTRUCTION)) for p in problems]
        return {(q["start"], tuple(q["steps"])) for q in asked}
    assert len(equations(heldout)) == 500 and len(equations(train)) == 4000 and not equations(train) & equations(heldout)
    long = config_env(options.make_config(dict(env="gsm8k", env_data="arithmetic", env_ops=6)))
    assert long.problems("train", 1)[0]["solution"].count("<<") == 6
    T.train(dict(TINY, algo="sft", env="gsm8k", env_data="arithmetic", block_size=512, max_new_tokens=16, max_iters=1,
                 train_problems=16, val_examples=4, out_dir=str(tmp_path / "sft")))  # (GRPO on gsm8k rows: test_llama.py)


def test_a_train_pool_fixes_the_training_problems_of_every_algorithm():
    """env_train_pool=N: every draw of the train split (SFT's demonstrations, RL's rollout shards) repeats
    the same N problems, train-split ones, each draw seeded; held-out and OOD stay as they were; the
    option is arithmetic's alone."""
    from types import SimpleNamespace
    from nanopost import options
    from nanopost.options import config_env
    from nanopost.rollouts import shard_problems
    env = config_env(options.make_config(dict(env_train_pool=7)))
    pool = {p["prompt"] for p in env.pool}
    assert len(env.pool) == 7 == len(pool) and env.pool == Arithmetic().problems("train", 7, seed="pool")
    drawn = env.problems("train", 200, seed=0)
    assert {p["prompt"] for p in drawn} == pool  # 200 draws cover the 7 (the chance of missing one is ~1e-12)
    assert env.problems("train", 50, seed=1) == env.problems("train", 50, seed=1) != env.problems("train", 50, seed=2)
    assert env.problems("heldout", 30, seed=0) == Arithmetic().problems("heldout", 30, seed=0)
    run = SimpleNamespace(cfg=options.make_config(dict(algo="grpo", env_train_pool=7)), env=env, world_size=1)
    shards = [shard_problems(run, it, 0, 0)[0] for it in range(3)]
    assert all(p["prompt"] in pool for shard in shards for p in shard) and len(shards[0]) == 16
    drawn[0]["prompt"] = "changed"  # a draw is a copy: rewording it leaves the pool as it was
    assert "changed" not in {p["prompt"] for p in env.pool}
    old = {k: v for k, v in options.make_config({}).items() if k != "env_train_pool"}  # a config.json from before the key
    assert config_env(old).pool is None
    with pytest.raises(ValueError, match="--env_train_pool cannot apply to --env=generalpoints"):
        options.make_config(dict(env="generalpoints", env_train_pool=7))
