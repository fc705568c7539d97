"""
Online (iterative) DPO: DPO on pairs sampled from the policy being trained, a new round every few
iterations (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback", arXiv:2402.04792;
Xiong et al. 2024, "Iterative Preference Learning from Human Feedback", arXiv:2312.11456). SPEC §3 "DPO";
M14 §6–8.

    python train.py --algo online_dpo --init_from=out/sft                                   # labelled by the verifier
    python train.py --algo online_dpo --init_from=out/sft --online_labeler=rm --reward_model=out/rm
    python train.py --algo online_dpo --init_from=out/sft --online_labeler=judge --judge=out/judge_study/judge

What changes from dpo.py: where the train pairs come from. Offline, pairs.py samples them once from the
starting policy; here a round every online_every iterations, at its first:
  1. online_prompts fresh train prompts, group_size answers to each sampled from the CURRENT policy at
     pair_temperature (round r's prompts and sampler seed drawn from seeded_rng(seed, r));
  2. every answer scored by the labeler, higher preferred: the verifier's 0/1, the Bradley–Terry
     reward model's r_φ(x, y), or the judge's P(Verdict: correct) (judge.py, the mean over
     judge_samples judgements);
  3. one pair per prompt: chosen = its first answer of the highest score, rejected = its first of the
     lowest (first: in sampling order); no pair where every answer scores the same (the verifier: all
     right or all wrong);
  4. DPO's loss on the round's pairs for online_every iterations, batch_size pairs per step, a shuffle
     per pass seeded by (seed, round, pass) (pairs.step_batches).

π_ref stays the starting policy (init_from) through every round, as offline: the anchor does not move,
so offline and online DPO differ only in where the pairs come from. (Some iterative recipes make the
last round's policy the next round's reference instead; not done here.) Unlike the offline verifier
pairs (pairs.py's demo_chosen), no demonstration stands in as chosen where no answer is right: every
pair is the policy's own. The held-out pairs are the starting policy's verifier pairs, as offline.

Logged each iteration (the round's figures): online_round; online_pairs (pairs made); online_pair_share
(prompts with a pair: 1 − the no-pair share); online_sampled_acc (the verifier on the round's answers,
the current policy at pair_temperature); answers_sampled (so far in the run); and when the labeler is not
the verifier, its agreement with the verifier over the pairs it made: online_label_agrees (the verifier
marks the chosen answer right and the rejected one wrong) and online_label_reverses (the other way round;
the rest are pairs the verifier scores alike), with the judge's own figures (online_judge_agree, ...).

Ranks: the round's sampling is shared out over the ranks and gathered (rollouts with spread=True), every
rank labels the same answers, and π_ref's log-probs of the pairs are shared out too (dpo.reference_sums),
so every rank holds the pairs one process makes. Resume: the checkpoint keeps the round's pairs; mid-round
a resumed run trains on them, and a new round samples from the restored policy with the round's seed: the
pairs of the uninterrupted run.
"""

from types import SimpleNamespace

import torch

import dpo
from nanopost import pairs
from nanopost.checkpoints import load_judge, load_reference, load_reward_model
from nanopost.distributed import seeded_rng
from dpo import evaluate, loss, starts_from  # noqa: F401  (what online DPO does not change: DPO's loss)
from nanopost.evaluation import write_samples
from nanopost.judge import JUDGE_KEYS
from nanopost.passports import preference_passport, write_passport
from nanopost.rewards import judged_reward
from nanopost.rollouts import rollouts, score_rollout

base = "dpo"
defaults = dict(
    {k: v for k, v in dpo.defaults.items() if k not in ("pairs", "train_prompts")},  # (its train pairs: the rounds')
    online_every=4,             # iterations per round; each round samples new pairs from the current policy at its first
    online_prompts=128,         # train prompts per round (group_size answers each, at pair_temperature)
    online_labeler="verifier",  # who labels the answers: verifier (0/1) | rm (a Bradley–Terry reward
                                # model's score) | judge (judge.py's P(Verdict: correct)); chosen = the highest, rejected = the lowest
    reward_model="",            # online_labeler=rm: the reward model's checkpoint dir (python train.py --algo rm --init_from=out/sft --out_dir=out/rm)
    **JUDGE_KEYS,               # online_labeler=judge: the judge, and how many judgements per answer (judge.py)
)
LABELERS = ("verifier", "rm", "judge")
LABELLED_BY = dict(verifier="the verifier's 0/1", rm="the Bradley–Terry reward model `{reward_model}`'s score",
                   judge="the judge `{judge}`'s P(Verdict: correct) (judge_samples = {judge_samples})")


