"""Building the CUTLASS kernels on demand (``sparsity_lab/backends/cutlass/build.py``), on the CPU: the cache
key follows everything that changes the library, a second call finds the library instead of compiling
again, the commands target sm_90a with one object per variant, and missing tools are named.

A stand-in nvcc (a shell script that writes each ``-o`` file and logs its call) replaces the compiler,
so none of this needs CUDA."""
from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from sparsity_lab.backends.cutlass import build
from sparsity_lab.backends.cutlass.build import CutlassUnavailable

SOURCE_TEXT = build.SOURCE.read_text()


def test_the_source_ships_beside_the_module_and_declares_its_variants():
    assert build.SOURCE.is_file()
    count = build.variant_count(SOURCE_TEXT)
    rows = re.findall(r"^\s+X\((\d+), ", SOURCE_TEXT, re.MULTILINE)
    assert [int(r) for r in rows] == list(range(count))  # the table is numbered 0..count-1, in order
    with pytest.raises(ValueError, match="SL_VARIANT_COUNT"):
        build.variant_count("// no table")


def test_setup_ships_the_cuda_source_in_the_wheel():
    setup_py = (Path(__file__).resolve().parent.parent / "setup.py").read_text()
    assert '"sparsity_lab.backends.cutlass": ["*.cu"]' in setup_py


def test_the_cache_key_follows_source_flags_and_tools():
    key = build.build_key("src", ("-O3",), "nvcc 13.0", "cutlass 4.2")
    assert key == build.build_key("src", ("-O3",), "nvcc 13.0", "cutlass 4.2")
    others = [build.build_key("src2", ("-O3",), "nvcc 13.0", "cutlass 4.2"),
              build.build_key("src", ("-O2",), "nvcc 13.0", "cutlass 4.2"),
              build.build_key("src", ("-O3",), "nvcc 12.8", "cutlass 4.2"),
              build.build_key("src", ("-O3",), "nvcc 13.0", "cutlass 4.3")]
    assert len({key, *others}) == 5
    # parts are separated: moving text from one part to the next changes the key
    assert build.build_key("ab", (), "c", "d") != build.build_key("a", (), "bc", "d")


def test_one_object_per_variant_plus_the_entry_points_all_for_sm90a(tmp_path):
    commands = build.compile_commands("nvcc", [Path("/inc"), Path("/util")], Path("k.cu"), tmp_path, 3)
    assert len(commands) == 4
    assert "-DSL_API" in commands[0]
    assert [c[-3] for c in commands[1:]] == ["-DSL_VARIANT=0", "-DSL_VARIANT=1", "-DSL_VARIANT=2"]
    for c in commands:
        assert "arch=compute_90a,code=sm_90a" in c and "-I/inc" in c and "-I/util" in c
    outputs = [c[c.index("-o") + 1] for c in commands]
    assert len(set(outputs)) == 4
    link = build.link_command("nvcc", [Path(o) for o in outputs], tmp_path / "lib.so")
    assert "-shared" in link and outputs[0] in link


def _fake_cutlass(root: Path) -> Path:
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n")
    (root / "tools" / "util" / "include" / "cutlass" / "util").mkdir(parents=True)
    return root


