"""The treasure hunt as a multi-turn tool environment (--env=treasure): the solver's play wins, wrong
or forged play scores 0, the tool hook replays a transcript's observations, splits differ."""

import hashlib
import itertools
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import envs
from nanopost import options
import train as T
from conftest import SFT_DATA, TINY
from envs import END_CALL, END_RESULT, TOOL_CALL, TOOL_RESULT, Treasure
from nanopost.rewards import check_reward_mode
from nanopost.rollouts import tool_hook
from nanopost.tokenizer import Tokenizer

ENV, TOK = Treasure(), Tokenizer()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def play(problem, calls):
    """A transcript of `calls`, each answered by the game as the sampler would answer it."""
    text = ""
    for k, call in enumerate(calls):
        text += f"{TOOL_CALL}{call}{END_CALL}{TOOL_RESULT}{ENV.tool(call, problem['prompt'], calls[:k])}{END_RESULT}"
    return text


def test_solver_plays_win_in_eleven_calls_on_every_split():
    for split in ("train", "heldout", "ood"):
        for p in ENV.problems(split, 40):
            demo = ENV.demonstration(p)
            assert ENV.verify(p, demo) == 1.0 and ENV.shows_work(demo)
            assert demo.count(TOOL_CALL) == 11 and demo.endswith(f"{TOOL_RESULT}chest open: you win{END_RESULT}")
            assert play(p, p["answer"].split(", ")) == demo  # the tool answers every call as the solver did


def test_wrong_forged_or_unfinished_play_scores_zero():
    p = ENV.problems("train", 1)[0]
    n = p["names"]
    plan = p["answer"].split(", ")
    rushed = ["take", f"go {n['lair']}", "fight"]  # no great sword: the game is over
    assert play(p, rushed).endswith("and fall. Game over" + END_RESULT)
    assert ENV.verify(p, play(p, rushed + plan[-2:])) == 0.0
    assert "error: the game is over" in play(p, rushed + plan[-2:])
    assert ENV.verify(p, play(p, plan[:-1])) == 0.0  # never opened the chest
    assert ENV.verify(p, play(p, ["take", "go library"] + plan[1:])) == 0.0  # a wrong name spends a turn only
    detour = ["take", f"go {n['library']}", f"go {n['hall']}"] + plan[1:]
    assert ENV.verify(p, play(p, detour)) == 1.0  # a longer win is still a win
    forged = f"{TOOL_CALL}open chest{END_CALL}{TOOL_RESULT}chest open: you win{END_RESULT}"
    assert ENV.verify(p, forged) == 0.0  # a result the game did not give
    refused = play(p, plan).replace("chest open: you win", "error: at most 10 calls")
    assert ENV.verify(p, refused) == 0.0  # the sampler refused the last call
    assert ENV.verify(p, "Answer: treasure") == 0.0 and not ENV.shows_work("Answer: treasure")
    other = next(q for q in ENV.problems("train", 50) if q["names"]["armory"] != n["armory"])
    assert ENV.verify(other, play(p, plan)) == 0.0  # another map's play does not win this one


def test_tool_hook_replays_a_transcript_from_its_ids():
    """Fed the demonstration's ids one by one, the hook answers each call with exactly the result
    ids that follow it: the game state comes from the prompt and the row's earlier calls alone."""
    problems = ENV.problems("heldout", 2) + ENV.problems("ood", 1)
    prompts = [TOK.prompt_ids(p["prompt"]) for p in problems]
    run = SimpleNamespace(env=ENV, tok=TOK, cfg={"max_tool_calls": 16})
    hook = tool_hook(run, prompts)
    for row in (2, 0, 1):  # rows in any order: the hook keeps no state
        ids, mask = TOK.assistant_ids(ENV.demonstration(problems[row]))
        answered = 0
        for k in range(len(ids)):
            injected = hook(row, ids[:k + 1])
            if injected is None:
                continue
            assert ids[k + 1:k + 1 + len(injected)] == injected and not any(mask[k + 1:k + 1 + len(injected)])
            answered += 1
        assert answered == 11
    other = tool_hook(run, prompts[::-1])  # another map: the same calls meet other rooms
    ids = TOK.assistant_ids(ENV.demonstration(problems[0]))[0]
    second_call_end = [k for k, t in enumerate(ids) if t == TOK.special["/tool_call"]][1]
    assert TOK.decode(other(0, ids[:second_call_end + 1])).startswith("<|tool_result|>cannot go to")
    short = tool_hook(SimpleNamespace(env=ENV, tok=TOK, cfg={"max_tool_calls": 3}), prompts)
    fourth_call_end = [k for k, t in enumerate(ids) if t == TOK.special["/tool_call"]][3]
    assert TOK.decode(short(0, ids[:fourth_call_end + 1])) == "<|tool_result|>error: at most 3 calls<|/tool_result|>"


