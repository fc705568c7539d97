"""
Preference data shared by the reward model (rm.py) and the direct methods (dpo.py and its lab
variants): pairs from a file or built from the environment, and their batches. SPEC §3 "Reward
model", "DPO"; M14 §3–5.

- built in (--data=""): prompts of the environment's train split (held-out pairs: heldout split,
  so the two never share an equation). The model named by init_from samples `group_size`
  answers per prompt at `pair_temperature`, and --pairs picks the kind of preference:
    verifier  chosen = an answer the verifier accepts, rejected = one it refuses; demo_chosen: when
              no sample is correct, the solver's demonstration stands in as chosen (demo_chosen)
              (counted as demo_chosen in the printed counts); builtin_pairs(..., demo_fallback=False)
              drops that stand-in: such a prompt makes no pair, as in online DPO (counted as
              no_right_sample; experiments/online_dpo.py's offline arm);
    style     both correct: chosen = the concise demonstration, rejected = the same answer padded
              with filler sentences, so that length effects can be seen;
    both      one pair of each kind per prompt.
  Sampled answers stay token ids (they are never decoded and re-encoded for training).
  (Online DPO, lab/online_dpo.py, samples its train pairs each round from the policy instead.)
- --data=FILE (json / jsonl / parquet, through data.load_rows): rows {"prompt", "chosen",
  "rejected"} for pairs, or {"prompt", "completion", "label": bool} for KTO's single labelled
  examples (lab/kto.py). A prompt is a string or a list of {"role", "content"} messages; a response
  is a string or a one-message list [{"role": "assistant", "content": ...}]. TRL's conversational
  form with an implicit prompt is read too: {"chosen": messages, "rejected": messages}, two
  conversations sharing their first messages (the prompt). The last rows (a tenth of the file, at
  least 2, at most heldout_prompts) are held out.

An example is a dict: prompt ids, two responses with their loss masks and a label (a response's
mask is 0 on tool results, which are context, never a target, and 1 elsewhere). Pairs: responses
(chosen, rejected), label 1. A single example of a file (KTO): responses (its completion, None),
label 1 = desirable, 0 = undesirable.
"""

import random

import torch

from nanopost import data
from nanopost.data import RowError, check_length, encode_rows, load_rows, render_messages, require
from nanopost.distributed import seeded_rng, shard
from model import GPT
from nanopost.rollouts import response_text, rollouts

PAIR_DEFAULTS = dict(
    pairs="verifier",       # built-in preference kind: verifier | style | both
    train_prompts=512,      # built-in training prompts (env train split)
    heldout_prompts=128,    # built-in held-out prompts (env heldout split); caps the file's held-out rows
    group_size=4,           # answers sampled per prompt to find a correct and a wrong one
    pair_temperature=1.0,   # sampling temperature of those answers
)

PAIR_KINDS = ("verifier", "style", "both")
# Padding for the style preference: true, content-free, and free of "Answer:" so the padded
# answer still verifies as correct.
# Short, so that a padded answer to a word problem still fits the default block_size.
FILLER = ["Let me see.", "Step by step.", "Simple sums.", "Let me check.", "Looks right.", "All done."]


# ----------------------------------------------------------------------------------------------
# File rows

def _prompt_ids(run, row):
    if isinstance(row.get("prompt"), list):
        return render_messages(run, row["prompt"], "prompt", add_generation_prompt=True)[0]
    return run.tok.prompt_ids(require(row, "prompt", str))


def _response_text(row, field):
    value = row.get(field)
    if isinstance(value, list):  # the conversational layout: one assistant message
        if len(value) != 1 or not isinstance(value[0], dict) or value[0].get("role") != "assistant" \
                or not isinstance(value[0].get("content"), str):
            raise RowError(field, "a message list must be exactly [{'role': 'assistant', 'content': str}]")
        value = value[0]["content"]
    else:
        value = require(row, field, str)
    if not value.strip():
        raise RowError(field, "empty response")
    return value


def _check_length(run, prompt, response, field):
    # the reward model reads the scalar at the last token, so the whole sequence must be an input
    check_length(prompt, response, field, run.cfg["block_size"], f"block_size={run.cfg['block_size']}")


def implicit_prompt_pair(run, row):
    """TRL's conversational form with an implicit prompt: chosen and rejected are whole conversations
    (message lists) that share their first messages, the prompt, and differ in the assistant's
    reply. Each conversation goes through the chat template whole, so the reply's tokens and loss
    mask are exactly the template's; the prompt is the shared messages with the generation prompt,
    which must be where both conversations' ids begin."""
    chosen, rejected = require(row, "chosen", list), require(row, "rejected", list)
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise RowError("rejected", "shares no prompt message with chosen (an implicit prompt is the messages both begin with)")
    prompt = render_messages(run, chosen[:shared], "chosen", add_generation_prompt=True)[0]
    responses, masks = [], []
    for field, messages in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(messages[shared], dict) or messages[shared].get("role") != "assistant":
            raise RowError(f"{field}[{shared}]", "the reply after the shared prompt must be an assistant message")
        ids, mask = render_messages(run, messages, field)
        if ids[:len(prompt)] != prompt:
            raise RowError(field, "the chat template renders the shared prompt differently inside the conversation")
        _check_length(run, prompt, ids[len(prompt):], field)
        responses.append(ids[len(prompt):])
        masks.append(mask[len(prompt):])
    if responses[0] == responses[1]:
        raise RowError("rejected", "identical to chosen")
    return dict(prompt=prompt, responses=tuple(responses), masks=tuple(masks), label=1.0)


