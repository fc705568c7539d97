"""The treasure hunt (envs/treasure.py: BFS optimum, text interface) and tabular Q-learning (qlearn.py)."""

import pytest

import envs
import qlearn as Q


def test_bfs_optimum_is_eleven_steps_and_wins():
    path = envs.shortest_solution()
    assert len(path) == 11
    state, reward = envs.START, 0.0
    for n, action in enumerate(path, start=1):
        state, reward, done, text = envs.step(state, action)
        assert done == (n == len(path))
    assert reward == 1.0 and "win" in text


def test_rules_locked_door_weak_weapon_sparse_reward():
    state, _, _, text = envs.step(envs.START, "go forge")  # not adjacent to the hall
    assert state == envs.START and "cannot" in text
    state, _, _, text = envs.step(envs.step(envs.START, "go armory")[0], "go forge")  # the red door is locked
    assert state.room == "armory" and "locked" in text
    lair = envs.step(envs.START, "go lair")[0]
    _, reward, done, text = envs.step(lair, "fight")  # no great sword: the game is lost, reward 0
    assert done and reward == 0.0 and "Game over" in text
    assert envs.describe(lair) == "lair: guardian" and all(a in Q.ACTIONS for a in ("take", "craft", "open chest"))


def test_q_learning_reaches_greedy_wins_on_a_small_budget():
    for seed in (0, 1):
        result = Q.q_learning(episodes=3000, seed=seed)
        assert result["first_win"] is not None and result["greedy_win"] is not None
        assert result["greedy_steps"] == 11  # the greedy policy ends optimal
        assert Q.play_greedy(result["Q"], 100) == (True, 11)


def test_command_line_reads_each_value_as_its_defaults_type():
    """1e-3 is a float (it used to be refused: no dot), 2000 an int; a typo or a fractional count is an error."""
    assert Q.parse_args(["--alpha=1e-3", "--episodes=2000", "--gamma=1"]) == dict(alpha=0.001, episodes=2000, gamma=1.0)
    assert type(Q.parse_args(["--gamma=1"])["gamma"]) is float
    for bad in (["--alpha=fast"], ["--episodes=2.5"], ["--episode=10"]):
        with pytest.raises(ValueError):
            Q.parse_args(bad)
