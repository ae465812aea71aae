"""Where `sparsity-lab course` writes: JupyterLab serves a working copy (never the shipped notebooks),
the learner's edits are never overwritten, --refresh saves them before replacing; the headless run's
notebooks write beside their executed copies under --out; SIGTERM to `course` stops the Jupyter server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from _lab_testing import exit_status

pytest.importorskip("papermill", reason="papermill is in the test extra")
import nbformat  # noqa: E402
from _notebooks import tiny_notebook  # noqa: E402

from sparsity_lab.lab import cli  # noqa: E402
from sparsity_lab.course import command as course_command  # noqa: E402
from sparsity_lab.course.workdir import MANIFEST, sync  # noqa: E402

POSIX = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


def _shipped(tmp_path: Path) -> Path:
    folder = tmp_path / "shipped" / "notebooks"
    tiny_notebook(folder, "01_one.ipynb", body="print('one', n)")
    tiny_notebook(folder, "02_two.ipynb", body="print('two', n)")
    (folder.parent / "docs").mkdir()
    (folder.parent / "docs" / "algorithms.md").write_text("# Algorithms\n")
    return folder


def _edit(path: Path, text: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1].source = text
    nbformat.write(nb, path)


def _source(path: Path) -> str:
    return nbformat.read(path, as_version=4).cells[-1].source


# --- the working copy ---------------------------------------------------------------------------

def test_first_sync_copies_the_notebooks_and_docs(tmp_path):
    shipped = _shipped(tmp_path)
    report = sync(tmp_path / "work", shipped, shipped.parent / "docs")
    assert sorted(report.copied) == ["docs/algorithms.md", "notebooks/01_one.ipynb", "notebooks/02_two.ipynb"]
    assert (tmp_path / "work" / "notebooks" / "01_one.ipynb").read_bytes() == (shipped / "01_one.ipynb").read_bytes()
    assert (tmp_path / "work" / "docs" / "algorithms.md").exists() and (tmp_path / "work" / MANIFEST).exists()
    assert "copied: 01_one.ipynb, 02_two.ipynb, algorithms.md" in report.lines()


def test_an_edited_copy_is_kept_and_an_untouched_one_follows_the_shipped_version(tmp_path):
    shipped, work = _shipped(tmp_path), tmp_path / "work"
    sync(work, shipped)
    _edit(work / "notebooks" / "01_one.ipynb", "print('my answer')")
    _edit(shipped / "01_one.ipynb", "print('one, revised', n)")
    _edit(shipped / "02_two.ipynb", "print('two, revised', n)")
    report = sync(work, shipped)
    assert report.kept == ["notebooks/01_one.ipynb"] and report.updated == ["notebooks/02_two.ipynb"]
    assert _source(work / "notebooks" / "01_one.ipynb") == "print('my answer')"
    assert _source(work / "notebooks" / "02_two.ipynb") == "print('two, revised', n)"
    assert any("kept your edited copies of 01_one.ipynb" in line and "--refresh" in line for line in report.lines())
    # the learner's copy stays theirs on every later start too
    assert sync(work, shipped).kept == ["notebooks/01_one.ipynb"]


def test_refresh_saves_the_edited_copy_then_replaces_it(tmp_path):
    shipped, work = _shipped(tmp_path), tmp_path / "work"
    sync(work, shipped)
    _edit(work / "notebooks" / "01_one.ipynb", "print('my answer')")
    report = sync(work, shipped, refresh=True)
    assert report.refreshed == ["notebooks/01_one.ipynb"] and report.backup is not None
    assert _source(report.backup / "notebooks" / "01_one.ipynb") == "print('my answer')"
    assert _source(work / "notebooks" / "01_one.ipynb") == "print('one', n)"
    assert any(str(report.backup) in line for line in report.lines())
    assert sync(work, shipped).kept == [], "after a refresh the copy is the shipped one again"


def test_sync_refuses_an_empty_source_and_a_file_as_workdir(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no course notebooks"):
        sync(tmp_path / "work", tmp_path / "empty")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        sync(tmp_path / "afile", _shipped(tmp_path))


def test_course_serves_the_working_copy_and_leaves_the_shipped_notebooks_alone(tmp_path, monkeypatch, capsys):
    shipped = _shipped(tmp_path)
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    seen = {}

    class FakeLab:
        def __init__(self, cmd, env):
            seen["cmd"] = cmd
            # what JupyterLab's autosave and notebook 09 would do, inside the served folder
            root = Path(next(a for a in cmd if a.startswith("--ServerApp.root_dir=")).split("=", 1)[1])
            _edit(root / "notebooks" / "01_one.ipynb", "print('edited in the lab')")
            (root / "notebooks" / "runs").mkdir(exist_ok=True)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(course_command.subprocess, "Popen", FakeLab)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["course", "--notebooks", str(shipped), "--no-browser"]) == 0
    work = (tmp_path / "sparsity-lab-course").resolve()  # the default: ./sparsity-lab-course
    assert f"--ServerApp.root_dir={work}" in seen["cmd"]
    out = capsys.readouterr().out
    assert f"Your working copy of the course: {work / 'notebooks'}" in out and "copied: 01_one.ipynb" in out
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before, "the shipped notebooks were written"
    assert _source(work / "notebooks" / "01_one.ipynb") == "print('edited in the lab')"
    # a second start keeps the edit and says so
    assert cli.main(["course", "--notebooks", str(shipped), "--no-browser"]) == 0
    assert _source(work / "notebooks" / "01_one.ipynb") == "print('edited in the lab')"
    assert "kept your edited copies of 01_one.ipynb" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [(("--headless", "--refresh"), "--refresh"),
                                           (("--workdir", "{file}"), "is a file")])
def test_workdir_errors_are_one_clear_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(course_command.subprocess, "Popen", lambda *a, **k: pytest.fail("lab started"))
    (tmp_path / "file").write_text("x")
    argv = [a.format(file=tmp_path / "file") for a in argv]
    assert exit_status(cli.main, ["course", "--notebooks", str(_shipped(tmp_path)), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# --- the headless run writes under --out ------------------------------------------------------------

def test_headless_notebooks_write_beside_their_executed_copies_not_in_the_cwd(tmp_path, monkeypatch):
    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_writes.ipynb", body="import os\nos.makedirs('runs/x', exist_ok=True)\n"
                                                  "open('runs/x/log.txt', 'w').write(str(n))")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["course", "--headless", "--no-book", "--notebooks", str(folder), "--workdir", "work"]) == 0
    executed = tmp_path / "work" / "book" / "_build" / "executed-ci"
    assert (executed / "01_writes.ipynb").exists() and (executed / "runs" / "x" / "log.txt").read_text() == "3"
    assert not (tmp_path / "runs").exists() and not (folder / "runs").exists()
    out = tmp_path / "elsewhere"
    assert cli.main(["course", "--headless", "--no-book", "--notebooks", str(folder), "--out", str(out)]) == 0
    assert (out / "_build" / "executed-ci" / "runs" / "x" / "log.txt").exists()


# --- stopping the server --------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _wait_until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


@POSIX
def test_sigterm_to_course_reaches_the_server(tmp_path):
    """`course` runs a stand-in server that records its pid; SIGTERM to `course` must end it too
    (before the fix, course died and the server kept running)."""
    pid_file = tmp_path / "server.pid"
    stub = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(300)", str(pid_file)]
    script = textwrap.dedent(f"""
        import sys
        from sparsity_lab.lab import cli
        from sparsity_lab.course import command as course_command
        course_command.lab_command = lambda *args, **kwargs: {stub!r}
        sys.exit(cli.main(["course", "--no-browser", "--notebooks", {str(_shipped(tmp_path))!r},
                           "--workdir", {str(tmp_path / "work")!r}]))
    """)
    course = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    server = None
    try:
        server = int(_wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60, "the stub never started"))
        course.send_signal(signal.SIGTERM)
        assert course.wait(timeout=30) == 128 + signal.SIGTERM
        _wait_until(lambda: not _alive(server), 10, f"the server (pid {server}) outlived course")
    finally:
        course.kill()
        if server and _alive(server):
            os.kill(server, signal.SIGKILL)


@POSIX
def test_a_server_that_ignores_the_signal_is_killed_after_the_grace_time(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        start = time.monotonic()
        assert course_command.wait_forwarding_signals(proc, grace_s=1.0) == 128 + signal.SIGTERM
        assert proc.poll() is not None and 1.0 <= time.monotonic() - start < 15
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    finally:
        proc.kill()
        proc.wait()


@POSIX
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the server's pid from /proc")
def test_sigterm_stops_a_real_jupyter_server(tmp_path):
    pytest.importorskip("jupyterlab", reason="JupyterLab is in the test extra")
    port = course_command.free_port()
    env = dict(os.environ, JUPYTER_TOKEN="t0k3n", JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    course = subprocess.Popen([sys.executable, "-m", "sparsity_lab", "course", "--no-browser", "--port", str(port),
                               "--notebooks", str(_shipped(tmp_path)), "--workdir", str(tmp_path / "work")],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        def answering():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=t0k3n", timeout=2) as r:
                    return r.status == 200
            except OSError:
                assert course.poll() is None, f"course exited with {course.returncode}"
                return False

        _wait_until(answering, 90, "JupyterLab did not answer")
        children = Path(f"/proc/{course.pid}/task/{course.pid}/children").read_text().split()
        assert len(children) == 1
        server = int(children[0])
        course.send_signal(signal.SIGTERM)
        assert course.wait(timeout=60) == 128 + signal.SIGTERM
        assert not _alive(server), f"the Jupyter server (pid {server}) outlived course"
    finally:
        course.kill()
        if server and _alive(server):
            os.kill(server, signal.SIGKILL)
