"""
Tokenizer and chat template, through tiktoken.

Two encodings:
- "byte" (the default, built in, no download): the 256 byte values as tokens plus the chat special
  tokens. Every string round-trips, and the vocabulary is tiny, which suits the tiny default model.
- GPT-2's BPE plus the same special tokens appended after GPT-2's 50257 ids, for GPT-2 weights:
  "gpt2" (tiktoken fetches it once, then caches it), or offline a directory holding the vocab.json
  that transformers' save_pretrained writes for a GPT-2 tokenizer (the same table as GPT-2's
  encoder.json).

save_pretrained writes either one as a transformers GPT2Tokenizer directory with the same ids
(export.py): the byte encoding is a byte-level BPE without merges, the 256 bytes as ids 0-255.

Chat template (one for every algorithm, so policy and reference always see the same ids):

    <|bos|> <|user|> question <|eos|> <|assistant|> answer <|eos|>

The loss mask is 1 exactly on the assistant's content and its closing <|eos|>: a model that never
sees its end token in the loss never learns to stop. <|pad|> only fills ragged batches and is never
the end token.

A real checkpoint (Qwen2.5-Instruct, SmolLM2, Llama 3) must see its own vocabulary and chat
template instead: ChatTemplateTokenizer wraps its transformers tokenizer with the same methods, and
make_tokenizer(name) picks it for any tokenizer that carries a chat template.
"""

import json
import os
import re

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenisation pattern

from nanopost.gguf_file import is_gguf, read_vocabulary
from nanopost.hf import looks_local

SPECIAL_TOKENS = [
    "<|bos|>", "<|eos|>", "<|pad|>",
    "<|system|>", "<|user|>", "<|assistant|>",
    "<|tool_call|>", "<|/tool_call|>", "<|tool_result|>", "<|/tool_result|>",
]
ROLES = ("system", "user", "assistant", "tool")
TOOL_TAGS_TEXT = ("<|tool_call|>", "<|/tool_call|>", "<|tool_result|>", "<|/tool_result|>")
TOOL_TAGS = "(" + "|".join(re.escape(tag) for tag in TOOL_TAGS_TEXT) + ")"  # re.split keeps them
# a "tool" message is environment output: rendered inside tool_result tags and never learned
_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_byte_chars():
    """GPT-2's spelling of bytes in its vocab.json (bytes_to_unicode): the printable ones as
    themselves, the other 68 as chr(256), chr(257), ... in byte order. byte -> character."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}


def gpt2_bpe(name):
    """(mergeable ranks, pattern, id of <|endoftext|> or None) of GPT-2's BPE, from tiktoken ("gpt2")
    or a local directory."""
    if name == "gpt2":
        base = tiktoken.get_encoding("gpt2")
        return base._mergeable_ranks, base._pat_str, base.eot_token
    path = os.path.join(name, "vocab.json")
    if not os.path.isfile(path):
        raise ValueError(f"unknown tokenizer {name!r}: expected 'byte', 'gpt2' or a directory with "
                         f"GPT-2's vocab.json")
    char_to_byte = {c: b for b, c in gpt2_byte_chars().items()}
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)
    ranks = {}
    for token, rank in vocab.items():  # a GPT-2 token's id is its merge rank
        if token == "<|endoftext|>" or token in SPECIAL_TOKENS:  # (ours: a directory save_pretrained wrote)
            continue
        if any(c not in char_to_byte for c in token):
            raise ValueError(f"{path}: token {token!r} is not in GPT-2's byte alphabet")
        ranks[bytes(char_to_byte[c] for c in token)] = rank
    if sorted(ranks.values()) != list(range(len(ranks))) or any(bytes([b]) not in ranks for b in range(256)):
        raise ValueError(f"{path}: not a byte-level BPE vocabulary (ids 0..n-1 with every single byte)")
    return ranks, r50k_pat_str, vocab.get("<|endoftext|>")


def bpe_merges(ranks):
    """The merge list (merges.txt) that rebuilds tiktoken's `ranks`: each token of two or more bytes
    is the merge of the two parts that byte-pair encoding reaches with the lower-ranked tokens."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:  # apply the lowest-ranked merge, as BPE does, until two parts are left
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], len(ranks)))
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2:
            merges.append(tuple(parts))
    return merges


