"""Byte-level text corpora that need no download, and a resumable batch sampler.

Default corpus: the ``.py`` files of the running Python's standard library (on every machine with
Python), test suites and installed packages left out, read in sorted path order and capped at
``max_bytes``. ``path`` may instead name any text file or folder (every file under it, sorted).

Split (fixed, interleaved): the byte stream is cut into ``SPLIT_BLOCKS`` equal blocks; every
``VAL_EVERY``-th block (indices 9, 19, ..., 99) is validation, the rest training: 10 % validation
spread over the whole corpus rather than its alphabetical tail.

Tokens are bytes (vocabulary 256) unless a tokenizer is given (``tokens.py``: a tokenizer file or a BPE
trained on the training split); nothing fetches a vocabulary at run time. ``data_format="datasets"``
reads ``path`` with Hugging Face ``datasets`` instead (local files).

Text only: a file that looks binary (NUL bytes, or more than 10 % control characters in its first 8 KiB,
e.g. an image) is skipped with a ``DataWarning`` naming it, and data with no text file at all is refused.
Files that are text but look like records (.json, .jsonl, .csv, ...) or are not UTF-8 are read, with a
``DataWarning``: they are trained on as raw characters.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

SPLIT_BLOCKS = 100
VAL_EVERY = 10
DEFAULT_MAX_BYTES = 16 * 2**20
# Standard-library folders that are not "the library's own source": tests and installed packages.
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}
SNIFF_BYTES = 8192
# text that is not prose or code: trained on as raw characters, with a warning
RECORD_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".xml", ".html", ".htm", ".parquet", ".arrow")
TOKEN_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64)


class DataWarning(UserWarning):
    """--data holds something that is read, but probably not as meant (binary files skipped, records as text)."""


def looks_binary(head: bytes) -> bool:
    """True for bytes that are not text: a NUL, or more than 10 % control characters (tab, newlines, form feed
    and escape aside)."""
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 32 and b not in (9, 10, 11, 12, 13, 27))
    return controls > 0.1 * max(1, len(head))


def _is_utf8(head: bytes) -> bool:
    import codecs

    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character cut at the end is fine
        return True
    except UnicodeDecodeError:
        return False


@dataclass
class ByteCorpus:
    """train and val: 1-D tensors of tokens, uint8 bytes (no tokenizer) or int32 token ids. source, files,
    fingerprint: where they came from; tokenizer: its file (None: bytes), vocab_size: its size."""

    train: torch.Tensor
    val: torch.Tensor
    source: str
    files: int
    fingerprint: str  # sha256 of the bytes used (before the split) and of the tokenizer, to tell corpora apart
    tokenizer: str | None = None
    vocab_size: int = 256

    def describe(self) -> dict:
        out = {"source": self.source, "files": self.files, "train_bytes": int(self.train.numel()),
               "val_bytes": int(self.val.numel()), "sha256": self.fingerprint}
        if self.tokenizer is not None:  # token counts then, not bytes
            out.update(tokenizer=self.tokenizer, vocab_size=self.vocab_size, train_tokens=out.pop("train_bytes"),
                       val_tokens=out.pop("val_bytes"))
        return out


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's root and its own .py files in sorted relative-path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    # the skipped folders are pruned, not walked: site-packages alone can hold tens of thousands of files
    for folder, dirs, names in os.walk(root):  # like rglob: symlinked folders are not entered
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        files += [p for p in (Path(folder, n) for n in names if n.endswith(".py")) if p.is_file()]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def text_files(path: str | Path) -> tuple[Path, list[Path]]:
    """A file, or every file under a folder (sorted, hidden entries skipped)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--data path {str(path)!r} does not exist; give a text file or a folder of text files")
    if p.is_file():
        return p.parent, [p]
    files = [f for f in p.rglob("*") if f.is_file()
             and not any(part.startswith(".") for part in f.relative_to(p).parts)]
    return p, sorted(files, key=lambda f: f.relative_to(p).as_posix())


