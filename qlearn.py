"""
The treasure hunt and a tabular Q-learning agent: the classical RL baseline of the chapter.
SPEC §3 "Q-learning", §4 (the treasure-hunt game); Ch7 Exp 7-1.

    python qlearn.py                      # 10,000 episodes; prints episodes to first win, to a winning
    python qlearn.py --episodes=2000      #   greedy policy and to an optimal one, Q-table size, wall time

The game (deterministic, sparse reward): six rooms. A red key lies in the hall, a sword in the
armory; the red door from the armory opens the forge, where ore lies and the sword can be crafted
into a great sword. Only the great sword beats the guardian of the lair (fighting it with less is
death: the episode ends with reward 0); the beaten guardian drops the blue key of the vault, whose
chest is the treasure: reward 1 for opening it, 0 for everything else. The library is a dead end.

    hall ── armory ══red door══ forge
     │  ╲                         │
  library  ╲──── lair ────────────┘
                  ║ blue door
                vault (chest)

The shortest win is 11 actions (take key, go armory, take sword, go forge, take ore, craft, go
lair, fight, take key, go vault, open chest); `shortest_solution` proves it by breadth-first search
over every reachable state, and the tests check it.

The game is written as text in, text out, so that it can become a multi-turn environment for a
language-model agent unchanged: `describe(state)` is the observation a player reads, ACTIONS are
the commands it may write, and `step(state, action) -> (state, reward, done, observation_text)`.

Q-learning (Watkins), for the transition s --a--> s' with reward r:

    Q(s, a) ← Q(s, a) + α·(r + γ·max_a' Q(s', a') − Q(s, a))       (no max term when s' ends the episode)

so Q approaches Q*(s, a) = r + γ·max_a' Q*(s', a'). With γ < 1 a win after n steps is worth γ^(n−1),
so the greedy policy prefers the shortest win. Behaviour is ε-greedy: a random action with
probability ε, else the best one (ties broken at random, so an all-zero table explores).
"""

import collections
import random
import sys
import time

ROOMS = ("hall", "armory", "library", "forge", "lair", "vault")
EXITS = {"hall": ("armory", "library", "lair"), "armory": ("hall", "forge"), "library": ("hall",),
         "forge": ("armory", "lair"), "lair": ("hall", "forge", "vault"), "vault": ("lair",)}
DOORS = {frozenset(("armory", "forge")): "red_key", frozenset(("lair", "vault")): "blue_key"}  # key needed
ITEMS = {"hall": "red_key", "armory": "sword", "forge": "ore"}  # the lair's blue key appears when the guardian falls
ACTIONS = tuple(f"go {room}" for room in ROOMS) + ("take", "craft", "fight", "open chest")
WEAPONS = ("no weapon", "a sword", "a great sword")


# A state is immutable and hashable (a Q-table key): where the player is, what it carries, what is done.
State = collections.namedtuple("State", "room red_key weapon ore guardian_down blue_key")
START = State(room="hall", red_key=False, weapon=0, ore=False, guardian_down=False, blue_key=False)


def item_here(state):
    """The item lying in the player's room, or None (taken items are in the inventory)."""
    if state.room == "lair":
        return "blue_key" if state.guardian_down and not state.blue_key else None
    item = ITEMS.get(state.room)
    taken = {None: True, "red_key": state.red_key, "sword": state.weapon > 0, "ore": state.ore or state.weapon == 2}
    return None if taken[item] else item


def describe(state):
    """The observation text a player reads in `state`."""
    carried = [name.replace("_", " ") for name in ("red_key", "ore", "blue_key") if getattr(state, name)]
    item = item_here(state)
    lines = [f"You are in the {state.room}. Exits: {', '.join(EXITS[state.room])}.",
             f"You carry {WEAPONS[state.weapon]}" + "".join(f", a {c}" for c in carried) + "."]
    if item:
        lines.append(f"There is a {item.replace('_', ' ')} here.")
    if state.room == "lair" and not state.guardian_down:
        lines.append("A guardian blocks the way to the vault.")
    if state.room == "vault":
        lines.append("A chest stands in the middle of the room.")
    return " ".join(lines)


def step(state, action):
    """(next state, reward, done, observation text). An action that cannot be done here changes
    nothing (the turn is spent); fighting the guardian without the great sword ends the game."""
    if action.startswith("go "):
        room = action[3:]
        if room not in EXITS[state.room]:
            return state, 0.0, False, f"You cannot go to the {room} from here. " + describe(state)
        key = DOORS.get(frozenset((state.room, room)))
        if key and not getattr(state, key):
            return state, 0.0, False, f"The door is locked: it needs the {key.replace('_', ' ')}. " + describe(state)
        state = state._replace(room=room)
        return state, 0.0, False, describe(state)
    if action == "take":
        item = item_here(state)
        if item is None:
            return state, 0.0, False, "There is nothing to take. " + describe(state)
        state = state._replace(weapon=1) if item == "sword" else state._replace(**{item: True})
        return state, 0.0, False, f"You take the {item.replace('_', ' ')}. " + describe(state)
    if action == "craft":
        if state.room != "forge" or state.weapon != 1 or not state.ore:
            return state, 0.0, False, "You need the sword and the ore at the forge to craft. " + describe(state)
        state = state._replace(weapon=2, ore=False)
        return state, 0.0, False, "You forge a great sword. " + describe(state)
    if action == "fight":
        if state.room != "lair" or state.guardian_down:
            return state, 0.0, False, "There is nothing to fight here. " + describe(state)
        if state.weapon < 2:
            return state, 0.0, True, f"You attack the guardian with {WEAPONS[state.weapon]} and fall. Game over."
        state = state._replace(guardian_down=True)
        return state, 0.0, False, "The guardian falls and drops a blue key. " + describe(state)
    if action == "open chest":
        if state.room != "vault":
            return state, 0.0, False, "There is no chest here. " + describe(state)
        return state, 1.0, True, "You open the chest: the treasure is yours. You win!"
    raise ValueError(f"unknown action {action!r}; choose from {ACTIONS}")


def shortest_solution(start=START):
    """The shortest winning action sequence, by breadth-first search over every reachable state
    (so its length is the optimum: no shorter win exists)."""
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        state = queue.popleft()
        for action in ACTIONS:
            nxt, reward, done, _ = step(state, action)
            if reward > 0:  # the first win found by BFS is a shortest one
                path = [action]
                while parent[state] is not None:
                    state, previous_action = parent[state]
                    path.append(previous_action)
                return path[::-1]
            if not done and nxt not in parent:
                parent[nxt] = (state, action)
                queue.append(nxt)
    return None


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


def main(argv):
    """`--key=value` overrides of q_learning's arguments (episodes, alpha, gamma, epsilon, max_steps,
    eval_every, seed)."""
    kwargs = {}
    for arg in argv:
        key, _, value = arg.lstrip("-").partition("=")
        kwargs[key] = float(value) if "." in value else int(value)
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
    main(sys.argv[1:])
