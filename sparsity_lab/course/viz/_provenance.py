"""One line that says where a recorded result came from (the ``provenance`` block of results/*.json)."""
from __future__ import annotations

import re


def provenance_line(prov: dict) -> str:
    """GPU (or CPU), date, commit and versions, from a ``provenance`` dict; absent fields are left out.

    >>> provenance_line({"gpu": "H100", "date": "2026-11-21T15:00:00+00:00", "git_commit": "0123456789abcdef",
    ...                  "torch": "2.11.0", "triton": "3.6.0"})
    'H100, 2026-11-21 15:00 UTC, commit 0123456789ab, torch 2.11.0, triton 3.6.0'
    """
    if not isinstance(prov, dict):
        raise TypeError(f"prov must be the 'provenance' dict of a recorded result, got {type(prov).__name__}")
    where = prov.get("gpu") or f"CPU ({prov.get('cpu') or 'unknown'}, no GPU)"
    parts = [where + (f" (compute capability {prov['compute_capability']})" if prov.get("compute_capability") else "")]
    date = prov.get("date")
    if date:
        parts.append(date[:16].replace("T", " ") + (" UTC" if date.endswith("+00:00") else ""))
    commit = prov.get("git_commit")
    if commit:
        head, _, tail = commit.partition("+")
        parts.append(f"commit {head[:12]}" + (f"+{tail}" if tail else ""))
    for key, label in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"), ("cusparselt", "cuSPARSELt")):
        if prov.get(key) is not None:
            parts.append(f"{label} {prov[key]}")
    return ", ".join(parts)


# The recorded commands name the recording machine's files (/work/main/sparsity_lab/__main__.py, --out-dir
# /root/out) and the layout of their commit (bench-* subcommands, sparsity_lab/benchmarks/): a reader needs
# the command as they would type it in a clone today, with no path of someone else's machine.
_MAIN = re.compile(r"^(?:\S*/)?(?:sparsity_lab/__main__\.py|python -m sparsity_lab|sparsity-lab)\s+")
_BENCH_FILE = re.compile(r"^(?:python -m )?(?:\S*/)?(?:sparsity_lab/)?(benchmarks/\S+)\.py(?=\s|$)")
_TORCHTITAN = re.compile(r"^\S*/torchtitan_record\.py(?=\s|$)")
_OLD_MODULES = {"sparsity_lab.viz.": "sparsity_lab.course.viz."}
# benchmarks/<file>.py -> its name under ``python -m benchmarks NAME`` (benchmarks/__main__.py's table;
# tests/test_viz_provenance.py keeps the two equal); a file not named here stays ``python -m benchmarks.<module>``
BENCHMARK_NAMES = {"mask_solvers": "masks", "kernels": "kernels", "ffn.cli": "ffn", "cusparselt_calls": "cslt-calls",
                   "lab_speed": "lab-speed", "distributed_speed": "dist", "compile_speed": "compile",
                   "export_speed": "export", "act24_speed": "act24", "act24_accuracy": "act24-accuracy", "dyad": "dyad",
                   "mvue_variants": "mvue-variants", "fp8_training": "fp8-training", "fp8_sparse": "fp8-sparse",
                   "kernel_configs": "kernel-configs", "ffn_profile": "ffn-profile", "act24_profile": "act24-profile",
                   "cusparselt_probe": "cusparselt-probe", "cusparselt_layout_dump": "cusparselt-layout",
                   "step_profile": "step-profile", "step_host": "step-host", "optimizer_overlap": "optimizer-overlap",
                   "fp8_scalar_alpha": "fp8-scalar-alpha", "fp8_scale_update": "fp8-scale-update",
                   "fp8_ffn_clocks": "fp8-ffn-clocks",
                   "torchtitan_gpus": "torchtitan-gpus", "cutlass_sparse": "cutlass"}
_ABSOLUTE = re.compile(r"(?<![\w.])/[^\s'\"]+")


def provenance_command(prov: dict) -> str:
    """The command of a recorded result as a reader types it in a clone: ``python -m benchmarks NAME ...``
    for a benchmark, ``sparsity-lab ...`` for the CLI; every absolute path is cut to its last part.

    >>> provenance_command({"command": "/work/main/sparsity_lab/__main__.py bench-cslt-calls --out-dir /root/out"})
    'python -m benchmarks cslt-calls --out-dir out'
    >>> provenance_command({"command": "/srv/x/sparsity_lab/__main__.py compare --steps 10 --out /tmp/cmp"})
    'sparsity-lab compare --steps 10 --out cmp'
    """
    if not isinstance(prov, dict):
        raise TypeError(f"prov must be the 'provenance' dict of a recorded result, got {type(prov).__name__}")
    command = str(prov.get("command") or "not recorded").strip()
    main = _MAIN.match(command)
    if main:
        rest = command[main.end():]
        if rest.startswith("bench-"):
            command = "python -m benchmarks " + rest[len("bench-"):]
        else:
            command = "sparsity-lab " + rest
    elif _TORCHTITAN.match(command):
        # the recorder runs under torchtitan's trainer (docs/integrations.md); the module keeps its name
        command = _TORCHTITAN.sub("python -m benchmarks.torchtitan_record", command)
    else:
        command = _BENCH_FILE.sub(_benchmark_command, command)
    for old, new in _OLD_MODULES.items():
        command = command.replace(old, new)
    return _ABSOLUTE.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1] or "/", command)


def _benchmark_command(match: re.Match) -> str:
    module = match.group(1).replace("/", ".")[len("benchmarks."):]
    name = BENCHMARK_NAMES.get(module)
    return f"python -m benchmarks {name}" if name else f"python -m benchmarks.{module}"
