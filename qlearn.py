"""
Tabular Q-learning on the treasure hunt: the classical RL baseline of the chapter.
SPEC §3 "Q-learning", §4 (the treasure-hunt game); Ch7 Exp 7-1.

    python qlearn.py                      # 10,000 episodes; prints episodes to first win, to a winning
    python qlearn.py --episodes=2000      #   greedy policy and to an optimal one, Q-table size, wall time

The game, the treasure hunt, lives in envs/treasure.py (ROOMS, step, shortest_solution), where the
language-model agent plays it too (--env=treasure): six rooms, keys and doors, a sword to craft into
a great sword, a guardian that only the great sword beats, a chest worth reward 1; everything else
is worth 0. The shortest win is 11 actions, proved by breadth-first search.

Q-learning (Watkins), for the transition s --a--> s' with reward r:

    Q(s, a) ← Q(s, a) + α·(r + γ·max_a' Q(s', a') − Q(s, a))       (no max term when s' ends the episode)

so Q approaches Q*(s, a) = r + γ·max_a' Q*(s', a'). With γ < 1 a win after n steps is worth γ^(n−1),
so the greedy policy prefers the shortest win. Behaviour is ε-greedy: a random action with
probability ε, else the best one (ties broken at random, so an all-zero table explores).
"""

import inspect
import random
import sys
import time

from envs import START, actions, shortest_solution, step

ACTIONS = actions()  # the commands, rooms called by their role: Q-table column a is ACTIONS[a]


# ----------------------------------------------------------------------------------------------
# Tabular Q-learning

def greedy(q_values, rng):
    best = max(q_values)
    return rng.choice([a for a, v in enumerate(q_values) if v == best])


def play_greedy(Q, max_steps):
    """One episode of the greedy policy (ties: the first best action); returns (won, steps)."""
    state = START
    for n in range(1, max_steps + 1):
        values = Q.get(state, [0.0] * len(ACTIONS))
        state, reward, done, _ = step(state, ACTIONS[values.index(max(values))])
        if done:
            return reward > 0, n
    return False, max_steps


def q_learning(episodes=10000, alpha=0.5, gamma=0.95, epsilon=0.1, max_steps=100, eval_every=50, seed=0):
    """Train a Q-table by ε-greedy Q-learning; evaluate the greedy policy every `eval_every` episodes.
    Returns a dict: Q, first_win (episode of the first win while exploring), greedy_win (first
    evaluation whose greedy episode wins: the deterministic game has one start, so that is 100% of
    greedy episodes), greedy_optimal (first evaluation winning in the optimal number of steps),
    greedy_steps (at the end), wins (while exploring) and seconds."""
    rng = random.Random(seed)
    Q = {}
    optimum = len(shortest_solution())
    first_win = greedy_win = greedy_optimal = None
    wins, t0 = 0, time.time()
    for episode in range(1, episodes + 1):
        state = START
        for _ in range(max_steps):
            q = Q.setdefault(state, [0.0] * len(ACTIONS))
            a = rng.randrange(len(ACTIONS)) if rng.random() < epsilon else greedy(q, rng)
            nxt, reward, done, _ = step(state, ACTIONS[a])
            target = reward if done else reward + gamma * max(Q.setdefault(nxt, [0.0] * len(ACTIONS)))
            q[a] += alpha * (target - q[a])
            state = nxt
            if done:
                break
        if reward > 0:
            wins += 1
            first_win = first_win or episode
        if episode % eval_every == 0:
            won, steps = play_greedy(Q, max_steps)
            if won:
                greedy_win = greedy_win or episode
                if steps == optimum:
                    greedy_optimal = greedy_optimal or episode
    won, steps = play_greedy(Q, max_steps)
    return dict(Q=Q, first_win=first_win, greedy_win=greedy_win, greedy_optimal=greedy_optimal,
                greedy_steps=steps if won else None, wins=wins, seconds=time.time() - t0)


def parse_args(argv):
    """`--key=value` overrides of q_learning's arguments, each read as its default's type (alpha=1e-3
    is a float, episodes=2000 an int); an unknown key or a value of the wrong type is an error."""
    defaults = {name: p.default for name, p in inspect.signature(q_learning).parameters.items()}
    kwargs = {}
    for arg in argv:
        key, _, value = arg.lstrip("-").partition("=")
        if key not in defaults:
            raise ValueError(f"unknown argument {key!r}: choose from {', '.join(defaults)}")
        try:
            kwargs[key] = type(defaults[key])(value)
        except ValueError:
            raise ValueError(f"--{key}={value}: expects {type(defaults[key]).__name__}") from None
    return kwargs


def main(argv):
    """`--key=value` overrides of q_learning's arguments (episodes, alpha, gamma, epsilon, max_steps,
    eval_every, seed)."""
    kwargs = parse_args(argv)
    path = shortest_solution()
    print(f"treasure hunt: {len(path)}-step optimum (BFS): {', '.join(path)}")
    result = q_learning(**kwargs)
    n_states = len(result["Q"])
    print(f"episodes to first win:                 {result['first_win']}")
    print(f"episodes to 100% greedy wins:          {result['greedy_win']} (greedy policy checked every "
          f"{kwargs.get('eval_every', 50)} episodes)")
    print(f"episodes to an optimal greedy policy:  {result['greedy_optimal']} "
          f"(greedy win now takes {result['greedy_steps']} steps)")
    print(f"wins while exploring: {result['wins']} of {kwargs.get('episodes', 10000)} episodes")
    print(f"Q-table: {n_states} states x {len(ACTIONS)} actions = {n_states * len(ACTIONS)} entries")
    print(f"wall time: {result['seconds']:.2f} s")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as e:
        sys.exit(f"error: {e}")
