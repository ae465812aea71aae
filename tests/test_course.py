"""``sparsity-lab course``: argument handling, the JupyterLab launch command, and the headless path
(execute every notebook, build the book) on tiny notebooks made here."""
from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
from _lab_testing import exit_status

pytest.importorskip("papermill", reason="papermill is in the test extra")
import nbformat  # noqa: E402

from _notebooks import WIDGET_CELL, tiny_notebook  # noqa: E402

from sparsity_lab.lab import cli  # noqa: E402
from sparsity_lab.course import command as course_command  # noqa: E402
from sparsity_lab.course import NotebookFailed, execute, execute_all, is_current  # noqa: E402


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser("course").parse_args(["course", *argv])


def printed(run_output) -> str:
    return "".join(l.get("text", "") for c in run_output.cells for l in c.get("outputs", []))


# --- arguments ---------------------------------------------------------------------------------

def test_cli_lists_the_course_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "course" in capsys.readouterr().out


def test_headless_options_parse():
    args = parse("--headless", "--sizes", "full", "--out", "somewhere")
    assert args.headless and args.sizes == "full" and args.out == Path("somewhere")
    course_command.check_arguments(args)


def test_sizes_must_be_ci_or_full(capsys):
    with pytest.raises(SystemExit):
        parse("--headless", "--sizes", "huge")
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [
    (("--sizes", "ci"), "--sizes"),
    (("--out", "x"), "--out"),
    (("--no-book",), "--no-book"),
    (("--headless", "--report", "r.json"), "--report goes with --no-book"),
    (("--headless", "--no-browser"), "--no-browser"),
    (("--headless", "--port", "9000"), "--port"),
    (("--headless", "--", "--ServerApp.allow_root=True"), "LAB_ARGS"),
    (("--port", "70000"), "--port"),
    (("--notebooks", "/no/such/folder"), "--notebooks"),
])
def test_options_of_the_other_mode_are_named_errors(argv, named, capsys):
    assert exit_status(cli.main, ["course", *argv]) == 2
    assert named in capsys.readouterr().err


