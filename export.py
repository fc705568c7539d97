"""
Write a trained checkpoint as a transformers directory: GPT2LMHeadModel for GPT-2's block, and for
the Llama family's the class it was imported from (LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM: hf.hf_family_of reads it off the config's options).

    python export.py out/sft out/sft-hf        # any algorithm that trains a language model
    python export.py out/ppo out/ppo-hf        # PPO: the policy (the critic stays behind)
    python export.py out/smollm2_sft out/smollm2_sft.gguf   # a model started from a GGUF file: back to
                                                             # GGUF (F32; its tokenizer's tables included)

The directory holds config.json and model.safetensors (LoRA merged: the checkpoint's model as
checkpoints.load_model gives it) and the tokenizer's files, so that

    AutoModelForCausalLM.from_pretrained(OUT_DIR)   gives the checkpoint's logits, and
    AutoTokenizer.from_pretrained(OUT_DIR)          gives the same token ids (chat specials included)

A checkpoint trained with a model's own tokenizer (--tokenizer=Qwen/Qwen2.5-0.5B-Instruct) writes
that tokenizer back, chat template included, and generation stops at its end-of-turn token.

The byte tokenizer becomes a byte-level BPE without merges (ids 0-255 are the bytes, then
<|bos|>, <|eos|>, <|pad|>, ...). The vocabulary stays padded to a multiple of 64: ids past the
tokenizer's are never produced by it. To train on from the export: --init_from=OUT_DIR
--tokenizer=OUT_DIR (or --tokenizer=byte, the same ids). Needs the optional transformers package.
"""

import sys

from nanopost.checkpoints import load_model, load_tokenizer
from nanopost.gguf_file import is_gguf, read_model, write
from nanopost.hf import to_transformers
from nanopost.tokenizer import GGUFTokenizer, make_tokenizer
from model import GPT
from nanopost.options import optional_dependency


def export(ckpt_dir, out_dir):
    if is_gguf(ckpt_dir):  # a GGUF file itself (smollm2): its model and tokenizer as transformers'
        model, tok = read_model(ckpt_dir), make_tokenizer(ckpt_dir)
    else:
        model, tok = load_model(ckpt_dir), load_tokenizer(ckpt_dir)
    if not isinstance(model, GPT):
        raise ValueError(f"{ckpt_dir} holds a scalar model (a reward model): only a language model exports")
    if out_dir.lower().endswith(".gguf"):
        if not isinstance(tok, GGUFTokenizer):
            raise ValueError(f"{out_dir}: a GGUF file carries its tokenizer's tables, and {ckpt_dir}'s tokenizer "
                             f"{tok.name!r} came from no GGUF file: export to a directory instead")
        return write(model, tok.vocabulary, out_dir)
    hf = to_transformers(model)
    # transformers' generate stops at the end token (<|eos|>, or the chat template's end of turn) and pads with pad
    hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id = tok.bos, tok.eos, tok.pad
    hf.generation_config.bos_token_id, hf.generation_config.eos_token_id = tok.bos, tok.eos
    hf.generation_config.pad_token_id = tok.pad
    hf.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


USAGE = "usage: python export.py CKPT_DIR|FILE.gguf OUT_DIR|OUT.gguf"

if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(USAGE + "\n" + __doc__)
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.exit(USAGE)
    try:
        export(*sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    except ImportError as e:  # transformers, which the export needs, is optional
        sys.exit(f"error: {optional_dependency(e)}")
    if is_gguf(sys.argv[2]):
        print(f"wrote {sys.argv[2]}: train from it with --init_from={sys.argv[2]} --tokenizer={sys.argv[2]}")
    else:
        print(f"wrote {sys.argv[2]}: load it with transformers.AutoModelForCausalLM.from_pretrained({sys.argv[2]!r})")
