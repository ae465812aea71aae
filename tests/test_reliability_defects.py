"""Regression tests for the outside audit's defects, each checked as a class of inputs.

Masks: exact solvers at tiny/huge magnitudes and near the float32 maximum, NaN/Inf on every
mask path (reference and Triton kernels under TRITON_INTERPRET), meta tensors; MVUE's dtype
overflow; sparsify's messages; checkpoints (empty, truncated, overwritten bytes, failing
writes); the CLI's --out and --stop-at. Hooks: tests/test_reliability_hooks.py.
"""
import itertools
import math
import os

import pytest
from _lab_testing import exit_status
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.masks import is_nm, is_transposable, kept_fraction, nm_mask, transposable_mask
from sparsity_lab.masks.flow import COST_LEVELS
from sparsity_lab.masks.patterns import transposable_patterns
from sparsity_lab.masks.tiles import to_tiles
from sparsity_lab.methods.mvue import mvue24
from sparsity_lab.methods.soft_threshold import soft_threshold

EXACT = ("patterns", "flow", "lp")
ALL_SOLVERS = (*EXACT, "greedy", "greedy_prune")


def optimal_24_mass(w: torch.Tensor) -> float:
    """Brute force: per 4x4 tile the best of the 90 patterns, kept |w| summed with math.fsum."""
    pats = transposable_patterns(2, 4).reshape(90, 16)
    total = []
    for tile in to_tiles(w.detach().abs().double(), 4).reshape(-1, 16).tolist():
        total.append(max(math.fsum(v for v, k in zip(tile, p) if k) for p in pats.tolist()))
    return math.fsum(total)


def kept_mass(w, mask) -> float:
    return math.fsum((w.detach().abs().double() * mask).reshape(-1).tolist())


# --- exact solvers at any magnitude (LP was unscaled; patterns overflowed float32) ---------------

@pytest.mark.parametrize("solver", EXACT)
@pytest.mark.parametrize("scale", [1e-30, 1e-9, 1.0, 1e9, 1e25, 1e30])
def test_exact_solvers_are_exact_at_any_scale(solver, scale):
    torch.manual_seed(0)
    w = torch.rand(16, 16, dtype=torch.float64) * scale
    mask = transposable_mask(w, solver=solver)
    assert is_transposable(mask, 2, 4)
    assert kept_mass(w, mask) >= optimal_24_mass(w) * (1 - 1e-6)


@pytest.mark.parametrize("solver", EXACT)
def test_exact_solvers_near_float32_max(solver):
    # every score overflowed to inf and the first pattern won; its kept mass was half the optimum
    p0 = transposable_patterns(2, 4)[0]
    w = torch.where(p0, torch.tensor(1e38), torch.tensor(2e38)).float().repeat(2, 3)
    mask = transposable_mask(w, solver=solver)
    assert kept_mass(w, mask) == pytest.approx(optimal_24_mass(w), rel=1e-6)


def test_triton_transposable_near_float32_max(device):
    kernels = pytest.importorskip("sparsity_lab.kernels")
    p0 = transposable_patterns(2, 4)[0]
    torch.manual_seed(0)
    w = torch.where(p0, torch.tensor(1e38), torch.tensor(2e38)).float().repeat(4, 4)
    w = w * (1 + 0.5 * torch.rand_like(w))  # ~1e38..3e38: every sum of 8 overflows float32
    mask = kernels.transposable_mask24(w.to(device), pruned=False)[0].cpu()
    assert torch.equal(mask, transposable_mask(w, solver="patterns"))
    assert kept_mass(w, mask) == pytest.approx(optimal_24_mass(w), rel=1e-6)