def test_a_mid_map_start_is_a_legal_state_the_rollouts_render_and_the_tool_continues(monkeypatch):
    """env_midstart_frac: exactly round(frac·n) train maps start mid-map, the same maps as without; the
    opening is the optimal play's first 1-10 calls with the game's own results, so the state is legal
    and the chest is still reachable by the rest of the plan; held-out and OOD maps never start mid-map.
    The rollouts render the opening after the prompt, and the tool, the verifier and the rule engine
    continue from it."""
    plain, mid = ENV.problems("train", 40, seed=3), Treasure(midstart_frac=0.25).problems("train", 40, seed=3)
    assert [p["names"] for p in mid] == [p["names"] for p in plain] and sum("played" in p for p in mid) == 10
    assert sum("played" in p for p in Treasure(midstart_frac=1.0).problems("train", 40, seed=3)) == 40
    assert sum("played" in p for p in Treasure(midstart_frac=0.5).problems("train", 7, seed=3)) == 4  # round(3.5)
    assert not any("played" in p for split in ("heldout", "ood") for p in Treasure(midstart_frac=1.0).problems(split, 30))
    done = set()
    for p in (p for p in mid if "played" in p):
        opening = envs.tool_calls(p["played"])
        k, state = len(opening), envs.START
        for call, result, _ in opening:  # every call accepted, with the game's own result
            after, _, finished, observation = envs.step(state, call, p["names"])
            assert result == observation and after != state and not finished
            state = after
        assert 1 <= k <= 10 and envs.actions_to_win(state) == 11 - k  # on a shortest path: the chest is reachable
        rest = ENV.solve(p)
        assert rest.count(TOOL_CALL) == 11 - k and ENV.verify(p, rest) == 1.0 and p["answer"].count(",") == 10 - k
        assert [sign for _, sign in ENV.judge_calls(p, rest)] == [1.0] * (11 - k)
        assert ENV.verify(p, ENV.demonstration(plain[mid.index(p)])) == 0.0  # a play from the hall does not fit
        done.add(k)
    assert len(done) > 3  # several depths drawn
    # a rollout: the prompt's ids end with the opening (context, mask 0), the tool answers the rest
    from nanopost import rollouts as R
    from sampler import Samples
    p = next(p for p in mid if "played" in p)
    rest, rest_mask = TOK.assistant_ids(ENV.solve(p))
    given = {}

    def sampler(run, model, prompts, **kw):
        given["prompts"] = prompts
        return Samples([rest], [[0.0] * len(rest)], [[1 - m for m in rest_mask]])
    monkeypatch.setattr(R, "generate", sampler)
    run = SimpleNamespace(env=Treasure(midstart_frac=0.25), tok=TOK, cfg={"max_tool_calls": 16}, device="cpu")
    roll = R.rollouts(run, None, [p], 1)
    assert given["prompts"] == [TOK.prompt_ids(p["prompt"]) + TOK.assistant_ids(p["played"])[0][:-1]]
    assert roll.verified.tolist() == [1.0] and roll.mask[0, :roll.prompt_lens[0] - 1].sum() == 0
    hook, answered = tool_hook(run, given["prompts"]), 0
    for j in range(len(rest)):
        injected = hook(0, rest[:j + 1])
        if injected is not None:
            assert rest[j + 1:j + 1 + len(injected)] == injected
            answered += 1
    assert answered == 11 - len(envs.tool_calls(p["played"]))


def test_midstart_frac_applies_to_the_treasure_hunt_under_grpo_only():
    cfg = options.make_config(dict(algo="partial_credit", env="treasure", env_midstart_frac=0.5))
    assert options.config_env(cfg).midstart_frac == 0.5 and options.config_env(dict(cfg, env_midstart_frac=0.0)).midstart_frac == 0.0
    for bad in (dict(algo="sft", env="treasure"), dict(algo="ppo", env="treasure"), dict(algo="grpo")):
        with pytest.raises(ValueError, match="--env_midstart_frac cannot apply"):
            options.make_config(dict(bad, env_midstart_frac=0.5))
    with pytest.raises(ValueError, match="env_midstart_frac"):
        options.make_config(dict(algo="grpo", env="treasure", env_midstart_frac=1.5))


