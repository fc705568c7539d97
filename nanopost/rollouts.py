"""
Rollouts: the one path from prompts to verified responses (rollouts -> a Rollout: generate with the
KV-cache sampler and the environment's tool, decode, verify, lay out with masks), the tool hook,
the shards RL samples in, the scoring of a rollout's tokens by a model (score_tokens: π_old, π_ref)
and a reward model's read-out of whole responses (score_responses).
"""

import dataclasses
import time

import torch
import torch.nn.functional as F

from nanopost.distributed import all_ranks_busy, chunks, lockstep_count, over_ranks, seeded_rng
from model import sequence_logprobs
from sampler import Samples, sample


def tool_hook(run, prompts):
    """The sampler's tool hook for the run's environment (tool_calling_hook), or None when it has no tool."""
    tool = getattr(run.env, "tool", None)
    return None if tool is None else tool_calling_hook(run, prompts, tool)


def tool_calling_hook(run, prompts, tool):
    """The hook that runs the environment's `tool` inside the sampler (SPEC §4, multi-turn tool
    environment). When a row writes the closing call tag, the text between it and
    the opening tag before it is the call: the environment's tool runs it, given the row's prompt
    (`prompts`, the sampler's prompt ids by row) and its earlier calls (a game replays them: its
    state is the transcript), and the result comes back between result tags as ids the sampler feeds
    to that row as forced tokens while the other rows keep sampling. Only the prompt and the calls
    are decoded (to run the call); the trajectory stays token ids. A response's calls past
    max_tool_calls are not run: the result says so. The hook keeps no state, each row is judged by
    its own ids alone, so rows pause and resume independently."""
    special, limit = run.tok.special, run.cfg["max_tool_calls"]
    if "tool_call" not in special:
        raise ValueError(f"env {run.env.name!r} calls a tool, whose tags are special tokens of the built-in "
                         f"tokenizers (byte, gpt2): tokenizer={run.tok.name!r} has none")

    def hook(row, generated):
        if generated[-1] != special["/tool_call"]:
            return None
        spans, opened = [], None  # (first, end) ids of every call's text that has both tags, in order
        for k, t in enumerate(generated):
            if t == special["tool_call"]:
                opened = k + 1
            elif t == special["/tool_call"] and opened is not None:
                spans.append((opened, k))
                opened = None
        if generated.count(special["/tool_call"]) > limit:
            result = f"error: at most {limit} calls"
        elif not spans or spans[-1][1] != len(generated) - 1:
            result = "error: no opening tag"
        else:
            calls = [run.tok.decode(generated[first:end]) for first, end in spans]
            result = tool(calls[-1], run.tok.decode(prompts[row]), calls[:-1])
        return [special["tool_result"]] + run.tok.encode(result) + [special["/tool_result"]]
    return hook


def generate(run, model, prompts, max_new_tokens=None, temperature=0.0, seed=None, batch_size=None,
             spread=False, **kw):
    """Sample responses for a list of prompt-id lists in chunks, running the environment's tool when
    it has one; returns sampler.Samples(tokens, logprobs, forced), forced = 1 on tool tokens.
    Chunk i is seeded by seed + i·batch_size. spread=True: setup work every rank needs the whole of
    (pair sampling, RFT pools): the chunks are shared out over the ranks and gathered (over_ranks)."""
    max_new_tokens = max_new_tokens or run.cfg["max_new_tokens"]
    batch_size = batch_size or run.cfg["eval_batch_size"]
    busy = all_ranks_busy(run) if run.lockstep else None  # (--fsdp_rollouts=sharded: ranks decode in lockstep)

    def sample_chunk(chunk, i):
        with run.autocast:
            return sample(model, chunk, max_new_tokens, temperature=temperature, stop_tokens=(run.tok.eos,),
                          pad_id=run.tok.pad, seed=None if seed is None else seed + i * batch_size,
                          tool_hook=tool_hook(run, chunk), all_ranks_busy=busy, **kw)
    if spread and run.lockstep:
        raise ValueError("--fsdp_rollouts=sharded does not share setup sampling out over ranks yet: use gathered")
    if spread:
        parts = over_ranks(run, prompts, batch_size, sample_chunk)
    else:
        mine = chunks(prompts, batch_size)
        mine += [[]] * (lockstep_count(run, len(mine)) - len(mine))  # (sharded rollouts: an empty chunk idles)
        parts = [sample_chunk(chunk, i) for i, chunk in enumerate(mine)]
    return Samples(*([x for part in parts for x in part[k]] for k in range(3)))