class Tokenizer:
    def __init__(self, name="byte"):
        if name == "byte":
            ranks, pat, specials = {bytes([i]): i for i in range(256)}, _PAT, {}
        else:  # GPT-2's <|endoftext|> keeps its id (50256), right after the merges
            ranks, pat, endoftext = gpt2_bpe(name)
            specials = {} if endoftext is None else {"<|endoftext|>": endoftext}
        first = len(ranks) + len(specials)
        specials.update({tok: first + i for i, tok in enumerate(SPECIAL_TOKENS)})
        self.name, self.ranks = name, ranks
        self.enc = tiktoken.Encoding(name=f"nanopost-{os.path.basename(os.path.normpath(name))}", pat_str=pat,
                                     mergeable_ranks=ranks, special_tokens=specials)
        self.n_vocab = self.enc.n_vocab
        self.special = {tok[2:-2]: i for tok, i in specials.items()}  # "bos" -> id, "/tool_call" -> id
        self.bos, self.eos, self.pad = self.special["bos"], self.special["eos"], self.special["pad"]

    def encode(self, text):
        # plain text never turns into special tokens: a user typing "<|eos|>" gets bytes
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        # ids past the vocabulary (the model's embedding is padded to a multiple of 64) show as U+FFFD
        parts = [self.enc.decode_single_token_bytes(i) if i < self.n_vocab else b"\xef\xbf\xbd"
                 for i in ids if i != self.pad]
        return b"".join(parts).decode("utf-8", errors="replace")

    def render_chat(self, messages, add_generation_prompt=False):
        """messages: [{"role", "content"}] -> (ids, loss_mask); mask is 1 on assistant tokens."""
        ids, mask = [self.bos], [0]
        for i, msg in enumerate(messages):
            role, content = msg.get("role"), msg.get("content")
            if role not in ROLES:
                raise ValueError(f"message {i}: role must be one of {ROLES}, got {role!r}")
            if not isinstance(content, str):
                raise ValueError(f"message {i}: content must be a string, got {type(content).__name__}")
            if role == "tool":
                body = [self.special["tool_result"]] + self.encode(content) + [self.special["/tool_result"]]
            else:
                body = [self.special[role]] + self.encode(content) + [self.eos]
            learn = 1 if role == "assistant" else 0
            ids += body
            mask += [0] + [learn] * (len(body) - 1)  # the role token itself is template, not learned
        if add_generation_prompt:
            ids.append(self.special["assistant"])
            mask.append(0)
        return ids, mask

    def prompt_ids(self, prompt):
        """A single-turn prompt, ready for the assistant to answer: render_chat's ids of one user message
        with the generation prompt, <|bos|><|user|>PROMPT<|eos|><|assistant|>."""
        return [self.bos, self.special["user"]] + self.encode(prompt) + [self.eos, self.special["assistant"]]

    def response_ids(self, response):
        """The assistant's answer as the model must produce it (end token included)."""
        return self.encode(response) + [self.eos]

    def assistant_ids(self, response):
        """(ids, loss mask) of an answer that may hold tool calls and their results, written with the
        tags as text ("<|tool_call|>347*28<|/tool_call|><|tool_result|>9716<|/tool_result|>Answer: ..."):
        the tags become their special ids, as the model writes them and the sampler injects them, and
        each result span, tags included, has mask 0: environment output is context, never a target
        (exactly the tokens the sampler forces). Without tags: (response_ids(response), all ones)."""
        ids, mask, in_result = [], [], False
        for part in re.split(TOOL_TAGS, response):
            in_result = in_result or part == "<|tool_result|>"
            part_ids = [self.special[part[2:-2]]] if part in TOOL_TAGS_TEXT else self.encode(part)
            ids += part_ids
            mask += [0 if in_result else 1] * len(part_ids)
            in_result = in_result and part != "<|/tool_result|>"
        return ids + [self.eos], mask + [1]

    def save_pretrained(self, directory):
        """Write this tokenizer as a transformers GPT2Tokenizer directory (vocab.json, merges.txt, the
        special tokens) that gives every text the same ids, and that Tokenizer(directory) reads back.
        Needs the optional transformers package."""
        from transformers import GPT2Tokenizer
        chars = gpt2_byte_chars()
        spell = lambda token: "".join(chars[b] for b in token)  # GPT-2's spelling of a byte string
        vocab = {spell(token): rank for token, rank in self.ranks.items()}
        vocab.update({f"<|{name}|>": i for name, i in self.special.items()})
        os.makedirs(directory, exist_ok=True)
        vocab_file, merges_file = os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
        with open(vocab_file, "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(merges_file, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(f"{spell(a)} {spell(b)}\n" for a, b in bpe_merges(self.ranks)))
        named = {"<|bos|>", "<|eos|>", "<|pad|>"}
        hf = GPT2Tokenizer(vocab_file, merges_file, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>",
                           unk_token="<|endoftext|>" if "endoftext" in self.special else "<|pad|>",
                           additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in named])
        hf.save_pretrained(directory)


