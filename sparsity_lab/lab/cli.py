"""Command line: ``sparsity-lab COMMAND`` (or ``python -m sparsity_lab COMMAND``).

The user's verbs: the course, a demo, training, the method comparison and the decay search. Each
command lives in its own module with ``add_arguments(parser)`` and ``run(args) -> int``; only the
module of the command being run is imported (a broken or heavy command module never stops the
others). The benchmarks run from a clone of the repository: ``python -m benchmarks --help``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "course": ("sparsity_lab.course.command", "open the notebook course in JupyterLab (--headless: run it all, build the book)"),
    "demo": ("sparsity_lab.lab.demo", "a short tour: a 2:4 mask, the solvers compared, a flip-rate trace"),
    "train": ("sparsity_lab.lab.train", "pre-train the lab GPT on bytes with one method (dense, ste, srste, ...)"),
    "compare": ("sparsity_lab.lab.compare", "every method, same seed, data and token budget: table, claims, figures"),
    "decay-search": ("sparsity_lab.lab.decay_search", "choose masked decay's lambda_W by warm-up trials (our procedure)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s own arguments are loaded (from its module)."""
    parser = argparse.ArgumentParser(prog="sparsity-lab", description="2:4 sparse pre-training toolkit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module, _parser=p)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


_WARNING_COMMAND = [None]  # the command whose DataWarnings are being printed


def _one_line_warnings(command: str | None) -> None:
    """The lab's warnings about the user's input (DataWarning) as one line naming the command, not with a
    source line; other warnings keep Python's format."""
    _WARNING_COMMAND[0] = command
    if getattr(warnings.formatwarning, "sparsity_lab", False):
        return
    default = warnings.formatwarning

    def fmt(message, category, filename, lineno, line=None):
        if category.__name__ == "DataWarning":
            return f"sparsity-lab {_WARNING_COMMAND[0]}: warning: {message}\n"
        return default(message, category, filename, lineno, line)
    fmt.sparsity_lab = True
    warnings.formatwarning = fmt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    _one_line_warnings(command)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if getattr(args, "config", None) is not None:
        from .config_file import expand  # --config FILE.toml: the file's options first, the flags win

        at = argv.index(command) + 1
        args = parser.parse_args([*argv[:at], *expand(args._parser, argv[at:], args.config)])
    module = importlib.import_module(args._module)
    check = getattr(module, "check_arguments", None)
    if check is not None:
        try:
            check(args)
        except ValueError as err:
            args._parser.error(str(err))  # the usage, the message, exit status 2
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
