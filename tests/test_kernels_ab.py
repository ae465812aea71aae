"""benchmarks.kernels_ab: the step's 2:4 kernels of two trees side by side (CPU smoke through the interpreter):
the same tree agrees with itself, and a tree whose kernels write other bytes is caught."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(before: Path, out_dir: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels_ab", "--before", str(before), "--smoke",
                           "--rounds", "1", "--out-dir", str(out_dir), "--name", "ab"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    result = json.loads((out_dir / "ab_smoke.json").read_text()) if (out_dir / "ab_smoke.json").exists() else {}
    return done.returncode, result


def _copy_tree(dst: Path) -> Path:
    shutil.copytree(ROOT / "sparsity_lab", dst / "sparsity_lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "kernels", dst / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_a_tree_with_other_metadata_bytes_is_reported_and_the_exit_code_says_so(tmp_path):
    other = _copy_tree(tmp_path / "other")
    compress = other / "kernels" / "compress24.py"
    text = compress.read_text()
    assert "0x898E4DCC" in text
    compress.write_text(text.replace("0x898E4DCC", "0x898E4DDC"))  # flags 0b0001 (x0 alone): code 0xD, not 0xC
    code, result = _run(other, tmp_path)
    assert code == 2
    rows = result["kernels"]
    assert result["before_tree"] == str(other.resolve())
    # the kernels whose pick uses the table (the weight kernels here) write other metadata
    assert not rows["11 prepare24 W 128x64"]["same_bytes"]
    assert not rows["21 refresh24 W 128x64"]["same_bytes"]


def test_the_same_kernels_agree_and_every_case_is_reported(tmp_path):
    code, result = _run(_copy_tree(tmp_path / "same"), tmp_path)
    assert code == 0
    names = set(result["kernels"])
    assert {n.split()[0] for n in names} == {"7", "10", "11", "14", "19", "20", "21", "23", "24", "26"}
    assert "24 refresh24_cutlass_fp8 W 128x64" in names
    assert all(row["same_bytes"] for row in result["kernels"].values())
    assert result["provenance"]["command"].startswith("python -m benchmarks.kernels_ab")


def test_kernel_20_without_the_masked_decay_runs_kernel_5_first_and_writes_the_same_bytes(tmp_path):
    """A tree whose kernel 20 takes no masked decay (its form before the term joined the pass) runs kernel 5's pass
    and then kernel 20: with the case's all-True mask both trees write the same bytes."""
    older = _copy_tree(tmp_path / "older")
    kernel = older / "kernels" / "adamw_master.py"
    text = kernel.read_text()
    start, end = text.index("    if MASKED_DECAY:"), text.index("    p, m, v = _adamw_update(")
    text = text[:start] + text[end:]  # the kernel without the term (its wrapper then refuses masked_decays)
    text = text.replace("masked_decays: dict | None = None,", "")
    text = text.replace("    decays = _check_masked_decays(masked_decays, masters)\n", "    decays = {}\n")
    kernel.write_text(text)
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels_ab", "--before", str(older), "--smoke", "--rounds",
                           "1", "--only", "20", "--out-dir", str(tmp_path), "--name", "ab"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "ab_smoke.json").read_text())["kernels"]
    assert list(rows) == ["20 adamw_master masked decay W 128x64", "20 adamw_master W 128x64"]
    assert all(row["same_bytes"] for row in rows.values())


def test_a_tree_without_kernel_26_runs_kernels_20_and_11_and_writes_the_same_bytes(tmp_path):
    """Kernel 26's case in a tree without it: kernel 20's step, then kernel 11 on the bf16 weight it wrote."""
    older = _copy_tree(tmp_path / "older")
    (older / "kernels" / "adamw_prepare24.py").unlink()
    init = older / "kernels" / "__init__.py"
    init.write_text(init.read_text().replace("from .adamw_prepare24 import adamw_master_prepare24_\n", ""))
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels_ab", "--before", str(older), "--smoke", "--rounds",
                           "1", "--only", "26", "--out-dir", str(tmp_path), "--name", "ab"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "ab_smoke.json").read_text())["kernels"]
    assert list(rows) == ["26 adamw_prepare24 W 128x64"] and rows["26 adamw_prepare24 W 128x64"]["same_bytes"]