def has_chat_template(name):
    """Whether `name` (a local directory or a hub name) is a transformers tokenizer with a chat
    template: built-in names and a GPT-2 vocab.json directory without one are ours."""
    if name in ("byte", "gpt2"):
        return False
    if not os.path.isdir(name):
        return True  # a hub name: only a chat tokenizer is looked up there
    if os.path.isfile(os.path.join(name, "chat_template.jinja")):
        return True
    config = os.path.join(name, "tokenizer_config.json")
    return os.path.isfile(config) and "chat_template" in json.load(open(config, encoding="utf-8"))


def make_tokenizer(name):
    """The tokenizer a config names: "byte", "gpt2", a GPT-2 vocab directory (Tokenizer), a
    checkpoint's own tokenizer with its chat template (ChatTemplateTokenizer), or a GGUF file's
    ("smollm2" or a path ending .gguf: GGUFTokenizer)."""
    if name in ("byte", "gpt2"):
        return Tokenizer(name)
    if is_gguf(name):
        return GGUFTokenizer(name)
    if looks_local(name) and not os.path.exists(name):  # never a hub lookup for a path
        raise FileNotFoundError(f"tokenizer={name}: no such directory")
    return ChatTemplateTokenizer(name) if has_chat_template(name) else Tokenizer(name)


class ChatTemplateTokenizer:
    """A transformers tokenizer and its chat template behind Tokenizer's methods, so that every
    algorithm renders prompts, SFT conversations and preference pairs exactly as the checkpoint was
    trained to see them. Needs the optional transformers package.

    eos is the template's end of turn (the special token right after an assistant message: Qwen's
    <|im_end|>, Llama 3's <|eot_id|>), the sampler's stop token; the loss mask is 1 on each
    assistant message's tokens through that end token, 0 on the template around them."""

    def __init__(self, name):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ImportError(f"tokenizer={name!r} needs the optional transformers package: pip install transformers") from None
        try:
            self.name, self.hf = name, AutoTokenizer.from_pretrained(name)
        except OSError as e:  # not a directory with a tokenizer, and the hub unreachable or without it
            raise ValueError(f"tokenizer {name!r}: cannot load it ({str(e).splitlines()[0]})") from None
        if not self.hf.chat_template or not self.hf.is_fast:
            raise ValueError(f"tokenizer {name!r}: needs a fast tokenizer with a chat template")
        self.plain = type(self.hf.backend_tokenizer).from_str(self.hf.backend_tokenizer.to_str())
        self.plain.encode_special_tokens = True  # plain text never turns into special tokens
        self.n_vocab = len(self.hf)
        self.eos = self.end_of_turn()
        self.bos = self.hf.bos_token_id if self.hf.bos_token_id is not None else self.eos
        self.pad = self.hf.pad_token_id
        if self.pad is None or self.pad == self.eos:  # the pad must never read as the end of a turn
            self.pad = next((i for i in self.hf.all_special_ids if i != self.eos), None)
        if self.pad is None:
            raise ValueError(f"tokenizer {name!r}: no special token besides the end of turn to pad with")
        self.special = dict(bos=self.bos, eos=self.eos, pad=self.pad)

    def end_of_turn(self):
        """The first token after an assistant message's text in the template: its closing token."""
        marker = "MARKER"
        text = self.render_text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}])
        after = self.hf(text[text.rindex(marker) + len(marker):], add_special_tokens=False)["input_ids"]
        if not after or after[0] not in self.hf.all_special_ids:
            raise ValueError(f"tokenizer {self.name!r}: its chat template closes an assistant message with no "
                             f"special token, so there is no end-of-turn token to stop at")
        return after[0]

    def render_text(self, messages, add_generation_prompt=False):
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text):
        return self.plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.hf.decode([i for i in ids if i != self.pad])

    def render_chat(self, messages, add_generation_prompt=False):
        """(ids, loss mask) of the template's text tokenised as one string (what apply_chat_template
        gives). The mask is 1 on the tokens inside an assistant message's span of text: from the end
        of the conversation before it with the generation prompt, through its end-of-turn token.
        A template that does not render each conversation's beginning as a prefix of it (one that
        drops earlier reasoning, say) cannot give an exact mask: an error."""
        for i, msg in enumerate(messages):
            if msg.get("role") not in ROLES or not isinstance(msg.get("content"), str):
                raise ValueError(f"message {i}: needs a role in {ROLES} and a string content")
        text = self.render_text(messages, add_generation_prompt)
        spans = assistant_spans(self, messages, text)
        encoded = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(a <= first and last <= b for a, b in spans)) for first, last in encoded["offset_mapping"]]
        return encoded["input_ids"], mask

    def prompt_ids(self, prompt):
        return self.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)[0]

    def response_ids(self, response):
        return self.encode(response) + [self.eos]

    def assistant_ids(self, response):
        """(ids, mask) of an answer: its tokens and the end of turn, all learned (no tool tags here)."""
        ids = self.response_ids(response)
        return ids, [1] * len(ids)

    def save_pretrained(self, directory):
        self.hf.save_pretrained(directory)


