"""Without triton (macOS and Windows have no wheels) the library imports, trains on the reference
backend and runs the lab's `train` command; asking for backend "triton" says what is missing and how
to fix it. Each check runs in a fresh interpreter whose import system refuses triton (a sys.meta_path
finder placed first), as on a machine where it is not installed."""
import subprocess
import sys
import textwrap

BLOCK_TRITON = textwrap.dedent("""
    import sys

    class NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTriton())
""")


def run_without_triton(code: str, timeout: int = 180) -> subprocess.CompletedProcess:
    script = BLOCK_TRITON + textwrap.dedent(code) + "\nassert 'triton' not in sys.modules, 'triton was imported'\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)


def test_the_blocker_really_blocks_triton():
    out = run_without_triton("import triton")
    assert out.returncode != 0 and "No module named 'triton'" in out.stderr


def test_import_sparsify_and_train_a_step_on_the_reference_backend():
    out = run_without_triton("""
        import torch
        import sparsity_lab as sl
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        sl.sparsify(model, sl.SSTE(mvue=True), select="all")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sl.attach_optimizer(model, opt)
        before = [p.detach().clone() for p in model.parameters()]
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        opt.step()
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())), "the step changed nothing"
        print("trained one step, loss", float(loss))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trained one step" in out.stdout


def test_the_lab_train_command_runs(tmp_path):
    out = run_without_triton(f"""
        from sparsity_lab.lab.cli import main
        rc = main(["train", "--method", "masked_decay", "--steps", "2", "--layers", "1", "--width", "32",
                   "--context", "16", "--batch-size", "2", "--eval-batches", "1", "--no-progress",
                   "--data-max-bytes", "20000", "--out", {str(tmp_path / "run")!r}])
        assert rc == 0, rc
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").exists()


def test_train_backend_triton_is_one_clear_line(tmp_path):
    out = run_without_triton(f"""
        from sparsity_lab.lab.cli import main
        rc = main(["train", "--backend", "triton", "--steps", "1", "--no-progress", "--out", {str(tmp_path / "r")!r}])
        assert rc == 2, rc
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.startswith("sparsity-lab train: error: --backend triton: backend 'triton' needs the triton "
                                 "package, which is not installed") and "Traceback" not in out.stderr


def test_backend_triton_says_it_is_missing_and_how_to_fix_it():
    out = run_without_triton("""
        import torch
        import sparsity_lab as sl
        for make in (lambda: sl.backends.get_backend("triton"), lambda: sl.backends.get_backend("triton_fp8sim"),
                     lambda: sl.SparseLinear(8, 8, method=sl.STE(backend="triton"))):
            try:
                make()
            except RuntimeError as err:
                print("REFUSED:", err)
            else:
                raise SystemExit("backend 'triton' was created without triton")
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("REFUSED:")]
    assert len(lines) == 3
    for line in lines:
        assert "needs the triton package, which is not installed" in line and "pip install triton" in line
        assert "backend='torch'" in line


def test_triton_is_required_on_linux_only():
    """pip on macOS or Windows must not try to install triton (it has no wheels there)."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    everything = [Requirement(r) for r in project["dependencies"]]
    everything += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    tritons = [r for r in everything if r.name == "triton"]
    assert tritons, "triton should stay a dependency on Linux (the kernels, notebook 07)"
    for platform, wanted in (("linux", True), ("darwin", False), ("win32", False)):
        assert all(r.marker is not None and r.marker.evaluate({"sys_platform": platform}) == wanted
                   for r in tritons), f"triton requirement on {platform}: {[str(r) for r in tritons]}"
