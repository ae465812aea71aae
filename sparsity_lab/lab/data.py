"""Byte-level text corpora that need no download, and a resumable batch sampler.

Default corpus: the ``.py`` files of the running Python's standard library (on every machine with
Python), test suites and installed packages left out, read in sorted path order and capped at
``max_bytes``. ``path`` may instead name any text file or folder (every file under it, sorted).

Split (fixed, interleaved): the byte stream is cut into ``SPLIT_BLOCKS`` equal blocks; every
``VAL_EVERY``-th block (indices 9, 19, ..., 99) is validation, the rest training: 10 % validation
spread over the whole corpus rather than its alphabetical tail.

Tokens are bytes (vocabulary 256): nothing fetches a vocabulary at run time.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

SPLIT_BLOCKS = 100
VAL_EVERY = 10
DEFAULT_MAX_BYTES = 16 * 2**20
# Standard-library folders that are not "the library's own source": tests and installed packages.
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}


@dataclass
class ByteCorpus:
    """train and val: 1-D uint8 tensors of bytes. source, files, fingerprint: where they came from."""

    train: torch.Tensor
    val: torch.Tensor
    source: str
    files: int
    fingerprint: str  # sha256 of the bytes used (before the split), to tell corpora apart

    def describe(self) -> dict:
        return {"source": self.source, "files": self.files, "train_bytes": int(self.train.numel()),
                "val_bytes": int(self.val.numel()), "sha256": self.fingerprint}


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's root and its own .py files in sorted relative-path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])]
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


def read_capped(files: list[Path], max_bytes: int) -> tuple[bytes, int]:
    """Concatenate files (a newline between them) up to max_bytes; returns (bytes, files used)."""
    chunks, total, used = [], 0, 0
    for f in files:
        if total >= max_bytes:
            break
        try:
            data = f.read_bytes()[: max_bytes - total]
        except OSError as err:  # unreadable (permissions, I/O error, a broken link): name the file
            raise OSError(err.errno, f"cannot read the data file {str(f)!r}: {err.strerror or err}") from err
        if data:
            chunks.append(data + b"\n")
            total += len(data) + 1
            used += 1
    return b"".join(chunks)[:max_bytes], used


def split_blocks(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed interleaved split: block k of SPLIT_BLOCKS is validation when k % VAL_EVERY == VAL_EVERY - 1."""
    bounds = [len(data) * k // SPLIT_BLOCKS for k in range(SPLIT_BLOCKS + 1)]
    train, val = [], []
    for k in range(SPLIT_BLOCKS):
        (val if k % VAL_EVERY == VAL_EVERY - 1 else train).append(data[bounds[k]:bounds[k + 1]])
    return torch.cat(train), torch.cat(val)


def load_corpus(path: str | Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                min_split_bytes: int = 2) -> ByteCorpus:
    """Build the byte corpus. path None: the standard library's .py files; else a file or folder.

    min_split_bytes: both splits must hold at least this many bytes (a model with context T needs
    T + 1 to draw one window); otherwise a ValueError says how much data there is.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    if path is None:
        root, files = stdlib_files()
        source = f"python-stdlib:{root}"
    else:
        root, files = text_files(path)
        source = str(Path(path).resolve())
    raw, used = read_capped(files, max_bytes)
    if not raw.strip():
        raise ValueError(f"no text found in {source!r} ({len(files)} file(s), all empty); "
                         "give a file or folder with text")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    train, val = split_blocks(data)
    if min(len(train), len(val)) < min_split_bytes:
        raise ValueError(f"data in {source!r} is too small: {len(raw)} bytes give {len(train)} training and "
                         f"{len(val)} validation bytes, need at least {min_split_bytes} in each "
                         f"(context + 1); use more text or a shorter context")
    return ByteCorpus(train=train, val=val, source=source, files=used,
                      fingerprint=hashlib.sha256(raw).hexdigest())


class BatchSampler:
    """Random windows of ``context + 1`` bytes from one split, drawn with its own torch.Generator.

    sample() -> (x, y), both (batch, context) int64, y = x shifted by one byte. The generator's
    state is in ``state_dict()``, so a resumed run draws the same batches as an uninterrupted one.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, context: int, seed: int) -> None:
        if data.dim() != 1 or data.dtype != torch.uint8:
            raise ValueError(f"data must be a 1-D uint8 tensor, got {data.dtype} with shape {tuple(data.shape)}")
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
