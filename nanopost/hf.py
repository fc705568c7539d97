"""
transformers checkpoints in and out: which architectures load (GPT-2, Llama, Qwen2, Qwen3), how
their configs and weight names map to model.GPT's, and the two conversions, from_pretrained (a hub
name or a save_pretrained directory -> a GPT with the same logits) and to_transformers (a GPT -> the
transformers model of its family, the same weights). Needs the optional transformers package.
"""

import os

import torch

from model import GPT, GPTConfig

HF_ARCHITECTURES = dict(gpt2="GPT2LMHeadModel", llama="LlamaForCausalLM", qwen2="Qwen2ForCausalLM",
                        qwen3="Qwen3ForCausalLM")
# GPT-2 stores these linear layers as Conv1D, whose weight is the transpose of nn.Linear's
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# A name ending so is a file, never a hub name
FILE_EXTENSIONS = (".json", ".jsonl", ".parquet", ".csv", ".txt", ".pt", ".bin", ".safetensors")


def looks_local(name):
    """Whether a name (--data, --init_from, ...) means a local path, so that a missing one is "no such
    file" rather than a hub lookup (a long wait, then a connection error): it starts with '.', '/' or
    '~', holds a backslash or more than the one '/' of owner/name, ends with a file extension, or its
    first component exists here (out/sftt: out/ does)."""
    first = name.split("/")[0]
    return (name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1
            or name.lower().endswith(FILE_EXTENSIONS) or ("/" in name and os.path.exists(first)))


def from_pretrained(name_or_dir, dropout=0.0):
    """Weights of a transformers checkpoint: a hub name ('gpt2', 'Qwen/Qwen2.5-0.5B-Instruct', ...:
    network) or a local directory written by save_pretrained (offline). The architecture named in
    its config.json picks the layout (HF_ARCHITECTURES); any other is an error naming it. Needs
    the optional transformers package."""
    family = hf_family(name_or_dir)
    import transformers
    cfg = config_from_hf(transformers.AutoConfig.from_pretrained(name_or_dir), family, dropout)  # checked before any weight
    hf = getattr(transformers, HF_ARCHITECTURES[family]).from_pretrained(name_or_dir, dtype=torch.float32)
    model = GPT(cfg)
    sd_hf = hf.state_dict()
    with torch.no_grad():
        if family == "gpt2":
            for name, p in model.state_dict().items():
                if name != "lm_head.weight" or not model.config.tie_embeddings:
                    p.copy_(sd_hf[name].t() if name.endswith(CONV1D_WEIGHTS) else sd_hf[name])
        else:
            load_llama_state(model, sd_hf, name_or_dir)
    return model


def load_llama_state(model, sd_hf, source):
    """A Llama-family model's weights from transformers' names (sd_hf), fused into ours (llama_names);
    a weight with no place in the model is an error naming `source`."""
    pairs = llama_names(model)
    unused = set(sd_hf) - {n for _, names in pairs for n in names} - {"lm_head.weight"}
    if unused:
        raise ValueError(f"{source}: weights this model has no place for: {sorted(unused)[:5]}")
    state = {ours: torch.cat([sd_hf[n] for n in names]) for ours, names in pairs}
    if model.config.tie_embeddings:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state)


def to_transformers(model):
    """The inverse of from_pretrained: a transformers GPT2LMHeadModel, LlamaForCausalLM,
    Qwen2ForCausalLM or Qwen3ForCausalLM (by the config's options, hf_family_of) holding the
    same weights (same logits), in eval mode, on this model's device. Needs the optional
    transformers package."""
    import transformers
    family = hf_family_of(model.config)
    hf = getattr(transformers, HF_ARCHITECTURES[family])(config_to_hf(model.config, family))
    if family == "gpt2":
        state = {name: (p.t() if name.endswith(CONV1D_WEIGHTS) else p) for name, p in model.state_dict().items()}
        ignored = (".attn.bias", ".attn.masked_bias")
    else:  # each of our fused matrices is split back into transformers' parts, by their sizes
        ours, sizes = model.state_dict(), {n: p.size(0) for n, p in hf.state_dict().items()}
        state = {n: part for name, names in llama_names(model)
                 for n, part in zip(names, ours[name].split([sizes[n] for n in names]))}
        ignored = ("lm_head.weight",) if model.config.tie_embeddings else ()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith(ignored) for k in missing):
        raise RuntimeError(f"weight names do not line up: missing {missing}, unexpected {unexpected}")
    if model.config.tie_embeddings:
        hf.tie_weights()
    return hf.to(next(model.parameters()).device).eval()


def hf_family(name_or_dir):
    """The model_type ("gpt2", "llama", ...) of a checkpoint's config.json, read before any weight,
    or a ValueError naming its architecture and what loads."""
    try:
        from transformers import PretrainedConfig
    except ImportError:
        raise ImportError("loading transformers checkpoints needs the optional transformers package: "
                          "pip install transformers") from None
    try:
        raw = PretrainedConfig.get_config_dict(name_or_dir)[0]
    except OSError as e:  # neither a directory with config.json nor a reachable hub name
        raise ValueError(f"{name_or_dir}: no transformers checkpoint there ({str(e).splitlines()[0]})") from None
    archs, family = raw.get("architectures") or [], raw.get("model_type")
    if family in HF_ARCHITECTURES and (not archs or HF_ARCHITECTURES[family] in archs):
        return family
    raise ValueError(f"{name_or_dir}: architecture {', '.join(archs) or '?'} (model_type {family!r}) is not "
                     f"supported; supported: {', '.join(HF_ARCHITECTURES.values())}")


