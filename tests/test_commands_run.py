"""Every command we print works: the shell commands of README.md's ```bash blocks, and the ```bash and
```python blocks of each notebook's "## Things to try" cell.

Shell commands run at small sizes: the rules (which flags shrink to what, which commands are only
parsed without a GPU, collected, or skipped and why) are in tests/_commands.py. Python blocks run in
the notebook's state after its last cell: the notebook is executed at its CI sizes with the blocks
appended as cells. A failure names the file, the line or block, the command as printed and as run.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _commands import (ROOT, Command, command_table, fenced_blocks, plan, runnable_inline_spans, shell_commands,
                       things_to_try)

HAS_GPU = torch.cuda.is_available()
README = ROOT / "README.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TIMEOUT_S = 600


def _readme_commands() -> list[Command]:
    text = README.read_text()
    return [c for lang, body, line in fenced_blocks(text) if lang in ("bash", "sh", "shell", "console")
            for c in shell_commands(body, "README.md", line)]


def _notebook_blocks(path: Path) -> tuple[list[Command], list[str]]:
    import nbformat

    source = things_to_try(nbformat.read(path, as_version=4))
    if source is None:
        return [], []
    blocks = fenced_blocks(source)
    where = f"{path.name}, Things to try"
    bash = [c for lang, body, _ in blocks if lang in ("bash", "sh", "shell") for c in shell_commands(body, where)]
    python = [body for lang, body, _ in blocks if lang == "python"]
    return bash, python


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text)[:60]


README_COMMANDS = _readme_commands()
NOTEBOOK_COMMANDS = [c for path in NOTEBOOKS for c in _notebook_blocks(path)[0]]
NOTEBOOK_PYTHON = [(path, _notebook_blocks(path)[1]) for path in NOTEBOOKS]


def _program(command: Command, program: str, launcher: list[str]) -> list[str]:
    """The interpreter running this test, or the console script installed beside it."""
    module = "benchmarks" if program == "benchmarks" else "sparsity_lab"
    if launcher:
        return [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", module]
    if program == "benchmarks":
        return [sys.executable, "-m", "benchmarks"]
    if program == "pytest":
        return [sys.executable, "-m", "pytest"]
    script = Path(sys.executable).parent / "sparsity-lab"
    if command.argv[0] == "sparsity-lab" and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "sparsity_lab"]


def _parse(program: str, name: str, argv: list[str]) -> None:
    """Parse ``argv`` with the command's own parser (SystemExit on bad options)."""
    if program == "benchmarks":
        import argparse
        import importlib

        module = importlib.import_module(command_table("benchmarks")[name][0])
        if hasattr(module, "add_arguments"):
            parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}")
            module.add_arguments(parser)
            parser.parse_args(argv[1:])
        return
    from sparsity_lab.lab.cli import build_parser
    build_parser(name).parse_args(argv)


def check_command(command: Command, tmp_path: Path) -> None:
    p = plan(command, tmp_path, HAS_GPU)
    if p.kind == "skip":
        pytest.skip(f"{command}: {p.reason}")
    if p.kind == "parse":
        name = next(a for a in p.argv if not a.startswith("-"))
        try:
            _parse(p.program, name, p.argv)
        except SystemExit as exit_:
            pytest.fail(f"{command}\nits options do not parse (exit status {exit_.code}); see stderr above")
        pytest.skip(f"{command}: {p.reason}")
    cmd = _program(command, p.program, p.launcher) + p.argv
    cwd = ROOT if p.kind == "collect" else tmp_path  # pytest file paths are relative to the repository
    env = dict(os.environ, **p.env)
    if p.program == "benchmarks":  # run from the clone: the test's folder is elsewhere
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    ran = " ".join([*(f"{k}={v}" for k, v in p.env.items()), *cmd])
    assert done.returncode == 0, (
        f"{command}\n  ran (shrunk, tests/_commands.py): {ran}\n  in {cwd}\n  exit status {done.returncode}\n"
        f"--- stdout (end) ---\n{done.stdout[-2500:]}\n--- stderr (end) ---\n{done.stderr[-2500:]}")


def test_the_readme_has_commands_to_check():
    names = " ".join(c.text for c in README_COMMANDS)
    assert "sparsity-lab train" in names and "sparsity-lab compare" in names, \
        "README.md's bash blocks no longer hold the train/compare commands this test is meant to run"


@pytest.fixture(scope="module")
def folder_per_file(tmp_path_factory):
    """One working folder per README / notebook: its commands run there in order (a later line may use
    what an earlier one wrote, e.g. --resume)."""
    folders = {}

    def get(command: Command) -> Path:
        name = command.where.split()[0].rstrip(",")
        if name not in folders:
            folders[name] = tmp_path_factory.mktemp(_slug(name))
        return folders[name]
    return get


@pytest.mark.parametrize("command", README_COMMANDS, ids=lambda c: _slug(f"L{c.where.split()[-1]}-{' '.join(c.argv)}"))
def test_readme_command_runs(command, folder_per_file):
    check_command(command, folder_per_file(command))


def _or_none_found(params: list, what: str) -> list:
    return params or [pytest.param(None, marks=pytest.mark.skip(reason=f"no notebook's Things to try has {what}"))]


@pytest.mark.parametrize("command", _or_none_found(NOTEBOOK_COMMANDS, "a ```bash block"),
                         ids=lambda c: _slug(f"{c.where[:2]}-{' '.join(c.argv)}") if c else "none")
def test_notebook_things_to_try_command_runs(command, folder_per_file):
    check_command(command, folder_per_file(command))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_things_to_try_keeps_runnable_code_in_fenced_blocks(path):
    """Inline code spans in "Things to try" are names only: a command, call or assignment there would
    be something a learner runs that no test checks."""
    import nbformat

    source = things_to_try(nbformat.read(path, as_version=4))
    assert source is not None, f"{path.name}: the last cell must be a markdown cell with the heading '## Things to try'"
    spans = runnable_inline_spans(source)
    assert not spans, (f"{path.name}, Things to try: put these in a ```bash or ```python block (a test runs "
                       f"those), or keep only names inline: {spans}")


@pytest.mark.parametrize("path, blocks", [pytest.param(p, b, id=p.name) for p, b in NOTEBOOK_PYTHON if b] or
                         [pytest.param(None, None, id="none", marks=pytest.mark.skip(
                             reason="no notebook's Things to try has a ```python block"))])
def test_notebook_things_to_try_python_runs_after_the_notebook(path, blocks, things_to_try_runs):
    """The notebook runs once with its blocks appended (conftest.py's things_to_try_runs, which also
    hands the notebook's own executed copy to tests/test_notebooks.py and the book)."""
    assert path.name in things_to_try_runs, f"{path.name}: its python blocks were not run"
    failure = things_to_try_runs[path.name]
    assert failure is None, failure