def encode_row(run, row):
    """One file row -> ("pair" | "single", example), or RowError naming the bad field."""
    row = {k: v for k, v in row.items() if v is not None}  # datasets fills absent columns with None
    if "prompt" not in row and isinstance(row.get("chosen"), list):
        return "pair", implicit_prompt_pair(run, row)
    prompt = _prompt_ids(run, row)
    if "completion" in row or "label" in row:  # KTO's single labelled example
        completion, mask = run.tok.assistant_ids(_response_text(row, "completion"))
        label = require(row, "label", bool)
        _check_length(run, prompt, completion, "completion")
        return "single", dict(prompt=prompt, responses=(completion, None), masks=(mask, None), label=float(label))
    chosen_text, rejected_text = _response_text(row, "chosen"), _response_text(row, "rejected")
    if chosen_text == rejected_text:
        raise RowError("rejected", "identical to chosen")
    (chosen, chosen_mask), (rejected, rejected_mask) = map(run.tok.assistant_ids, (chosen_text, rejected_text))
    _check_length(run, prompt, chosen, "chosen")
    _check_length(run, prompt, rejected, "rejected")
    return "pair", dict(prompt=prompt, responses=(chosen, rejected), masks=(chosen_mask, rejected_mask), label=1.0)


# ----------------------------------------------------------------------------------------------
# Built from the environment

def padded_answer(demonstration, rng, n_fillers=2):
    """The same answer with filler sentences around the steps (if any): longer, equally correct."""
    body, answer = demonstration.rsplit("Answer:", 1)
    steps = [body.strip()] if body.strip() else []  # a bare answer has no steps to pad around
    fillers = rng.sample(FILLER, n_fillers)
    return " ".join(fillers[:1] + steps + fillers[1:]) + " Answer:" + answer


def builtin_pairs(run, sampler, split, n_prompts, seed, kind=None, demo_fallback=True):
    """Pairs on `n_prompts` problems of `split`, of the kind `kind` (default cfg["pairs"]); returns (pairs, counts).
    demo_fallback=False: a verifier pair is made of two sampled answers only (no demonstration as chosen)."""
    cfg, tok, env = run.cfg, run.tok, run.env
    kind = kind or cfg["pairs"]
    if kind not in PAIR_KINDS:
        raise ValueError(f"pairs={kind!r}: choose from {PAIR_KINDS}"
                         + (" (pairs sampled from the policy as it trains: --algo online_dpo)" if kind == "online" else ""))
    problems = env.problems(split, n_prompts, seed=seed)
    prompts = [tok.prompt_ids(p["prompt"]) for p in problems]
    k = cfg["group_size"]
    samples = [[]] * len(problems)
    if kind in ("verifier", "both"):
        roll = rollouts(run, sampler, problems, k, temperature=cfg["pair_temperature"], seed=seed,
                          batch_size=cfg["eval_batch_size"], spread=True)
        answers = list(zip(roll.responses, roll.response_masks(), roll.verified.tolist()))  # (ids, loss mask, verdict)
        samples = [answers[i * k:(i + 1) * k] for i in range(len(problems))]
    rng = random.Random(seed)
    pairs, counts = [], dict(verifier=0, demo_chosen=0, all_correct=0, no_right_sample=0, style=0, too_long=0)
    for problem, prompt, answers in zip(problems, prompts, samples):
        demo = env.solve(problem)
        if kind in ("verifier", "both"):
            correct = [(ids, mask) for ids, mask, verdict in answers if verdict == 1.0]
            wrong = [(ids, mask) for ids, mask, verdict in answers if verdict == 0.0]
            # demo_chosen: where no sample is right, the demonstration stands in as the chosen answer (so every
            # prompt with a wrong sample makes a pair; such pairs also teach the demonstration's form); without
            # the fallback such a prompt makes none, as online DPO's rounds do
            demo_chosen = not correct
            chosen = tok.assistant_ids(demo) if demo_chosen else correct[0]
            if demo_chosen and not demo_fallback:
                counts["no_right_sample"] += 1
            elif wrong and len(prompt) + len(chosen[0]) > cfg["block_size"]:
                counts["too_long"] += 1  # (sampled answers always fit; a demonstration may not)
            elif wrong:
                pairs.append(dict(prompt=prompt, responses=(chosen[0], wrong[0][0]), masks=(chosen[1], wrong[0][1]),
                                  label=1.0))
                counts["verifier"] += 1
                counts["demo_chosen"] += demo_chosen
            else:
                counts["all_correct"] += 1  # every sample correct: no wrong answer to prefer against
        if kind in ("style", "both"):
            for n_fillers in (2, 1):  # the longest padding that still fits block_size
                padded = padded_answer(demo, rng, n_fillers)
                (chosen, chosen_mask), (rejected, rejected_mask) = tok.assistant_ids(demo), tok.assistant_ids(padded)
                if len(prompt) + len(rejected) <= cfg["block_size"]:
                    assert env.verify(problem, padded) == 1.0, padded
                    pairs.append(dict(prompt=prompt, responses=(chosen, rejected), masks=(chosen_mask, rejected_mask),
                                      label=1.0))
                    counts["style"] += 1
                    break
            else:
                counts["too_long"] += 1
    if not pairs:
        raise ValueError(f"no {kind} pairs from {n_prompts} {split} prompts ({counts}): raise "
                         f"group_size or pair_temperature (all correct), or block_size (too long)")
    return pairs, counts