def _fake_nvcc(root: Path, log: Path, fail_on: str | None = None) -> Path:
    """A shell script standing in for nvcc: prints a version, logs each call, writes its -o file."""
    script = root / "nvcc"
    fail = f'case "$*" in *{fail_on}*) echo "error: no" >&2; exit 1;; esac\n' if fail_on else ""
    script.write_text("#!/bin/sh\n"
                      'if [ "$1" = "--version" ]; then echo "fake nvcc 1.0"; exit 0; fi\n'
                      f'echo "$*" >> "{log}"\n' + fail +
                      'while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then echo built > "$2"; fi; shift; done\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    cutlass = _fake_cutlass(tmp_path / "cutlass")
    nvcc = _fake_nvcc(tmp_path, log)
    source = tmp_path / "sparse_gemm.cu"
    source.write_text("#define SL_VARIANT_COUNT 2\n")
    monkeypatch.setenv("CUTLASS_PATH", str(cutlass))
    monkeypatch.setattr(build, "find_nvcc", lambda: str(nvcc))
    monkeypatch.setattr(build, "SOURCE", source)
    return {"log": log, "source": source, "cache": tmp_path / "cache", "root": tmp_path}


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_second_call_finds_the_library_and_a_changed_source_builds_again(fake_tools):
    log, cache = fake_tools["log"], fake_tools["cache"]
    first = build.library_path(jobs=2, cache=cache)
    assert first.name == build.LIBRARY and first.is_file()
    assert len(_calls(log)) == 4  # entry points, two variants, the link
    assert build.library_path(cache=cache) == first
    assert len(_calls(log)) == 4  # cached: nvcc not called
    fake_tools["source"].write_text("#define SL_VARIANT_COUNT 2\n// changed\n")
    second = build.library_path(cache=cache)
    assert second != first and second.parent.parent == first.parent.parent
    assert len(_calls(log)) == 8
    assert not list(cache.glob("cutlass/build-*"))  # the temporary build folders are gone


def test_a_failed_compile_says_which_command_and_caches_nothing(fake_tools, monkeypatch):
    nvcc = _fake_nvcc(fake_tools["root"], fake_tools["log"], fail_on="SL_VARIANT=1")
    monkeypatch.setattr(build, "find_nvcc", lambda: str(nvcc))
    with pytest.raises(CutlassUnavailable, match=r"failed \(1 of 3 objects\).*SL_VARIANT=1"):
        build.library_path(cache=fake_tools["cache"])
    assert not list(fake_tools["cache"].rglob(build.LIBRARY))


def test_missing_tools_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    monkeypatch.setenv("CUTLASS_PATH", str(tmp_path / "nothing"))
    missing = build.missing_tools()
    assert len(missing) == 2 and "nvcc" in missing[0] and "CUTLASS headers" in missing[1]
    with pytest.raises(CutlassUnavailable, match="missing nvcc.*and the CUTLASS headers.*nvidia-cutlass"):
        build.library_path(cache=tmp_path)


def test_cutlass_headers_are_found_in_a_checkout(monkeypatch, tmp_path):
    root = _fake_cutlass(tmp_path / "checkout")
    monkeypatch.setenv("CUTLASS_PATH", str(root))
    assert build.find_cutlass() == [root / "include", root / "tools" / "util" / "include"]


def test_the_default_cache_is_the_users(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.cache_root() == tmp_path / "sparsity_lab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert build.cache_root() == Path.home() / ".cache" / "sparsity_lab"


def test_the_default_configs_are_built():
    from sparsity_lab.backends.cutlass.ops import DEFAULT_CONFIGS
    names = re.findall(r'"((?:bf16|e4m3)\.[a-z]{2}\.[^"]+)"\)', SOURCE_TEXT)
    assert len(names) == build.variant_count(SOURCE_TEXT)
    for layouts, config in DEFAULT_CONFIGS.items():
        assert f"{layouts}.{config}" in names


def test_the_variant_table_reads_back_and_rows_are_written_from_names():
    names = build.variant_names(SOURCE_TEXT)
    assert len(names) == build.variant_count(SOURCE_TEXT) and len(set(names)) == len(names)
    rebuilt = build.with_variants(SOURCE_TEXT, list(enumerate(names)))
    assert build.variant_names(rebuilt) == names and build.variant_count(rebuilt) == len(names)
    two = build.with_variants(SOURCE_TEXT, [(3, "bf16.tc.128x256x64.2x1.coop"), (7, "e4m3.tr.256x128x128.1x2.coopfast")])
    assert build.variant_names(two) == ["bf16.tc.128x256x64.2x1.coop", "e4m3.tr.256x128x128.1x2.coopfast"]
    assert build.variant_count(two) == 2
    assert "X(3, bf16, 't', 'c', 128, 256, 64, 2, 1, Coop," in two and "CoopFast" in two
    assert two.count("#define SL_VARIANTS(X)") == 1 and "SL_GEMM_ARGS" in two  # the rest of the source kept
    for bad, why in (("bf16.tc.128x256.2x1.coop", "is not"), ("bf16.tc.128x256x64.2x1.fast", "schedule one of"),
                     ("e4m3.nr.128x256x128.1x2.coop", "K-major only")):
        with pytest.raises(ValueError, match=why):
            build.variant_row(0, bad)
    with pytest.raises(ValueError, match="at least one row"):
        build.with_variants(SOURCE_TEXT, [])


def test_a_candidate_search_leaves_out_the_variants_that_do_not_compile(fake_tools, monkeypatch):
    source = fake_tools["root"] / "real.cu"
    source.write_text(SOURCE_TEXT)
    monkeypatch.setattr(build, "SOURCE", source)
    nvcc = _fake_nvcc(fake_tools["root"], fake_tools["log"], fail_on="SL_VARIANT=1")
    monkeypatch.setattr(build, "find_nvcc", lambda: str(nvcc))
    names = ["bf16.tc.128x256x64.2x1.coop", "bf16.tc.256x128x64.1x2.coop", "e4m3.tc.256x128x128.1x2.coopfast"]
    path, failed = build.candidate_library(names, jobs=2, cache=fake_tools["cache"])
    assert path.is_file() and list(failed) == ["bf16.tc.256x128x64.1x2.coop"] and "error: no" in failed[names[1]]
    calls = _calls(fake_tools["log"])
    link = calls[-1]
    assert "-shared" in link and "variant0.o" in link and "variant2.o" in link and "variant1.o" not in link
    # the entry points built beside the variants, then again from the kept table
    assert sum("-DSL_API" in c for c in calls) == 2 and "-DSL_API" in calls[-2]
    assert build.candidate_library(names, cache=fake_tools["cache"]) == (path, failed)  # cached
    assert len(_calls(fake_tools["log"])) == len(calls)
    with pytest.raises(ValueError, match="distinct"):
        build.candidate_library(names + names[:1], cache=fake_tools["cache"])