# ----------------------------------------------------------------------------------------------
# Setup: the held-out pairs (offline's), the labeler's model

def setup(run, saved):
    """π_ref, its verifier pairs on held-out prompts with their π_ref log-probs, the labeler's model, and
    the round's pairs (a resumed run's: the saved ones)."""
    check_config(run)
    cfg = run.cfg
    reference = load_reference(run)  # the held-out pairs' sampler, the reference log-probs, the KL at evaluation
    heldout, counts = pairs.builtin_pairs(run, reference, "heldout", cfg["heldout_prompts"], seed=1, kind="verifier")
    if run.master:
        print(f"online dpo: train pairs sampled each round, heldout verifier pairs {counts}")
    cache = dpo.attach_reference(run, reference, [heldout])
    write_passport(run, passport(run))
    state = SimpleNamespace(reference=reference, heldout_examples=heldout, ref_cache_path=cache, skipped_rows=0,
                            reward_model=load_reward_model(run) if cfg["online_labeler"] == "rm" else None,
                            judge=load_judge(run) if cfg["online_labeler"] == "judge" else None,
                            round=None, round_examples=None, round_figures={})
    if saved is not None:
        state.round, state.round_examples, state.round_figures = saved["round"], saved["examples"], saved["figures"]
    return state


def check_config(run):
    """What each labeler needs, and the keys it reads only (never ignored silently)."""
    cfg = run.cfg
    if cfg["online_labeler"] not in LABELERS:
        raise ValueError(f"online_labeler={cfg['online_labeler']!r}: choose from {LABELERS}")
    if cfg["group_size"] < 2:
        raise ValueError(f"online_dpo: group_size={cfg['group_size']} answer per prompt makes no pair: at least 2")
    labeler = cfg["online_labeler"]
    if labeler == "rm" and not cfg["reward_model"]:
        raise ValueError("online_labeler=rm needs --reward_model=DIR, a Bradley–Terry reward model: make one with "
                         "`python train.py --algo rm --init_from=out/sft --out_dir=out/rm`")
    if labeler == "judge" and not cfg["judge"]:
        raise ValueError("online_labeler=judge needs --judge=DIR: make one with `python experiments/judge_agreement.py "
                         "--init_from=out/sft` (it writes out/judge_study/judge)")
    for key, needs in (("reward_model", "rm"), ("judge", "judge")):
        if cfg[key] and labeler != needs:
            raise ValueError(f"--{key}={cfg[key]} is read only with online_labeler={needs} (now {labeler!r})")


def passport(run):
    c = run.cfg
    mode = (f"- online preferences (lab/online_dpo.py): every {c['online_every']} iterations a round of "
            f"{c['online_prompts']} *train* prompts × {c['group_size']} answers sampled from the current policy at "
            f"temperature {c['pair_temperature']}; per prompt chosen = the answer scored highest, rejected = the "
            f"lowest, no pair where all score alike\n"
            f"- held-out pairs: verifier pairs of `{c['init_from']}` on *heldout* prompts (disjoint by equation), fixed")
    labels = f"each round's answers scored by {LABELLED_BY[c['online_labeler']].format(**c)}"
    return preference_passport(
        run, f"the DPO loss (SPEC §3), β = {c['beta']}; the reference's log-probs computed once and cached; each "
             f"round's new pairs scored by π_ref once, at the round", references=f"π_ref = `{c['init_from']}` frozen",
        online=(mode, labels))


# ----------------------------------------------------------------------------------------------
# Each iteration: a new round at its first, then DPO's step on the round's pairs

def batches(run, state, it):
    """A new round at its first iteration (or after a resume that left none), then one optimizer step on
    the round's pairs; the round's figures every iteration."""
    round_, position = divmod(it, run.cfg["online_every"])
    if state.round != round_:
        state.round_examples, state.round_figures = sample_round(run, state, round_)
        state.round = round_
        if run.master:
            print(f"online dpo round {round_}: " + ", ".join(f"{k} {v:.4g}" for k, v in state.round_figures.items()))
    steps = pairs.step_batches(run, position, state.round_examples, keys=(round_,))
    dpo.keep_pairs(run, it, steps, state.reference)  # tokens.jsonl, for report.py
    return steps, dict(state.round_figures)