def load_preferences(run, reference, singles=False):
    """(train, heldout, skipped rows): the pairs of --data, or built-in pairs sampled by `reference`
    (the model init_from names, before any training). singles=True (KTO) also takes a file of single
    labelled examples, returned as they are."""
    cfg = run.cfg
    if cfg["data"]:
        return file_preferences(run, singles)
    if not isinstance(reference, GPT):
        raise ValueError(f"built-in pairs are sampled from init_from's language model, but "
                         f"init_from={cfg['init_from']!r} is a scalar model: pass --data=FILE")
    train, counts = builtin_pairs(run, reference, "train", cfg["train_prompts"], seed=1)
    heldout, heldout_counts = builtin_pairs(run, reference, "heldout", cfg["heldout_prompts"], seed=1)
    if run.master:
        print(f"built-in {cfg['pairs']} pairs: train {counts}, heldout {heldout_counts}")
    return train, heldout, 0


def file_preferences(run, singles):
    """(train, heldout, skipped rows) of --data: its last rows held out."""
    cfg = run.cfg
    encoded, skipped = encode_rows(run, cfg["data"], load_rows(cfg["data"]), encode_row)
    kinds = {kind for kind, _ in encoded}
    if len(kinds) > 1:
        raise ValueError(f"{cfg['data']}: mixes pair rows (prompt, chosen, rejected) and single rows "
                         f"(prompt, completion, label)")
    if kinds == {"single"} and not singles:
        raise ValueError(f"{cfg['data']}: rows are single labelled examples (prompt, completion, label), "
                         f"usable only with --algo kto; --algo {cfg['algo']} needs pairs (prompt, chosen, rejected)")
    examples = [ex for _, ex in encoded]
    n_heldout = max(2, min(cfg["heldout_prompts"], len(examples) // 10))  # 2: KTO's mismatched pairs
    return examples[:-n_heldout] or examples, examples[-n_heldout:], skipped


def describe(run, ex):
    """A pair as text, for samples.txt."""
    first, second = (response_text(run, r) for r in ex["responses"])
    return f"[pair] {run.tok.decode(ex['prompt'])}\n  chosen: {first!r}\n  rejected: {second!r}"


def collate(run, examples):
    """Both responses of every example in one batch, so one forward scores them: rows
    [prompt + responses[0] for each example] + [prompt + responses[1] for each example].
    Returns ids (2B, T), mask (2B, T-1) aligned with ids[:, 1:] (1 on response tokens the model
    wrote, 0 on the prompt, tool results and padding), prompt_lens (2B,), label (B,) and, when the
    examples carry cached reference log-probs, ref (B, 2)."""
    rows = [(ex["prompt"] + ex["responses"][j], [0] * len(ex["prompt"]) + ex["masks"][j])
            for j in (0, 1) for ex in examples]
    ids, mask = data.collate(rows, run.tok.pad, run.device)
    batch = dict(ids=ids, mask=mask[:, 1:], label=torch.tensor([ex["label"] for ex in examples], device=run.device),
                 prompt_lens=torch.tensor([len(ex["prompt"]) for _ in (0, 1) for ex in examples], device=run.device))
    if "ref" in examples[0]:
        batch["ref"] = torch.tensor([ex["ref"] for ex in examples], dtype=torch.float32, device=run.device)
    return batch


def step_batches(run, it, examples, keys=()):
    """One optimizer step: gradient_accumulation_steps micro-batches of this rank, cut from a global
    batch of consecutive examples of a per-epoch shuffle. Every example is seen once per epoch and
    the batch depends only on (seed, keys, it), so a resumed run draws what the uninterrupted one would
    (keys: a stream of its own, e.g. online DPO's round, whose `it` counts from the round's start)."""
    accum, bs = run.cfg["gradient_accumulation_steps"], run.cfg["batch_size"]
    n = run.world_size * accum * bs
    orders = {}
    picks = []
    for k in range(it * n, (it + 1) * n):
        epoch, position = divmod(k, len(examples))
        if epoch not in orders:
            orders[epoch] = seeded_rng(run, *keys, epoch).permutation(len(examples))
        picks.append(examples[orders[epoch][position]])
    return [[collate(run, mb) for mb in shard(picks, run, accum, bs)]]