def response_text(run, tokens):
    return run.tok.decode([t for t in tokens if t != run.tok.eos])


@dataclasses.dataclass
class Rollout:
    """Responses sampled for problems and verified: N rows, the problems' G samples each side by
    side. Tokens in, tokens out: response ids are never decoded and re-encoded for training (text is
    decoded for the verifier only). With a tool environment a response holds the tool's results too
    (fed in by the sampler): they stay in ids as context and have mask 0, so no loss gives them weight.

    Per-token tensors are (N, T-1) (or (N, T-1, ...)), aligned with the shifted targets ids[:, 1:]
    exactly like sequence_logprobs(model, ids): position t scores token ids[:, t+1]."""
    ids: torch.Tensor            # (N, T) long: prompt + response, right-padded with <|pad|>
    mask: torch.Tensor           # (N, T-1) 1 on sampled response tokens (stop token included); 0 on the
                                 #          prompt, tool tokens and padding
    forced: torch.Tensor         # (N, T-1) 1 on the tool's tokens (response tokens the model did not sample)
    old_logprobs: torch.Tensor   # (N, T-1) the sampler's log-probs (π_old), 0 where mask is 0
    verified: torch.Tensor       # (N,) the verifier's reward, 1 or 0
    lengths: torch.Tensor        # (N,) response lengths in tokens
    truncated: torch.Tensor      # (N,) bool: hit max_new_tokens without the end token
    group: torch.Tensor          # (N,) the index of the problem each row answers
    prompt_lens: torch.Tensor    # (N,) each row's prompt length
    seq_len: torch.Tensor        # (N,) the index of the row's last response token + 1: its own width
    problems: list               # each row's problem
    texts: list                  # each row's decoded response
    responses: list              # each row's response ids
    time_decode: float = 0.0     # seconds sampling, verifying, and scoring (an algorithm's forwards)
    time_verify: float = 0.0
    time_score: float = 0.0
    # what an algorithm adds before it trains on the rows; None until then
    sampler_logprobs: torch.Tensor = None  # (N, T-1) the sampler's own, where old_logprobs are recomputed
    ref_logprobs: torch.Tensor = None      # (N, T-1) π_ref's of the sampled tokens, or (N, T-1, V) its whole
                                           # distributions (opd's anchor)
    teacher_logprobs: torch.Tensor = None  # (N, T-1, V) a teacher's distributions (opd)
    reward: torch.Tensor = None            # (N,) the training reward the advantages come from (grpo: the
                                           #      verifier's; a variant's own, e.g. DAPO's shaped one)
    advantages: torch.Tensor = None        # (N,) one per response, or (N, T-1) one per token (process rewards)

    def select(self, rows):
        """These rows (indices, in order), every tensor and list cut to them, and to their own width."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.ids.device)
        width = max(int(self.seq_len[rows].max()), 2) if len(rows) else 2
        picked = rows.tolist()
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if torch.is_tensor(value):
                value = value[rows]
                if value.dim() > 1:  # ids (N, T), per-token (N, T-1, ...)
                    value = value[:, :width if field.name == "ids" else width - 1]
            elif isinstance(value, list):
                value = [value[i] for i in picked]
            out[field.name] = value
        return Rollout(**out)

    def response_masks(self):
        """Each row's loss mask over its own response tokens, as lists: 1 on the sampled ones, 0 on
        the tool's."""
        return [[int(m) for m in row[start - 1:start - 1 + len(response)]]
                for row, start, response in zip(self.mask.tolist(), self.prompt_lens.tolist(), self.responses)]

    @staticmethod
    def cat(parts, pad_id):
        """The rows of several rollouts in order, right-padded to the widest (ids with pad_id, per-token
        values with 0); times add up."""
        width = max(p.ids.size(1) for p in parts)
        out = {}
        for field in dataclasses.fields(Rollout):
            values = [getattr(p, field.name) for p in parts]
            if values[0] is None:
                out[field.name] = None
            elif torch.is_tensor(values[0]) and values[0].dim() > 1:
                w, fill = (width, pad_id) if field.name == "ids" else (width - 1, 0.0)
                out[field.name] = torch.cat([F.pad(v, [0, 0] * (v.dim() - 2) + [0, w - v.size(1)], value=fill)
                                             for v in values])
            elif torch.is_tensor(values[0]):
                out[field.name] = torch.cat(values)
            elif isinstance(values[0], list):
                out[field.name] = [x for v in values for x in v]
            else:
                out[field.name] = sum(values)
        return Rollout(**out)


