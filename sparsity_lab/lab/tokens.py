"""Tokens beside bytes, and text from Hugging Face ``datasets`` (both optional: the ``data`` extra).

    --tokenizer bytes            the default: one token per byte, vocabulary 256, nothing to install
    --tokenizer PATH.json        a ``tokenizers`` tokenizer file (e.g. a GPT-2 or Llama tokenizer.json)
    --tokenizer bpe:VOCAB        a byte-level BPE of at most VOCAB tokens trained on the run's training split
                                 (never on validation text) and saved as OUT/tokenizer.json, so that a resumed
                                 or repeated run reads the same one
    --data-format datasets       --data read with ``datasets``: .jsonl/.json/.csv/.parquet/.txt files, or a
                                 folder written by ``Dataset.save_to_disk``; --text-field names the column

The model's vocabulary is the tokenizer's size. Tokens are ids in an int32 tensor (bytes stay uint8).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
from pathlib import Path

import torch

BYTES = "bytes"
BPE_PREFIX = "bpe:"
MIN_BPE_VOCAB = 257  # the 256 byte symbols of a byte-level BPE, and at least one merge
DATA_FORMATS = ("text", "datasets")
DATASET_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text",
                    ".arrow": "arrow"}


def tokenizer_spec(text) -> str:
    """argparse type of --tokenizer: ``bytes``, ``bpe:VOCAB`` or an existing tokenizer .json file."""
    text = str(text)
    if text == BYTES:
        return text
    if text.startswith(BPE_PREFIX):
        try:
            vocab = int(text[len(BPE_PREFIX):])
        except ValueError:
            vocab = 0
        if vocab < MIN_BPE_VOCAB:
            raise argparse.ArgumentTypeError(f"expected bpe:VOCAB with VOCAB >= {MIN_BPE_VOCAB} (the 256 bytes and "
                                             f"at least one merge), got {text!r}")
        return text
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"expected 'bytes', 'bpe:VOCAB' or an existing tokenizer .json file, "
                                         f"got {text!r}")
    return text


def require(package: str, option: str) -> None:
    """ValueError naming the option and the extra when ``package`` is not installed."""
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"{option} needs the {package} package, which is not installed: "
                         f"pip install \"sparsity-lab[data]\" (or pip install {package})")


def load_tokenizer(path: str | Path):
    require("tokenizers", "--tokenizer")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own exception types
        raise ValueError(f"--tokenizer {str(path)!r} is not a tokenizers file: {str(err).splitlines()[0][:200]}") \
            from None


def tokenizer_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def vocab_size(path: str | Path) -> int:
    return load_tokenizer(path).get_vocab_size()


def train_bpe(text: str, vocab: int, path: str | Path) -> Path:
    """A byte-level BPE (GPT-2's scheme) of at most ``vocab`` tokens trained on ``text``, saved to ``path``."""
    require("tokenizers", "--tokenizer bpe")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    lines = text.splitlines(keepends=True)
    tok.train_from_iterator((lines[i:i + 1000] for i in range(0, len(lines), 1000)), trainer=trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def encode(path: str | Path, data: torch.Tensor) -> torch.Tensor:
    """Token ids (1-D int32) of a split's bytes (decoded as UTF-8; a character cut by the split's block
    boundary becomes U+FFFD)."""
    ids = load_tokenizer(path).encode(bytes(data.numpy().tobytes()).decode("utf-8", errors="replace")).ids
    return torch.tensor(ids, dtype=torch.int32)


def read_dataset(path: str | Path, text_field: str, max_bytes: int) -> tuple[bytes, int, str]:
    """(text bytes, rows used, source) of a dataset read with ``datasets``: rows' ``text_field`` joined by
    newlines, capped at ``max_bytes``."""
    require("datasets", "--data-format datasets")
    import datasets

    p = Path(path)
    if p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()
                       or (p / "state.json").is_file()):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
    else:
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        builders = {DATASET_BUILDERS.get(f.suffix.lower()) for f in files}
        if not files or None in builders or len(builders) != 1:
            raise ValueError(f"--data {str(path)!r} with --data-format datasets: expected files of one kind among "
                             f"{sorted(DATASET_BUILDERS)} or a folder written by save_to_disk, found "
                             f"{sorted({f.suffix or f.name for f in files}) or 'nothing'}")
        ds = datasets.load_dataset(builders.pop(), data_files=[str(f) for f in files], split="train")
    if text_field not in ds.column_names:
        raise ValueError(f"--text-field {text_field!r} is not a column of {str(path)!r}; its columns are "
                         f"{ds.column_names}")
    chunks, total, rows = [], 0, 0
    for value in ds[text_field]:
        if total >= max_bytes:
            break
        data = (str(value) + "\n").encode()
        chunks.append(data)
        total += len(data)
        rows += 1
    return b"".join(chunks)[:max_bytes], rows, f"datasets:{Path(path).resolve()}:{text_field}"
