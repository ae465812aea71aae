"""Every option of every command, probed with 0, -1, nan, inf and a value of the wrong type.

The parsers are read from the commands themselves (``cli.COMMANDS``, the benchmarks of a clone's
``benchmarks/__main__.py`` as ``bench-NAME``, each module's ``add_arguments``), so a new option is walked too. For each probe the command line either parses cleanly (the value is
legitimately allowed: listed below, with why) or is refused with exit status 2, argparse's usage and
an error naming the option: never a traceback, never a run. The command's ``run`` is replaced by a
stub, so "parses cleanly" means that parsing and ``check_arguments`` (everything checked before any
work) let it through.
"""
from __future__ import annotations

import argparse
import importlib

import pytest

from benchmarks.__main__ import BENCHMARKS
from benchmarks.__main__ import main as bench_main
from sparsity_lab.lab import cli

PROBES = ("0", "-1", "nan", "inf", "abc")

# (command or "*", option) -> the probes that parse, and why. Everything else must be refused.
ALLOWED: dict[tuple[str, str], tuple[set[str], str]] = {
    ("*", "--seed"): ({"0"}, "seed 0 is a seed"),
    ("*", "--warmup-steps"): ({"0"}, "no warm-up"),
    ("*", "--weight-decay"): ({"0"}, "no weight decay"),
    ("*", "--grad-clip"): ({"0"}, "0 turns clipping off"),
    ("*", "--min-lr-ratio"): ({"0"}, "cosine down to 0"),
    ("*", "--act24-dense-fraction"): ({"0"}, "no feature kept dense"),
    ("*", "--decay"): ({"0"}, "lambda_W 0: the method without its decay term"),
    ("*", "--srste-decay"): ({"0"}, "lambda_W 0"),
    ("*", "--sparsity"): ({"0"}, "prune_regrow with no dead block"),
    ("*", "--loss-tolerance"): ({"0"}, "only the best gap passes"),
    ("train", "--checkpoint-interval"): ({"0"}, "0: a checkpoint at the end only"),
    ("bench-ffn", "--warmup"): ({"0"}, "no untimed call"),
    ("bench-ffn", "--rounds"): ({"0"}, "0 skips the paired section"),
    ("bench-dist", "--warmup"): ({"0"}, "no untimed step"),
    ("bench-lab-speed", "--skip-steps"): ({"0"}, "no step left out of the median"),
    ("*", "--idle-s"): ({"0"}, "no idle time"),
    ("bench-act24-accuracy", "--seeds"): ({"0"}, "seed 0"),
    # names, not numbers: any text is a name (checked where it is used, e.g. a notebook that is not there)
    ("*", "--name"): (set(PROBES), "a result file's name"),
    ("course", "--ip"): (set(PROBES), "an address for jupyter (checked by jupyter)"),
    ("demo", "--record"): (set(), "a path, but it must name a .json file"),
}
# options that mean something only beside others: those are given too
CONTEXT: dict[tuple[str, str], list[str]] = {
    ("course", "--out"): ["--headless"], ("course", "--sizes"): ["--headless"],
    ("course", "--only"): ["--headless"], ("course", "--report"): ["--headless", "--no-book"],
    ("demo", "--record"): ["--seeds", "2"],
}
# output paths: any name is a folder or file that can be created; a path under a file is refused
# (test_output_paths_under_a_file_are_refused)
OUTPUT_TYPES = ("output_folder", "output_file")


def _bench_modules() -> dict[str, str]:
    """``bench-NAME`` -> module, for every benchmark that declares its options (``add_arguments``)."""
    found = {}
    for name, (module, _) in BENCHMARKS.items():
        if hasattr(importlib.import_module(module), "add_arguments"):
            found[f"bench-{name}"] = module
    return found


BENCH = _bench_modules()
COMMANDS = [*cli.COMMANDS, *BENCH]


def _module(command: str) -> str:
    return BENCH[command] if command in BENCH else cli.COMMANDS[command][0]


def _prog(command: str) -> str:
    """How the command names itself in its errors."""
    return f"python -m benchmarks {command.removeprefix('bench-')}" if command in BENCH else f"sparsity-lab {command}"


def _main(command: str, argv: list[str]) -> int:
    """The command run through its own entry point: the CLI, or ``python -m benchmarks``."""
    if command in BENCH:
        return bench_main([command.removeprefix("bench-"), *argv])
    return cli.main([command, *argv])