def rollouts(run, model, problems, group_size, temperature=1.0, max_new_tokens=None, seed=None,
             top_k=None, top_p=None, batch_size=None, spread=False, prompt_ids=None):
    """The one rollout path: sample `group_size` responses per problem with the KV-cache
    sampler (on all prompts at once, or in chunks of `batch_size`), decode them, verify them with the
    environment's verifier and lay them out with their masks: a Rollout. prompt_ids(problem) -> ids
    renders a prompt (default: the chat template, run.tok.prompt_ids, then a mid-map start's calls
    already played, problem["played"], as the assistant's opening: context, mask 0)."""
    render = prompt_ids or (lambda problem: run.tok.prompt_ids(problem["prompt"])
                            + (run.tok.assistant_ids(problem["played"])[0][:-1] if "played" in problem else []))
    prompts = [render(p) for p in problems for _ in range(group_size)]
    rows = [p for p in problems for _ in range(group_size)]
    t0 = time.time()
    tokens, logprobs, forced = generate(run, model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                        seed=seed, batch_size=batch_size or len(prompts), top_k=top_k, top_p=top_p,
                                        spread=spread)  # spread: the sampling shared out over ranks (generate)
    t1 = time.time()
    texts = [response_text(run, t) for t in tokens]
    verified = torch.tensor([run.env.verify(p, text) for p, text in zip(rows, texts)], dtype=torch.float32)
    t2 = time.time()
    return Rollout(**layout(run, prompts, tokens, logprobs, forced), verified=verified.to(run.device),
                   group=torch.arange(len(problems), device=run.device).repeat_interleave(group_size),
                   problems=rows, texts=texts, time_decode=t1 - t0, time_verify=t2 - t1)


def layout(run, prompts, tokens, logprobs, forced):
    """The rows' tensors (a Rollout's fields) from each row's prompt ids, response ids, their log-probs
    and tool marks: prompt + response right-padded, the mask 1 on the sampled response tokens."""
    # (a rank can hold no problem: evaluation shards of fewer problems than ranks)
    N, T = len(prompts), max((len(p) + len(t) for p, t in zip(prompts, tokens)), default=2)
    ids = torch.full((N, T), run.tok.pad, dtype=torch.long)
    mask, tool, old = torch.zeros(N, T - 1), torch.zeros(N, T - 1), torch.zeros(N, T - 1)
    for i, (p, t, lp, f) in enumerate(zip(prompts, tokens, logprobs, forced)):
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        tool[i, len(p) - 1:len(p) - 1 + len(t)] = torch.tensor(f, dtype=torch.float32)
        mask[i, len(p) - 1:len(p) - 1 + len(t)] = 1.0 - tool[i, len(p) - 1:len(p) - 1 + len(t)]
        old[i, len(p) - 1:len(p) - 1 + len(t)] = torch.tensor(lp)
    device = run.device
    mask = mask.to(device)
    return dict(ids=ids.to(device), mask=mask, forced=tool.to(device), old_logprobs=old.to(device),
                lengths=torch.tensor([len(t) for t in tokens], device=device),
                truncated=torch.tensor([run.tok.eos not in t for t in tokens], device=device),
                prompt_lens=torch.tensor([len(p) for p in prompts], device=device),
                seq_len=last_response_column(mask) + 2, responses=tokens)


