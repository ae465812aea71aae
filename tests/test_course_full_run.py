"""The course at full size in queues side by side (sparsity_lab.course.full_run): how the notebooks are
dealt, how the queues' reports merge, and a whole run of two tiny notebooks in two queues."""
from __future__ import annotations

import json

import pytest

from sparsity_lab.course.full_run import (UNKNOWN_SECONDS, earlier_seconds, main, merge_reports, plan_queues,
                                          queue_env)


def test_the_longest_notebooks_go_to_different_queues_and_each_queue_keeps_reading_order():
    names = ["01_a.ipynb", "02_b.ipynb", "03_c.ipynb", "07_d.ipynb", "14_e.ipynb"]
    seconds = {"01_a.ipynb": 14, "02_b.ipynb": 44, "03_c.ipynb": 69, "07_d.ipynb": 128, "14_e.ipynb": 7}
    plan = plan_queues(names, 2, seconds)
    assert plan == [["07_d.ipynb"], ["01_a.ipynb", "02_b.ipynb", "03_c.ipynb", "14_e.ipynb"]]
    assert sorted(n for q in plan for n in q) == names  # every notebook once
    # an unknown notebook counts UNKNOWN_SECONDS; more queues than notebooks leaves none empty
    assert plan_queues(["01_a.ipynb", "99_new.ipynb"], 2, {"01_a.ipynb": UNKNOWN_SECONDS + 1}) == \
        [["01_a.ipynb"], ["99_new.ipynb"]]
    assert plan_queues(names[:2], 5, seconds) == [["02_b.ipynb"], ["01_a.ipynb"]]
    with pytest.raises(ValueError, match="queues"):
        plan_queues(names, 0, seconds)
    with pytest.raises(ValueError, match="no notebook"):
        plan_queues([], 2, seconds)


def test_the_merged_report_lists_every_notebook_and_a_queue_that_died():
    plan = [["02_b.ipynb"], ["01_a.ipynb", "03_c.ipynb"]]
    reports = [{"notebooks": [{"notebook": "02_b.ipynb", "seconds": 3.0, "ok": True, "error": None}]},
               {"notebooks": [{"notebook": "01_a.ipynb", "seconds": 1.0, "ok": False, "error": "boom"}]}]
    merged = merge_reports(reports, plan, ["01_a.ipynb", "02_b.ipynb", "03_c.ipynb"])
    assert [(r["notebook"], r["queue"], r["ok"]) for r in merged["notebooks"]] == \
        [("01_a.ipynb", 1, False), ("02_b.ipynb", 0, True), ("03_c.ipynb", 1, False)]
    assert "not reported" in merged["notebooks"][2]["error"] and merged["failed"] == ["01_a.ipynb", "03_c.ipynb"]
    assert merged["queues"] == plan


def test_each_queue_gets_its_gpu_and_its_share_of_the_cores():
    env = queue_env(3, queues=4, gpus=1, cores=16)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["OMP_NUM_THREADS"] == "4"
    assert queue_env(1, queues=4, gpus=2, cores=2)["CUDA_VISIBLE_DEVICES"] == "1"
    # without a GPU the queue keeps whatever the caller's environment says
    assert queue_env(0, queues=2, gpus=0, cores=8).get("CUDA_VISIBLE_DEVICES") == \
        __import__("os").environ.get("CUDA_VISIBLE_DEVICES")


def test_the_recorded_report_deals_the_course_into_queues_that_end_together():
    from sparsity_lab.course.full_run import DEFAULT_TIMES

    assert earlier_seconds(None) == {}

    recorded = earlier_seconds(DEFAULT_TIMES)
    assert len(recorded) >= 15
    plan = plan_queues(sorted(recorded), 4, recorded)
    loads = [sum(recorded[n] for n in q) for q in plan]
    # no queue longer than the longest notebook or a fair share, whichever is more (plus one notebook's slack)
    assert max(loads) <= max(max(recorded.values()), sum(loads) / 4) + max(recorded.values())


def test_a_full_run_of_two_tiny_notebooks_in_two_queues(tmp_path):
    pytest.importorskip("papermill", reason="papermill is in the test extra")
    from _notebooks import tiny_notebook

    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_tiny.ipynb", body="print('points:', n)")
    tiny_notebook(folder, "02_tiny.ipynb", body="print('points:', n)")
    report = tmp_path / "course_full.json"
    code = main(["--queues", "2", "--notebooks", str(folder), "--out", str(tmp_path / "out"),
                 "--report", str(report), "--times", str(tmp_path / "none.json")])
    merged = json.loads(report.read_text())
    assert code == 0 and merged["failed"] == [] and len(merged["queues"]) == 2
    assert [r["notebook"] for r in merged["notebooks"]] == ["01_tiny.ipynb", "02_tiny.ipynb"]
    assert merged["provenance"]["command"].startswith("python -m sparsity_lab.course.full_run --queues 2")
    assert merged["wall_s"] > 0 and all(r["ok"] and r["seconds"] > 0 for r in merged["notebooks"])
    # full size: the notebooks' own parameters (n = 50), not the CI ones
    executed = tmp_path / "out" / f"queue_{merged['notebooks'][0]['queue']}" / "_build" / "executed-full"
    assert "points: 50" in (executed / "01_tiny.ipynb").read_text()


def test_the_gpu_wheel_list_pins_what_a_headless_run_imports():
    """sparsity_lab/course/gpu_wheels.txt: one name==version a line, and among them every package the
    headless run needs that a GPU machine's torch environment lacks."""
    from pathlib import Path

    import sparsity_lab.course as course

    lines = [line.strip() for line in (Path(course.__file__).parent / "gpu_wheels.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert all(len(line.split("==")) == 2 and line.split("==")[1] for line in lines), lines
    needed = {"papermill", "nbformat", "nbclient", "ipykernel", "jupyter_client", "ipywidgets", "plotly",
              "anywidget", "ortools"}
    assert needed <= set(pins), needed - set(pins)