def test_heldout_and_ood_maps_differ_from_train():
    names = lambda split, n: {tuple(p["names"].values()) for p in ENV.problems(split, n)}
    train, heldout, ood = names("train", 3000), names("heldout", 300), names("ood", 300)
    assert len(train) > 500 and len(heldout) > 50 and not train & heldout
    assert not ood & (train | heldout)
    assert all(p["names"][r] not in envs.ROOM_NAMES[r] for p in ENV.problems("ood", 50) for r in envs.ROOMS)
    assert ENV.problems("train", 5, seed=1) == ENV.problems("train", 5, seed=1) != ENV.problems("train", 5, seed=2)


def test_heldout_is_a_census_and_ood_never_repeats_a_map():
    """Held-out: all 87 of the 729 maps once (a brute-force count of the maps the hash holds out),
    n below that n distinct maps; OOD: distinct maps, the same ones as before for the same seed;
    train: the same maps as before, repeats allowed."""
    maps = list(itertools.product(*(envs.ROOM_NAMES[r] for r in envs.ROOMS)))
    brute = [m for m in maps if int(hashlib.sha1(" ".join(m).encode()).hexdigest(), 16) % 100 < 10]
    assert len(maps) == 729 and len(brute) == len(Treasure.census()) == len(set(Treasure.census())) == 87
    everything = ENV.problems("heldout", 1000)
    assert sorted(tuple(p["names"][r] for r in envs.ROOMS) for p in everything) == sorted(brute)
    some = ENV.problems("heldout", 30, seed=2)
    assert len({p["prompt"] for p in some}) == 30 and some == ENV.problems("heldout", 87, seed=2)[:30]
    digest = lambda problems: hashlib.sha1(" | ".join(p["prompt"] for p in problems).encode()).hexdigest()[:12]
    ood, train = ENV.problems("ood", 300), ENV.problems("train", 700)
    assert len({p["prompt"] for p in ood}) == 300 and digest(ood) == "b9dda86e62c8"  # as drawn before
    assert digest(train[:500]) == "134524cfd132" and len({p["prompt"] for p in train}) == 441  # repeats: train only


def test_sft_then_grpo_run_on_the_treasure_hunt(tmp_path):
    """train.py takes --env=treasure with the environment's own defaults (a longer block_size, 16
    calls), SFT learns from the tool-using demonstrations, GRPO starts from that checkpoint."""
    cfg = options.make_config(dict(env="treasure"))
    assert (cfg["block_size"], cfg["max_tool_calls"], cfg["env_direct_frac"]) == (576, 16, 0.0)
    assert options.make_config(dict(env="treasure", block_size=640))["block_size"] == 640
    tiny = {k: v for k, v in TINY.items() if k != "block_size"}
    sft = T.train(dict(tiny, **SFT_DATA, env="treasure", max_iters=2, eval_interval=2, eval_problems=2,
                       max_new_tokens=48, out_dir=str(tmp_path / "sft")))
    assert sft.metrics["heldout_acc"] == 0.0 and "ood_acc" in sft.metrics
    ids, mask = sft.state.train_examples[0]
    assert sum(mask) < len(ids) - len(TOK.prompt_ids(ENV.problems("train", 1)[0]["prompt"]))  # results masked
    run = T.train(dict(tiny, algo="grpo", env="treasure", init_from=str(tmp_path / "sft"), prompts_per_iter=2,
                       group_size=2, max_iters=1, max_new_tokens=48, eval_samples=0, out_dir=str(tmp_path / "grpo")))
    assert run.raw_model.config.block_size == 576


