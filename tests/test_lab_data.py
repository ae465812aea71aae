"""Byte corpora without downloads: determinism, the fixed split, --data paths, the sampler."""
import pytest
import torch

from sparsity_lab.lab.data import (SPLIT_BLOCKS, VAL_EVERY, BatchSampler, load_corpus, split_blocks,
                                   stdlib_files)


def test_stdlib_corpus_is_deterministic_and_excludes_tests():
    root, files = stdlib_files()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert rel == sorted(rel) and len(rel) > 100
    assert not any(part in ("test", "tests", "site-packages") for r in rel for part in r.split("/")[:-1])
    a = load_corpus(max_bytes=300_000)
    b = load_corpus(max_bytes=300_000)
    assert a.fingerprint == b.fingerprint and a.source.startswith("python-stdlib:")
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert a.train.numel() + a.val.numel() == 300_000
    assert abs(a.val.numel() / 300_000 - 1 / VAL_EVERY) < 0.001


def test_split_is_interleaved_blocks():
    data = torch.arange(1000)
    train, val = split_blocks(data)
    size = 1000 // SPLIT_BLOCKS
    want_val = torch.cat([torch.arange(k * size, (k + 1) * size) for k in range(SPLIT_BLOCKS)
                          if k % VAL_EVERY == VAL_EVERY - 1])
    assert torch.equal(val, want_val)
    assert torch.equal(torch.sort(torch.cat([train, val])).values, data)  # a partition


def test_data_file_and_folder(tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second file " * 200)
    (folder / "sub" / "a.txt").write_text("first " * 300)  # "b.txt" < "sub/a.txt"
    (folder / ".hidden").write_text("never read")
    corpus = load_corpus(folder)
    assert corpus.files == 2
    raw = bytes(torch.cat([corpus.train, corpus.val]).tolist())  # same multiset of bytes
    assert sorted(raw) == sorted(("second file " * 200 + "\n" + "first " * 300 + "\n").encode())
    single = load_corpus(folder / "b.txt", max_bytes=1000)
    assert single.files == 1 and single.train.numel() + single.val.numel() == 1000


def test_data_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data path .* does not exist"):
        load_corpus(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("  \n")
    with pytest.raises(ValueError, match="no text found"):
        load_corpus(tmp_path / "empty")
    (tmp_path / "tiny.txt").write_text("x" * 300)
    with pytest.raises(ValueError, match="too small"):
        load_corpus(tmp_path / "tiny.txt", min_split_bytes=65)
    with pytest.raises(ValueError, match="max_bytes"):
        load_corpus(max_bytes=0)


def test_sampler_shapes_determinism_and_resume():
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8)
    a = BatchSampler(data, batch_size=4, context=16, seed=3)
    b = BatchSampler(data, batch_size=4, context=16, seed=3)
    x, y = a.sample()
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one byte
    assert torch.equal(x, b.sample()[0])
    state = a.state_dict()
    after = [a.sample()[0] for _ in range(3)]
    b.load_state_dict(state)
    assert all(torch.equal(u, b.sample()[0]) for u in after)
    other = BatchSampler(data, batch_size=4, context=16, seed=4).sample()[0]
    assert not torch.equal(x, other)
    with pytest.raises(ValueError, match="fewer than context"):
        BatchSampler(data[:10], batch_size=2, context=16, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(data, batch_size=0, context=16, seed=0)