@torch.no_grad()
def sample_round(run, state, round_):
    """Round `round_`: answers from the current policy, labelled, paired -> (the pairs the loss reads, with
    their π_ref log-probs; the round's figures)."""
    cfg, G = run.cfg, run.cfg["group_size"]
    rng = seeded_rng(run, round_)
    problems = run.env.problems("train", cfg["online_prompts"], seed=int(rng.integers(2 ** 31)))
    roll = rollouts(run, run.raw_model, problems, G, temperature=cfg["pair_temperature"],
                    seed=int(rng.integers(2 ** 31)), batch_size=cfg["eval_batch_size"], spread=True)
    scores, logged = label(run, state, roll)
    made = best_and_worst(scores.tolist(), G)
    if not made:
        raise ValueError(f"online round {round_}: no pair among {len(problems)} prompts × {G} answers (the "
                         f"{cfg['online_labeler']} scored every prompt's answers alike): raise group_size, "
                         f"online_prompts or pair_temperature")
    prompts, masks = [run.tok.prompt_ids(p["prompt"]) for p in problems], roll.response_masks()
    examples = [dict(prompt=prompts[p], responses=(roll.responses[i], roll.responses[j]),
                     masks=(masks[i], masks[j]), label=1.0) for p, i, j in made]
    write_samples(run, round_ * cfg["online_every"], [f"(online round {round_}) " + pairs.describe(run, ex)
                                                     for ex in examples[:2]])
    for ex, ref in zip(examples, dpo.reference_sums(run, state.reference, examples).tolist()):
        ex["ref"] = tuple(ref)
    figures = dict(online_round=round_, online_pairs=len(made), online_pair_share=len(made) / len(problems),
                   online_sampled_acc=float(roll.verified.float().mean()),
                   answers_sampled=(round_ + 1) * len(problems) * G,
                   **{f"online_{k}": float(v.float().mean()) for k, v in logged.items()})
    if cfg["online_labeler"] != "verifier":
        figures.update(verifier_agreement(roll.verified.tolist(), made))
    return examples, figures


def label(run, state, roll):
    """(one score per answer, higher preferred; {figure: per-answer values, logged as online_<figure>}):
        verifier   the environment's 0/1
        rm         r_φ(x, y), the reward model's scalar at the answer's last token (rollouts.score_rollout)
        judge      the judge's P(Verdict: correct), the mean over judge_samples judgements (rewards.judged_reward)"""
    cfg = run.cfg
    if cfg["online_labeler"] == "rm":
        return score_rollout(run, state.reward_model, roll), {}
    if cfg["online_labeler"] == "judge":
        return judged_reward(run, state.judge, roll)
    return roll.verified, {}


def best_and_worst(scores, group_size):
    """The pairs of a round from its answers' scores (prompt-major, group_size per prompt): [(prompt,
    chosen answer, rejected answer)], answer indices into `scores`; chosen = the prompt's first answer of
    the highest score, rejected = its first of the lowest; no pair where every answer scores the same."""
    made = []
    for prompt, start in enumerate(range(0, len(scores), group_size)):
        group = range(start, start + group_size)
        best, worst = max(group, key=scores.__getitem__), min(group, key=scores.__getitem__)
        if scores[best] > scores[worst]:
            made.append((prompt, best, worst))
    return made


def verifier_agreement(verified, made):
    """Over the pairs `made` (best_and_worst's), the share the verifier orders the same way (chosen right,
    rejected wrong) and the share it orders the other way; the rest it scores alike."""
    order = [verified[chosen] - verified[rejected] for _, chosen, rejected in made]
    return dict(online_label_agrees=sum(d > 0 for d in order) / max(len(made), 1),
                online_label_reverses=sum(d < 0 for d in order) / max(len(made), 1))


def state_dict(run, state):
    """The round and its pairs (with their π_ref log-probs): a resumed run trains on what the interrupted one sampled."""
    return dict(round=state.round, examples=state.round_examples, figures=state.round_figures)
