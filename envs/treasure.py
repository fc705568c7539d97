"""The treasure hunt: the game (qlearn.py's) and the language-model environment."""

import collections
import functools
import hashlib
import itertools
import random
import re
import string

from envs.arithmetic import HELDOUT_PERCENT
from envs.calculator import END_CALL, END_RESULT, TOOL_CALL, TOOL_RESULT, tool_calls

# ----------------------------------------------------------------------------------------------
# The treasure hunt [SPEC §3 Q-learning, §4; Ch7 Exp 7-1]: qlearn.py's tabular agent and the
# language-model agent (--env=treasure, below) play this one game. Six rooms, named by their role:
# a red key lies in the hall, a sword in the armory; the red door from the armory opens the forge,
# where ore lies and the sword can be crafted into a great sword. Only the great sword beats the
# guardian of the lair (fighting it with less is death: the game ends with reward 0); the beaten
# guardian drops the blue key of the vault, whose chest is the treasure: reward 1 for opening it,
# 0 for everything else. The library is a dead end.
#
#     hall ── armory ══red door══ forge
#      │  ╲                         │
#   library  ╲──── lair ────────────┘
#                   ║ blue door
#                 vault (chest)
#
# The shortest win is 11 actions (take, go armory, take, go forge, take, craft, go lair, fight,
# take, go vault, open chest); shortest_solution proves it by breadth-first search. Text in, text
# out: `names` maps each role to the name the player reads and writes ("go crypt"); without it a
# room is called by its role.

ROOMS = ("hall", "armory", "library", "forge", "lair", "vault")
EXITS = {"hall": ("armory", "library", "lair"), "armory": ("hall", "forge"), "library": ("hall",),
         "forge": ("armory", "lair"), "lair": ("hall", "forge", "vault"), "vault": ("lair",)}
DOORS = {frozenset(("armory", "forge")): "red_key", frozenset(("lair", "vault")): "blue_key"}  # key needed
ROOM_ITEMS = {"hall": "red_key", "armory": "sword", "forge": "ore"}  # the lair's blue key appears when the guardian falls
WEAPONS = ("no weapon", "a sword", "a great sword")
BY_ROLE = {room: room for room in ROOMS}

# A state is immutable and hashable (a Q-table key): where the player is, what it carries, what is done.
State = collections.namedtuple("State", "room red_key weapon ore guardian_down blue_key")
START = State(room="hall", red_key=False, weapon=0, ore=False, guardian_down=False, blue_key=False)


def actions(names=BY_ROLE):
    """The commands a player may write."""
    return tuple(f"go {names[room]}" for room in ROOMS) + ("take", "craft", "fight", "open chest")


def item_here(state):
    """The item lying in the player's room, or None (taken items are in the inventory)."""
    if state.room == "lair":
        return "blue_key" if state.guardian_down and not state.blue_key else None
    item = ROOM_ITEMS.get(state.room)
    taken = {None: True, "red_key": state.red_key, "sword": state.weapon > 0, "ore": state.ore or state.weapon == 2}
    return None if taken[item] else item


def describe(state, names=BY_ROLE):
    """The observation a player reads on entering a room: its name and what is in it ("lair: guardian")."""
    things = [item_here(state)] + [state.room == "lair" and not state.guardian_down and "guardian",
                                   state.room == "vault" and "chest"]
    return f"{names[state.room]}: " + (", ".join(t.replace("_", " ") for t in things if t) or "nothing")


def step(state, action, names=BY_ROLE):
    """(next state, reward, done, observation text). An action that cannot be done here changes
    nothing (the turn is spent); fighting the guardian without the great sword ends the game."""
    if action.startswith("go "):
        room = {name: role for role, name in names.items()}.get(action[3:])
        if room not in EXITS[state.room]:
            return state, 0.0, False, f"cannot go to {action[3:]} from here"
        key = DOORS.get(frozenset((state.room, room)))
        if key and not getattr(state, key):
            return state, 0.0, False, f"locked: needs the {key.replace('_', ' ')}"
        state = state._replace(room=room)
        return state, 0.0, False, describe(state, names)
    if action == "take":
        item = item_here(state)
        if item is None:
            return state, 0.0, False, "nothing to take"
        state = state._replace(weapon=1) if item == "sword" else state._replace(**{item: True})
        return state, 0.0, False, f"took {item.replace('_', ' ')}"
    if action == "craft":
        if state.room != "forge" or state.weapon != 1 or not state.ore:
            return state, 0.0, False, "crafting needs the sword and ore at the forge"
        return state._replace(weapon=2, ore=False), 0.0, False, "forged a great sword"
    if action == "fight":
        if state.room != "lair" or state.guardian_down:
            return state, 0.0, False, "nothing to fight"
        if state.weapon < 2:
            return state, 0.0, True, f"you fight with {WEAPONS[state.weapon]} and fall. Game over"
        state = state._replace(guardian_down=True)
        return state, 0.0, False, "guardian beaten. " + describe(state, names)
    if action == "open chest":
        if state.room != "vault":
            return state, 0.0, False, "no chest here"
        return state, 1.0, True, "chest open: you win"
    raise ValueError(f"unknown action {action!r}; choose from {actions(names)}")


