"""
The sampler: batched KV-cache decoding of ragged prompts (model.py's transformer fills and reads the
cache), shared prompts (each distinct prompt runs once, for sampling and for scoring), top-k / top-p
filtering, inverse-CDF draws, and the tool hook (a tool's output fed back as forced tokens).

`sample` takes the model as an argument (as nanochat's engine.py sits beside its gpt.py) and draws from
model.py's own distribution (sampled_logprobs), so a token is drawn and scored by one definition.
"""

from typing import NamedTuple

import torch

from model import sampled_logprobs

class KVCache:
    """Keys and values of every layer for a batch of left-padded rows: every row writes the same
    column at every step, into buffers of max_len columns allocated once.

    A decode step attends over the columns written so far, a narrowed view of the buffer (each row's
    and head's keys one contiguous block), with an additive bias of −inf on left padding: nothing is
    copied as the cache fills, and no work is spent on columns not yet written. Dropping finished
    rows (and fanning a shared prefill out) copies the written columns of the rows kept into a
    second pair of buffers, and the two pairs swap roles: no fresh memory at each selection.
    `python experiments/bench.py sampler_against --against=OLD_SAMPLER.py` times it against the
    design before (a dense buffer grown 32 columns at a time, attended whole and masked), and
    `attention` the attention alone.
    """

    def __init__(self, cfg, prompt_valid, max_len):
        """prompt_valid: (B, P) bool, False on each row's left padding; max_len: P + new tokens."""
        self.n_layer, self.prompt_valid, self.max_len = cfg.n_layer, prompt_valid, max_len
        # grouped-query attention keeps only its n_kv_head key/value heads (H below): the cache is
        # n_head / n_kv_head times smaller, and each group of query heads reads its one kv head
        self.buffers = self.spare = None  # (keys, values), each (n_layer, rows, H, max_len, head_size)
        self.k = self.v = None  # the rows in use, views of self.buffers: (n_layer, B, H, max_len, head_size)
        self.bias = None        # (B, H, 1, max_len): −inf on left padding, one row per (row, kv head) as baddbmm wants
        self.length = 0         # columns written by every layer so far

    def write_prompt(self, layer, k, v):
        B, H, P, D = k.shape
        if layer == 0:  # (empty: a column is read only once it is written)
            self.buffers = self.k, self.v = tuple(t.new_empty(self.n_layer, B, H, self.max_len, D) for t in (k, v))
            self.bias = torch.zeros((B, H, 1, self.max_len), device=k.device, dtype=k.dtype)
            self.bias[..., :P].masked_fill_(~self.prompt_valid[:, None, None, :], float("-inf"))
            self._make_views()
        self.layer_k[layer][:, :, :P] = k
        self.layer_v[layer][:, :, :P] = v
        if layer == self.n_layer - 1:
            self.length = P

    def decode_attention(self, layer, q, k, v):
        """Write this step's key and value (B, H, 1, D) at the next column, then attend:
        softmax(q·Kᵀ/√D + bias)·V over the columns written. q (B, G·H, 1, D): the G query heads of
        kv head h are h·G ... h·G + G − 1 (transformers' repeat_kv), so they become G rows of one
        batched matmul against that head's keys. Returns (B, G·H, 1, D)."""
        B, H, _, D = k.shape
        G = q.size(1) // H
        n = self.length + 1  # the columns attended: those written, this step's included
        self.layer_k[layer].narrow(2, n - 1, 1).copy_(k)
        self.layer_v[layer].narrow(2, n - 1, 1).copy_(v)
        if layer == self.n_layer - 1:
            self.length = n
        scores = torch.baddbmm(self.flat_bias.narrow(2, 0, n), q.reshape(B * H, G, D),
                               self.keys_t[layer].narrow(2, 0, n), alpha=D ** -0.5)
        return torch.bmm(scores.softmax(-1), self.values[layer].narrow(1, 0, n)).view(B, G * H, 1, D)

    def select_rows(self, rows):
        """Keep these rows, in this order (a row may be repeated: a shared prefill fans out): their
        written columns are copied into the spare buffers, which become the cache's."""
        b, n = len(rows), self.length
        if self.spare is None or self.spare[0].size(1) < b:
            self.spare = tuple(t.new_empty(self.n_layer, b, *t.shape[2:]) for t in self.buffers)
        for now, spare in zip((self.k, self.v), self.spare):
            torch.index_select(now[:, :, :, :n], 1, rows, out=spare[:, :b, :, :n])  # (into place: 2-7× a fresh copy)
        self.buffers, self.spare = self.spare, self.buffers
        self.k, self.v = (t[:, :b] for t in self.buffers)
        self.bias = self.bias.index_select(0, rows)
        self._make_views()

    def _make_views(self):
        """Per-layer views, made once per buffer rather than at every step of every layer."""
        B, H, L, D = self.k.shape[1:]
        self.layer_k, self.layer_v = self.k.unbind(0), self.v.unbind(0)              # (B, H, L, D)
        self.keys_t = [k.view(B * H, L, D).transpose(1, 2) for k in self.layer_k]  # (B·H, D, L)
        self.values = [v.view(B * H, L, D) for v in self.layer_v]                 # (B·H, L, D)
        self.flat_bias = self.bias.view(B * H, 1, L)


