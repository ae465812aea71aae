"""Typed command-line values: one checker per kind of option, used as argparse ``type=`` by every command.

A bad value is refused while the command line is parsed, before any work starts: argparse prints the
usage, ``error: argument --steps: expected a positive integer, got '0'`` and exits with status 2.

    positive_int        1, 2, ...                      (steps, sizes, repeats, batch)
    nonnegative_int     0, 1, ...  where 0 means something (a seed, "0: off", "0: none")
    positive_float      finite > 0                     (a learning rate, a time budget)
    nonnegative_float   finite >= 0                    (a clip norm where 0 = off, a decay, idle seconds)
    fraction            in (0, 1]
    closed_fraction     in [0, 1]
    existing_file, existing_folder, existing_path      a path that must already be there
    output_folder       a folder that can be created or written (not under a file), checked, not created
    output_file         a file whose folder is an output_folder (the path itself not a folder)

``command_errors`` turns the errors a command raises on bad input (ValueError, OSError) into one line and
exit status 2, with no traceback.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from pathlib import Path


def _fail(expected: str, text) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {str(text)!r}")


def _int(text, expected: str) -> int:
    if isinstance(text, bool):
        raise _fail(expected, text)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise _fail(expected, text) from None


def _finite(text, expected: str) -> float:
    if isinstance(text, bool):
        raise _fail(expected, text)
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise _fail(expected, text) from None
    if not math.isfinite(value):
        raise _fail(expected, text)
    return value


def _number(parse, expected: str, ok, name: str):
    """An argparse ``type=``: ``parse(text, expected)`` then ``ok(value)``, else "expected <expected>"."""
    def check(text):
        value = parse(text, expected)
        if not ok(value):
            raise _fail(expected, text)
        return value
    check.__name__ = check.__qualname__ = name  # argparse names the type in some messages
    return check


positive_int = _number(_int, "a positive integer", lambda v: v >= 1, "positive_int")
nonnegative_int = _number(_int, "an integer >= 0", lambda v: v >= 0, "nonnegative_int")
positive_float = _number(_finite, "a finite number > 0", lambda v: v > 0, "positive_float")
nonnegative_float = _number(_finite, "a finite number >= 0", lambda v: v >= 0, "nonnegative_float")
fraction = _number(_finite, "a fraction in (0, 1]", lambda v: 0 < v <= 1, "fraction")
closed_fraction = _number(_finite, "a number in [0, 1]", lambda v: 0 <= v <= 1, "closed_fraction")
# a matrix cut into 4x4 tiles
multiple_of_4 = _number(_int, "a positive multiple of 4", lambda v: v >= 4 and v % 4 == 0, "multiple_of_4")
port_number = _number(_int, "a port in 1..65535", lambda v: 0 < v < 65536, "port_number")
_fraction_in_text = _number(_finite, "a fraction in (0, 1] or 'none'", lambda v: 0 < v <= 1, "fraction_or_none")


def fraction_or_none(text) -> float | None:
    return None if str(text).lower() == "none" else _fraction_in_text(text)


def existing_file(text) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"expected an existing file, got {str(text)!r}"
                                         + (" (a folder)" if Path(text).is_dir() else " (no such file)"))
    return str(text)


def existing_folder(text) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected an existing folder, got {str(text)!r}"
                                         + (" (a file)" if Path(text).exists() else " (no such folder)"))
    return str(text)


def existing_path(text) -> str:
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"expected an existing file or folder, got {str(text)!r} (no such path)")
    return str(text)


def output_folder(text) -> str:
    """A folder that exists and is writable, or can be created: the nearest existing ancestor must be a
    writable folder (a path under a regular file is refused here, before any work)."""
    path = Path(text)
    if str(text) == "" or "\x00" in str(text):
        raise argparse.ArgumentTypeError(f"expected a folder path, got {str(text)!r}")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "is a file" if probe == path else f"is under the file {str(probe)!r}"
        raise argparse.ArgumentTypeError(f"expected a folder to write into, but {str(text)!r} {where}")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"expected a writable folder, but {str(probe)!r} is not writable")
    return str(text)


def output_file(text) -> str:
    """A file to write: not an existing folder, and its folder an ``output_folder``."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file to write, but {str(text)!r} is a folder")
    output_folder(str(path.parent) if str(path.parent) else ".")
    return str(text)


def as_path(check):
    """The type ``check`` (e.g. ``existing_folder``) returning a ``pathlib.Path``."""
    def convert(text) -> Path:
        return Path(check(text))
    convert.__name__ = check.__name__
    return convert


def backend_name(text) -> str:
    """One of ``sparsity_lab.backends.available_backends()`` (whether it runs here is checked when it is built)."""
    from ..backends import available_backends

    if text not in available_backends():
        raise argparse.ArgumentTypeError(f"expected one of {available_backends()}, got {text!r}")
    return text


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 process``, ``2 processes``."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def command_errors(command: str, errors: tuple[type[BaseException], ...] = ()):
    """Decorator of a command's ``run(args)``: ValueError, OSError (and ``errors``) become one line
    ``sparsity-lab COMMAND: error: ...`` on stderr and exit status 2, with no traceback."""
    caught = (ValueError, OSError, *errors)

    def wrap(fn):
        @functools.wraps(fn)
        def run(args):
            try:
                return fn(args)
            except caught as err:  # OSError: names its path
                print(f"sparsity-lab {command}: error: {err}", file=sys.stderr)
                return 2
        return run
    return wrap
