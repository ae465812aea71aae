"""What tests/test_commands_run.py runs: the shell commands printed in README.md and the fenced blocks
of every notebook's "Things to try" cell, read and planned here (pure functions, no execution).

Format (the course's convention): anything runnable sits in a fenced block, ```bash (one command a
line; ``\\`` continues a line; ``#`` starts a comment) or ```python (code that runs in the notebook's
state after its last cell). A bash line is ``[VAR=value ...] program args``, where program is
``sparsity-lab``, ``python -m sparsity_lab``, ``python -m benchmarks`` (from the clone), ``pytest`` / ``python -m pytest`` or ``python -m pip``.

Each command gets a plan:

* ``run``: run it, with its size flags shrunk (table SHRINK; REPLACED flags dropped), small sizes
  added where a training command gives none (TRAINING_DEFAULTS), and output paths moved into a
  temporary folder (OUTPUT_FLAGS; relative paths already land there: the commands of one file run in
  order in one temporary folder, so a later line can resume what an earlier one wrote); a resumed
  run (``--resume``) keeps its checkpoint's sizes; ``torchrun`` runs at most 2 processes
  (``--standalone``); ``--help`` runs as written. ``train --backend triton`` on a CPU runs
  the kernels through the Triton interpreter (TRITON_INTERPRET=1).
* ``parse``: a GPU command (its ``--help`` line says "(GPU)", it asks for ``--device cuda``, its line
  carries a comment that says "GPU", or it is compare/decay-search on backend triton, which the
  interpreter runs too slowly) on a machine without CUDA: its options are checked by the command's
  own parser, then the test is skipped with that reason. On a GPU machine it runs.
* ``collect``: ``pytest FILES``: collected (``--collect-only``): the files exist and import; the suite
  runs their tests anyway.
* ``skip``: install lines, the suite's own test command and ``course`` (a JupyterLab server that
  runs until stopped, or the headless book build): each with the reason and the test that covers it.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# flag -> the value it is shrunk to (never enlarged: min(value, small) for numbers)
SHRINK: dict[str, float | int | str] = {
    "--steps": 3, "--tokens": 4096, "--layers": 1, "--heads": 2, "--width": 32, "--context": 32,
    "--ffn-hidden": 64, "--batch-size": 2, "--grad-accum": 1, "--eval-batches": 1, "--eval-interval": 2,
    "--trial-steps": 2, "--data-max-bytes": 100_000,
    "--size": 64, "--repeats": 1, "--mib": 1, "--rep-ms": 10, "--regrow-every": 1,
}
# dropped with their value: compare's --time-budget first probes every variant (minutes on a CPU) and
# sizes the run from that; the small run below (--steps 3) takes its place
REPLACED = ("--time-budget", "--max-tokens")
# training commands get these when the line does not set them (their defaults are GPU-sized)
TRAINING = ("train", "compare", "decay-search")
TRAINING_DEFAULTS = {"--steps": "3", "--layers": "1", "--width": "32", "--context": "32", "--batch-size": "2",
                     "--eval-batches": "1", "--data-max-bytes": "100000"}
COMMAND_DEFAULTS = {"demo": {"--steps": "20", "--size": "64"}, "masks": {"--quick": None, "--repeats": "1"},
                    "act24-accuracy": {**TRAINING_DEFAULTS, "--no-progress": None}}
# flags whose value is a path the command writes; moved under the test's temporary folder
OUTPUT_FLAGS = ("--out", "--out-dir", "--report")
# commands that write results/<name>.json under the current folder unless told otherwise (moved to the test's own)
WRITES_RESULTS = ("masks", "kernels", "dyad", "ffn", "cslt-calls", "lab-speed", "act24", "act24-accuracy")


@dataclass
class Command:
    where: str                      # "README.md line 12" or "04_masked_decay.ipynb, Things to try"
    text: str                       # the line as printed (continuations joined)
    env: dict[str, str]
    argv: list[str]                 # program and arguments as written (no env prefix)
    comment: str = ""

    def __str__(self) -> str:
        env = [f"{k}={v}" for k, v in self.env.items()]
        shown = shlex.join([*env, *self.argv])
        return f"{self.where}: {shown}" + (f"  (in the line: {self.text})" if " && " in self.text else "")


@dataclass
class Plan:
    kind: str                       # "run", "parse", "collect" or "skip"
    reason: str = ""
    argv: list[str] = field(default_factory=list)   # what runs, after the program (sparsity-lab / pytest args)
    program: str = ""               # "sparsity-lab" or "pytest"
    env: dict[str, str] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)  # torchrun's own options, when it launches the command


FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


def fenced_blocks(markdown: str) -> list[tuple[str, str, int]]:
    """(language, body, line number of the body's first line) of every fenced block."""
    return [(m.group(1).lower(), m.group(2), markdown.count("\n", 0, m.start(2)) + 1)
            for m in FENCE.finditer(markdown)]


def shell_commands(block: str, where: str, first_line: int | None = None) -> list[Command]:
    """The commands of a bash block: one per line, ``\\`` continuations joined, ``&&`` chains split."""
    out, pending, start = [], "", None
    for offset, raw in enumerate(block.splitlines()):
        line = raw.rstrip()
        if start is None:
            start = offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = (pending + line).strip(), ""
        line_no, start = (first_line + start if first_line is not None else None), None
        if not text or text.startswith("#"):
            continue
        here = f"{where} line {line_no}" if line_no is not None else where
        lexer = shlex.shlex(text, posix=True, punctuation_chars="&|;")
        lexer.whitespace_split = True
        lexer.commenters = ""
        tokens = list(lexer)
        comment = ""
        if "#" in tokens or any(t.startswith("#") for t in tokens):
            cut = next(i for i, t in enumerate(tokens) if t.startswith("#"))
            comment, tokens = " ".join(tokens[cut:]), tokens[:cut]
        parts, current = [], []
        for token in tokens:
            if token == "&&":
                parts.append(current)
                current = []
            elif token in ("|", "||", ";", "&"):
                raise ValueError(f"{here}: {text!r}: one command per line (or a && chain); found {token!r}")
            else:
                current.append(token)
        parts.append(current)
        for argv in parts:
            env = {}
            while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
                name, value = argv.pop(0).split("=", 1)
                env[name] = value
            if argv:
                out.append(Command(here, text, env, argv, comment))
    return out


PROGRAMS = {"sparsity_lab": "sparsity-lab", "benchmarks": "benchmarks"}  # module run by -m -> program


def torchrun_split(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """``torchrun OPTS -m sparsity_lab ARGS`` -> (OPTS with at most 2 processes, ["sparsity-lab", *ARGS]);
    ``-m benchmarks`` likewise, -> ["benchmarks", *ARGS]."""
    if argv[0] != "torchrun" and argv[:3] != ["python", "-m", "torch.distributed.run"]:
        return None
    rest = argv[1:] if argv[0] == "torchrun" else argv[3:]
    if "-m" not in rest or rest[rest.index("-m") + 1:][:1] == [] or rest[rest.index("-m") + 1] not in PROGRAMS:
        return None
    program = PROGRAMS[rest[rest.index("-m") + 1]]
    cut = rest.index("-m")
    opts, args = rest[:cut], rest[cut + 2:]
    for flag in ("--nproc-per-node", "--nproc_per_node"):
        if flag in opts and opts[opts.index(flag) + 1].isdigit():
            opts[opts.index(flag) + 1] = str(min(2, int(opts[opts.index(flag) + 1])))
    return (opts if "--standalone" in opts else ["--standalone", *opts]), [program, *args]


def subcommand(argv: list[str]) -> tuple[str, list[str]] | None:
    """("sparsity-lab", args), ("benchmarks", args: ``python -m benchmarks``, run from the clone),
    ("pytest", args) or ("pip", args); None for anything else."""
    if argv[0] in ("sparsity-lab", "benchmarks"):
        return argv[0], argv[1:]
    if argv[0] in ("pytest", "py.test"):
        return "pytest", argv[1:]
    if argv[0] in ("python", "python3") and argv[1:2] == ["-m"] and len(argv) > 2:
        module = {**PROGRAMS, "pytest": "pytest", "pip": "pip"}.get(argv[2])
        if module:
            return module, argv[3:]
    if argv[0] in ("pip", "pip3"):
        return "pip", argv[1:]
    return None


def command_table(program: str) -> dict[str, tuple[str, str]]:
    """name -> (module, help) of the CLI's commands or of the benchmarks."""
    if program == "benchmarks":
        from benchmarks.__main__ import BENCHMARKS
        return BENCHMARKS
    from sparsity_lab.lab.cli import COMMANDS
    return COMMANDS


def _gpu_only(program: str, command_name: str, args: list[str], comment: str) -> str:
    help_text = command_table(program).get(command_name, ("", ""))[1]
    if re.search(r"\bGPU\)\s*$", help_text) and "--smoke" not in args and "--allow-cpu" not in args:
        return f"`{command_name}` is a GPU command ({help_text})"
    if "--device" in args and args[args.index("--device") + 1:][:1] == ["cuda"]:
        return "it asks for --device cuda"
    if re.search(r"\bGPU\b", comment):
        return f"its line says so ({comment})"
    return ""


def _shrunk(flag: str, value: str) -> str:
    """``value`` or the table's smaller one (a value that is not a number is kept)."""
    try:
        return value if float(value) <= SHRINK[flag] else str(SHRINK[flag])
    except ValueError:
        return value


def plan(command: Command, tmp: Path, has_gpu: bool) -> Plan:
    """How the test treats ``command`` (see the module docstring)."""
    titan_trainers = (["torchtitan.train"], ["sparsity_lab.integrations.torchtitan_train"],
                      ["benchmarks.torchtitan_train"])  # torchtitan's trainer, or the launcher that starts it
    if "-m" in command.argv and command.argv[command.argv.index("-m") + 1:][:1] in titan_trainers:
        return Plan("skip", "torchtitan's own trainer, which needs an accelerator: "
                            "tests/test_readme_integrations.py parses this command with torchtitan's config parser "
                            "and tests/test_integrations_torchtitan.py drives the trainer's pieces on the CPU")
    launched = torchrun_split(command.argv)
    launcher, argv = launched if launched else ([], command.argv)
    found = subcommand(argv)
    if found is None:
        raise ValueError(f"{command}: the test runs `sparsity-lab ...`, `python -m sparsity_lab ...`, "
                         f"`python -m benchmarks ...`, `torchrun ... -m sparsity_lab|benchmarks ...` and `pytest ...` commands; write other programs as prose, or teach tests/_commands.py "
                         "to run them")
    program, args = found
    if program == "pip":
        return Plan("skip", "installs packages: this test runs in the environment that the README's test "
                            "command installed (.ci/run runs it), with the test extra, a superset of lab")
    if program == "pytest":
        files = [a for a in args if not a.startswith("-")]
        if not files:
            return Plan("skip", "the whole suite: this test is part of it (CI runs exactly this line, .ci/run)")
        return Plan("collect", "the suite runs these tests itself; here they are collected (the files exist "
                               "and import)", ["--collect-only", "-q", "-p", "no:cacheprovider", *args], "pytest",
                    command.env)
    name = next((a for a in args if not a.startswith("-")), None)
    if "--help" in args or "-h" in args or name is None:
        return Plan("run", argv=args, program=program, env=command.env)
    if name == "course":
        if "--headless" in args:
            return Plan("skip", "runs every notebook and builds the book: tests/test_notebooks.py builds the same "
                                "book from the notebooks executed at CI sizes, and tests/test_course.py runs "
                                "`course --headless` on small notebooks")
        return Plan("skip", "starts a JupyterLab server that runs until it is stopped: tests/test_course_workdir.py "
                            "starts `course` with a real JupyterLab and stops it with SIGTERM")
    gpu = _gpu_only(program, name, args, command.comment)
    if not gpu and not has_gpu and name != "train" and any(a.startswith("triton") for a in args):
        gpu = (f"`{name}` trains several runs on backend triton, which the CPU interpreter runs too slowly "
               "for CI (`train --backend triton` runs here, interpreted)")
    if gpu and not has_gpu:
        return Plan("parse", f"needs a CUDA GPU: {gpu}; its options were checked by its parser", args, program,
                    command.env)
    if "--resume" in args:  # the checkpoint fixes the sizes; a resumed run refuses new ones
        return Plan("run", argv=args, program=program, env=command.env, launcher=launcher)
    new, i = [], 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        if flag in REPLACED and value is not None:
            i += 2
        elif flag in SHRINK and value is not None and not value.startswith("--"):
            new += [flag, _shrunk(flag, value)]
            i += 2
        elif flag in OUTPUT_FLAGS and value is not None and Path(value).is_absolute():
            new += [flag, str(tmp / "out" / Path(value).name)]  # relative ones land in the test's folder
            i += 2
        else:
            new.append(flag)
            i += 1
    defaults = dict(TRAINING_DEFAULTS) if name in TRAINING else {}
    if "--tokens" in new:  # sizes the steps itself
        defaults.pop("--steps", None)
    defaults.update(COMMAND_DEFAULTS.get(name, {}))
    if name in WRITES_RESULTS and "--out-dir" not in new:
        defaults["--out-dir"] = str(tmp / "out")
    for flag, value in defaults.items():
        if flag not in new:
            new += [flag] if value is None else [flag, value]
    if name in TRAINING and "--no-progress" not in new:
        new.append("--no-progress")
    env = dict(command.env)
    if any(a in ("triton", "triton_fp8sim") for a in new) and not has_gpu:
        env.setdefault("TRITON_INTERPRET", "1")  # the Triton kernels on the CPU, through the interpreter
    return Plan("run", argv=new, program=program, env=env, launcher=launcher)


# --- notebooks ----------------------------------------------------------------------------------

THINGS_TO_TRY = "## Things to try"


def things_to_try(nb) -> str | None:
    """The notebook's "## Things to try" section: its last cell from that heading on (the convention
    has the cell start with it; prose before it in the same cell is left out), or None."""
    if not nb.cells or nb.cells[-1].cell_type != "markdown":
        return None
    match = re.search(rf"^{re.escape(THINGS_TO_TRY)}[ \t]*$", nb.cells[-1].source, re.M)
    return nb.cells[-1].source[match.start():] if match else None


RUNNABLE_SPAN = re.compile(r"^(sparsity-lab|python |pytest|pip |[A-Z_]+=\S+ )|[A-Za-z_]\w*\(.*\)")


def runnable_inline_spans(markdown: str) -> list[str]:
    """Inline code spans (outside fenced blocks) that look like something to run: a command or a
    call. The convention keeps those in fenced blocks, where a test runs them. A parameter setting
    (`steps = 600`, to change in the parameters cell and rerun) is not flagged."""
    prose = FENCE.sub("", markdown)
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose)
    return [s for s in spans if RUNNABLE_SPAN.search(s.strip())]


def python_blocks_failure(path: Path, blocks: list[str], tmp: Path, executed_copy: Path | None = None) -> str | None:
    """Execute notebook ``path`` at its CI sizes with ``blocks`` appended as cells (the state after its
    last cell); None when everything ran, else a message naming the notebook and the failing block.

    ``executed_copy``: where to also write the notebook's own executed copy (the appended cells taken
    out again) after a successful run, so that one execution can serve both this check and the
    notebook tests (``course.is_current`` accepts it as a run of ``path``).
    """
    import nbformat

    from sparsity_lab.course import NotebookFailed, execute

    nb = nbformat.read(path, as_version=4)
    original = len(nb.cells)
    for k, code in enumerate(blocks, 1):
        nb.cells.append(nbformat.v4.new_code_cell(f"# Things to try, python block {k} of {len(blocks)}\n{code}",
                                                  metadata={"tags": [APPENDED_TAG]}))
    source = Path(tmp) / "source" / Path(path).name
    source.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, source)
    executed = Path(tmp) / "executed" / Path(path).name
    try:
        execute(source, executed, sizes="ci")
    except NotebookFailed as err:
        if err.cell is None or err.cell < original:
            return (f"{Path(path).name} failed before its Things-to-try blocks ran (tests/test_notebooks.py "
                    f"reports the notebook itself):\n{err}")
        k = err.cell - original + 1
        return (f"{Path(path).name}, Things to try, python block {k} of {len(blocks)} failed:\n"
                f"{blocks[k - 1].strip()}\n---\n{err}")
    if executed_copy is not None:
        run = nbformat.read(executed, as_version=4)
        run.cells = [c for c in run.cells if APPENDED_TAG not in c.metadata.get("tags", [])]
        Path(executed_copy).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(run, executed_copy)
    return None


APPENDED_TAG = "things-to-try-block"
