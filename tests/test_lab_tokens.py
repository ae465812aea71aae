"""Tokens beside bytes (a tokenizers file, or a BPE trained on the training split), text from Hugging Face
datasets (local files), and --data that is not text: binary files skipped or refused, records warned about."""
import importlib.util
import json
import struct
import zlib

import pytest
import torch
from _lab_testing import CLI_TINY, cli_code, tiny_corpus_file

from sparsity_lab.lab import cli
from sparsity_lab.lab import GPTConfig, TrainConfig, Trainer, load_corpus
from sparsity_lab.lab.data import BatchSampler, DataWarning
from sparsity_lab.lab.runlog import read_log

RUN = [*CLI_TINY, "--steps", "4", "--eval-interval", "2"]


def png_file(path):
    """A 4x4 RGB PNG (NUL bytes in its chunks, like any image)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\x00" * 52)) + chunk(b"IEND", b""))
    return path


@pytest.fixture
def text(tmp_path):
    return tiny_corpus_file(tmp_path)


def test_a_bpe_trained_on_the_run_sizes_the_model_and_resumes(tmp_path, text, capsys):
    pytest.importorskip("tokenizers", reason="the optional data extra")
    out = tmp_path / "run"
    assert cli.main(["train", *RUN, "--data", text, "--tokenizer", "bpe:300", "--stop-at", "2",
                     "--out", str(out)]) == 0
    assert "trained a byte-level BPE" in capsys.readouterr().out
    tokenizer = out / "tokenizer.json"
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    assert 256 < vocab <= 300
    assert cli.main(["train", "--resume", str(out / "checkpoint.pt"), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["tokenizer"] == str(tokenizer.resolve())
    assert summary["config"]["model"]["vocab_size"] == vocab == summary["corpus"]["vocab_size"]
    assert summary["corpus"]["train_tokens"] < len(open(text, "rb").read())  # merges: fewer tokens than bytes
    # the saved tokenizer file, given again, is the same run
    again = tmp_path / "again"
    assert cli.main(["train", *RUN, "--data", text, "--tokenizer", str(tokenizer), "--out", str(again)]) == 0
    assert [r["loss"] for r in read_log(out / "log.jsonl")] == [r["loss"] for r in read_log(again / "log.jsonl")]


def test_token_ids_feed_the_sampler_and_a_wrong_vocabulary_is_refused(tmp_path, text):
    pytest.importorskip("tokenizers", reason="the optional data extra")
    from sparsity_lab.lab.tokens import train_bpe
    path = train_bpe(open(text).read(), 280, tmp_path / "tok.json")
    corpus = load_corpus(text, tokenizer=path, min_split_bytes=17)
    assert corpus.train.dtype == torch.int32 and int(corpus.train.max()) < corpus.vocab_size
    assert corpus.fingerprint != load_corpus(text).fingerprint  # the tokenizer is part of the data's identity
    x, y = BatchSampler(corpus.train, 2, 16, seed=0).sample()
    assert x.dtype == torch.int64 and x.shape == (2, 16) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="model's vocabulary \\(256\\) is not the data's"):
        Trainer(TrainConfig(model=GPTConfig(n_layer=1, n_head=1, d_model=16, context=16), data=text,
                            tokenizer=str(path), device="cpu", progress=False))


def test_hf_datasets_from_local_jsonl_files(tmp_path, capsys):
    pytest.importorskip("datasets", reason="the optional data extra")
    folder = tmp_path / "ds"
    folder.mkdir()
    with (folder / "part.jsonl").open("w") as fh:
        for i in range(300):
            fh.write(json.dumps({"id": i, "body": f"def f{i}(x):\n    return x * {i}\n"}) + "\n")
    out = tmp_path / "run"
    argv = ["train", *RUN, "--data", str(folder), "--data-format", "datasets", "--out", str(out)]
    assert cli_code(argv) == 2
    assert "--text-field 'text' is not a column" in capsys.readouterr().err
    assert cli.main([*argv, "--text-field", "body"]) == 0
    corpus = json.loads((out / "summary.json").read_text())["corpus"]
    assert corpus["source"].startswith("datasets:") and corpus["files"] == 300  # rows
    assert cli_code(["train", *RUN, "--data", str(folder), "--text-field", "body"]) == 2
    assert "--text-field goes with --data-format datasets" in capsys.readouterr().err


def test_a_folder_holding_only_an_image_is_refused(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    png_file(tmp_path / "data" / "a.png")
    assert cli.main(["train", *RUN, "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "holds no text" in err and "'a.png'" in err and "Traceback" not in err


def test_binary_files_are_skipped_and_records_warned_about(tmp_path, text, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    png_file(folder / "a.png")
    (folder / "corpus.txt").write_text(open(text).read())
    (folder / "rows.jsonl").write_text('{"text": "x = 1"}\n')
    with pytest.warns(DataWarning) as seen:
        corpus = load_corpus(folder, min_split_bytes=17)
    assert corpus.files == 2  # the text file and the records, not the image
    messages = " ".join(str(w.message) for w in seen)
    assert "'a.png') look binary and were skipped" in messages and "'rows.jsonl') hold records" in messages
    with pytest.warns(DataWarning, match="look binary"):
        assert cli.main(["train", *RUN, "--steps", "1", "--data", str(folder), "--out", str(tmp_path / "run")]) == 0
    # printed as one line naming the command (pytest records warnings instead of printing them)
    import warnings
    assert warnings.formatwarning(DataWarning("x"), DataWarning, "f.py", 1) == "sparsity-lab train: warning: x\n"


@pytest.mark.parametrize("argv, package", [(["--tokenizer", "bpe:300"], "tokenizers"),
                                           (["--data-format", "datasets"], "datasets")])
def test_a_missing_package_is_refused_before_any_work(tmp_path, text, monkeypatch, capsys, argv, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    out = tmp_path / "run"
    assert cli_code(["train", *RUN, "--data", text, "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert f"needs the {package} package" in err and "sparsity-lab[data]" in err and not out.exists()


@pytest.mark.parametrize("argv, words", [
    (["train", "--tokenizer", "bpe:100"], "VOCAB >= 257"),
    (["train", "--tokenizer", "nope.json"], "expected 'bytes', 'bpe:VOCAB' or an existing tokenizer"),
    (["train", "--tokenizer", "bpe:300", "--parallel", "ddp"], "train the tokenizer once first"),
    (["decay-search", "--tokenizer", "bpe:300"], "give --out"),
])
def test_tokenizer_options_that_cannot_work_are_refused(argv, words, capsys):
    pytest.importorskip("tokenizers", reason="the optional data extra")
    assert cli_code(argv) == 2
    assert words in capsys.readouterr().err
