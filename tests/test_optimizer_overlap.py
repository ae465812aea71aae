"""benchmarks.optimizer_overlap: the optimizer and the 2:4 weight work on two streams, its plumbing on the CPU."""
import json

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.optimizer_overlap import weight_shapes


def test_the_lab_gpt_weights_in_the_optimizer_order():
    shapes = weight_shapes(4096, 8)
    assert len(shapes) == 32 and shapes[:4] == [(12288, 4096), (4096, 4096), (16384, 4096), (4096, 16384)]
    assert sum(o * i for o, i in shapes) == 1_610_612_736  # the step's 1.61 G 2:4 weights


def test_smoke_run_records_every_schedule_and_the_share_hidden(tmp_path):
    assert bench_main(["optimizer-overlap", "--smoke", "--works", "prepare", "--out-dir", str(tmp_path),
                       "--name", "overlap"]) == 0
    result = json.loads((tmp_path / "overlap.json").read_text())
    assert result["smoke"] and result["shapes"] == [list(s) for s in weight_shapes(64, 1)]
    (record,) = result["records"]
    med = record["ms_median"]
    assert set(med) == {"optimizer", "work", "serial", "two_streams", "two_streams_urgent"}
    assert all(v > 0 for v in med.values()) and len(record["ms_all"]["serial"]) == 2  # timed before and after
    best = record["best_two_streams"]
    assert med[best] == min(med["two_streams"], med["two_streams_urgent"])
    assert record["hidden_share_of_work"] == pytest.approx((med["serial"] - med[best]) / med["work"])


def test_an_unknown_work_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main(["optimizer-overlap", "--smoke", "--works", "mvue"])
    assert exit_.value.code == 2 and "--works" in capsys.readouterr().err