def assistant_spans(tok, messages, text):
    """The character spans of `text` (the whole conversation rendered) that the loss learns: each
    assistant message, from the end of the conversation before it with the generation prompt
    through its end-of-turn token. A template that does not render each conversation's beginning as
    a prefix of it (one that drops earlier reasoning, say) cannot give an exact mask: an error."""
    spans, end_text = [], tok.decode([tok.eos])
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant":
            before, through = tok.render_text(messages[:i], True), tok.render_text(messages[:i + 1])
            if not (text.startswith(before) and text.startswith(through) and through.startswith(before)):
                raise ValueError(f"message {i}: the chat template does not render the conversation before "
                                 f"it as a prefix, so its loss mask cannot be exact")
            close = through.rfind(end_text, len(before))
            spans.append((len(before), len(through) if close < 0 else close + len(end_text)))
    return spans


class GGUFTokenizer:
    """A GGUF file's own tokenizer (nanopost/gguf_file.py reads its tables), through tiktoken: its
    byte-level BPE vocabulary and merges, its control tokens as specials, and its chat template
    rendered with jinja2 as transformers renders it. The ids equal transformers' tokenizer built
    from the same file (AutoTokenizer.from_pretrained(dir, gguf_file=...)), which splits text with
    GPT-2's pattern whatever the file's pre-tokenizer (SmolLM2's, 'smollm', splits digits one by
    one; this vocabulary has no merge of a digit, so that differs only where several spaces or
    newlines stand before a digit). Bytes missing from the vocabulary (SmolLM2: 21 of them, control
    characters and bytes that start no common character) are dropped, as transformers drops them.

    The same methods as ChatTemplateTokenizer, so every algorithm runs on it unchanged."""

    def __init__(self, name):
        try:
            import jinja2.sandbox
        except ImportError:
            raise ImportError(f"tokenizer={name!r}: its chat template needs jinja2: pip install jinja2") from None
        self.name, self.vocabulary = name, read_vocabulary(name)
        char_to_byte = {c: b for b, c in gpt2_byte_chars().items()}
        tokens, types = self.vocabulary["tokens"], self.vocabulary["token_types"]
        specials = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 3}  # 3: control
        ranks = {bytes(char_to_byte[c] for c in t): i for i, t in enumerate(tokens) if t not in specials}
        # tiktoken merges by the rank of the merged token; the file's merges are in its id order (checked)
        merged = [ranks[bytes(char_to_byte[c] for c in m.replace(" ", ""))] for m in self.vocabulary["merges"]]
        if merged != sorted(merged):
            raise ValueError(f"{name}: its merges are not in the order of their tokens' ids: not supported")
        self.n_vocab = len(tokens)
        missing = [bytes([b]) for b in range(256) if bytes([b]) not in ranks]  # (tiktoken needs every byte)
        ranks.update({b: self.n_vocab + i for i, b in enumerate(missing)})
        self.enc = tiktoken.Encoding(name=f"nanopost-gguf-{os.path.basename(name)}", pat_str=r50k_pat_str,
                                     mergeable_ranks=ranks, special_tokens=specials)
        self.specials = specials
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(self.vocabulary["chat_template"] or "")
        if not self.vocabulary["chat_template"]:
            raise ValueError(f"tokenizer {name!r}: the GGUF file has no chat template")
        self.eos = self.end_of_turn()
        self.bos = self.vocabulary["bos"] if self.vocabulary["bos"] is not None else self.eos
        # the pad must never read as the end of a turn: the file's, else its first other control token
        pad = self.vocabulary["pad"]
        self.pad = pad if pad is not None and pad != self.eos else min(i for i in specials.values() if i != self.eos)
        self.special = dict(bos=self.bos, eos=self.eos, pad=self.pad)

    def end_of_turn(self):
        """The first token after an assistant message's text in the template: its closing token."""
        text = self.render_text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "MARKER"}])
        after = self.enc.encode(text[text.rindex("MARKER") + len("MARKER"):], allowed_special="all")
        if not after or after[0] not in self.specials.values():
            raise ValueError(f"tokenizer {self.name!r}: its chat template closes an assistant message with no "
                             f"special token, so there is no end-of-turn token to stop at")
        return after[0]

    def render_text(self, messages, add_generation_prompt=False):
        named = {f"{key}_token": self.vocabulary["tokens"][self.vocabulary[key]] if self.vocabulary[key] is not None else ""
                 for key in ("bos", "eos")}  # (a template may write them)
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **named)

    def encode(self, text):
        # plain text never turns into special tokens: a user typing "<|im_end|>" gets its characters
        return [i for i in self.enc.encode_ordinary(text) if i < self.n_vocab]

    def decode(self, ids):
        return b"".join(self.enc.decode_single_token_bytes(i) for i in ids
                        if i != self.pad and i < self.n_vocab).decode("utf-8", errors="replace")

    def render_chat(self, messages, add_generation_prompt=False):
        """(ids, loss mask) of the template's text, its special tokens' text as their ids; the mask is 1
        on the tokens inside the assistant spans (assistant_spans), by each token's character offsets."""
        for i, msg in enumerate(messages):
            if msg.get("role") not in ROLES or not isinstance(msg.get("content"), str):
                raise ValueError(f"message {i}: needs a role in {ROLES} and a string content")
        text = self.render_text(messages, add_generation_prompt)
        spans = assistant_spans(self, messages, text)
        ids = [i for i in self.enc.encode(text, allowed_special="all") if i < self.n_vocab]
        _, starts = self.enc.decode_with_offsets(ids)
        ends = starts[1:] + [len(text)]
        return ids, [int(any(a <= first and last <= b for a, b in spans)) for first, last in zip(starts, ends)]

    # a prompt, a response and an answer's ids: as a transformers chat template's (the same template here)
    prompt_ids, response_ids, assistant_ids = (ChatTemplateTokenizer.prompt_ids, ChatTemplateTokenizer.response_ids,
                                               ChatTemplateTokenizer.assistant_ids)

    def save_pretrained(self, directory):
        """A transformers tokenizer directory (vocab.json, merges.txt, the control tokens as specials,
        the chat template) that gives every text the same ids. Needs the optional transformers package."""
        from transformers import GPT2Tokenizer
        tokens = self.vocabulary["tokens"]
        os.makedirs(directory, exist_ok=True)
        vocab_file, merges_file = os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
        with open(vocab_file, "w", encoding="utf-8") as f:
            json.dump({t: i for i, t in enumerate(tokens)}, f, ensure_ascii=False)
        with open(merges_file, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(m + "\n" for m in self.vocabulary["merges"]))
        named = dict(bos_token=tokens[self.bos], eos_token=tokens[self.eos], pad_token=tokens[self.pad],
                     unk_token=tokens[self.vocabulary["unk"] if self.vocabulary["unk"] is not None else self.pad])
        hf = GPT2Tokenizer(vocab_file, merges_file, add_prefix_space=False, **named)
        hf.add_special_tokens({"additional_special_tokens": [t for t in self.specials if t not in named.values()]})
        hf.chat_template = self.vocabulary["chat_template"]
        hf.save_pretrained(directory)
