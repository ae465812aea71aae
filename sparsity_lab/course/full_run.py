"""Every course notebook at its full size on one GPU machine, in a few queues side by side, and one report.

    python -m sparsity_lab.course.full_run --queues 4 --report results/course_full_h200.json

Each queue is one ``sparsity-lab course --headless --no-book --sizes full --only NN ...`` process with its
own output folder (what a notebook writes lands there) and its own report; the queues share the machine's
GPUs (queue k on GPU k mod the GPU count) and split its CPU cores (``OMP_NUM_THREADS``). The notebooks are
dealt to the queues longest first, by the seconds of an earlier report (``--times``, default the recorded
``results/course_full_h200.json``), so that the queues end at about the same time. The merged report has
one row per notebook in reading order (``notebook``, ``seconds``, ``ok``, ``error``, ``queue``), the
queues, the wall time of the whole run and the provenance of the machine (docs/measuring.md, "The course
at full size").
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..shipped import NOTEBOOK_DIR, RESULTS_DIR
from .running import notebooks

DEFAULT_TIMES = RESULTS_DIR / "course_full_h200.json"
UNKNOWN_SECONDS = 60.0  # a notebook the earlier report does not list


def earlier_seconds(report: Path | None) -> dict[str, float]:
    """Each notebook's seconds in an earlier full-size report (empty when there is none)."""
    if report is None or not Path(report).is_file():
        return {}
    rows = json.loads(Path(report).read_text()).get("notebooks", [])
    return {r["notebook"]: float(r["seconds"]) for r in rows if r.get("seconds") is not None}


def plan_queues(names: list[str], queues: int, seconds: dict[str, float]) -> list[list[str]]:
    """Deal ``names`` to ``queues`` queues, longest first, each to the queue that ends soonest; each queue
    keeps the reading order of ``names``. A notebook missing from ``seconds`` counts UNKNOWN_SECONDS."""
    if isinstance(queues, bool) or not isinstance(queues, int) or queues < 1:
        raise ValueError(f"queues must be an integer >= 1, got {queues!r}")
    if not names:
        raise ValueError("names is empty: no notebook to run")
    load, plan = [0.0] * queues, [[] for _ in range(queues)]
    for name in sorted(names, key=lambda n: -seconds.get(n, UNKNOWN_SECONDS)):
        k = min(range(queues), key=lambda q: load[q])
        plan[k].append(name)
        load[k] += seconds.get(name, UNKNOWN_SECONDS)
    order = {name: i for i, name in enumerate(names)}
    return [sorted(q, key=order.__getitem__) for q in plan if q]


def queue_command(names: list[str], out: Path, report: Path, notebook_dir: Path) -> list[str]:
    """The headless course command that runs ``names`` at full size into ``out`` and reports to ``report``."""
    return [sys.executable, "-m", "sparsity_lab", "course", "--headless", "--no-book", "--sizes", "full",
            "--notebooks", str(notebook_dir), "--out", str(out), "--report", str(report),
            "--only", *[Path(n).stem for n in names]]


def queue_env(k: int, queues: int, gpus: int, cores: int) -> dict[str, str]:
    """Queue ``k``'s environment: its GPU (when there are GPUs) and its share of the CPU cores."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // queues))}
    if gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = str(k % gpus)
    return env


def merge_reports(reports: list[dict], plan: list[list[str]], names: list[str]) -> dict:
    """One report of the queues' reports: every notebook of ``names`` once, in that order, with its queue;
    a notebook no queue reported (its queue died) is a failure that says so."""
    rows = {}
    for k, report in enumerate(reports):
        for row in report.get("notebooks", []):
            rows[row["notebook"]] = {**row, "queue": k}
    queue_of = {name: k for k, q in enumerate(plan) for name in q}
    merged = [rows.get(name, {"notebook": name, "seconds": None, "ok": False, "queue": queue_of.get(name),
                              "error": "not reported: its queue stopped before it (see the queue's log)"})
              for name in names]
    return {"sizes": "full", "notebooks": merged, "failed": [r["notebook"] for r in merged if not r["ok"]],
            "queues": plan}


def run_queues(plan: list[list[str]], out_dir: Path, notebook_dir: Path, gpus: int, cores: int) -> list[dict]:
    """Start every queue, wait for all, return their reports (an empty one for a queue that wrote none);
    each queue's output goes to ``out_dir/queue_K.log``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, names in enumerate(plan):
        report = out_dir / f"queue_{k}.json"
        log = open(out_dir / f"queue_{k}.log", "w")
        cmd = queue_command(names, out_dir / f"queue_{k}", report, notebook_dir)
        procs.append((subprocess.Popen(cmd, env=queue_env(k, len(plan), gpus, cores), stdout=log,
                                       stderr=subprocess.STDOUT), log, report))
    reports = []
    for proc, log, report in procs:
        proc.wait()
        log.close()
        reports.append(json.loads(report.read_text()) if report.is_file() else {})
    return reports


def main(argv: list[str] | None = None) -> int:
    import torch

    from ..provenance import provenance

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=4, help="notebooks run side by side (default 4)")
    parser.add_argument("--report", type=Path, required=True, help="the merged report (JSON) to write")
    parser.add_argument("--out", type=Path, default=Path("course_full"),
                        help="folder of the queues' executed notebooks, reports and logs (default ./course_full)")
    parser.add_argument("--times", type=Path, default=DEFAULT_TIMES,
                        help="an earlier report whose seconds deal the notebooks to the queues")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOK_DIR, help="the notebooks' folder")
    parser.add_argument("--only", nargs="+", default=None, metavar="NN", help="run only these notebooks")
    args = parser.parse_args(argv)
    names = [p.name for p in notebooks(args.notebooks)]
    if args.only:
        from .running import select_notebooks

        names = [p.name for p in select_notebooks(notebooks(args.notebooks), args.only)]
    plan = plan_queues(names, args.queues, earlier_seconds(args.times))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    start = time.perf_counter()
    reports = run_queues(plan, args.out, args.notebooks, gpus, os.cpu_count() or 1)
    merged = merge_reports(reports, plan, names)
    merged["wall_s"] = round(time.perf_counter() - start, 1)
    command = "python -m sparsity_lab.course.full_run " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    merged = {"provenance": provenance(command), **merged}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(merged, indent=2) + "\n")
    for row in merged["notebooks"]:
        seconds = "-" if row["seconds"] is None else f"{row['seconds']:.1f} s"
        print(f"{row['notebook']:<34} {seconds:>9}  queue {row['queue']}  {'ok' if row['ok'] else 'FAILED'}")
    print(f"{len(plan)} queues, {gpus} GPU(s), wall {merged['wall_s']:.0f} s; report: {args.report}")
    return 1 if merged["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
