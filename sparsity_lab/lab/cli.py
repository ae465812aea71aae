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
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
