"""
Data files and rows: JSON lines, JSON and parquet files or hub datasets (load_rows), a dataset
environment's splits (gsm8k_env: a dataset's, or the rows the project writes), rows checked field by field (RowError names the bad one), chat messages
through the template, and collate (right-padded batches).
"""

import json
import os

import torch

from envs import GSM8K, WRITTEN, written_rows
from nanopost.distributed import rank0_first
from nanopost.hf import looks_local


class RowError(ValueError):
    """A malformed data row: which field, and what is wrong with it."""

    def __init__(self, field, problem):
        super().__init__(f"field {field!r}: {problem}")
        self.field = field


def read_json_rows(path):
    """The rows of a JSON-lines file (or of a .json file holding one array), parsed here rather than
    by `datasets`, so that a broken line is an error naming its line."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 (byte 0x{raw[e.start]:02x}): save the file as UTF-8") from None
    if not text.strip():
        raise ValueError(f"{path}: the file is empty (no rows)")
    if path.endswith(".json") and text.lstrip().startswith("["):
        try:
            rows, lines = json.loads(text), None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None
    else:
        rows, lines = [], []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue  # blank lines (a trailing one, most often) hold no row
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {number}: invalid JSON: {e.msg} (column {e.colno})") from None
            lines.append(number)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            where = f"line {lines[i]}" if lines else f"row {i + 1}"
            raise ValueError(f"{path}: {where}: expected a JSON object, got {type(row).__name__}")
    return rows


def load_rows(path, split="train"):
    """The rows (dicts) of a jsonl / json / parquet file, or of a hub dataset's `split` when online
    (`datasets`; NAME or NAME:CONFIG, e.g. openai/gsm8k:main)."""
    if os.path.isfile(path):
        if not path.endswith(".parquet"):
            return read_json_rows(path)
        from datasets import load_dataset
        try:
            rows = list(load_dataset("parquet", data_files=path, split="train"))
        except Exception as e:  # datasets wraps parse errors in several types
            raise ValueError(f"{path}: cannot be read as parquet: {e}") from None
        if not rows:
            raise ValueError(f"{path}: the file is empty (no rows)")
        return rows
    if looks_local(path.split(":")[0]) and not os.path.exists(path.split(":")[0]):  # never a hub lookup for a path
        raise FileNotFoundError(f"data file {path}: no such file")
    from datasets import load_dataset
    name, _, config = path.partition(":")
    try:
        with rank0_first():
            return list(load_dataset(name, config or None, split=split))
    except OSError as e:  # (datasets' connection and not-found errors are OSErrors)
        raise ValueError(f"dataset {path!r}: cannot load it ({str(e).splitlines()[0][:120]}): check the name and that "
                         f"this machine is online, or pass a local file") from None


def gsm8k_env(name, digits, n_ops):
    """--env=gsm8k from --env_data: the hub dataset or local file `name` (dataset_splits), or, for
    "arithmetic", the default task's word problems written in GSM8K's form (envs/gsm8k.written_rows)."""
    if name == WRITTEN:
        return GSM8K(*([GSM8K.check_row(row) for row in written_rows(split, digits, n_ops)] for split in GSM8K.splits))
    return GSM8K(*dataset_splits(name, GSM8K.check_row))


def dataset_splits(path, check):
    """(train, held-out) rows of a dataset environment, each row through check(row) (a ValueError
    naming the field becomes one naming the file and row too): a hub dataset's train and test
    splits, or a local file's rows with the last tenth (at least one) held out."""
    def checked(rows, where):
        out = []
        for i, row in enumerate(rows, start=1):
            try:
                out.append(check(row))
            except ValueError as e:
                raise ValueError(f"{where}: row {i}: {e}") from None
        return out
    if os.path.isfile(path):
        rows = checked(load_rows(path), path)
        held = max(1, len(rows) // 10)
        if len(rows) < 2:
            raise ValueError(f"{path}: needs at least 2 rows (train and held out)")
        return rows[:-held], rows[-held:]
    return checked(load_rows(path, "train"), f"{path} (train)"), checked(load_rows(path, "test"), f"{path} (test)")


def encode_rows(run, path, rows, encode):
    """encode(run, row) -> example (sft.encode_row, pairs.encode_row), raising RowError for a bad row. A bad row is an error naming the
    file, row (1-based: the line of a jsonl file without blank lines) and field, or, with
    skip_bad_rows, skipped and counted. Returns (examples, the number skipped)."""
    examples, skipped = [], 0
    for i, row in enumerate(rows, start=1):
        try:
            examples.append(encode(run, row))
        except RowError as e:
            if not run.cfg["skip_bad_rows"]:
                raise ValueError(f"{path}: row {i}: {e} (pass --skip_bad_rows=True to skip such rows)") from None
            skipped += 1
    if not examples:
        raise ValueError(f"{path}: no usable rows ({skipped} skipped)")
    if skipped and run.master:
        print(f"{path}: skipped {skipped} malformed rows of {len(rows)}")
    return examples, skipped


def check_length(prompt, response, field, limit, what):
    """A row longer than the model reads (limit tokens, `what` in words) is a RowError naming the
    prompt where it alone leaves no room for the response, else the response's field."""
    n = len(prompt) + len(response)
    if len(prompt) >= limit:
        raise RowError("prompt", f"{len(prompt)} tokens, which leave no room for the {field} within {what}")
    if n > limit:
        raise RowError(field, f"{n} tokens{' with the prompt' if prompt else ''}, longer than {what}")


def require(row, field, kind):
    """row[field], checked to exist and to be a `kind` (str, list, ...), else a RowError."""
    if field not in row or row[field] is None:
        raise RowError(field, "missing")
    if not isinstance(row[field], kind):
        raise RowError(field, f"expected {kind.__name__}, got {type(row[field]).__name__}")
    return row[field]


def render_messages(run, messages, field, add_generation_prompt=False):
    """A row's message list through the chat template -> (ids, mask), or a RowError naming the field."""
    for j, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
            raise RowError(f"{field}[{j}].content", "missing or not a string")
    try:
        return run.tok.render_chat(messages, add_generation_prompt=add_generation_prompt)
    except ValueError as e:
        raise RowError(field, str(e)) from None


def pretraining(cfg):
    """Whether a run of sft.py pre-trains (the corpus, every token in the loss): --algo pretrain, or a
    variant of SFT's lab given --pretrain=True (lab/muon.py: the optimiser is all it changes)."""
    return cfg["algo"] == "pretrain" or cfg.get("pretrain", False)


def collate(examples, pad_id, device):
    """[(ids, mask)] -> right-padded (B, T) id and 0/1 mask tensors (padding has mask 0)."""
    T = max(len(ids) for ids, _ in examples)
    # padded lists, then one tensor each: a tensor per row costs more than the rest of collate
    ids = torch.tensor([list(seq) + [pad_id] * (T - len(seq)) for seq, _ in examples], dtype=torch.long)
    mask = torch.tensor([list(m) + [0] * (T - len(m)) for _, m in examples], dtype=torch.float32)
    return ids.to(device), mask.to(device)
