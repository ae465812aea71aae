"""Building ``sparse_gemm.cu`` on demand into a shared library, cached by a hash of what went into it.

The library is built once per (source, flags, nvcc, CUTLASS headers) and kept under the user's cache
(``$XDG_CACHE_HOME/sparsity_lab``, else ``~/.cache/sparsity_lab``; ``library_path(cache=...)`` moves
it), in ``cutlass/<key>/libsl_cutlass.so``. The source is compiled once per variant
(``-DSL_VARIANT=i``: one kernel per object, so the objects compile in parallel, one nvcc each) plus once
for the C entry points (``-DSL_API``), then linked with ``nvcc -shared`` (the CUDA runtime linked
statically, so the library needs only the driver).

What it needs, each found here without importing anything heavy:

    nvcc            ``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``), else ``nvcc`` on the PATH (CUDA >= 12.0)
    CUTLASS headers ``$CUTLASS_PATH`` (CUTLASS's own variable: a checkout with ``include/`` and
                    ``tools/util/include/``), else PyPI's ``nvidia-cutlass`` wheel, which ships them under
                    ``cutlass_library/source/``

``missing_tools`` says what is absent (a CPU-only machine can ask); ``build`` raises
:class:`CutlassUnavailable` naming it.

A tile search builds other variants the same way: ``candidate_library(names)`` rewrites the source's variant
table (``with_variants``) and leaves out, naming them, the candidates that do not compile.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

# the CUDA source ships as package data beside this module (a plain folder: nvcc needs a real path)
SOURCE = Path(str(resources.files(__package__).joinpath("sparse_gemm.cu")))
LIBRARY = "libsl_cutlass.so"
# sm_90a, not sm_90: the sparse warpgroup MMA (wgmma.sp) and setmaxnreg exist only on the "a" target
ARCH = ("-gencode", "arch=compute_90a,code=sm_90a")
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", *ARCH)
INSTALL_HINT = ("pip install nvidia-cutlass (the CUTLASS headers) and a CUDA toolkit with nvcc >= 12.0 "
                "(on the PATH, or in $CUDA_HOME/bin)")


class CutlassUnavailable(RuntimeError):
    """The CUTLASS backend cannot run here: no Hopper GPU, no nvcc, no CUTLASS headers, or the build failed."""


def cache_root() -> Path:
    """Where built libraries are kept by default (see the module docstring)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparsity_lab"


def find_nvcc() -> str | None:
    """Path of nvcc, or None."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found is None and Path("/usr/local/cuda/bin/nvcc").is_file():  # the toolkit's default place, off the PATH
        found = "/usr/local/cuda/bin/nvcc"
    return found


def find_cutlass() -> list[Path] | None:
    """The two include folders of CUTLASS (its ``include`` and ``tools/util/include``), or None."""
    if os.environ.get("CUTLASS_PATH"):
        roots = [Path(os.environ["CUTLASS_PATH"])]
    else:
        try:  # find_spec only: importing cutlass_library pulls in its own Python generator
            spec = importlib.util.find_spec("cutlass_library")
        except (ImportError, ValueError):
            spec = None
        roots = [Path(p) / "source" for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        dirs = [root / "include", root / "tools" / "util" / "include"]
        if (dirs[0] / "cutlass" / "version.h").is_file() and (dirs[1] / "cutlass" / "util").is_dir():
            return dirs
    return None


def missing_tools() -> list[str]:
    """What the build lacks on this machine, in words (empty when it can build)."""
    missing = []
    if find_nvcc() is None:
        missing.append("nvcc (no $CUDA_HOME/bin/nvcc and no nvcc on the PATH)")
    if find_cutlass() is None:
        missing.append("the CUTLASS headers (no nvidia-cutlass package, no $CUTLASS_PATH)")
    return missing


def variant_count(source_text: str) -> int:
    """The number of GEMM variants the source declares (its ``SL_VARIANT_COUNT``)."""
    found = re.search(r"^#define SL_VARIANT_COUNT (\d+)$", source_text, re.MULTILINE)
    if not found:
        raise ValueError("sparse_gemm.cu declares no SL_VARIANT_COUNT")
    return int(found.group(1))


# one row of the variant table: X(index, element, B major, D layout, TM, TN, TK, CM, CN, schedule, "name")
_ROW = re.compile(r'^\s*X\((\d+), (\w+), \'(\w)\', \'(\w)\', (\d+), (\d+), (\d+), (\d+), (\d+), (\w+), "([^"]+)"\)')
_SCHEDULES = {"coop": "Coop", "ping": "Ping", "coopfast": "CoopFast", "pingfast": "PingFast"}
_NAME = re.compile(r"^(bf16|e4m3)\.([tn])([cr])\.(\d+)x(\d+)x(\d+)\.(\d+)x(\d+)\.(coop|ping|coopfast|pingfast)$")


def variant_names(source_text: str) -> list[str]:
    """The names of the source's variant table, in its order ("<element>.<b><d>.<tile>.<cluster>.<schedule>")."""
    return [m.group(11) for m in map(_ROW.match, source_text.splitlines()) if m]


