"""The install surface: environment.yml matches pyproject, the CLI answers, the demo runs."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _requirement_map(reqs):
    out = {}
    for req in reqs:
        name = re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")
        out[name] = req.replace(" ", "")
    return out


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        if name != "compressed-tensors":  # an environment of its own: it needs transformers < 5
            wanted += extra
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = [r for r in pip_section if not r.startswith("-e")]
    assert _requirement_map(listed) == _requirement_map(wanted)
    assert "-e ." in pip_section


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    match = re.search(r"<!-- test-command -->\s*```bash\n(.+?)\n```", readme, re.S)
    assert match, "README must show the test command in a bash block after <!-- test-command -->"
    assert match.group(1).strip() in ci


def test_cli_lists_its_commands():
    out = subprocess.run([sys.executable, "-m", "sparsity_lab", "--help"], capture_output=True, text=True, check=True)
    assert "demo" in out.stdout and "train" in out.stdout and "bench" not in out.stdout  # benchmarks run from a clone


def test_cli_unknown_command_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "sparsity_lab", "no-such-command"], capture_output=True, text=True)
    assert out.returncode != 0 and "invalid choice" in out.stderr


def test_demo_runs_and_prints_its_three_parts():
    out = subprocess.run([sys.executable, "-m", "sparsity_lab", "demo", "--steps", "12", "--size", "64"],
                         capture_output=True, text=True, check=True, timeout=300)
    assert "1. A 2:4 mask" in out.stdout
    assert "patterns (exact)" in out.stdout and "flow (exact)" in out.stdout
    assert "flip rate early" in out.stdout
