"""``--config FILE.toml``: a command's options from a TOML file; flags on the command line override it.

The file holds the options by their long name, without the dashes (``batch-size`` or ``batch_size``):

    method = "sste"
    mvue = true            # a flag: true sets it, false leaves it off
    steps = 2000
    lr = 1e-3
    variants = "dense,ste,sste"   # compare

Each value goes through the same check as the flag (``lab/arguments.py``); an unknown key, a bad value or
two keys that exclude each other (``steps`` and ``tokens``) stop the command before any work, naming the
file and the key. A key whose option is also given on the command line is dropped (the flag wins; so is
a key that excludes a given flag: ``--tokens`` on the command line drops the file's ``steps``).

``resolved_toml`` writes the options a run used (given, from the file, or their resolved defaults) as such a
file: ``train`` and ``compare`` save it as OUT/config.toml, and ``--config OUT/config.toml`` runs it again.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
from pathlib import Path

CONFIG_OPTION = "--config"


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    from .arguments import existing_file

    parser.add_argument(CONFIG_OPTION, metavar="FILE.toml", type=existing_file, default=None,
                        help="options from a TOML file (keys: the long option names without the dashes, e.g. "
                             "batch-size = 8); flags given here override the file. The run writes every option it "
                             "used to OUT/config.toml")


def read_toml(path: str | Path) -> dict:
    """The TOML file as a dict (ValueError naming the file when it is not TOML)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the same parser as the package tomli
        try:
            import tomli as tomllib
        except ImportError:
            raise ValueError(f"{path}: reading TOML needs Python 3.11 or later, or the tomli package "
                             "(pip install tomli)") from None
    if Path(path).suffix.lower() in (".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: --config reads TOML files (key = value lines), not "
                         f"{Path(path).suffix} files")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None


def _option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """{key: action} for every long option that takes part in a config (``batch-size`` -> --batch-size)."""
    found = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction) or longs[0] == CONFIG_OPTION:
            continue
        found[longs[0][2:]] = action
    return found


def _tokens(option: str, action: argparse.Action, value, where: str) -> list[str]:
    """The command-line tokens of one config entry (checked like the flag: type and choices)."""
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [f"--{option}" if value else f"--no-{option}"]
        return [f"--{option}"] if value else []
    many = action.nargs in ("+", "*") or isinstance(action.nargs, int)
    values = value if isinstance(value, list) and many else [value]
    if isinstance(value, (list, dict)) and not many:
        raise ValueError(f"{where}: expected one value, got {value!r}")
    texts = []
    for v in values:
        if isinstance(v, bool) or isinstance(v, (dict, list)):
            raise ValueError(f"{where}: expected a value for --{option}, got {v!r}")
        text = str(v)
        try:
            converted = action.type(text) if action.type is not None else text
        except (argparse.ArgumentTypeError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None
        if action.choices is not None and converted not in action.choices:
            raise ValueError(f"{where}: expected one of {list(action.choices)}, got {v!r}")
        texts.append(text)
    return [f"--{option}", *texts]


def config_tokens(parser: argparse.ArgumentParser, path: str, given: set[str]) -> list[str]:
    """The command-line tokens of the config file ``path`` for ``parser``, leaving out the options in ``given``
    (dests set on the command line) and those that exclude one of them. ValueError names file and key."""
    table = read_toml(path)
    actions = _option_actions(parser)
    by_dest = {a.dest: k for k, a in actions.items()}
    chosen: dict[str, tuple[str, argparse.Action, object]] = {}
    for key, value in table.items():
        name = key.replace("_", "-")
        if isinstance(value, dict):
            raise ValueError(f"{path}: [{key}] is a table; write the options as top-level keys (key = value)")
        if name == CONFIG_OPTION[2:]:
            raise ValueError(f"{path}: a config file cannot name another one ({key!r})")
        if name not in actions:
            near = difflib.get_close_matches(name, list(actions), n=3)
            raise ValueError(f"{path}: unknown key {key!r}" + (f" (did you mean {', '.join(near)}?)" if near else "")
                             + f"; the keys are the options of `{parser.prog}` without the dashes")
        if actions[name].dest in {a.dest for _, a, _ in chosen.values()}:
            raise ValueError(f"{path}: {key!r} is given twice (as {by_dest[actions[name].dest]!r} and {key!r})")
        chosen[name] = (key, actions[name], value)
    for group in parser._mutually_exclusive_groups:
        dests = {a.dest for a in group._group_actions}
        in_file = [key for key, action, _ in chosen.values() if action.dest in dests]
        if len(in_file) > 1:
            raise ValueError(f"{path}: {' and '.join(repr(k) for k in in_file)} exclude each other; keep one")
        if dests & given:  # the command line sets one of the group: it wins over the file's
            chosen = {n: c for n, c in chosen.items() if c[1].dest not in dests}
    tokens = []
    for name, (key, action, value) in chosen.items():
        if action.dest not in given:
            tokens += _tokens(name, action, value, f"{path}: {key}")
    return tokens


def given_dests(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests that ``argv`` sets (parsed with every default suppressed)."""
    saved = [(a, a.default) for a in parser._actions]
    saved_defaults = dict(parser._defaults)
    try:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
        parser._defaults.clear()
        namespace, _ = parser.parse_known_args(argv)
    finally:
        for action, default in saved:
            action.default = default
        parser._defaults.update(saved_defaults)
    return set(vars(namespace))


def expand(parser: argparse.ArgumentParser, argv: list[str], path: str) -> list[str]:
    """``argv`` (a command's own arguments) with the tokens of the config file ``path`` put first. A bad file
    ends the command through ``parser.error`` (the usage, exit status 2)."""
    try:
        return [*config_tokens(parser, path, given_dests(parser, argv)), *argv]
    except ValueError as err:
        parser.error(f"{CONFIG_OPTION} {err}")
    return argv  # not reached: parser.error exits


# --- the resolved options, written back as TOML ---------------------------------------------------------
def resolved_options(parser: argparse.ArgumentParser, args: argparse.Namespace, resolved: dict,
                     skip: tuple[str, ...] = ()) -> dict:
    """{key: value} for every option of ``parser``: the value given (flag or file), else ``resolved[dest]``
    (what the run computed, e.g. the head count from the width), else the option's default; None where none
    of these exists. Members of an exclusive group other than the one given are None."""
    values = vars(args)
    out = {}
    excluded = set()
    for group in parser._mutually_exclusive_groups:
        dests = {a.dest for a in group._group_actions}
        if dests & set(values):
            excluded |= dests - set(values)
    for key, action in _option_actions(parser).items():
        dest = action.dest
        if dest in skip:
            continue
        if dest in values:
            value = values[dest]
        elif dest in excluded:
            value = None
        elif dest in resolved:
            value = resolved[dest]
        elif action.default is not argparse.SUPPRESS:
            value = action.default
        else:
            value = None
        if value is None and action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
            value = False  # a flag not set
        out[key] = value
    return out


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                         ("inf" if value > 0 else "-inf"))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string (JSON's escapes are TOML's)


def resolved_toml(options: dict, command: str) -> str:
    """The options as a TOML file ``--config`` reads back; options without a value are comments."""
    lines = [f"# sparsity-lab {command}: every option of this run (sparsity-lab {command} --config THIS_FILE",
             "# runs it again; flags given beside --config override these values)"]
    for key, value in options.items():
        lines.append(f"# {key} = (not set: its default applies)" if value is None else f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def write_resolved(folder: str | Path, options: dict, command: str) -> Path:
    from .atomic_io import write_text_atomic

    return write_text_atomic(Path(folder) / "config.toml", resolved_toml(options, command), "resolved config")