def variant_row(index: int, name: str) -> str:
    """The table row of the variant ``name`` (e.g. "bf16.tc.256x128x128.2x1.coop"); ValueError naming the rule."""
    m = _NAME.match(name)
    if not m:
        raise ValueError(f"variant {name!r} is not <bf16|e4m3>.<t|n><c|r>.<TM>x<TN>x<TK>.<CM>x<CN>.<schedule> with "
                         f"schedule one of {sorted(_SCHEDULES)}")
    element, b, d, tm, tn, tk, cm, cn, schedule = m.groups()
    if element == "e4m3" and b != "t":
        raise ValueError(f"variant {name!r}: E4M3 products read B K-major only (layout 't')")
    return (f"  X({index}, {element}, '{b}', '{d}', {tm}, {tn}, {tk}, {cm}, {cn}, {_SCHEDULES[schedule]}, "
            f'"{name}") \\')


def with_variants(source_text: str, rows: list[tuple[int, str]]) -> str:
    """The source with its variant table replaced by ``rows`` ((index, name) pairs: the index names the object's
    entry point, ``sl_cutlass_gemm_<index>``; the table's order is the library's variant order)."""
    if not rows:
        raise ValueError("a variant table needs at least one row")
    lines = source_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#define SL_VARIANTS(X)"))
    end = start + 1
    while end < len(lines) and lines[end].strip():
        end += 1
    table = [f"#define SL_VARIANTS(X){' ' * 46}\\"] + [variant_row(i, name) for i, name in rows]
    table[-1] = table[-1].rstrip(" \\")
    out = lines[:start] + table + lines[end:]
    count = next(i for i, line in enumerate(out) if line.startswith("#define SL_VARIANT_COUNT "))
    out[count] = f"#define SL_VARIANT_COUNT {len(rows)}"
    return "\n".join(out) + "\n"


def build_key(source_text: str, flags: tuple[str, ...], nvcc_version: str, cutlass_version: str) -> str:
    """The cache key: a hash of everything that changes the built library."""
    h = hashlib.sha256()
    for part in (source_text, "\0".join(flags), nvcc_version, cutlass_version):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:20]


def compile_commands(nvcc: str, includes: list[Path], source: Path, out_dir: Path, count: int) -> list[list[str]]:
    """One nvcc command per object: the C entry points, then each variant."""
    base = [nvcc, *FLAGS, *(f"-I{d}" for d in includes), "-c", str(source)]
    commands = [base + ["-DSL_API", "-o", str(out_dir / "api.o")]]
    commands += [base + [f"-DSL_VARIANT={i}", "-o", str(out_dir / f"variant{i}.o")] for i in range(count)]
    return commands


def link_command(nvcc: str, objects: list[Path], library: Path) -> list[str]:
    return [nvcc, *ARCH, "-shared", "-o", str(library), *map(str, objects)]


def _version_of(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout


def _key_for(nvcc: str, includes: list[Path], source_text: str) -> str:
    cutlass_version = (includes[0] / "cutlass" / "version.h").read_text()
    return build_key(source_text, FLAGS, _version_of(nvcc), cutlass_version)


def _run_all(commands: list[list[str]], workers: int) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True), commands))


