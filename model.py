"""
The model: a GPT-2-style decoder, a scalar-head variant (reward model, critic), per-token log-probs
shared by every algorithm, and LoRA. The batched KV-cache sampler is sampler.py, beside it.

The default is GPT-2's layout (pre-LayerNorm blocks, tanh-GELU MLP, learned positions, tied
embeddings), so that GPT-2 checkpoints load and give the same logits as transformers'
GPT2LMHeadModel. Options of the same config give the Llama family's block (Llama, Qwen2, Qwen3,
SmolLM): RMSNorm, SwiGLU, rotary positions, grouped-query attention, QK-norm, an untied head.
Loading transformers checkpoints into it and writing them back is hf.py.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 320  # the byte tokenizer's 266 ids, rounded up to a multiple of 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    # the Llama family's options; every default is GPT-2's block, so the tiny model stays as it was
    norm: str = "layernorm"   # layernorm (GPT-2) | rmsnorm (Llama)
    norm_eps: float = 1e-5    # ε inside the norm's square root
    mlp: str = "gelu"         # gelu (GPT-2: 4·n_embd tanh-GELU) | swiglu (Llama)
    mlp_hidden: int = 0       # the MLP's inner width; 0 = 4·n_embd
    pos: str = "learned"      # learned (GPT-2's absolute table) | rope (rotary, Llama)
    rope_theta: float = 10000.0  # rotary base θ: pair i turns by pos·θ^(−2i/head_dim)
    rope_llama3: tuple = ()   # Llama 3.1+'s frequency rescaling (factor, low_freq_factor, high_freq_factor, original context); () = none
    n_kv_head: int = 0        # key/value heads; 0 = n_head; fewer = grouped-query attention
    head_dim: int = 0         # 0 = n_embd // n_head (Qwen3 sets its own)
    qkv_bias: bool = False    # biases on q, k, v alone, with bias=False (Qwen2)
    qk_norm: bool = False     # RMSNorm of each head's q and k before rotary (Qwen3)
    tie_embeddings: bool = True  # lm_head shares wte's weight (GPT-2, small Llamas) or has its own


def dropout(x, p, training):
    """F.dropout, skipped outright when it would do nothing: while sampling, every call counts."""
    return F.dropout(x, p) if training and p > 0 else x


class RMSNorm(nn.Module):
    """y = g · x / √(mean(x²) + ε): LayerNorm without centring or bias (Llama). In fp32, as
    transformers computes it, then back to the input's dtype before the gain."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def make_norm(cfg, dim):
    return RMSNorm(dim, cfg.norm_eps) if cfg.norm == "rmsnorm" else nn.LayerNorm(dim, cfg.norm_eps, bias=cfg.bias)


