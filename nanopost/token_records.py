"""
Token records: a few iterations' rollouts kept token by token in out_dir/tokens.jsonl, for report.py
to colour. keep_tokens iterations are kept, spread evenly from the first to the last but one. The
algorithm's batches calls here once an iteration (keep_rollouts, or keep_pairs for DPO); on a kept
iteration rank 0 appends one JSON line: every row's prompt, its response tokens as text, which of them a tool wrote
(no loss trains on them), the verifier's verdict, whether the answer parsed, and per response token
what the algorithm had: log π_old, log π_ref, the advantage, the policy's entropy, the teacher's
log-prob (OPD), the critic's value and target (PPO), the step rewards (process rewards, RLVP).

The update comes after batches, so the call at the next iteration scores the kept rows again, under
the policy that iteration's update made, and appends {"iter", "after"}: ρ = π_new/π_old on every
token, how far (and which way) the update moved it. A resumed run appends; the report keeps the last
line of each iteration.
"""

import json
import os

import torch

from model import gather_targets, sequence_logprobs, token_logprobs_and_entropy
from nanopost.data import collate
from nanopost.distributed import chunks

RECORDS = "tokens.jsonl"


def kept(cfg, it):
    """Whether iteration `it` is one of the keep_tokens kept: spread evenly over 0 .. max_iters − 2, the
    iterations that have a next one to score their update (a run of one iteration keeps none)."""
    n, last = cfg["keep_tokens"], cfg["max_iters"] - 2
    return n > 0 and 0 <= it <= last and it in {round(k * last / max(n - 1, 1)) for k in range(n)}


def keep_rollouts(run, it, rollouts, **per_token):
    """Keep iteration `it`'s rollouts (a list of Rollout) when it is kept, with what they do not hold:
    per_token {name: one tensor per rollout, (N, T-1) per token or (N,) per row} (PPO's values, ...);
    and score iteration it − 1's kept rows again under the updated policy. Rank 0's rows only (with
    --fsdp_rollouts=sharded none: its forwards need every rank)."""
    if run.master and not run.lockstep and kept(run.cfg, it - 1):
        score_after(run, it - 1)
    if run.master and not run.lockstep and kept(run.cfg, it):
        append(run, it, dict(iter=it, kind="rollouts", rows=rollout_rows(run, rollouts, per_token)))


@torch.no_grad()
def rollout_rows(run, rollouts, per_token):
    """Every row of the rollouts as a dict: its prompt, group, response tokens, the tool's tokens, the
    verdict and parse, and the per-token quantities (see the module's docstring)."""
    rows = []
    for k, ro in enumerate(rollouts):
        targets = ro.ids[:, 1:]
        found = dict(logp_old=ro.old_logprobs, advantage=ro.advantages,
                     entropy=policy_logprobs_and_entropy(run, ro.ids)[1],
                     logp_ref=pick(ro.ref_logprobs, targets), logp_teacher=pick(ro.teacher_logprobs, targets))
        found.update({name: tensors[k] for name, tensors in per_token.items()})
        for i in range(len(ro.ids)):
            first, end = int(ro.prompt_lens[i]) - 1, int(ro.seq_len[i]) - 1  # position t scores token t + 1
            row = response_tokens(run, ro.ids[i], first, end)
            row.update(prompt=ro.problems[i]["prompt"], group=[k, int(ro.group[i])],
                       tool=[int(f) for f in ro.forced[i, first:end].tolist()],
                       verdict=float(ro.verified[i]), text=ro.texts[i],
                       parsed=run.env.parses(ro.texts[i]) if hasattr(run.env, "parses") else None)
            for name, values in found.items():
                if values is not None:
                    row[name] = rounded(values[i] if values.dim() == 1 else values[i, first:end])
            rows.append(row)
    return rows