def candidate_library(names: list[str], jobs: int | None = None, log=None, cache: Path | None = None
                      ) -> tuple[Path, dict[str, str]]:
    """A library of the variants ``names`` instead of the shipped table, for a search: ``(path, failed)``.

    A variant that does not compile (a tile CUTLASS's builders refuse, one whose shared memory does not fit, one
    whose operand layout differs from the compressor's) is left out and named in ``failed`` with the end of its
    compiler output; the library holds the others, in the order given. Cached as ``library_path`` is."""
    missing = missing_tools()
    if missing:
        raise CutlassUnavailable(f"the CUTLASS backend cannot be built here: missing {' and '.join(missing)}. "
                                 f"Install: {INSTALL_HINT}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"names must be distinct variant names, at least one, got {names}")
    nvcc, includes = find_nvcc(), find_cutlass()
    text = with_variants(SOURCE.read_text(), list(enumerate(names)))
    target_dir = Path(cache or cache_root()) / "cutlass" / ("search-" + _key_for(nvcc, includes, text))
    library, failures = target_dir / LIBRARY, target_dir / "failed.json"
    if library.is_file() and failures.is_file():
        return library, json.loads(failures.read_text())
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir.parent, prefix="build-") as tmp:
        tmp = Path(tmp)
        source = tmp / "sparse_gemm.cu"
        source.write_text(text)
        commands = compile_commands(nvcc, includes, source, tmp, len(names))  # the entry points, the variants
        workers = max(1, min(jobs or os.cpu_count() or 1, len(commands)))
        if log:
            log(f"building {len(names)} candidate CUTLASS variants with {workers} nvcc processes")
        results = _run_all(commands, workers)
        failed = {name: r.stderr[-1500:] for name, r in zip(names, results[1:]) if r.returncode != 0}
        kept = [(i, name) for i, name in enumerate(names) if name not in failed]
        if not kept:
            raise CutlassUnavailable(f"no candidate variant compiled; the first error:\n{next(iter(failed.values()))}")
        api = results[0]
        if failed:  # the entry points again, of the kept objects only
            source.write_text(with_variants(SOURCE.read_text(), kept))
            api = subprocess.run(commands[0], capture_output=True, text=True)
        if api.returncode != 0:
            raise CutlassUnavailable(f"building the CUTLASS entry points failed:\n{api.stderr[-4000:]}")
        objects = [tmp / "api.o"] + [tmp / f"variant{i}.o" for i, _ in kept]
        result = subprocess.run(link_command(nvcc, objects, tmp / LIBRARY), capture_output=True, text=True)
        if result.returncode != 0:
            raise CutlassUnavailable(f"linking the CUTLASS library failed:\n{result.stderr[-4000:]}")
        target_dir.mkdir(exist_ok=True)
        (target_dir / "failed.json").write_text(json.dumps(failed))
        os.replace(tmp / LIBRARY, library)
    if log:
        log(f"built {library}: {len(kept)} variants, {len(failed)} failed to compile")
    return library, failed


def library_path(jobs: int | None = None, log=None, cache: Path | None = None) -> Path:
    """The built library, built first if the cache has none for this key (minutes on a few cores).

    jobs: parallel nvcc processes (default: the CPU count, at most one per object).
    log: a callable given one line per step (default: silent). cache: instead of ``cache_root()``."""
    missing = missing_tools()
    if missing:
        raise CutlassUnavailable(f"the CUTLASS backend cannot be built here: missing {' and '.join(missing)}. "
                                 f"Install: {INSTALL_HINT}")
    nvcc, includes = find_nvcc(), find_cutlass()
    source_text = SOURCE.read_text()
    target_dir = Path(cache or cache_root()) / "cutlass" / _key_for(nvcc, includes, source_text)
    library = target_dir / LIBRARY
    if library.is_file():
        return library
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir.parent, prefix="build-") as tmp:
        tmp = Path(tmp)
        commands = compile_commands(nvcc, includes, SOURCE, tmp, variant_count(source_text))
        workers = max(1, min(jobs or os.cpu_count() or 1, len(commands)))
        if log:
            log(f"building {len(commands)} CUTLASS objects with {workers} nvcc processes in {tmp}")
        results = _run_all(commands, workers)
        failed = [(c, r) for c, r in zip(commands, results) if r.returncode != 0]
        if failed:
            command, result = failed[0]
            raise CutlassUnavailable(f"building the CUTLASS kernels failed ({len(failed)} of {len(commands)} "
                                     f"objects): {' '.join(command)}\n{result.stderr[-4000:]}")
        objects = [Path(c[c.index("-o") + 1]) for c in commands]
        result = subprocess.run(link_command(nvcc, objects, tmp / LIBRARY), capture_output=True, text=True)
        if result.returncode != 0:
            raise CutlassUnavailable(f"linking the CUTLASS library failed:\n{result.stderr[-4000:]}")
        target_dir.mkdir(exist_ok=True)
        os.replace(tmp / LIBRARY, library)  # atomic: a concurrent build of the same key writes the same bytes
    if log:
        log(f"built {library}")
    return library