def shortest_solution(start=START, names=BY_ROLE):
    """The shortest winning action sequence, by breadth-first search over every reachable state
    (so its length is the optimum: no shorter win exists)."""
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        state = queue.popleft()
        for action in actions(names):
            nxt, reward, done, _ = step(state, action, names)
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
# Treasure (--env=treasure): the treasure hunt as a multi-turn game for the language model, played
# through the tool machinery. The prompt is the map; each action is a call, and the game's
# observation comes back as its result (forced tokens, never trained on); the response ends after
# the chest opens:
#
#   <|tool_call|>take<|/tool_call|><|tool_result|>took red key<|/tool_result|><|tool_call|>go arsenal<|/tool_call|>
#   <|tool_result|>arsenal: sword<|/tool_result|> ... <|tool_call|>open chest<|/tool_call|><|tool_result|>chest open: you win<|/tool_result|>
#
# No game state is kept anywhere: each call replays the response's earlier calls from the start the
# prompt's map describes (Treasure.tool, given the prompt and the earlier calls by rollouts.tool_hook),
# so rows pause and resume independently and a transcript alone determines its episode. A mid-map
# start (env_midstart_frac) is a prompt followed by the opening calls already played, which the tool
# replays first.
#
# What varies is the rooms' names. Each role has three (ROOM_NAMES), 3^6 = 729 maps; "train" and
# "heldout" are disjoint by map (a hash holds out 10%), so a held-out map is a combination of names
# never trained on. "ood" names every room from another role's three (the sword in the "crypt"), so
# only reading the map, not a name's usual role, wins there. The map's shape and the items' places,
# and so the shape of the plan, are the same in every problem.

ROOM_NAMES = {"hall": ("hall", "yard", "porch"), "armory": ("armory", "arsenal", "barracks"),
              "library": ("library", "study", "attic"), "forge": ("forge", "smelter", "smithy"),
              "lair": ("lair", "den", "cave"), "vault": ("vault", "crypt", "cellar")}
MIDSTART_MAX = 10  # a mid-map start has played at most 10 of the 11 actions: the chest is still to open
MAP_TEXT = ("Paths: {hall}-{armory}, {hall}-{library}, {hall}-{lair}, {armory}-{forge} (red door), {forge}-{lair}, "
            "{lair}-{vault} (blue door). {hall}: red key. {armory}: sword. {forge}: ore. {lair}: guardian. "
            "{vault}: chest. You are in the {hall}.")


@functools.lru_cache(maxsize=None)
def _map_pattern(text):
    """A regex that reads the names back out of a map written from `text`: each role's first place
    captures its name, the later ones must repeat it (made on first use: a run of another task never
    needs it)."""
    pattern, seen = "", set()
    for literal, role, _, _ in string.Formatter().parse(text):
        pattern += re.escape(literal)
        if role:
            pattern += f"(?P={role})" if role in seen else f"(?P<{role}>[a-z]+)"
            seen.add(role)
    return re.compile(pattern)


def transcript(episode):
    """[(action, observation)] as the calls and results a play writes."""
    return "".join(f"{TOOL_CALL}{action}{END_CALL}{TOOL_RESULT}{observation}{END_RESULT}" for action, observation in episode)


@functools.lru_cache(maxsize=None)
def actions_to_win(state):
    """The fewest actions that still win from `state` (BFS over the game; rooms by role, so one table
    serves every map); None once no win is reachable."""
    path = shortest_solution(start=state)
    return None if path is None else len(path)


@functools.lru_cache(maxsize=None)
def optimal_episode(names):
    """[(action, observation)] of the shortest win (BFS), rooms called by `names` (a tuple in ROOMS
    order); cached: a map's solution is searched once."""
    names, state, out = dict(zip(ROOMS, names)), START, []
    for action in shortest_solution(names=names):
        state, _, _, observation = step(state, action, names)
        out.append((action, observation))
    return tuple(out)