def _subparser(command: str) -> argparse.ArgumentParser:
    if command in BENCH:
        parser = argparse.ArgumentParser(prog=_prog(command))
        importlib.import_module(BENCH[command]).add_arguments(parser)
        return parser
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _value_options(command: str) -> list[argparse.Action]:
    return [a for a in _subparser(command)._actions if a.option_strings and a.nargs != 0
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def _type_name(action: argparse.Action) -> str:
    return getattr(action.type, "__name__", "")


def _allowed(command: str, action: argparse.Action) -> set[str]:
    option = action.option_strings[-1]
    for key in ((command, option), ("*", option)):
        if key in ALLOWED:
            return ALLOWED[key][0]
    return set(PROBES) if _type_name(action) in OUTPUT_TYPES else set()


def _cases():
    for command in COMMANDS:
        for action in _value_options(command):
            yield pytest.param(command, action.option_strings[-1], id=f"{command} {action.option_strings[-1]}")


def _run_stubbed(monkeypatch, command: str, argv: list[str]) -> int:
    module = importlib.import_module(_module(command))
    monkeypatch.setattr(module, "run", lambda args: 0)
    try:
        return _main(command, argv)
    except SystemExit as exit_:
        return exit_.code


@pytest.mark.parametrize("command, option", list(_cases()))
def test_every_option_refuses_bad_values_at_parse_time(command, option, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # relative paths ("0", "abc") name nothing that exists
    action = next(a for a in _value_options(command) if option in a.option_strings)
    allowed = _allowed(command, action)
    for probe in PROBES:
        code = _run_stubbed(monkeypatch, command, [*CONTEXT.get((command, option), []), option, probe])
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if probe in allowed:
            assert code == 0, f"{command} {option} {probe}: expected a clean parse, got {code}: {err}"
        else:
            assert code == 2, f"{command} {option} {probe}: expected exit status 2, got {code}"
            assert "usage:" in err and option in err, err
            assert err.splitlines()[-1].startswith(f"{_prog(command)}: error:"), err


def _output_cases():
    for command in COMMANDS:
        for action in _value_options(command):
            if _type_name(action) in OUTPUT_TYPES:
                yield pytest.param(command, action.option_strings[-1], id=f"{command} {action.option_strings[-1]}")


@pytest.mark.parametrize("command, option", list(_output_cases()))
def test_output_paths_under_a_file_are_refused(command, option, monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code = _run_stubbed(monkeypatch, command, [*CONTEXT.get((command, option), []), option,
                                               str(blocker / "out" / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and option in err and "is under the file" in err, err


def test_the_walk_covers_every_command_and_the_listed_cases():
    walked = {c for c in COMMANDS if _value_options(c)}
    assert walked == set(COMMANDS)  # every command has options taking a value
    options = {(c, a.option_strings[-1]) for c in COMMANDS for a in _value_options(c)}
    for case in [("train", "--tokens"), ("demo", "--steps"), ("demo", "--size"), ("demo", "--seeds"),
                 ("compare", "--max-tokens"), ("compare", "--time-budget"), ("bench-masks", "--repeats"),
                 ("bench-masks", "--budget-s"), ("bench-masks", "--out-dir"), ("decay-search", "--trial-steps"),
                 ("decay-search", "--loss-tolerance")]:
        assert case in options
    stale = [key for key in ALLOWED if key[0] != "*" and key not in options]
    assert not stale, f"allowances for options that no longer exist: {stale}"


@pytest.mark.parametrize("argv, words", [
    (["demo", "--size", "7"], ["--size", "multiple of 4"]),
    (["demo", "--steps", "-5"], ["--steps", "positive integer"]),
    (["demo", "--record", "x.json"], ["--record needs --seeds"]),
    (["demo", "--record", "x.txt", "--seeds", "2"], ["--record must name a .json file"]),
    (["train", "--tokens", "inf"], ["--tokens", "'inf'"]),
    (["compare", "--max-tokens", "1000"], ["--max-tokens", "--time-budget"]),
    (["compare", "--time-budget", "nan"], ["--time-budget", "'nan'"]),
    (["compare", "--time-budget", "-5"], ["--time-budget", "'-5'"]),
    (["bench-masks", "--budget-s", "nan"], ["--budget-s"]),
    (["decay-search", "--loss-tolerance", "nan"], ["--loss-tolerance"]),
])
def test_the_cases_seen_are_one_clear_error_before_any_work(argv, words, monkeypatch, capsys, tmp_path):
    """Refused by the real command (not a stub): nothing is run, nothing written."""
    monkeypatch.chdir(tmp_path)
    try:
        code = _main(argv[0], argv[1:])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and all(w in err for w in words), err
    assert list(tmp_path.iterdir()) == []


def test_bench_masks_out_dir_under_a_file_is_refused_before_the_benchmark(tmp_path, capsys, monkeypatch):
    import benchmarks.mask_solvers as bench

    ran = []
    monkeypatch.setattr(bench, "run_case", lambda *a, **k: ran.append(a))
    (tmp_path / "f").write_text("x")
    try:
        code = bench_main(["masks", "--quick", "--out-dir", str(tmp_path / "f" / "sub")])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and ran == [] and "--out-dir" in capsys.readouterr().err


def test_demo_errors_go_through_the_command_line_error_handling(monkeypatch, capsys):
    """A ValueError inside demo is one line and exit status 2, as for every command."""
    import sparsity_lab.lab.demo as demo

    def broken(size, seed):
        raise ValueError("size is wrong")
    monkeypatch.setattr(demo, "compare_solvers", broken)
    assert cli.main(["demo", "--size", "8", "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip().endswith("sparsity-lab demo: error: size is wrong")