def read_capped(files: list[Path], max_bytes: int, source: str | None = None) -> tuple[bytes, int]:
    """Concatenate the text files (a newline between them) up to max_bytes; returns (bytes, files used).
    Binary files are skipped (a DataWarning names them); only binary files is a ValueError."""
    chunks, total, used, binary, records, not_utf8 = [], 0, 0, [], [], []
    for f in files:
        if total >= max_bytes:
            break
        try:
            data = f.read_bytes()[: max_bytes - total]
        except OSError as err:  # unreadable (permissions, I/O error, a broken link): name the file
            raise OSError(err.errno, f"cannot read the data file {str(f)!r}: {err.strerror or err}") from err
        head = data[:SNIFF_BYTES]
        if looks_binary(head):
            binary.append(f)
            continue
        if f.suffix.lower() in RECORD_SUFFIXES:
            records.append(f)
        elif not _is_utf8(head):
            not_utf8.append(f)
        if data:
            chunks.append(data + b"\n")
            total += len(data) + 1
            used += 1
    where = source or (str(files[0].parent) if files else "--data")
    if binary and not used:
        raise ValueError(f"--data {where!r} holds no text: {len(binary)} file(s) look binary (e.g. "
                         f"{binary[0].name!r}: NUL bytes or control characters); give text files")
    for found, what in ((binary, "look binary and were skipped"),
                        (records, "hold records (JSON, CSV, ...) read as raw text; --data-format datasets reads "
                                  "their text column"),
                        (not_utf8, "are not UTF-8 text; their bytes are read as they are")):
        if found:
            names = ", ".join(repr(f.name) for f in found[:3]) + (", ..." if len(found) > 3 else "")
            warnings.warn(f"--data {where!r}: {len(found)} file(s) ({names}) {what}", DataWarning, stacklevel=3)
    return b"".join(chunks)[:max_bytes], used


def split_blocks(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed interleaved split: block k of SPLIT_BLOCKS is validation when k % VAL_EVERY == VAL_EVERY - 1."""
    bounds = [len(data) * k // SPLIT_BLOCKS for k in range(SPLIT_BLOCKS + 1)]
    train, val = [], []
    for k in range(SPLIT_BLOCKS):
        (val if k % VAL_EVERY == VAL_EVERY - 1 else train).append(data[bounds[k]:bounds[k + 1]])
    return torch.cat(train), torch.cat(val)


def load_corpus(path: str | Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                min_split_bytes: int = 2, tokenizer: str | Path | None = None, data_format: str = "text",
                text_field: str = "text") -> ByteCorpus:
    """Build the corpus. path None: the standard library's .py files; else a file or folder.

    min_split_bytes: both splits must hold at least this many tokens (bytes without a tokenizer; a
    model with context T needs T + 1 to draw one window); otherwise a ValueError says how much data
    there is. tokenizer: a ``tokenizers`` .json file (``tokens.py``); data_format "datasets": path read
    with Hugging Face datasets, its ``text_field`` column.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    if data_format not in ("text", "datasets"):
        raise ValueError(f"data_format must be 'text' or 'datasets', got {data_format!r}")
    if data_format == "datasets":
        if path is None:
            raise ValueError("--data-format datasets reads --data: give a file or folder")
        from .tokens import read_dataset
        raw, used, source = read_dataset(path, text_field, max_bytes)
        files = [None] * used
    elif path is None:
        root, files = stdlib_files()
        source = f"python-stdlib:{root}"
        raw, used = read_capped(files, max_bytes, source)
    else:
        root, files = text_files(path)
        source = str(Path(path).resolve())
        raw, used = read_capped(files, max_bytes, str(path))
    if not raw.strip():
        raise ValueError(f"no text found in {source!r} ({len(files)} file(s), all empty); "
                         "give a file or folder with text")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    train, val = split_blocks(data)
    digest, vocab, unit = hashlib.sha256(raw), 256, "bytes"
    if tokenizer is not None:
        from .tokens import encode, tokenizer_digest, vocab_size
        train, val = encode(tokenizer, train), encode(tokenizer, val)
        digest.update(tokenizer_digest(tokenizer).encode())
        vocab, unit = vocab_size(tokenizer), "tokens"
    if min(len(train), len(val)) < min_split_bytes:
        raise ValueError(f"data in {source!r} is too small: {len(raw)} bytes give {len(train)} training and "
                         f"{len(val)} validation {unit}, need at least {min_split_bytes} in each "
                         f"(context + 1); use more text or a shorter context")
    return ByteCorpus(train=train, val=val, source=source, files=used, fingerprint=digest.hexdigest(),
                      tokenizer=None if tokenizer is None else str(tokenizer), vocab_size=vocab)


class BatchSampler:
    """Random windows of ``context + 1`` bytes from one split, drawn with its own torch.Generator.

    sample() -> (x, y), both (batch, context) int64, y = x shifted by one byte. The generator's
    state is in ``state_dict()``, so a resumed run draws the same batches as an uninterrupted one.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, context: int, seed: int) -> None:
        if data.dim() != 1 or data.dtype not in TOKEN_DTYPES:
            raise ValueError(f"data must be a 1-D tensor of tokens ({TOKEN_DTYPES}), got {data.dtype} with shape "
                             f"{tuple(data.shape)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if len(data) < context + 1:
            raise ValueError(f"split has {len(data)} bytes, fewer than context + 1 = {context + 1}")
        self.data, self.batch_size, self.context = data, batch_size, context
        self.generator = torch.Generator().manual_seed(seed)
        self._offsets = torch.arange(context + 1)

    def sample(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - self.context, (self.batch_size,), generator=self.generator)
        window = self.data[starts[:, None] + self._offsets].long()  # (B, T + 1)
        window = window.to(device, non_blocking=True)
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