def hf_family_of(cfg):
    """The transformers class a config exports to: GPT-2's block, else Qwen3 (QK-norm), Qwen2
    (q, k, v biases) or Llama."""
    if cfg.norm == "layernorm" and cfg.mlp == "gelu" and cfg.pos == "learned":
        return "gpt2"
    if (cfg.norm, cfg.mlp, cfg.pos, cfg.bias) != ("rmsnorm", "swiglu", "rope", False):
        raise ValueError("only GPT-2's block or the Llama family's (rmsnorm, swiglu, rope, bias=False) exports")
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"


def rope_of(c):
    """(θ, Llama 3's rescaling or ()) of a transformers config (rope_parameters from transformers 5,
    rope_theta and rope_scaling before); any other rope scaling is an error."""
    params = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta, **(getattr(c, "rope_scaling", None) or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "llama3":
        return float(params["rope_theta"]), tuple(float(params[k]) for k in LLAMA3_KEYS)
    if kind != "default":
        raise ValueError(f"rope scaling {kind!r} is not supported (plain rotary positions and Llama 3's 'llama3')")
    return float(params["rope_theta"]), ()


LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def config_from_hf(c, family, dropout):
    if family == "gpt2":
        return GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                         n_embd=c.n_embd, dropout=dropout, bias=True, tie_embeddings=c.tie_word_embeddings)
    unsupported = [k for k in ("attention_bias", "mlp_bias", "use_sliding_window") if getattr(c, k, False)]
    if unsupported or c.hidden_act != "silu":
        raise ValueError(f"{family} with {unsupported or c.hidden_act} is not supported")
    rope = rope_of(c)
    return GPTConfig(block_size=c.max_position_embeddings, vocab_size=c.vocab_size, n_layer=c.num_hidden_layers,
                     n_head=c.num_attention_heads, n_embd=c.hidden_size, dropout=dropout, bias=False,
                     norm="rmsnorm", norm_eps=c.rms_norm_eps, mlp="swiglu", mlp_hidden=c.intermediate_size,
                     pos="rope", rope_theta=rope[0], rope_llama3=rope[1], n_kv_head=c.num_key_value_heads,
                     head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                     qkv_bias=family == "qwen2", qk_norm=family == "qwen3", tie_embeddings=c.tie_word_embeddings)


def config_to_hf(c, family):
    import transformers
    if family == "gpt2":
        if not c.bias:
            raise ValueError("GPT-2 has biases: only a bias=True model converts")
        return transformers.GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd,
                                       n_layer=c.n_layer, n_head=c.n_head, resid_pdrop=c.dropout,
                                       embd_pdrop=c.dropout, attn_pdrop=c.dropout, bos_token_id=None,
                                       eos_token_id=None, tie_word_embeddings=c.tie_embeddings)
    kind = getattr(transformers, HF_ARCHITECTURES[family].replace("ForCausalLM", "Config"))
    rope = dict(rope_type="default", rope_theta=c.rope_theta)
    if c.rope_llama3:
        rope.update(zip(LLAMA3_KEYS, c.rope_llama3), rope_type="llama3", original_max_position_embeddings=int(c.rope_llama3[3]))
    return kind(rope_parameters=rope, vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.mlp_hidden or 4 * c.n_embd,
                num_hidden_layers=c.n_layer, num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head or c.n_head,
                head_dim=c.head_dim or c.n_embd // c.n_head, max_position_embeddings=c.block_size,
                rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
                attention_dropout=c.dropout, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def llama_names(model):
    """(our parameter, [transformers' parameters]) for a Llama-family model: where several are named,
    ours is theirs concatenated along dim 0 (q, k, v into c_attn; gate, up into c_fc)."""
    ours = model.state_dict()
    modules = [("transformer.wte", ["model.embed_tokens"]), ("transformer.ln_f", ["model.norm"]),
               ("lm_head", ["lm_head"])]
    for i in range(model.config.n_layer):
        a, b = f"transformer.h.{i}.", f"model.layers.{i}."
        modules += [(a + "ln_1", [b + "input_layernorm"]), (a + "ln_2", [b + "post_attention_layernorm"]),
                    (a + "attn.c_attn", [b + f"self_attn.{p}_proj" for p in "qkv"]),
                    (a + "attn.c_proj", [b + "self_attn.o_proj"]),
                    (a + "attn.q_norm", [b + "self_attn.q_norm"]), (a + "attn.k_norm", [b + "self_attn.k_norm"]),
                    (a + "mlp.c_fc", [b + "mlp.gate_proj", b + "mlp.up_proj"]), (a + "mlp.c_proj", [b + "mlp.down_proj"])]
    skip_head = model.config.tie_embeddings
    return [(f"{mine}.{kind}", [f"{n}.{kind}" for n in theirs]) for mine, theirs in modules for kind in ("weight", "bias")
            if f"{mine}.{kind}" in ours and not (skip_head and mine == "lm_head")]
