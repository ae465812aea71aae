"""docs/measuring.md keeps up with results/: every recorded JSON is there, with the commit it was made at.

A JSON added to results/ without saying how to run it again fails here, and so does a file re-recorded
at another commit while the page still names the old one. The page's Python blocks run as written.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "measuring.md"


def recorded_files() -> list[Path]:
    return sorted(p for p in (ROOT / "results").rglob("*.json"))


def passages(text: str, name: str) -> list[str]:
    """The table rows and paragraphs of ``text`` that mention ``name``."""
    blocks = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines):
            blocks += [line for line in lines if name in line]  # a table: each row on its own
        elif name in block:
            blocks.append(block)
    return blocks


def names_of(path: Path) -> list[str]:
    """How the page may name a recorded file: its path, or the folder of a lab run, or its bare name in
    the table of earlier runs."""
    relative = path.relative_to(ROOT).as_posix()
    if path.name == "results.json":
        return [path.parent.relative_to(ROOT).as_posix() + "/"]
    return [relative, path.name]


@pytest.mark.parametrize("path", recorded_files(), ids=lambda p: p.relative_to(ROOT / "results").as_posix())
def test_every_recorded_json_is_on_the_page_with_its_commit(path):
    text = PAGE.read_text()
    found = [block for name in names_of(path) for block in passages(text, name)]
    assert found, f"docs/measuring.md does not say how to reproduce {path.relative_to(ROOT)}"
    commit = json.loads(path.read_text())["provenance"]["git_commit"][:7]
    assert any(commit in block for block in found), (
        f"docs/measuring.md names {path.relative_to(ROOT)} but not the commit it was recorded at ({commit}): "
        f"{found[0][:300]!r}")


def test_the_pages_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert blocks, "docs/measuring.md has no Python example"
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), {})


def test_the_checks_catch_a_missing_file_and_a_stale_commit():
    text = "**`results/a.json`**: recorded at commit 1234567.\n\n| `b.json` | 19:00, abcdef0 | x |\n"
    assert passages(text, "results/a.json") and "1234567" in passages(text, "results/a.json")[0]
    assert passages(text, "b.json") == ["| `b.json` | 19:00, abcdef0 | x |"]
    assert passages(text, "results/c.json") == []
    assert not any("7654321" in block for block in passages(text, "results/a.json"))


def test_the_pages_commands_parse():
    """Every ``sparsity-lab`` command of the page (bash blocks, inline code) names a command and flags
    that exist."""
    import shlex

    from sparsity_lab.lab.cli import build_parser

    text = PAGE.read_text()
    lines = [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for line in block.replace("\\\n", " ").splitlines()]  # continuation lines joined
    commands = [line for line in lines if line.startswith("sparsity-lab ")]
    commands += [" ".join(span.split()) for span in re.findall(r"`(sparsity-lab [a-z-]+ [^`]+)`", text)]
    assert len(commands) >= 10, commands  # the benchmarks: test_every_benchmark_command_on_the_page_names_a_benchmark_and_parses
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            build_parser(argv[0]).parse_args(argv)
        except SystemExit as exit_:
            pytest.fail(f"docs/measuring.md prints a command that does not parse (exit {exit_.code}): {command}")


def test_every_benchmark_command_on_the_page_names_a_benchmark_and_parses():
    """The page's commands run from a clone: ``python -m benchmarks NAME ...`` (or ``torchrun ... -m benchmarks``)
    names a listed benchmark whose own parser takes the options; ``python -m benchmarks.MODULE`` names a module
    of benchmarks/ that runs as a script."""
    import argparse
    import importlib

    from _commands import fenced_blocks, shell_commands
    from benchmarks.__main__ import BENCHMARKS

    checked = 0
    for language, block, line in fenced_blocks(PAGE.read_text()):
        if language != "bash":
            continue
        for command in shell_commands(block, f"docs/measuring.md:{line}", line):
            argv = command.argv
            if "benchmarks" in argv and argv[argv.index("benchmarks") - 1] == "-m":
                name, options = argv[argv.index("benchmarks") + 1], argv[argv.index("benchmarks") + 2:]
                assert name in BENCHMARKS, f"{command}: no benchmark {name!r} (python -m benchmarks --help)"
                module = importlib.import_module(BENCHMARKS[name][0])
                if hasattr(module, "add_arguments"):
                    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}")
                    module.add_arguments(parser)
                    parser.parse_args(options)
                checked += 1
            for token in argv:
                if token.startswith("benchmarks.") and argv[argv.index(token) - 1] == "-m":
                    source = (ROOT / token.replace(".", "/")).with_suffix(".py")
                    assert source.is_file() and '__name__ == "__main__"' in source.read_text(), \
                        f"{command}: {token} does not run as a script"
                    checked += 1
    assert checked > 10
