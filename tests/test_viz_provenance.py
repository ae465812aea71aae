"""The recorded commands as the course prints them: typed in a clone, no path of the recording machine."""
import json
import re

import pytest

from benchmarks.__main__ import BENCHMARKS
from sparsity_lab.course.viz._provenance import BENCHMARK_NAMES, provenance_command
from sparsity_lab.provenance import RESULTS_DIR

ABSOLUTE = re.compile(r"(?<![\w.])/(root|work|home|tmp|srv|opt|mnt|data)\b")


def recorded_commands():
    out = []
    for path in sorted(RESULTS_DIR.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        prov = data.get("provenance") if isinstance(data, dict) else None
        if isinstance(prov, dict) and prov.get("command"):
            out.append((path.relative_to(RESULTS_DIR).as_posix(), prov))
    return out


def test_results_hold_commands_with_machine_paths():  # what the formatting exists for
    assert any(ABSOLUTE.search(prov["command"]) for _, prov in recorded_commands())


@pytest.mark.parametrize("name, prov", recorded_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_recorded_command_prints_without_a_machine_path(name, prov):
    command = provenance_command(prov)
    assert not ABSOLUTE.search(command), f"{name}: {command}"
    assert "__main__.py" not in command and "bench-" not in command.split(" --")[0], f"{name}: {command}"
    if command.startswith("python -m benchmarks "):
        assert command.split()[3] in BENCHMARKS, f"{name}: {command}"


@pytest.mark.parametrize("recorded, shown", [
    ("/work/main/sparsity_lab/__main__.py bench-cslt-calls --out-dir /root/out",
     "python -m benchmarks cslt-calls --out-dir out"),
    ("sparsity-lab bench-act24-accuracy --seeds 0 1", "python -m benchmarks act24-accuracy --seeds 0 1"),
    ("/w/.carry/sparsity_lab/benchmarks/fp8_training.py --budget-s 60", "python -m benchmarks fp8-training --budget-s 60"),
    ("/w/sparsity_lab/benchmarks/ffn/baseline.py --out-dir /root/out", "python -m benchmarks.ffn.baseline --out-dir out"),
    ("/w/sparsity_lab/__main__.py compare --out /tmp/cmp_all --steps 5", "sparsity-lab compare --out cmp_all --steps 5"),
    ("python -m sparsity_lab.viz.beta_seeds_view --seeds 3", "python -m sparsity_lab.course.viz.beta_seeds_view --seeds 3"),
])
def test_provenance_command_forms(recorded, shown):
    assert provenance_command({"command": recorded}) == shown


def test_benchmark_names_follow_the_benchmarks_table():
    modules = {module[len("benchmarks."):]: name for name, (module, _) in BENCHMARKS.items()}
    assert BENCHMARK_NAMES == modules


def test_provenance_command_refuses_a_string():
    with pytest.raises(TypeError, match="prov must be"):
        provenance_command("python -m benchmarks ffn")


def test_the_views_print_the_reader_command():
    from sparsity_lab.course.viz.comparison_view import describe, find_comparisons
    from sparsity_lab.course.viz.kernel_bench_view import kernel_bench_provenance
    from sparsity_lab.provenance import read_result

    texts = [describe(c, html=False) for c in find_comparisons()] + [kernel_bench_provenance(read_result("kernels_h100"))]
    assert len(texts) > 1
    for text in texts:
        assert not ABSOLUTE.search(text), text