def rotary_cos_sin(pos, head_dim, theta, dtype, llama3=()):
    """cos and sin (B, 1, T, head_dim) of the angles pos·θ_i, θ_i = θ^(−2i/head_dim), i < head_dim/2,
    each angle written twice (for x_i and its partner x_{i+head_dim/2}). pos: (B, T) or (1, T)."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float) / head_dim)
    if llama3:
        inv_freq = llama3_frequencies(inv_freq, *llama3)
    angles = pos.float()[..., None] * inv_freq  # (B, T, head_dim/2), in fp32 as transformers does
    angles = torch.cat([angles, angles], -1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def llama3_frequencies(inv_freq, factor, low, high, original):
    """Llama 3.1's long-context rescaling: a frequency θ_i whose wavelength λ_i = 2π/θ_i is long
    (original/λ_i < low) turns `factor` times slower, a short one (original/λ_i > high) is kept, and
    in between they blend: θ_i ← (1 − s)·θ_i/factor + s·θ_i, s = (original/λ_i − low)/(high − low)."""
    smooth = ((original * inv_freq / (2 * math.pi) - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def rotate(x, cos, sin):
    """Rotary embedding: each pair (x_i, x_{i+d/2}) of a head turned by its angle,
    (x_i, x_{i+d/2}) -> (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin). Applied to q and k, so
    q_m·k_n depends on positions only through m − n."""
    x1, x2 = x.chunk(2, -1)
    return (x * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)  # (fp32 angles: bf16 in, bf16 out)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.n_kv_head = cfg.n_kv_head or cfg.n_head
        self.head_dim = cfg.head_dim or cfg.n_embd // cfg.n_head
        assert cfg.head_dim or cfg.n_embd % cfg.n_head == 0
        assert self.n_head % self.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        # q, k, v in one matrix: n_head query heads, n_kv_head key and value heads. Grouped-query
        # attention: query head h reads key/value head h // (n_head / n_kv_head)
        widths = [self.n_head * self.head_dim] + 2 * [self.n_kv_head * self.head_dim]
        self.widths = widths
        self.c_attn = nn.Linear(cfg.n_embd, sum(widths), bias=cfg.bias or cfg.qkv_bias)
        self.c_proj = nn.Linear(widths[0], cfg.n_embd, bias=cfg.bias)
        if cfg.qk_norm:  # q ← RMSNorm(q), k ← RMSNorm(k) per head: bounded logits q·k (Qwen3)
            self.q_norm, self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps), RMSNorm(self.head_dim, cfg.norm_eps)

    def forward(self, x, attn_mask=None, cache=None, layer=0, prefix=None, record=None, rope=None):
        """prefix: (k, v) of shared prompts, one row per row of x, put in front of its own keys and
        values; record: a function called with this layer's (k, v) (a shared prompt's own pass; a
        function, not a list: FSDP2 rebuilds a forward's list arguments when they hold tensors);
        rope: (cos, sin) of the rows' positions (rotary models)."""
        B, T, C = x.shape
        # (B, T, widths) -> q (B, n_head, T, head_dim), k and v (B, n_kv_head, T, head_dim)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in self.c_attn(x).split(self.widths, -1))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if cache is not None and cache.length > 0:  # a decode step: one new token per row
            y = cache.decode_attention(layer, q, k, v)
        else:  # training, scoring, or a prompt's prefill (which fills the cache)
            if cache is not None:
                cache.write_prompt(layer, k, v)
            if record is not None:
                record((k, v))
            if prefix is not None:
                k, v = torch.cat([prefix[0], k], 2), torch.cat([prefix[1], v], 2)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=attn_mask is None and T > 1,
                                               enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return dropout(self.c_proj(y), self.dropout, self.training)


GELU_C = 2 * math.sqrt(2 / math.pi)


