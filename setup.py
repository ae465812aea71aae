"""What goes into the wheel besides the metadata of pyproject.toml: the packages, and the course
material shipped inside the package.

- Packages: every package under ``sparsity_lab/`` (found, so a new subpackage needs no edit here),
  and the Triton kernels, which live in the top-level ``kernels/`` folder and are imported as
  ``sparsity_lab.kernels``.
- Course material: the notebooks, the docs they link to, the book's configuration and the recorded
  ``results/`` they display are copied into the wheel as ``sparsity_lab/_shipped/`` (where
  ``sparsity_lab/shipped.py`` finds them), with ``BUILD_COMMIT``, the git commit the wheel was built
  from. An editable install (``pip install -e .``) reads them from the checkout instead.
"""
from __future__ import annotations

import fnmatch
import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent

# the recorded comparisons (results/<folder>/) the notebooks read, logs included
COMPARISONS = ("lab_compare_h100_triton", "lab_compare_h100_structures", "lab_compare_h100_fp8",
               "lab_compare_h100_fp8_seed1", "lab_compare_h100_12m")

# folder -> (files to ship, as globs relative to it; globs to leave out)
MATERIAL = {
    "notebooks": (["[0-9][0-9]_*.ipynb"], []),
    "docs": (["**/*.md"], []),
    "book": (["_config.yml", "intro.md", "_static/*"], []),
    # the recorded results the notebooks display: every file at the top of results/, and the
    # comparisons the notebooks draw (their tables and notes here, their logs in SHIPPED_LOGS)
    "results": (["*.json", "*.md", "*.txt", *(f"{d}/{f}" for d in COMPARISONS for f in ("results.json", "NOTES.md"))],
                # repeat runs and before/after checks of a measurement the notebooks show once: evidence for
                # docs/measuring.md, read from a clone
                ["*_run[0-9].json", "*_run[0-9][0-9].json", "*_old_tree.json", "*_new_tree.json",
                 "*_after_layout.json", "*_eager_masks.json", "*_first.json", "*_cusparselt010.json",
                 "torchtitan_llama_*.json",
                 # side-by-side kernel checks, instruction counts, host profiles, overlap probes and tile searches
                 "kernels_ab_*.json", "sass_counts_*.json", "step_host_*.json", "optimizer_overlap_*.json",
                 "*_search.json", "*_searched.json",
                 # kernel profiles, ceilings beside a figure, and repeats of a run the course quotes
                 "fp8_ffn_profile_*.json", "*_ceilings.json", "*_repeat.json",
                 # the H200 FP8 step profiles (the course quotes the H100 step profile) and launch-time probes
                 "step_profile_h200_fp8*.json", "fp8_scale_update_*.json",
                 # the later FFN and step runs of docs/measuring.md (the course reads one FP8 FFN run, named in
                 # sparsity_lab/course/headlines.py) and their launch sweeps
                 "fp8_training_ffn_h200_refresh21_fp8*.json", "fp8_training_ffn_h200_ab_*.json",
                 "step_profile_h200_meet_in_the_middle.json", "step_kernels_sweep_h200_refresh21_fp8.json",
                 # the optimizer writing the operands (kernel 26): its sweep, step profiles and the day's FFN check
                 "optimizer_kernels_sweep_*.json", "step_profile_h200_k26_*.json", "fp8_training_ffn_h200_k26.json",
                 "gelu_kernels_sweep_*.json"]),
}


def packages() -> tuple[list[str], dict[str, str]]:
    """Package names and the one folder mapping (``sparsity_lab.kernels`` -> ``kernels/``)."""
    names = find_packages(where=str(HERE), include=["sparsity_lab", "sparsity_lab.*"])
    kernel_subpackages = find_packages(where=str(HERE / "kernels"))
    kernels = ["sparsity_lab.kernels"] + [f"sparsity_lab.kernels.{p}" for p in kernel_subpackages]
    return names + kernels, {"sparsity_lab.kernels": "kernels"}


def material_files() -> dict[str, Path]:
    """Path inside ``_shipped/`` -> source file, for every folder of MATERIAL.

    Raises FileNotFoundError when a folder or its files are missing (a wheel built from an incomplete
    source tree would otherwise install a course without notebooks).
    """
    files = {}
    for folder, (keep, leave_out) in MATERIAL.items():
        base = HERE / folder
        found = [p for pattern in keep for p in sorted(base.glob(pattern)) if p.is_file()]
        found = [p for p in found if not any(fnmatch.fnmatch(p.name, pattern) for pattern in leave_out)]
        if not found:
            raise FileNotFoundError(f"building the wheel: no files in {base} matching {keep} (the course "
                                    "material ships inside the wheel; build from a full clone)")
        files.update({f"{folder}/{p.relative_to(base).as_posix()}": p for p in found})
    return files


def packed_logs() -> dict[str, bytes]:
    """Path inside ``_shipped/`` -> gzip bytes, for the per-step logs of the shipped comparisons.

    The logs are the bulk of results/ (about 1 MB per run): the wheel carries them gzip-compressed and
    without the per-layer flip columns (``flip/<layer>``), which no notebook draws; the overall
    ``flip_rate`` and every other column stay exact. ``lab.runlog.read_log`` reads ``log.jsonl.gz``
    where ``log.jsonl`` is missing.
    """
    out = {}
    for folder in COMPARISONS:
        for log in sorted((HERE / "results" / folder).glob("*/log.jsonl")):
            rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            text = "".join(json.dumps({k: v for k, v in row.items() if not k.startswith("flip/")}) + "\n"
                           for row in rows)
            rel = log.relative_to(HERE).as_posix() + ".gz"
            out[rel] = gzip.compress(text.encode(), compresslevel=9, mtime=0)
    return out


def build_commit() -> str | None:
    """The commit being built (``+dirty`` when tracked files differ from it), or SPARSITY_LAB_COMMIT."""
    if os.environ.get("SPARSITY_LAB_COMMIT"):
        return os.environ["SPARSITY_LAB_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "") if head.returncode == 0 else None


class BuildWithMaterial(build_py):
    """build_py, then the course material copied into ``sparsity_lab/_shipped/`` of the build."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own folders
        target = Path(self.build_lib) / "sparsity_lab" / "_shipped"
        if target.exists():
            shutil.rmtree(target)
        for rel, source in material_files().items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / rel)
        for rel, packed in packed_logs().items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_bytes(packed)
        commit = build_commit()
        if commit:
            (target / "BUILD_COMMIT").write_text(commit + "\n")


names, package_dir = packages()
# the CUDA source the CUTLASS backends build on first use (sparsity_lab/backends/cutlass/build.py)
setup(packages=names, package_dir=package_dir, package_data={"sparsity_lab.backends.cutlass": ["*.cu"]},
      cmdclass={"build_py": BuildWithMaterial})