class Treasure:
    name = "treasure"
    # train.py's defaults under --env=treasure (the command line still overrides them): a map of about
    # 200 tokens and the 11-call win with its observations, about 270 (538 at most, with the longest
    # names); every demonstration plays, there is no bare answer to mix in
    train_defaults = dict(block_size=576, max_new_tokens=320, max_tool_calls=16, env_direct_frac=0.0)

    def __init__(self, digits=1, n_ops=3, direct_frac=0.0, midstart_frac=0.0):
        # train.py passes every env the arithmetic knobs; the treasure hunt has no use for them
        if (digits, n_ops, direct_frac) != (1, 3, 0.0):
            raise ValueError("env_digits, env_ops and env_direct_frac set the arithmetic task; the treasure hunt "
                             "has one map shape, and a bare answer is no way to play it")
        if not 0.0 <= midstart_frac <= 1.0:
            raise ValueError(f"env_midstart_frac={midstart_frac}: a share of the train maps, in [0, 1]")
        self.midstart_frac = midstart_frac  # (train.py's env_midstart_frac)

    # -- problems ---------------------------------------------------------------------------
    @staticmethod
    def _split_of(names):
        key = " ".join(names[room] for room in ROOMS)
        return "heldout" if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT else "train"

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def census():
        """Every held-out map once, as a tuple of names in ROOMS order, in the order of
        itertools.product over ROOM_NAMES: 87 of the 729 maps."""
        return tuple(names for names in itertools.product(*(ROOM_NAMES[room] for room in ROOMS))
                     if Treasure._split_of(dict(zip(ROOMS, names))) == "heldout")

    def problems(self, split, n, seed=0):
        """n maps of `split`: "train" / "heldout" (each role named from its own three, disjoint by
        map) or "ood" (each role named from another role's three).
        "heldout" is small, so an evaluation is a census: its 87 maps (`census`) in a seeded shuffle,
        the first n; n ≥ 87 gives every map once. "ood" holds 4,625,505 maps: n drawn uniformly
        without replacement (a repeat is drawn again). "train" draws with replacement (a map may
        recur; seeded, so the same seed gives the same maps).
        Mid-map starts (midstart_frac > 0, "train" only): round(midstart_frac·n) of the n maps, chosen
        by a seeded draw of their own (the maps are the same as without), start after the optimal
        play's first k actions, k uniform in 1..MIDSTART_MAX: problem["played"] holds them with the
        game's results, which the rollouts render as the assistant's opening (forced context, never
        trained on), so that the chest-bound actions are sampled (a reverse curriculum: Salimans &
        Chen 2018, arXiv:1812.03381; Xi et al. 2024, R^3, arXiv:2402.05808)."""
        if split not in ("train", "heldout", "ood"):
            raise ValueError(f"split must be train, heldout or ood, got {split!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        if split == "heldout":
            maps = list(self.census())
            rng.shuffle(maps)
            return [self._problem(dict(zip(ROOMS, names))) for names in maps[:n]]
        everything = sorted(name for names in ROOM_NAMES.values() for name in names)
        out, seen = [], set()
        while len(out) < n:
            if split == "ood":
                names = dict(zip(ROOMS, rng.sample(everything, len(ROOMS))))
                if any(names[room] in ROOM_NAMES[room] for room in ROOMS) or tuple(names.values()) in seen:
                    continue
                seen.add(tuple(names.values()))
            else:
                names = {room: rng.choice(ROOM_NAMES[room]) for room in ROOMS}
                if self._split_of(names) != split:
                    continue
            out.append(self._problem(names))
        if split == "train" and self.midstart_frac:
            rng = random.Random(f"{self.name}-midstart-{seed}")
            for i in rng.sample(range(n), round(self.midstart_frac * n)):
                out[i] = self._problem(out[i]["names"], played=rng.randint(1, MIDSTART_MAX))
        return out

    @staticmethod
    def _problem(names, played=0):
        """The problem of a map ({role: name}): its text, its names and the optimal plan; with `played`
        > 0 the plan's first `played` actions are done (problem["played"], their transcript) and the
        answer is the rest."""
        episode = optimal_episode(tuple(names[room] for room in ROOMS))
        problem = {"prompt": MAP_TEXT.format(**names), "names": names,
                   "answer": ", ".join(action for action, _ in episode[played:])}
        if played:
            problem["played"] = transcript(episode[:played])
        return problem

    @staticmethod
    def _opening(problem):
        """(state, the states visited) where a play of `problem` begins: START, or after the calls of
        problem["played"] (a mid-map start)."""
        names, state, seen = problem["names"], START, {START}
        for call, _, _ in tool_calls(problem.get("played", "")):
            state = step(state, call, names)[0]
            seen.add(state)
        return state, seen

    # -- the game as a tool, solver, verifier -------------------------------------------------
    @staticmethod
    def _act(state, done, call, names):
        """(state, done, observation, reward) of one call: an action, or an error that spends the turn."""
        call = call.strip()
        if done:
            return state, True, "error: the game is over", 0.0
        if call not in actions(names) and not call.startswith("go "):  # (a room not on the map: step says so)
            return state, False, "error: write go ROOM, take, craft, fight or open chest", 0.0
        state, reward, done, observation = step(state, call, names)
        return state, done, observation, reward

    def tool(self, call, prompt, earlier):
        """The observation for `call`: the map read from the prompt, the earlier calls replayed from
        the start (rollouts.tool_hook gives all three, each row's own)."""
        found = _map_pattern(MAP_TEXT).search(prompt)
        if found is None:
            return "error: no map in the prompt"
        names, state, done = found.groupdict(), START, False
        played = [call for call, _, _ in tool_calls(prompt[found.end():])]  # a mid-map start's opening, rendered
        for previous in played + list(earlier):
            state, done, _, _ = self._act(state, done, previous, names)
        return self._act(state, done, call, names)[2]

    @staticmethod
    def solve(problem):
        """The optimal play (BFS): every action of shortest_solution as a call with its observation (after
        a mid-map start, the actions still to play)."""
        episode = optimal_episode(tuple(problem["names"][room] for room in ROOMS))
        return transcript(episode[len(tool_calls(problem.get("played", ""))):])

    def demonstration(self, problem):
        """The SFT target: the optimal play."""
        return self.solve(problem)

    @staticmethod
    def shows_work(response):
        """True when the response plays (writes a call)."""
        return TOOL_CALL in response

    @staticmethod
    def parses(response):
        """True when the response plays at least one call (the game has no answer line)."""
        return bool(tool_calls(response))

    def verify(self, problem, response):
        """1.0 when the calls, replayed from where the play begins (START, or a mid-map start's opening),
        open the chest, and every result up to that call is the one the game gives: a call the sampler
        refused (past max_tool_calls) or a result the model wrote itself never counts. The response may
        end there or go on; nothing after counts."""
        names, state, done = problem["names"], self._opening(problem)[0], False
        for call, result, _ in tool_calls(response):
            state, done, observation, reward = self._act(state, done, call, names)
            if result != observation:
                return 0.0
            if reward > 0:
                return 1.0
        return 0.0

    # -- the rule engine: step rewards (process) and path signals (RLVP) ---------------------------
    def judge_calls(self, problem, response):
        """[(character offset just after the call, +1, 0 or −1)] for every call, the calls replayed
        from where the play begins (a mid-map start's opening counts as visited; SPEC §3 RLVP, Process
        vs outcome; each judgement is a fact of the game):
          +1 progress: an action the game accepts that brings the chest one action nearer (the fewest
             actions left to win, by BFS, falls by one): taking the red key, the sword, the ore or the
             blue key, crafting, beating the guardian, each room toward the next goal (through a door
             once its key is held), opening the chest;
          −1 a refused action (the game answers "cannot go", "locked", "nothing to take", an error,
             or a call after the game ended), a result that is not the game's (a call past
             max_tool_calls), a wasted action (back to a state already visited in this episode: a
             loop), and the fatal fight without the great sword;
           0 anything else: an accepted action into a new state that is no nearer (the dead-end
             library). No call, no judgement: absence of progress is never penalised."""
        (state, seen), names, done, out = self._opening(problem), problem["names"], False, []
        for call, result, end in tool_calls(response):
            after, done_after, observation, reward = self._act(state, done, call, names)
            if result != observation or after == state and not done_after or done_after and reward == 0 or done:
                sign = -1.0  # refused, not the game's result, fatal, or after the end (the state is kept)
            elif reward > 0:
                sign = 1.0  # the chest
            elif after in seen:
                sign = -1.0  # a loop: wasted, even where it undoes a detour
            else:
                sign = 1.0 if actions_to_win(after) == actions_to_win(state) - 1 else 0.0
            if result == observation:
                state, done = after, done_after
                seen.add(state)
            out.append((end, sign))
        return out

    def step_rewards(self, problem, response):
        """Process rewards (V-IRL's shape): each call's judgement (+1 progress, −1 refused, wasted or
        fatal, 0 otherwise), and the verifier's reward at the end of the response."""
        return self.judge_calls(problem, response) + [(len(response), self.verify(problem, response))]

    def path_signals(self, problem, response):
        """RLVP's rule engine: the calls judged +1 (verifiable progress, paired with the penalty of
        its opposite) or −1 (a machine-detectable bad action); the algorithm weighs them +μ / −λ."""
        return [(end, sign) for end, sign in self.judge_calls(problem, response) if sign != 0]

    def corpus(self, n, seed=0):
        """Pre-training text: optimal plays of train maps."""
        return [self.solve(p) for p in self.problems("train", n, seed)]