def gelu(x):
    """GPT-2's tanh-GELU, ½·x·(1 + tanh u) with u = √(2/π)·(x + 0.044715·x³). Without autograd on a CPU,
    from 64 rows of 512 on, as x·σ(2u), the same function: PyTorch's CPU tanh kernel is slow, and this
    form measured 1.4–1.9× faster at 64 to 1,024 rows (slower below 32). Big-batch decoding gains;
    training keeps F.gelu and its fused backward."""
    if torch.is_grad_enabled() or x.device.type != "cpu" or x.numel() < 32768:
        return F.gelu(x, approximate="tanh")
    two_u = x * x
    return x * two_u.mul_(GELU_C * 0.044715).add_(GELU_C).mul_(x).sigmoid_()


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hidden = cfg.mlp_hidden or 4 * cfg.n_embd
        self.swiglu = cfg.mlp == "swiglu"
        # SwiGLU's gate and up projections are one matrix: c_fc(x) = [x·W_gate, x·W_up]
        self.c_fc = nn.Linear(cfg.n_embd, (2 if self.swiglu else 1) * hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x):
        if self.swiglu:  # SwiGLU(x) = (SiLU(x·W_gate) ⊙ x·W_up)·W_down, SiLU(z) = z·σ(z)
            gate, up = self.c_fc(x).chunk(2, -1)
            x = F.silu(gate) * up
        else:
            x = gelu(self.c_fc(x))  # GPT-2's "gelu_new"
        return dropout(self.c_proj(x), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = make_norm(cfg, cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg, cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, attn_mask=None, cache=None, layer=0, prefix=None, record=None, rope=None):
        x = x + self.attn(self.ln_1(x), attn_mask, cache, layer, prefix, record, rope)
        return x + self.mlp(self.ln_2(x))


def fp32_linear(x, layer):
    """An output head (LM head, scalar head) in fp32 whatever the autocast: bf16 logits, rounded
    differently for different batch shapes, would score a token differently in the sampler, the scoring
    pass and the loss (the first PPO/GRPO ratio ≠ 1, DPO's margin ≠ 0 at init)."""
    with torch.autocast(x.device.type, enabled=False):
        if layer.weight.dtype == torch.float32:
            return layer(x.float())  # (the module itself: its hooks run)
        bias = None if layer.bias is None else layer.bias.float()  # bf16 weights (FSDP's mixed precision)
        return F.linear(x.float(), layer.weight.float(), bias)


NORMS, MLPS, POSITIONS = ("layernorm", "rmsnorm"), ("gelu", "swiglu"), ("learned", "rope")


# ----------------------------------------------------------------------------------------------
# Shared prompts: the layout in which rows that share a prompt run it once

class SharedPrompts:
    """Rows of prompt + continuation laid out so that each distinct prompt runs once: GRPO's G
    responses of a prompt, a DPO pair's two answers. model(shared.inputs, prompts=shared) gives the
    logits of shared.targets; to_rows moves per-token values from this layout (N, S) to the rows'
    (N, T-1), aligned with ids[:, 1:] as in sequence_logprobs.

    ids (N, T) right-padded rows, prompt_lens (N,) each row's prompt length L ≥ 1. A row's prefix is
    its prompt without the last token, ids[:L-1]; rows with equal prefixes share one, found by
    torch.unique over the rows. The continuation input is ids[L-1 : T-1], left-aligned and
    right-padded to S = T − min L columns, at positions L-1, L, ...: it starts with the last prompt
    token, so every response token, the first one too, is predicted inside the continuation, whose
    keys are the prefix's (masked to its length) and its own (causal)."""

    def __init__(self, ids, prompt_lens):
        N, T = ids.shape
        device = ids.device
        start = prompt_lens.to(device=device, dtype=torch.long) - 1  # (N,) column of the last prompt token
        P = max(int(start.max()), 1)  # prefix columns (one masked column if every prompt is a single token)
        keyed = torch.where(torch.arange(P, device=device) < start[:, None], ids[:, :P], -1)
        unique, self.rows = torch.unique(keyed, dim=0, return_inverse=True)  # rows: (N,) its prefix's row
        self.prefix_ids, self.prefix_pos = unique.clamp(min=0), torch.arange(P, device=device)[None]
        S = T - 1 - int(start.min())
        self.start, self.width = start, T - 1
        src = (start[:, None] + torch.arange(S, device=device)).clamp(max=T - 2)  # (N, S) column of each input
        self.inputs, self.targets, self.pos = ids.gather(1, src), ids.gather(1, src + 1), src
        causal = torch.ones(S, S, dtype=torch.bool, device=device).tril()
        prefix_valid = (unique >= 0)[self.rows]  # (N, P)
        self.attn_mask = torch.cat([prefix_valid[:, None, :].expand(N, S, P), causal.expand(N, S, S)], 2)[:, None]

    @staticmethod
    def saves_work(prompt_lens, width, n_prompts):
        """Whether this layout runs fewer positions than one full row each: n_prompts prefixes of
        P = max L − 1 columns and N continuations of S = T − min L columns, against N·(T − 1). With
        ragged prompts one short prompt widens every continuation, so rows that share a prompt only
        by two (DPO's pairs) can run more positions shared than plain."""
        start = prompt_lens - 1
        n = len(prompt_lens)
        return n_prompts * int(start.max()) + n * (width - 1 - int(start.min())) < n * (width - 1)

    def to_rows(self, x):
        """(N, S) values of the continuation -> (N, T-1) aligned with ids[:, 1:], 0 before the last prompt token."""
        col = torch.arange(self.width, device=x.device) - self.start[:, None]  # (N, T-1) continuation column
        return torch.where(col >= 0, x.gather(1, col.clamp(min=0)), 0.0)


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        for key, value, choices in (("norm", cfg.norm, NORMS), ("mlp", cfg.mlp, MLPS), ("pos", cfg.pos, POSITIONS)):
            if value not in choices:
                raise ValueError(f"model {key}={value!r}: choose from {choices}")
        layers = dict(wte=nn.Embedding(cfg.vocab_size, cfg.n_embd))
        if cfg.pos == "learned":  # (rotary positions have no table: they turn q and k in every layer)
            layers["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        layers.update(h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]), ln_f=make_norm(cfg, cfg.n_embd))
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def hidden(self, idx, pos=None, attn_mask=None, cache=None, prompts=None):
        """Final-norm hidden states (B, T, n_embd). pos: (B, T) position ids (ragged rows).
        prompts: a SharedPrompts whose continuations idx are (its positions and mask are used)."""
        if prompts is not None:
            return self._after_prompts(idx, prompts)
        T = idx.size(1)
        if pos is None:  # (the sampler passes its own positions and keeps them in range)
            if T > self.config.block_size:
                raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")
            pos = torch.arange(T, device=idx.device).unsqueeze(0)
        x, rope = self.embed(idx, pos)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, attn_mask, cache, layer, rope=rope)
        return self.transformer.ln_f(x)

    def embed(self, idx, pos):
        """The blocks' input and the rotary (cos, sin) at positions pos: token embedding plus the
        learned position's (GPT-2), or the token embedding alone and the angles (rotary)."""
        if self.config.pos == "learned":
            return dropout(self.transformer.wte(idx) + self.transformer.wpe(pos), self.config.dropout, self.training), None
        x = dropout(self.transformer.wte(idx), self.config.dropout, self.training)
        c = self.config
        return x, rotary_cos_sin(pos, c.head_dim or c.n_embd // c.n_head, c.rope_theta, x.dtype, c.rope_llama3)

    def _after_prompts(self, idx, prompts):
        """Each distinct prompt runs once (causal, right-padded: no mask needed) and every layer's
        keys and values are kept; each continuation row then attends to its prompt's, picked by
        index_select, whose backward sums the gradients of all rows sharing a prompt into it."""
        kv = []
        x, rope = self.embed(prompts.prefix_ids, prompts.prefix_pos)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, layer=layer, record=kv.append, rope=rope)
        x, rope = self.embed(idx, prompts.pos)
        for layer, block in enumerate(self.transformer.h):
            k, v = kv[layer]
            x = block(x, prompts.attn_mask, layer=layer, prefix=(k.index_select(0, prompts.rows),
                                                                  v.index_select(0, prompts.rows)), rope=rope)
        return self.transformer.ln_f(x)

    def forward(self, idx, pos=None, attn_mask=None, cache=None, prompts=None, last_only=False):
        """Logits (B, T, V) in fp32, or with last_only (a sampler's prefill) only the last position's (B, 1, V)."""
        h = self.hidden(idx, pos, attn_mask, cache, prompts)
        return fp32_linear(h[:, -1:] if last_only else h, self.lm_head)

    def resize_vocab(self, vocab_size):
        """Grow the embedding (and an untied head), e.g. for chat special tokens appended to GPT-2's
        vocabulary; new rows start at the average of the old ones."""
        old = self.transformer.wte.weight
        if vocab_size <= old.size(0):
            return
        grown = lambda w: torch.cat([w, w.mean(0, keepdim=True).expand(vocab_size - w.size(0), -1)])
        with torch.no_grad():
            self.transformer.wte = nn.Embedding.from_pretrained(grown(old), freeze=False)
            head = self.lm_head.weight if not self.config.tie_embeddings else None
            self.lm_head = nn.Linear(old.size(1), vocab_size, bias=False).to(old.device, old.dtype)
            if head is None:
                self.lm_head.weight = self.transformer.wte.weight
            else:
                self.lm_head.weight.copy_(grown(head))
        self.config.vocab_size = vocab_size


class ScalarHeadGPT(nn.Module):
    """The same backbone with one linear head: a scalar per position (reward model, critic)."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt
        self.config = gpt.config
        self.head = nn.Linear(gpt.config.n_embd, 1)
        nn.init.normal_(self.head.weight, std=1.0 / math.sqrt(gpt.config.n_embd + 1))
        nn.init.zeros_(self.head.bias)

    def forward(self, idx, pos=None, attn_mask=None):
        return fp32_linear(self.gpt.hidden(idx, pos, attn_mask), self.head).squeeze(-1)  # (B, T) fp32


# ----------------------------------------------------------------------------------------------
# Log-probs: the one function every algorithm uses to score tokens

def filter_logits(logits, top_k, top_p):
    """Truncate the (already temperature-scaled) distribution (..., V): top-k, then nucleus (top-p);
    −inf on the tokens cut."""
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # mass strictly before this token already ≥ p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def truncates(top_k, top_p):
    """Whether top_k / top_p cut anything off (None, 0 and top_p = 1 keep the whole distribution)."""
    return bool(top_k) or (top_p is not None and top_p < 1.0)


def sampled_logprobs(logits, temperature=1.0, top_k=None, top_p=None):
    """Log-probs (..., V) of the distribution a token is drawn from: softmax(logits / T), cut by top-k
    then top-p and renormalised over the tokens kept (−inf on the others):
        π_trunc(v) = π(v) / Σ_{u kept} π(u)  for v kept, 0 otherwise.
    The sampler draws from it and reports its log-probs; a trainer that scores with the same cut gets
    the same numbers (ρ = 1 before an update). Scored on the full softmax instead, every kept token's
    ratio is the kept mass Σ_{u kept} π(u) < 1 (TRL 6789). T = 0 (greedy): the T = 1 distribution, whole."""
    logp = F.log_softmax(logits.float() if temperature in (0, 1) else logits.float() / temperature, dim=-1)
    if temperature == 0 or not truncates(top_k, top_p):
        return logp
    return filter_logits(logp, top_k, top_p).log_softmax(-1)


def token_logprobs(logits, targets, temperature=1.0, top_k=None, top_p=None):
    """log π(targets | prefix) per position, in fp32. logits (B, T, V), targets (B, T) -> (B, T).

    RL must divide by the sampler's temperature, or the ratio π_θ/π_old is wrong from step one; and
    with top_k / top_p, score the same truncated distribution the sampler drew from (sampled_logprobs)."""
    if truncates(top_k, top_p):
        return gather_targets(sampled_logprobs(logits, temperature, top_k, top_p), targets)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # cross_entropy avoids materialising the (B, T, V) log_softmax
    return -F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


def token_logprobs_and_entropy(logits, targets, temperature=1.0, top_k=None, top_p=None, max_elements=2 ** 22):
    """token_logprobs, and without gradient each position's entropy (nats), (B, T) each, from one
    log_softmax (computed apart, the two cost 1.5× as much on CPU, backward included)."""
    logp_all = sampled_logprobs(logits, temperature, top_k, top_p)
    return gather_targets(logp_all, targets), token_entropy(logp_all, max_elements)


def gather_targets(logp_all, targets):
    """log π(target) at each position of log-probs (..., V). A target a top-k / top-p cut left out
    scores the lowest float rather than −inf: on a prompt or padding position, where the target is
    anything, −inf − (−inf) would be a NaN that no mask removes from a gradient."""
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1).clamp(min=torch.finfo(logp_all.dtype).min)


@torch.no_grad()
def token_entropy(logp_all, max_elements=2 ** 22):
    """H = −Σ_v p(v) log p(v) per position of log-probs (..., V), without gradient, in chunks of at most
    16 MB (a logged figure never copies the whole (B, T, V)); a truncated distribution's −inf counts 0."""
    rows = logp_all.detach().flatten(0, -2)
    chunks = rows.split(max(1, max_elements // rows.size(-1)))
    entropy = [-(c.exp() * c.masked_fill(c == float("-inf"), 0.0)).sum(-1) for c in chunks]
    return torch.cat(entropy).view(logp_all.shape[:-1])


def sequence_logprobs(model, ids, temperature=1.0, prompt_lens=None, top_k=None, top_p=None):
    """Per-token log-probs of ids[:, 1:] given their prefixes: (B, T-1). Right padding is harmless
    (causal attention never looks ahead); the caller masks padded and prompt positions. With
    prompt_lens (B,), rows that share a prompt run it once (SharedPrompts): the same log-probs from
    the last prompt token on, 0 before it."""
    if prompt_lens is None:
        return token_logprobs(model(ids[:, :-1]), ids[:, 1:], temperature, top_k, top_p)
    shared = SharedPrompts(ids, prompt_lens)
    return shared.to_rows(token_logprobs(model(shared.inputs, prompts=shared), shared.targets, temperature, top_k,
                                         top_p))


def kl_estimate(logprobs, ref_logprobs, estimator="k1"):
    """Per-token estimate of KL(π‖π_ref) from the log-probs of tokens sampled from π [M14 §9]:
    k1 = log π − log π_ref (unbiased, can be negative); k3 = ρ − 1 − log ρ with ρ = π_ref/π
    (unbiased, never negative, 0 where π = π_ref)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kl estimator {estimator!r}: choose k1 or k3")


def clipped_surrogate(ratio, adv, on, eps_low, eps_high):
    """PPO's clipped surrogate per token, −min(ρ·A, clip(ρ, 1 − eps_low, 1 + eps_high)·A) (Schulman et al.
    2017; ppo.py and grpo.py alike), and the tokens of `on` whose gradient the clip cut: A > 0 with
    ρ > 1 + eps_high, A < 0 with ρ < 1 − eps_low."""
    low, high = 1 - eps_low, 1 + eps_high
    per_token = -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    with torch.no_grad():
        clipped = on & (((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low)))
    return per_token, clipped


# ----------------------------------------------------------------------------------------------
# LoRA: frozen W plus a trainable low-rank update B·A·(α/r), B zero-initialised (no change at init)

class LoRALinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale

    def merged(self):
        with torch.no_grad():
            self.base.weight += (self.lora_B @ self.lora_A) * self.scale
        return self.base


def apply_lora(model, rank, alpha=None, trainable=()):
    """Wrap every linear layer of the transformer blocks (attention and MLP) in LoRA and freeze the
    rest, except parameters with a name component in `trainable` (e.g. "head": a scalar head).
    Returns (trainable, total) parameter counts."""
    alpha = alpha if alpha is not None else 2 * rank
    for p in model.parameters():
        p.requires_grad_(False)
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LoRALinear(child, rank, alpha))
    for name, p in model.named_parameters():
        if any(part in trainable for part in name.split(".")):
            p.requires_grad_(True)
    return count_parameters(model)


def merge_lora(model):
    """Fold every B·A·(α/r) into its W, leaving plain nn.Linear layers (same logits, faster)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def count_parameters(model):
    """(trainable, total), counting a tied weight once."""
    params = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