def keep_pairs(run, it, steps, reference):
    """DPO: keep iteration `it`'s pairs when it is kept: each prompt with its chosen and rejected answer,
    log π_θ and log π_ref on every token (β·Σ of their difference: the implicit reward; a variant
    without β, SimPO or ORPO, keeps the log-probs)."""
    if run.master and not run.lockstep and kept(run.cfg, it):
        append(run, it, dict(iter=it, kind="pairs", beta=run.cfg.get("beta"), pairs=pair_rows(run, steps, reference)))


@torch.no_grad()
def pair_rows(run, steps, reference):
    """Every pair of the steps' micro-batches: {prompt, chosen, rejected}, each side's tokens and log-probs."""
    pairs = []
    for batch in (micro for step in steps for micro in step):
        ids, lens = batch["ids"], batch["prompt_lens"]
        policy, ref = (sequence_logprobs(model, ids) for model in (run.raw_model, reference))
        half = len(ids) // 2  # rows i and i + half: example i's chosen and rejected answers
        for i in range(half):
            sides = []
            for r in (i, i + half):
                first, end = int(lens[r]) - 1, int(batch["mask"][r].nonzero().max()) + 1
                side = response_tokens(run, ids[r], first, end)
                side.update(logp=rounded(policy[r, first:end]), logp_ref=rounded(ref[r, first:end]))
                sides.append(side)
            pairs.append(dict(prompt=run.tok.decode(ids[i, :int(lens[i])].tolist()), chosen=sides[0], rejected=sides[1]))
    return pairs


def response_tokens(run, ids, first, end):
    """The token ids and texts of positions first .. end − 1 (the targets ids[first + 1 .. end])."""
    tokens = ids[first + 1:end + 1].tolist()
    return dict(ids=ids[:end + 1].tolist(), start=first, tokens=[run.tok.decode([t]) for t in tokens])


def policy_logprobs_and_entropy(run, ids):
    """The policy's log-prob of every target ids[:, 1:] and its entropy (nats) at each position, at the
    sampling temperature: (N, T-1) each, batch_size rows a forward."""
    parts = []
    for rows in chunks(ids, run.cfg["batch_size"]):
        with run.autocast:
            out = run.raw_model(rows[:, :-1])
        logits = out[0] if isinstance(out, tuple) else out  # (PPO's model gives the critic's values too)
        parts.append(token_logprobs_and_entropy(logits.float(), rows[:, 1:], run.cfg.get("temperature", 1.0)))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def pick(logprobs, targets):
    """Log-probs of the sampled tokens: as they are (N, T-1), or picked from whole distributions (N, T-1, V)."""
    if logprobs is None or logprobs.dim() == 2:
        return logprobs
    return gather_targets(logprobs, targets)


@torch.no_grad()
def score_after(run, it):
    """Iteration it's kept rows scored by the policy now (after it's update): {"iter", "after"}."""
    path = os.path.join(run.cfg["out_dir"], RECORDS)
    if not os.path.exists(path):
        return
    with open(path) as f:
        record = json.loads(f.readlines()[-1])
    if record.get("iter") != it or record.get("kind") != "rollouts":
        return
    rows = record["rows"]
    ids = collate([(row["ids"], [1] * len(row["ids"])) for row in rows], run.tok.pad, run.device)[0]
    logp = policy_logprobs_and_entropy(run, ids)[0]  # (right padding: causal attention never looks ahead)
    after = [rounded(logp[i, row["start"]:len(row["ids"]) - 1]) for i, row in enumerate(rows)]
    append(run, it, dict(iter=it, kind="after", after=after))


def rounded(values):
    """A tensor as a list (or a number) of floats to 4 decimals: the file stays small."""
    values = values.float().tolist()
    return round(values, 4) if isinstance(values, float) else [round(v, 4) for v in values]


def append(run, it, record):
    """One line of out_dir/tokens.jsonl; iteration 0 (always kept) starts the file afresh."""
    with open(os.path.join(run.cfg["out_dir"], RECORDS), "w" if it == 0 and record["kind"] != "after" else "a") as f:
        f.write(json.dumps(record) + "\n")