@torch.no_grad()
def score_tokens(run, model, ids, prompt_lens, top_k=None, top_p=None):
    """Per-token log-probs of ids[:, 1:] at the sampling temperature (π_old, π_ref of a rollout), on the
    distribution top_k / top_p truncate (model.sampled_logprobs; none: the whole softmax), no
    gradient, in chunks of batch_size rows; with share_prompt each distinct prompt of a chunk runs
    once (model.SharedPrompts)."""
    size, share, tau = run.cfg["batch_size"], run.cfg["share_prompt"], run.cfg["temperature"]
    with run.autocast:
        return torch.cat([sequence_logprobs(model, chunk, tau, lens if share else None, top_k, top_p).float()
                          for chunk, lens in zip(chunks(ids, size), chunks(prompt_lens, size))])


def old_logprobs_mode(run):
    """Where RL's π_old comes from, old_logprobs with auto resolved: recompute (a training forward)
    under autocast on a GPU, whose bf16 sampler rounds differently; else the sampler's own log-probs."""
    mode = run.cfg["old_logprobs"]
    return mode if mode != "auto" else ("recompute" if run.device.startswith("cuda") else "sampler")


def last_response_column(mask):
    """(N,) column t of each row's last response token in a mask aligned with ids[:, 1:] (the
    token is ids[:, t+1]); −1 for a row without one."""
    positions = torch.arange(mask.size(1), device=mask.device)
    return torch.where(mask > 0, positions, -1).amax(1)


def score_responses(scalar_model, ids, mask):
    """r_φ of each row: a ScalarHeadGPT's value at its last response token, where causal attention
    has seen the whole prompt and answer (the reward model's read-out; lab/ppo_rm.py scores rollouts
    with it). ids (N, T) right-padded prompt + response; mask (N, T-1) aligned with ids[:, 1:] (1 on
    response tokens, as from rollouts), so the last t with mask[i, t] = 1 points at token
    ids[i, t+1]. Returns (N,)."""
    has_response = mask.sum(1) > 0
    if not bool(has_response.all()):
        raise ValueError(f"rows {has_response.logical_not().nonzero().flatten().tolist()} have no response token")
    last = last_response_column(mask) + 1  # token index of the last response token
    values = scalar_model(ids)              # (N, T)
    return values.gather(1, last[:, None]).squeeze(1).float()


@torch.no_grad()
def score_rollout(run, scalar_model, roll):
    """r_φ of every row of a rollout (score_responses), eval_batch_size rows at a time under the run's
    autocast: (N,) float."""
    size = run.cfg["eval_batch_size"]
    with run.autocast:
        return torch.cat([score_responses(scalar_model, ids, mask)
                          for ids, mask in zip(chunks(roll.ids, size), chunks(roll.mask, size))]).float()


def shard_size(run):
    """Prompts per sampler call in RL's sharded rollouts (grpo, opd): rollout_prompts, or one shard per rank."""
    return run.cfg["rollout_prompts"] or run.cfg["prompts_per_iter"] // run.world_size


def shard_problems(run, *keys):
    """A rollout shard's fresh train problems (shard_size of them) and its sampler seed, both drawn
    from seeded_rng(run, *keys) (e.g. the iteration and the shard): the same on any world size."""
    rng = seeded_rng(run, *keys)
    problems = run.env.problems("train", shard_size(run), seed=int(rng.integers(2 ** 31)))
    return problems, int(rng.integers(2 ** 31))