def test_options_after_double_dash_go_to_jupyter_lab(monkeypatch, capsys, tmp_path):
    """The launch: exactly the requested port, --no-browser and the pass-through options on the
    command line, the token in the environment, and the URL with that token printed."""
    seen = {}

    class FakeLab:
        def __init__(self, cmd, env):
            seen["cmd"], seen["env"] = cmd, env

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(course_command.subprocess, "Popen", FakeLab)
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    port = course_command.free_port()
    shipped = tiny_notebook(tmp_path / "notebooks").parent
    rc = cli.main(["course", "--notebooks", str(shipped), "--workdir", str(tmp_path / "work"), "--port", str(port),
                   "--no-browser", "--", "--ServerApp.allow_root=True", "--LabApp.default_url=/lab/tree/x.ipynb"])
    assert rc == 0
    cmd, token = seen["cmd"], seen["env"]["JUPYTER_TOKEN"]
    assert cmd[1:3] == ["-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={(tmp_path / 'work').resolve()}" in cmd and f"--ServerApp.port={port}" in cmd
    assert "--ServerApp.port_retries=0" in cmd and "--no-browser" in cmd
    assert cmd[-2:] == ["--ServerApp.allow_root=True", "--LabApp.default_url=/lab/tree/x.ipynb"]
    assert token and token not in " ".join(cmd)
    assert f"http://127.0.0.1:{port}/lab?token={token}" in capsys.readouterr().out


def test_a_bare_word_for_jupyter_lab_is_an_error(capsys):
    assert exit_status(cli.main, ["course", "--", "notebook.ipynb"]) == 2
    assert "after --" in capsys.readouterr().err


def test_free_port_moves_off_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert course_command.free_port("127.0.0.1", preferred=busy) != busy


# --- executing and the book -------------------------------------------------------------------

def test_headless_runs_every_notebook_at_ci_sizes_and_builds_the_book(tmp_path, capsys):
    """Two notebooks (a plotly figure; a slider with a FigureWidget): both run with n = 3 injected,
    each has a page listed in the contents, each page draws its figure (the widget as a snapshot)."""
    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_tiny.ipynb")
    tiny_notebook(folder, "02_widget.ipynb", body=WIDGET_CELL)
    out = tmp_path / "book"
    assert cli.main(["course", "--headless", "--notebooks", str(folder), "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    index = out / "_build" / "html" / "index.html"
    assert str(index.resolve()) in shown
    for stem in ("01_tiny", "02_widget"):
        executed = nbformat.read(out / "_build" / "executed-ci" / f"{stem}.ipynb", as_version=4)
        assert "points: 3" in printed(executed), "the CI size n = 3 was not injected"
        page = (index.parent / f"{stem}.html").read_text()
        assert page.count('class="plotly-graph-div"') == 1 and "Plotly.newPlot(" in page
        assert f'href="{stem}.html"' in (index.parent / "intro.html").read_text()
    widget_page = (index.parent / "02_widget.html").read_text()
    assert "controls: steps" in widget_page and '"y":[0,1,2]' in widget_page.replace(" ", "")
    assert "_esm" not in widget_page, "the FigureWidget's JavaScript must not be embedded in the page"
    assert (index.parent / "_static" / "plotly.min.js").exists()


def test_headless_names_the_failing_notebook_and_cell(tmp_path, capsys):
    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_fine.ipynb", body="print(n)")
    tiny_notebook(folder, "02_broken.ipynb", body="x = n + 1\nraise ValueError('the tiny notebook breaks')")
    out = tmp_path / "book"
    assert cli.main(["course", "--headless", "--notebooks", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "02_broken.ipynb failed in cell 3 of 3" in err and "'x = n + 1'" in err
    assert "ValueError: the tiny notebook breaks" in err
    assert not (out / "_build" / "html" / "index.html").exists()


def test_no_book_report_times_every_notebook_and_goes_on_past_a_failure(tmp_path, capsys):
    """The GPU full-size run: each notebook timed, a failing one named (with its cell) but the next
    still run, the JSON report written with provenance, exit status 1."""
    import json

    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_broken.ipynb", body="raise ValueError('broken on purpose')")
    tiny_notebook(folder, "02_fine.ipynb", body="print('points:', n)")
    report = tmp_path / "report.json"
    rc = cli.main(["course", "--headless", "--no-book", "--sizes", "full", "--notebooks", str(folder),
                   "--out", str(tmp_path / "out"), "--report", str(report)])
    assert rc == 1
    written = json.loads(report.read_text())
    assert written["sizes"] == "full" and written["failed"] == ["01_broken.ipynb"]
    broken, fine = written["notebooks"]
    assert not broken["ok"] and "broken on purpose" in broken["error"] and "cell 3 of 3" in broken["error"]
    assert fine["ok"] and fine["seconds"] > 0 and fine["error"] is None
    assert "torch" in written["provenance"] and written["provenance"]["command"]
    executed = tmp_path / "out" / "_build" / "executed-full" / "02_fine.ipynb"
    assert "points: 50" in printed(nbformat.read(executed, as_version=4))
    out = capsys.readouterr()
    assert "02_fine.ipynb" in out.out and "FAILED" in out.out and "broken on purpose" in out.err


def test_only_runs_the_named_notebooks(tmp_path, capsys):
    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_broken.ipynb", body="raise ValueError('broken on purpose')")
    tiny_notebook(folder, "02_fine.ipynb", body="print('points:', n)")
    rc = cli.main(["course", "--headless", "--no-book", "--only", "2", "--notebooks", str(folder),
                   "--out", str(tmp_path / "out")])
    assert rc == 0, capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out" / "_build" / "executed-ci").iterdir()] == ["02_fine.ipynb"]


def test_only_names_what_matches_no_notebook(tmp_path, capsys):
    folder = tmp_path / "notebooks"
    tiny_notebook(folder, "01_a.ipynb", body="pass")
    assert exit_status(cli.main, ["course", "--headless", "--only", "07", "--notebooks", str(folder)]) == 2
    assert "--only 07: no such notebook (there are 01)" in capsys.readouterr().err


def test_a_notebook_can_be_read_after_an_earlier_number(tmp_path):
    from sparsity_lab.course import notebooks
    for name in ("01_a.ipynb", "02_b.ipynb", "03_c.ipynb"):
        tiny_notebook(tmp_path, name)
    late = tiny_notebook(tmp_path, "04_late.ipynb")
    nb = nbformat.read(late, as_version=4)
    nb.metadata["sparsity_lab"]["read_after"] = "01"
    nbformat.write(nb, late)
    assert [p.name[:2] for p in notebooks(tmp_path)] == ["01", "04", "02", "03"]
    nb.metadata["sparsity_lab"]["read_after"] = 1
    nbformat.write(nb, late)
    with pytest.raises(ValueError, match="read_after must be a notebook number"):
        notebooks(tmp_path)


def test_select_notebooks_by_number_or_name_in_reading_order():
    from sparsity_lab.course.running import select_notebooks

    paths = [Path("01_why.ipynb"), Path("02_masks.ipynb"), Path("12_gpus.ipynb")]
    assert select_notebooks(paths, ["12", "01_why"]) == [paths[0], paths[2]]
    assert select_notebooks(paths, ["2", "02_masks.ipynb"]) == [paths[1]]
    with pytest.raises(ValueError, match="--only 3 x"):
        select_notebooks(paths, ["3", "x"])


def test_full_sizes_keep_the_notebook_defaults_and_reuse_checks_the_run(tmp_path):
    source = tiny_notebook(tmp_path / "notebooks", body="print('points:', n)")
    [full] = execute_all([source], tmp_path / "full", sizes="full", progress=False)
    assert "points: 50" in printed(nbformat.read(full, as_version=4))
    assert is_current(full, source, "full") and not is_current(full, source, "ci")
    nb = nbformat.read(source, as_version=4)
    nb.cells[2].source = "print('changed', n)"
    nbformat.write(nb, source)
    assert not is_current(full, source, "full"), "an edited notebook must be run again"
    [again] = execute_all([source], tmp_path / "full", sizes="full", reuse=True, progress=False)
    assert "changed 50" in printed(nbformat.read(again, as_version=4))


@pytest.mark.skipif(__import__("os").name != "posix", reason="local sockets (ipc) exist on POSIX systems only")
def test_the_kernel_runs_without_the_tcp_warning(tmp_path, capfd):
    source = tiny_notebook(tmp_path / "notebooks", body="print('points:', n)")
    execute(source, tmp_path / "run" / source.name)
    captured = capfd.readouterr()
    assert "running over TCP" not in captured.err + captured.out


def test_the_kernel_is_not_interrupted_when_it_shuts_down(tmp_path, monkeypatch):
    """jupyter_client interrupts a kernel before its shutdown; the SIGINT landed in the handler of the last
    request and the kernel logged "KeyboardInterrupt caught in kernel" to the headless run's terminal."""
    from jupyter_client import AsyncKernelManager

    interrupts = []

    async def recorded(self):
        interrupts.append(self.shutting_down)

    monkeypatch.setattr(AsyncKernelManager, "_async_interrupt_kernel", recorded)
    source = tiny_notebook(tmp_path / "notebooks", body="print('points:', n)")
    execute(source, tmp_path / "run" / source.name)
    assert interrupts == [], "the kernel was interrupted while it shut down"


def test_a_failed_run_is_never_reused(tmp_path):
    source = tiny_notebook(tmp_path / "notebooks", body="raise RuntimeError('no')")
    with pytest.raises(NotebookFailed) as failure:
        execute(source, tmp_path / "run" / source.name)
    assert failure.value.cell == 2 and failure.value.notebook == source
    assert (tmp_path / "run" / source.name).exists() and not is_current(tmp_path / "run" / source.name, source, "ci")


def test_bad_sizes_are_a_clear_error(tmp_path):
    source = tiny_notebook(tmp_path)
    with pytest.raises(ValueError, match="sizes must be 'ci' or 'full'"):
        execute(source, tmp_path / "out.ipynb", sizes="tiny")
    with pytest.raises(ValueError, match="sources is empty"):
        execute_all([], tmp_path / "out")


def test_a_book_warning_fails_the_build(tmp_path):
    """-W: a page that makes Sphinx warn (here a reference to a label that does not exist) fails the
    build, and the error carries the warning."""
    from sparsity_lab.course import BookBuildFailed, build_book

    source = tiny_notebook(tmp_path / "notebooks", body="print(n)")
    nb = nbformat.read(source, as_version=4)
    nb.cells[0].source += "\n\nSee {ref}`a-label-nobody-defined`."
    nbformat.write(nb, source)
    [executed] = execute_all([source], tmp_path / "executed", progress=False)
    with pytest.raises(BookBuildFailed, match="a-label-nobody-defined"):
        build_book([executed], tmp_path / "book")


@pytest.mark.parametrize("root", [True, False])
def test_as_root_jupyter_is_allowed_to_start_and_says_so(monkeypatch, capsys, tmp_path, root):
    """jupyter lab exits at once as root unless allowed: the README's command must work there too."""
    seen = {}

    class FakeLab:
        def __init__(self, cmd, env):
            seen["cmd"] = cmd

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(course_command.subprocess, "Popen", FakeLab)
    monkeypatch.setattr(course_command, "_is_root", lambda: root)
    shipped = tiny_notebook(tmp_path / "notebooks").parent
    assert cli.main(["course", "--notebooks", str(shipped), "--workdir", str(tmp_path / "work"), "--no-browser"]) == 0
    assert ("--ServerApp.allow_root=True" in seen["cmd"]) == root
    assert ("running as root" in capsys.readouterr().out) == root