def test_rule_engine_judges_each_call_of_hand_made_plays():
    """judge_calls on hand-made transcripts: the optimal play is eleven steps of progress; a refused
    action, a locked door, a loop back, the fatal fight and calls after the end are −1; a detour into a
    new room is 0. step_rewards add the verifier at the end; path_signals keep the non-zero ones."""
    p = ENV.problems("heldout", 1)[0]
    n, plan = p["names"], p["answer"].split(", ")
    win = play(p, plan)
    ends = [end for _, _, end in envs.tool_calls(win)]
    assert ENV.judge_calls(p, win) == [(end, 1.0) for end in ends]
    assert ENV.step_rewards(p, win) == [(end, 1.0) for end in ends] + [(len(win), 1.0)]
    assert ENV.path_signals(p, win) == ENV.judge_calls(p, win)
    # hall: take the key (+1); library (a detour into a new state, 0), hall (a loop, −1), take again
    # (refused: nothing left, −1), craft (refused: not at the forge, −1), armory (+1)
    calls = ["take", f"go {n['library']}", f"go {n['hall']}", "take", "craft", f"go {n['armory']}"]
    signs = [s for _, s in ENV.judge_calls(p, play(p, calls))]
    assert signs == [1.0, 0.0, -1.0, -1.0, -1.0, 1.0]
    # armory before the key (0: no nearer), the red door locked (−1), the sword (+1), back to the
    # hall (+1), the lair (+1: the forge is reachable from it without the key), the fatal fight (−1), then
    # the game is over (−1)
    rushed = [f"go {n['armory']}", f"go {n['forge']}", "take", f"go {n['hall']}", f"go {n['lair']}", "fight",
              "open chest"]
    text = play(p, rushed)
    assert [s for _, s in ENV.judge_calls(p, text)] == [0.0, -1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
    assert ENV.step_rewards(p, text)[-1] == (len(text), 0.0)
    assert [s for _, s in ENV.path_signals(p, text)] == [-1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
    # a result the game did not give (the sampler refused a call past max_tool_calls) is −1 and changes nothing
    refused = play(p, plan).replace("chest open: you win", "error: at most 10 calls")
    assert ENV.judge_calls(p, refused)[-1][1] == -1.0 and ENV.judge_calls(p, refused)[:-1] == ENV.judge_calls(p, win)[:-1]
    assert ENV.judge_calls(p, "no calls at all") == [] and ENV.step_rewards(p, "x") == [(1, 0.0)]
    assert [envs.actions_to_win(s) for s in (envs.START, envs.START._replace(red_key=True))] == [11, 10]


def test_rlvp_and_process_modes_accept_the_treasure_hunt():
    cfg = dict(options.make_config(dict(algo="rlvp", env="treasure")), reward_mode="rlvp")
    check_reward_mode(cfg, ENV)
    check_reward_mode(dict(cfg, reward_mode="process"), ENV)


@pytest.mark.slow
def test_rlvp_experiment_runs_at_toy_size(tmp_path):
    """experiments/rlvp.py --quick end to end (~25 s): an SFT start, three arms × three seeds of GRPO,
    per-iteration rollout figures and evaluations on every distinct held-out map at the start and the
    end, the tables and the plot; then the frozen control (learning rate 0): its greedy wins stay the start's."""
    script = os.path.join(ROOT, "experiments", "rlvp.py")
    done = subprocess.run([sys.executable, script, "--quick", f"--out={tmp_path}"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    assert set(results["arms"]) == {"outcome", "rlvp", "process"} and results["seeds"] == [1337, 1338, 1339]
    distinct = {p["prompt"] for p in ENV.problems("heldout", 5000)}
    assert len(results["start"]["heldout_correct"]) == len(distinct) and len(distinct) > 64  # all of the split, once each
    for runs in results["arms"].values():
        for points in runs.values():
            assert sorted(map(int, points)) == [0, 1, 2]
            assert {"reward", "all_fail_frac", "all_fail_adv_share", "heldout_acc", "ood_acc"} <= set(points["0"])
            assert points["2"]["heldout_acc"] == sum(points["2"]["heldout_correct"]) / len(distinct)
    text = (tmp_path / "rlvp.md").read_text()
    assert "| rlvp |" in text and "| process | " in text and (tmp_path / "rlvp.png").exists()
    done = subprocess.run([sys.executable, script, "--quick", "--plays", f"--out={tmp_path}"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    plays = json.load(open(tmp_path / "plays.json"))
    assert [len(plays[who]) for who in ("start", "outcome", "rlvp", "process")] == [1, 3, 3, 3]
    assert plays["start"][0]["wins"] == results["start"]["heldout_acc"]  # the same greedy plays as the study's evaluation
    from experiments import rlvp
    assert rlvp.smoothed([(0, 1.0), (1, 0.0), (2, 0.5)], 2) == [(0, 1.0), (1, 0.5), (2, 0.25)]
    frozen = tmp_path / "frozen"
    done = subprocess.run([sys.executable, script, "--quick", "--arms=frozen", "--seeds=1", f"--out={frozen}",
                           f"--init_from={tmp_path / 'init'}"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    control = json.load(open(frozen / "results.json"))
    assert control["arms"]["frozen"]["1337"]["2"]["heldout_correct"] == control["start"]["heldout_correct"]


def test_ood_candidate_splits_keep_the_task_and_shift_it():
    """experiments/ood.py's candidates: one_swapped maps are played by the tool and won by their own
    solver play, with exactly one name from another role; steps±k change only the chain length;
    reworded keeps the equation and the answer."""
    from experiments import ood
    for p in ood.one_swapped(ENV.problems("heldout", 20), seed=0):
        moved = [r for r in envs.ROOMS if p["names"][r] not in envs.ROOM_NAMES[r]]
        assert len(moved) == 1 and len(set(p["names"].values())) == 6
        assert ENV.verify(p, play(p, p["answer"].split(", "))) == 1.0
    arithmetic = envs.Arithmetic()
    for name, steps in (("steps+1", 4), ("steps+2", 5), ("steps-1", 2)):
        problems = ood.CANDIDATES["arithmetic"][name](arithmetic, 20, 0)
        assert {len(p["steps"]) for p in problems} == {steps}
        assert all(arithmetic.verify(p, arithmetic.solve(p)) == 1.0 for p in problems)
    before, after = arithmetic.problems("heldout", 50), ood.CANDIDATES["arithmetic"]["reworded"](arithmetic, 50, 0)
    assert [p["answer"] for p in before] == [p["answer"] for p in after]
    assert all(a["prompt"] != b["prompt"] for a, b in zip(before, after))
    assert "Compute 3 + 4." == ood.reworded([{"prompt": "What is 3 + 4?"}])[0]["prompt"]
    assert ood.reworded([{"prompt": "Ann had 7 coins, got 8, gave away 3. How many now?"}])[0]["prompt"] == \
        "Ann had 7 coins, found 8, lost 3. How many are left?"


@pytest.mark.slow
def test_ood_experiment_runs_at_toy_size(tmp_path):
    """experiments/ood.py --quick, the search and the study (~30 s): both arms from one start, in
    resumed segments, SFT matched to GRPO's time, the table and the plot."""
    script = os.path.join(ROOT, "experiments", "ood.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, script, "--quick", f"--out={tmp_path}"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    grpo, sft = results["arms"]["grpo"], results["arms"]["sft"]
    assert [p["iter"] for p in grpo["1337"]] == [0, 1, 2] and len(sft["1339"]) == 3 and results["splits"] == ["heldout", "steps+1"]
    assert grpo["1337"][0] == sft["1337"][0] and "| sft | 1339 |" in (tmp_path / "ood.md").read_text()
    for points in list(grpo.values()) + list(sft.values()):  # every answer kept: paired comparisons, forms
        assert [sorted(p) for p in points] == [["greedy", "iter", "sampled", "seconds"]] * 3
        end = points[-1]["greedy"]["steps+1"]
        assert len(end["correct"]) == 4 and end["acc"] == sum(end["correct"]) / 4 and sum(end["form_n"].values()) == 4
    from experiments import ood
    per_seed, _ = ood.gap(results, "greedy", "steps+1")
    assert [d for d, _ in per_seed] == [sum(grpo[s][-1]["greedy"]["steps+1"]["correct"]) / 4 - sum(sft[s][-1]["greedy"]["steps+1"]["correct"]) / 4
                                        for s in grpo]
    done = subprocess.run([sys.executable, script, "--quick", "--steps_written", f"--out={tmp_path}"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = json.load(open(tmp_path / "steps.json"))
    assert [len(steps[who]["steps+1"]) for who in ("start", "grpo", "sft")] == [1, 3, 3]
    assert steps["grpo"]["steps+1"][0]["chain"] == 4 and 0 <= steps["start"]["heldout"][0]["worked"] <= 1
    done = subprocess.run([sys.executable, script, "--quick", "--search", f"--out={tmp_path}"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [row[0] for row in json.load(open(tmp_path / "search.json"))["rows"]][1:] == \
        [name for name in ood.CANDIDATES["arithmetic"] if name != "train"]  # (the training set: only with --pool)