def test_flow_resolution_is_the_documented_bound():
    # one outlier 1e8 x the rest: the outlier is kept, the rest is optimal up to N*M/COST_LEVELS * max
    torch.manual_seed(1)
    for _ in range(20):
        w = torch.rand(4, 4, dtype=torch.float64)
        w[torch.randint(4, ()), torch.randint(4, ())] = 1e8
        mask = transposable_mask(w, solver="flow")
        assert mask[w == 1e8].all()
        assert optimal_24_mass(w) - kept_mass(w, mask) <= 2 * 4 / COST_LEVELS * 1e8
    # within the resolution (outlier 1e5 x the rest) flow is exact
    w = torch.rand(8, 8, dtype=torch.float64)
    w[0, 0] = 1e5
    assert kept_mass(w, transposable_mask(w, solver="flow")) == pytest.approx(optimal_24_mass(w), rel=1e-14)


# --- NaN/Inf: every mask path returns a valid mask ----------------------------------------------

def _nan_inf_groups():
    """Every placement of 1-4 NaN/+Inf/-Inf in a group of 4 distinct magnitudes, stacked as rows."""
    rows = []
    for k in range(1, 5):
        for pos in itertools.combinations(range(4), k):
            for bad in (float("nan"), float("inf"), -float("inf")):
                for vals in ((1.0, -2.0, 3.0, 4.0), (4.0, 3.0, -2.0, 1.0)):
                    row = list(vals)
                    for p in pos:
                        row[p] = bad
                    rows.append(row)
    rows += [[float("nan"), float("inf"), 1.0, 0.0]] * 4
    return torch.tensor(rows[: len(rows) // 4 * 4])  # a multiple of 4 rows: 4x4 tiles too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_nm_mask_valid_with_nan_inf(dtype):
    w = _nan_inf_groups().to(dtype)
    assert is_nm(nm_mask(w, 2, 4, dim=1, check=False), 2, 4, dim=1)
    assert is_nm(nm_mask(w.repeat(1, 2), 3, 8, dim=1, check=False), 3, 8, dim=1)  # the sort path (m > 8 uses it)
    assert is_nm(nm_mask(w.repeat(1, 4), 5, 16, dim=1, check=False), 5, 16, dim=1)
    with pytest.raises(ValueError, match="NaN/Inf"):
        nm_mask(w)  # the public call with checks refuses


@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_transposable_solvers_valid_with_nan_inf(solver):
    w = _nan_inf_groups()
    mask = transposable_mask(w, solver=solver, check=False)
    assert is_transposable(mask, 2, 4, exact=solver in EXACT)


def test_triton_masks_valid_with_nan_inf(device):
    kernels = pytest.importorskip("sparsity_lab.kernels")
    w = _nan_inf_groups()
    _, bits = kernels.prune24(w.to(device), values=False)
    rowwise = kernels.unpack_mask24(bits).cpu()
    assert is_nm(rowwise, 2, 4)
    assert torch.equal(rowwise, nm_mask(w, 2, 4, check=False))
    assert is_transposable(kernels.transposable_mask24(w.to(device), pruned=False)[0].cpu(), 2, 4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("transposable", [False, True])
def test_layer_mask_stays_valid_on_nan(backend, transposable, device):
    if backend == "triton":
        pytest.importorskip("sparsity_lab.kernels")
    torch.manual_seed(0)
    model = nn.Sequential()
    model.mlp = nn.Linear(16, 16).to(device)
    sl.sparsify(model, sl.STE(transposable=transposable, backend=backend))
    with torch.no_grad():
        model.mlp.weight[:3, :5] = float("nan")
        model.mlp.weight[5, 2] = float("inf")
    model.mlp.refresh_mask()
    mask = model.mlp.mask.cpu()
    assert is_transposable(mask, 2, 4) if transposable else is_nm(mask, 2, 4, dim=1)


def test_sparsify_refuses_nan_weights():
    model = nn.Sequential()
    model.mlp = nn.Linear(8, 8)
    with torch.no_grad():
        model.mlp.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"'mlp'.*NaN/Inf"):
        sl.sparsify(model, sl.SSTE())


# --- meta tensors -------------------------------------------------------------------------------

@pytest.mark.parametrize("solver", ("auto", *ALL_SOLVERS))
def test_masks_on_meta_are_shape_only(solver):
    w = torch.empty(8, 12 if solver == "nm" else 8, device="meta")
    mask = transposable_mask(w, solver=solver)
    assert mask.is_meta and mask.shape == w.shape and mask.dtype == torch.bool
    assert nm_mask(torch.empty(3, 8, device="meta")).is_meta
    assert soft_threshold(torch.empty(4, 8, device="meta")).is_meta
    assert mvue24(torch.empty(4, 8, device="meta")).is_meta


def test_value_functions_refuse_meta_clearly():
    w = torch.empty(8, 8, device="meta")
    for fn in (lambda: is_nm(w), lambda: kept_fraction(w, w), lambda: is_transposable(w, 2, 4),
               lambda: sl.masks.validate_transposable_mask(w, 2, 4)):
        with pytest.raises(ValueError, match="meta device"):
            fn()


@pytest.mark.parametrize("method", [sl.STE(), sl.SSTE(), sl.STE(transposable=True)])
def test_sparsify_on_meta_refuses_clearly(method):
    with torch.device("meta"):
        model = nn.Sequential()
        model.mlp = nn.Linear(8, 8)
    with pytest.raises(ValueError, match=r"'mlp'.*meta device.*materialize"):
        sl.sparsify(model, method)
    assert type(model.mlp) is nn.Linear  # untouched


# --- MVUE: a kept x / p that overflows the dtype ---------------------------------------------------

@pytest.mark.parametrize("dtype,big", [(torch.float16, 4e4), (torch.bfloat16, 2e38), (torch.float32, 2e38)])
@pytest.mark.parametrize("method", ["exact", "sequential"])
def test_mvue_overflow_is_an_error_not_inf(dtype, big, method):
    x = torch.full((3, 8), big, dtype=dtype)
    advice = r"pass x.double\(\) \(the result is then float64\)" if dtype == torch.float32 else \
        r"pass x.float\(\) \(the result is then float32\)"  # never x.float() for an x that is float32 already
    with pytest.raises(ValueError, match=f"overflow {dtype}.*{advice}"):
        mvue24(x, method=method, generator=torch.Generator().manual_seed(0))
    out = mvue24(x.float() if dtype == torch.float16 else x.double(), method=method)
    assert torch.isfinite(out).all()
    # the unchecked hot path passes the overflow on (a GradScaler then skips the step)
    assert not torch.isfinite(mvue24(x, method=method, check=False)).all()


# --- sparsify on an already sparsified model -------------------------------------------------------

@pytest.mark.parametrize("select", [None, "all", ["mlp"]])
def test_sparsify_twice_says_already_sparsified(select):
    model = nn.Sequential()
    model.mlp = nn.Linear(8, 8)
    sl.sparsify(model, sl.STE(), select=select)
    with pytest.raises(ValueError, match=r"already sparsified.*'mlp'"):
        sl.sparsify(model, sl.STE(), select=select)


# --- checkpoints -------------------------------------------------------------------------------------

def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"step": 3, "config": {"lr": 1e-3, "name": "x"}, "model": {"w": torch.randn(32, 32, generator=g),
            "mask": torch.rand(32, 32, generator=g) > 0.5}, "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}},
            "scheduler": {"last_epoch": 3}, "sampler": {"generator": g.get_state()}, "torch_rng": torch.get_rng_state()}


def _same(a, b):
    from sparsity_lab.lab.checkpoint import state_digest
    return state_digest(a) == state_digest(b)


def test_checkpoint_empty_and_truncated_files_are_clear_errors(tmp_path):
    from sparsity_lab.lab.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    path = save_checkpoint(tmp_path / "c.pt", _state())
    raw = path.read_bytes()
    for size in (0, 1, 10, len(raw) // 3, len(raw) // 2, len(raw) - 100, len(raw) - 1):
        path.write_bytes(raw[:size])
        with pytest.raises(CheckpointError, match=str(path).replace("\\", "\\\\")):
            load_checkpoint(path)


def test_checkpoint_overwritten_bytes_never_load_as_different_content(tmp_path):
    from sparsity_lab.lab.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    path = save_checkpoint(tmp_path / "c.pt", _state())
    raw = path.read_bytes()
    reference = load_checkpoint(path)
    rng = torch.Generator().manual_seed(0)
    for pos in range(0, len(raw) - 64, 61):
        corrupt = bytearray(raw)
        corrupt[pos:pos + 64] = bytes(torch.randint(0, 256, (64,), generator=rng, dtype=torch.uint8).tolist())
        path.write_bytes(bytes(corrupt))
        try:
            loaded = load_checkpoint(path)
        except CheckpointError:
            continue
        assert _same(loaded, reference), f"64 bytes overwritten at {pos} loaded as a different checkpoint"


def test_checkpoint_failing_write_keeps_the_previous_one(tmp_path, monkeypatch):
    from sparsity_lab.lab import checkpoint as ck
    path = ck.save_checkpoint(tmp_path / "c.pt", _state(0))
    before = path.read_bytes()

    def disk_full(obj, fh):  # half the bytes go out, then the disk is full
        fh.write(b"x" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", disk_full)
    with pytest.raises(OSError, match=r"cannot write the checkpoint .*c\.pt.*No space left.*unchanged"):
        ck.save_checkpoint(path, _state(1))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.pt"], "no temporary file left behind"
    monkeypatch.undo()
    assert _same(ck.load_checkpoint(path), ck.load_checkpoint(path))


def test_checkpoint_into_a_folder_that_is_a_file(tmp_path):
    from sparsity_lab.lab.atomic_io import OutputError
    from sparsity_lab.lab.checkpoint import save_checkpoint
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="f/run"):
        save_checkpoint(tmp_path / "f" / "run" / "c.pt", _state())


# --- the train command's --out and --stop-at -----------------------------------------------------------

TINY = ["--layers", "1", "--heads", "1", "--width", "16", "--context", "8", "--batch-size", "2",
        "--eval-batches", "1", "--no-progress", "--device", "cpu"]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("def f(x):\n    return x * 2\n" * 100)
    return str(path)


@pytest.mark.parametrize("out", ["file/run", "file"])
def test_train_out_under_a_regular_file(tmp_path, text, capsys, out):
    from sparsity_lab.lab.cli import main
    (tmp_path / "file").write_text("x")
    assert exit_status(main, ["train", "--data", text, "--steps", "2", "--out", str(tmp_path / out), *TINY]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and str(tmp_path / out) in err and "Traceback" not in err


@pytest.mark.parametrize("stop_at", ["-3", "0", "3"])
def test_train_stop_at_out_of_range(tmp_path, text, capsys, stop_at):
    from sparsity_lab.lab.cli import main
    assert exit_status(main, ["train", "--data", text, "--steps", "2", "--stop-at", stop_at,
                              "--out", str(tmp_path / "r"), *TINY]) == 2
    assert "stop" in capsys.readouterr().err
    assert not (tmp_path / "r" / "log.jsonl").exists()


def test_trainer_stop_at_not_after_the_current_step(tmp_path, text):
    from sparsity_lab.lab import TrainConfig, Trainer
    from sparsity_lab.lab.model import GPTConfig
    cfg = TrainConfig(model=GPTConfig(n_layer=1, n_head=1, d_model=16, context=8), data=text, batch_size=2,
                      steps=4, eval_batches=1, device="cpu", progress=False)
    trainer = Trainer(cfg)
    trainer.run(stop_at=2)
    for bad in (2, 1, 5, 2.5, True):
        with pytest.raises(ValueError, match="stop_at"):
            trainer.run(stop_at=bad)
    assert trainer.step == 2


def test_mvue_overflow_of_float64_advises_scaling_down():
    with pytest.raises(ValueError, match=r"overflow torch.float64.*scale x down \(no wider dtype holds it\)"):
        mvue24(torch.full((3, 8), 1.7e308, dtype=torch.float64), generator=torch.Generator().manual_seed(0))