# ----------------------------------------------------------------------------------------------
# Sampling

class Samples(NamedTuple):
    """What the sampler returns, per row: the generated ids (the stop token included when hit),
    their log-probs, and 0/1 marks on the ids a tool injected."""
    tokens: list
    logprobs: list
    forced: list


def draw(logp, generator):
    """One token per row from (possibly truncated, unnormalised) log-probs, by inverse CDF: one
    uniform number per row (torch.multinomial draws one per vocabulary entry, ~10% of a batch-64
    decode step on CPU). Tokens of probability 0 are never drawn."""
    cdf = logp.exp().cumsum(-1)
    u = torch.rand(cdf.size(0), 1, generator=generator, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=cdf.size(1) - 1)


def sample(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
           stop_tokens=(), seed=None, pad_id=0, tool_hook=None, all_ranks_busy=None):
    """Batched sampling with a preallocated KV cache. prompts: token-id lists (ragged), left-padded so
    that every row writes the same cache column; each row's positions start at 0 at its own first
    token and pad keys are masked out, so a row's logits equal those of its prompt alone.

    Returns Samples(tokens, logprobs, forced): per row the generated ids (the stop token included when
    hit), their log-probs under the distribution they were drawn from (sampled_logprobs: RL's π_old;
    greedy, temperature=0, reports the temperature-1 log-prob), and 0/1 marks on the ids tool_hook
    injected (log-prob 0.0, masked in RL). tool_hook(row, generated_ids) -> ids or None is called after
    each sampled token; the ids it returns are fed to that row one per step while the others sample.
    The model's train/eval mode is the caller's (train.py samples with dropout off). all_ranks_busy(busy)
    -> bool (a model sharded over processes: every forward a collective) says, before each decode
    forward, whether any process has one to make; one with nothing left makes a dummy forward meanwhile.
    """
    # inference mode: no autograd bookkeeping at all, ~10% faster decode than no_grad on CPU; but
    # not in lockstep: FSDP2 would make its buffers of gathered weights inference tensors, which a
    # training forward then cannot write into
    with torch.inference_mode(all_ranks_busy is None), torch.no_grad():
        device = next(model.parameters()).device
        B = len(prompts)
        if B == 0:
            if all_ranks_busy is not None:  # the other processes' prefill, then their decode steps
                idle(model, all_ranks_busy, device, prefill=True)
            return Samples([], [], [])
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        logits, lens, cache, max_new_tokens = prefill(model, prompts, max_new_tokens, pad_id, device)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed) if seed is not None else gen.seed()

        # what each row generated, kept on the device: no per-row Python work in the decode loop
        out_tok = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros(B, max_new_tokens, device=device)
        out_forced = torch.zeros(B, max_new_tokens, dtype=torch.bool, device=device)
        length = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
        stop = torch.tensor(sorted(set(stop_tokens)) or [-1], dtype=torch.long, device=device)
        queued = [[] for _ in range(B)]        # tool output waiting to be fed, per row
        rows = torch.arange(B, device=device)  # original row index of each cache row still active
        next_pos = lens.clone()
        for step in range(max_new_tokens):
            logp = sampled_logprobs(logits, temperature, top_k, top_p)  # (truncated and renormalised, if asked)
            tok = logits.argmax(-1) if temperature == 0 else draw(logp, gen)
            tok_logp = logp.gather(1, tok[:, None]).squeeze(1)
            if tool_hook is not None:
                tok, tok_logp, forced = _tool_step(tool_hook, queued, rows, tok, tok_logp, out_tok[:, :step])
                out_forced[rows, step] = forced
            out_tok[rows, step], out_logp[rows, step] = tok, tok_logp
            if step == max_new_tokens - 1:
                break
            finished = torch.isin(tok, stop) if tool_hook is None else torch.isin(tok, stop) & ~forced
            if bool(finished.any()):  # (the one host sync per step)
                length[rows[finished]] = step + 1
                keep_idx = (~finished).nonzero().squeeze(1)
                if len(keep_idx) == 0:
                    break
                # drop finished rows from the batch: later steps cost only what is still running
                cache.select_rows(keep_idx)
                rows, tok, next_pos = rows[keep_idx], tok[keep_idx], next_pos[keep_idx]
            if all_ranks_busy is not None:
                all_ranks_busy(True)
            logits = model(tok[:, None], pos=next_pos[:, None], cache=cache)[:, -1]
            next_pos = next_pos + 1
        if all_ranks_busy is not None:  # (no per-process early exit: the others' remaining steps)
            idle(model, all_ranks_busy, device)
        n = length.tolist()
        return Samples([t[:k] for t, k in zip(out_tok.tolist(), n)], [lp[:k] for lp, k in zip(out_logp.tolist(), n)],
                       [[int(f) for f in fs[:k]] for fs, k in zip(out_forced.tolist(), n)])


def idle(model, all_ranks_busy, device, prefill=False):
    """Lockstep with nothing to decode: a one-token forward (its output unused) for the prefill if
    asked, then for every decode step another process still makes."""
    dummy = torch.zeros(1, 1, dtype=torch.long, device=device)
    if prefill:
        model(dummy)
    while all_ranks_busy(False):
        model(dummy)


def prefill(model, prompts, max_new_tokens, pad_id, device):
    """The prompts' pass: a KV cache filled with them, left-padded (causal within a row, never
    attending to pads; a pad query sees itself: no NaN), and each row's last logits and length.
    Rows that ask for the same prompt (GRPO's G samples of one) share its prefill: each distinct
    prompt runs once, then its cache row and last logits are copied to every row that asked for it.
    Returns (logits (B, V), lens (B,), cache, max_new_tokens cut to what block_size leaves)."""
    distinct = list(dict.fromkeys(map(tuple, prompts)))
    index = {p: i for i, p in enumerate(distinct)}
    of_row = torch.tensor([index[tuple(p)] for p in prompts], device=device)  # (B,) each row's distinct prompt
    lens = torch.tensor([len(p) for p in distinct], device=device)
    P = int(lens.max())
    max_new_tokens = min(max_new_tokens, model.config.block_size - P)
    if max_new_tokens <= 0:
        raise ValueError(f"prompt of {P} tokens leaves no room in block_size={model.config.block_size}")
    idx = torch.full((len(distinct), P), pad_id, dtype=torch.long, device=device)
    for i, p in enumerate(distinct):
        idx[i, P - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
    pad_len = P - lens
    prompt_valid = torch.arange(P, device=device).unsqueeze(0) >= pad_len.unsqueeze(1)  # False on left padding
    ragged = bool((pad_len > 0).any())  # no row padded: no mask at all, SDPA's cheaper unmasked path
    causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
    mask = (causal.unsqueeze(0) & prompt_valid[:, None, :]) | torch.eye(P, dtype=torch.bool, device=device)
    cache = KVCache(model.config, prompt_valid, P + max_new_tokens)
    pos = (torch.arange(P, device=device).unsqueeze(0) - pad_len.unsqueeze(1)).clamp(min=0)
    logits = model(idx, pos=pos, attn_mask=mask.unsqueeze(1) if ragged else None, cache=cache, last_only=True)[:, -1]
    if len(distinct) < len(prompts):
        cache.select_rows(of_row)
        logits, lens = logits[of_row], lens[of_row]
    return logits, lens, cache, max_new_tokens


def _tool_step(tool_hook, queued, rows, tok, tok_logp, generated):
    """The tool path of one decode step: a row with queued tool output is fed its next id (log-prob
    0, forced); a row that just sampled is shown its tokens so far, and what the hook returns is queued."""
    tok, tok_logp, forced = tok.clone(), tok_logp.clone(), torch.zeros_like(tok, dtype=torch.bool)
    for j, r in enumerate(rows.tolist()):
        if queued[r]:
            tok[j], tok_logp[j], forced[j] = queued[r].pop(0), 0.0, True
        else:
            injected = tool_hook(r, generated[r].tolist() + [int(tok[j])])
            if injected:
                queued[r].extend(injected)
    return tok, tok_logp, forced
