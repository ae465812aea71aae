"""The declared backend interface (``sparsity_lab/backends/base.py``).

* A new backend written with the seven required methods only trains a SparseLinear exactly as the
  reference backend does: the defaults of the optional methods are enough.
* ``register_backend`` / ``get_backend`` refuse what is not a Backend, with the name in the message.
* graph_step's seed handling follows the ``reads_seed_from_device`` capability, not backend names,
  and ``graph_timing`` the ``MeasuresProducts`` interface.
* The product interface and the report/measurement interfaces are separate: ``Backend`` declares no
  reporting or timing, and a backend without them is described by default.
* Static: SparseLinear, graph_step, the sharded layer and the backend report never probe a backend
  with getattr/hasattr, and graph_step reaches into no private attribute of a layer or backend.
"""
import ast
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsity_lab as sl
from sparsity_lab.backends import Backend, base, get_backend, register_backend
from sparsity_lab.backends.report import BackendReport, MeasuresProducts, measures_products, report_of
from sparsity_lab.sparsify import backend_report
from sparsity_lab.backends.torch_reference import TorchBackend
from sparsity_lab.graph_layer import fill_device_seed, use_device_seed
from sparsity_lab.graph_step import fill_seeds, graph_timing, mvue_layers, release_device_seeds, use_device_seeds
from sparsity_lab.masks.nm import nm_mask
from sparsity_lab.masks.transposable import transposable_mask
from sparsity_lab.methods.mvue import mvue24
from sparsity_lab.methods.soft_threshold import soft_threshold

ROOT = Path(__file__).resolve().parent.parent / "sparsity_lab"


@pytest.fixture
def registry(monkeypatch):
    """A private backend registry: what a test registers does not leak into other tests."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_INSTANCES", {})
    return base


class MinimalBackend(Backend):
    """The required methods only, written from the equations with plain PyTorch."""

    name = "minimal"

    def mask(self, weight, n, m, transposable):
        return transposable_mask(weight, n, m) if transposable else nm_mask(weight, n, m, dim=1)

    def sparse_weight(self, weight, mask, beta, n, m):
        return weight * mask if beta is None else beta.to(weight.dtype) * soft_threshold(weight, mask, n, m)

    def prepare(self, sparse_weight):
        return sparse_weight

    def linear(self, x, operand, bias):
        return F.linear(x, operand, bias)  # Z = X S^T + b

    def grad_input(self, grad_out, operand):
        return grad_out @ operand  # dX = dZ S

    def grad_weight(self, grad_out, x, mvue, seed):
        if mvue:  # tokens are a multiple of 4 in these tests
            grad_out = mvue24(grad_out, dim=0, generator=seed)
        return grad_out.t() @ x  # dW = dZ^T X

    def masked_decay_(self, grad, weight, mask, decay):
        grad.add_(weight * ~mask, alpha=decay)


METHODS = {
    "ste": lambda b: sl.STE(backend=b),
    "ste_transposable": lambda b: sl.STE(transposable=True, backend=b),
    "srste": lambda b: sl.SRSTE(decay=0.1, backend=b),
    "masked_decay": lambda b: sl.MaskedDecay(decay=0.1, total_steps=50, backend=b),
    "masked_decay_weights": lambda b: sl.MaskedDecayOnWeights(decay=0.1, total_steps=50, backend=b),
    "sste_mvue": lambda b: sl.SSTE(mvue=True, transposable=True, backend=b),
}


def _train(backend: str, make_method, steps: int = 4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    sl.sparsify(model, make_method(backend), select="all")
    for _, layer in sl.sparse_layers(model):
        layer.mvue_seed = 1234  # the same MVUE streams for both backends
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sl.attach_optimizer(model, opt)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(12, 16, generator=gen), torch.randn(12, 8, generator=gen)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("method", list(METHODS))
def test_a_backend_with_the_required_methods_only_trains_like_the_reference(registry, method):
    register_backend("minimal", MinimalBackend)
    backend = get_backend("minimal")
    assert isinstance(backend, Backend) and not backend.reads_seed_from_device and not measures_products(backend)
    new, new_losses = _train("minimal", METHODS[method])
    ref, ref_losses = _train("torch", METHODS[method])
    assert new_losses == ref_losses
    for a, b in zip(new.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    new_layers, ref_layers = sl.sparse_layers(new), sl.sparse_layers(ref)
    assert [l.backend for _, l in new_layers] == [backend, backend]
    assert [l.counters() for _, l in new_layers] == [l.counters() for _, l in ref_layers]
    for (_, a), (_, b) in zip(new_layers, ref_layers):
        assert torch.equal(a.mask, b.mask) and a.flips_total == b.flips_total  # the default mask_flips
    # the defaults of the optional methods describe it as a dense-products backend
    rows = backend_report(new)
    assert rows[0].running == "minimal" and rows[0].fallback_reason is None
    assert rows[0].products["forward"] == "dense masked W (backend 'minimal')"
    assert report_of(backend).summary() == {"name": "minimal", "stats": {}, "algorithms": [], "decisions": []}
    assert not isinstance(backend, (BackendReport, MeasuresProducts))


def test_the_product_interface_carries_no_reporting_or_timing():
    """Backend declares products (and the capabilities they need); reporting and timing live in
    report.py, so a backend without them neither inherits nor needs them."""
    reporting = {"product_plan", "summary", "stats", "fallback_reason", "timing", "measures_products"}
    assert not reporting & set(dir(Backend))
    assert {"product_plan", "summary", "stats", "fallback_reason"} <= set(dir(BackendReport))
    assert MeasuresProducts.__abstractmethods__ == frozenset({"timing"})
    for name in ("torch", "cusparselt", "cusparselt_auto", "sparse_auto", "torch_fp8sim"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cusparselt without a GPU: the reference stands in
            assert report_of(get_backend(name)) is get_backend(name)


def test_activation_products_have_reference_defaults():
    """A backend with the seven required methods runs 2:4 activations through Backend's defaults, the
    reference of references.act24, exactly as the reference backend does."""
    from sparsity_lab.activation24 import Act24MLP

    class Counting(MinimalBackend):
        def __init__(self):
            self.calls = []

        def act24_linear(self, h, weight):
            self.calls.append("act24_linear")
            return super().act24_linear(h, weight)

        def act24_grad(self, h, grad_a24):
            self.calls.append("act24_grad")
            return super().act24_grad(h, grad_a24)

        def act24_grad_input(self, operand, weight):
            self.calls.append("act24_grad_input")
            return super().act24_grad_input(operand, weight)

    runs, counting = [], Counting()
    for backend in (counting, TorchBackend()):
        torch.manual_seed(0)
        mlp = Act24MLP(8, 32, bias=True)
        mlp.backend = backend
        x = torch.randn(3, 5, 8, requires_grad=True)
        y = mlp(x)
        y.square().mean().backward()
        runs.append([y.detach(), x.grad] + [p.grad for p in mlp.parameters()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    assert counting.calls == ["act24_linear", "act24_grad", "act24_grad_input"]


def test_the_defaults_compose_from_the_required_methods():
    backend, w = MinimalBackend(), torch.randn(8, 16)
    mask, beta = backend.mask(w, 2, 4, False), torch.tensor(1.3)
    for b in (None, beta):
        want = backend.sparse_weight(w, mask, b, 2, 4).to(torch.float64)
        assert torch.equal(backend.sparse_weight_as(w, mask, b, 2, 4, torch.float64), want)
        assert torch.equal(backend.prepare_masked(w, mask, b, 2, 4, torch.float64, backward=False), want)
    other = backend.mask(torch.randn(8, 16), 2, 4, False)
    flips = backend.mask_flips(mask, other)
    assert flips.dtype == torch.int64 and flips.dim() == 0 and int(flips) == int((mask != other).sum())
    plan = report_of(backend).product_plan(8, 16, mvue=False)
    assert list(plan) == ["forward", "grad_input", "grad_weight"] and plan["grad_weight"] == "dense dZ^T X"


def test_registration_refuses_what_is_not_a_backend(registry):
    class NotABackend:
        name = "nope"

    with pytest.raises(TypeError, match="'nope_cls' must be a subclass of sparsity_lab.backends.Backend"):
        register_backend("nope_cls", NotABackend)
    register_backend("nope_fn", lambda: NotABackend())
    with pytest.raises(TypeError, match="'nope_fn' returned a NotABackend, not a sparsity_lab.backends.Backend"):
        get_backend("nope_fn")
    with pytest.raises(TypeError, match="must be callable"):
        register_backend("nope_obj", MinimalBackend())
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        register_backend("", MinimalBackend)

    class Incomplete(Backend):  # grad_weight and masked_decay_ missing
        name = "incomplete"
        mask = sparse_weight = prepare = linear = grad_input = MinimalBackend.mask

    register_backend("incomplete", Incomplete)
    with pytest.raises(TypeError, match="abstract"):
        get_backend("incomplete")


def test_the_shipped_backends_are_backends(registry):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cusparselt without a GPU: the reference stands in, with a warning
        for name in ("torch", "torch_fp8sim", "cusparselt", "cusparselt_auto", "sparse_auto"):
            assert isinstance(get_backend(name), Backend)


@pytest.mark.triton
def test_the_triton_backends_read_their_seed_on_the_device(registry):
    assert get_backend("triton").reads_seed_from_device and not get_backend("torch").reads_seed_from_device


# --- graph_step follows the capabilities ----------------------------------------------------------------
class HostSeedDrawingBackend(MinimalBackend):
    """Draws MVUE on the host only (the default: reads_seed_from_device is False)."""

    name = "host_drawing"


class DeviceSeedBackend(TorchBackend):
    """A CPU stand-in for a backend whose kernels read their MVUE seed from a device tensor: each draw
    takes one int from the generator (eager) or reads the int from the tensor (graph mode)."""

    name = "device_seed_fake"
    reads_seed_from_device = True

    def device_seed_value(self, generator):
        return int(torch.randint(0, 2**31, (1,), generator=generator))

    def grad_weight(self, grad_out, x, mvue, seed):
        if mvue:
            value = int(seed) if isinstance(seed, torch.Tensor) else self.device_seed_value(seed)
            seed = torch.Generator().manual_seed(value)
        return super().grad_weight(grad_out, x, mvue, seed)


def _mvue_mlp(backend: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.GELU(), nn.Linear(32, 16, bias=False))
    sl.sparsify(model, sl.SSTE(mvue=True, transposable=True, backend=backend), select="all")
    return model


def test_device_seeds_follow_the_capability_not_the_name(registry):
    """A backend graph_step never heard of, declaring reads_seed_from_device: accepted, and the seeds
    fill_seeds writes make the same draws as eager mode; host-drawing backends are refused."""
    register_backend("device_seed_fake", DeviceSeedBackend)
    eager = _mvue_mlp("device_seed_fake")
    seeded = copy.deepcopy(eager)
    layers = mvue_layers(seeded)
    use_device_seeds(layers, torch.device("cpu"))
    assert all(l.seed_source is not None and l.seed_source.tensor.dtype == torch.int64 for l in layers)
    opts = []
    for model in (eager, seeded):
        opts.append(torch.optim.SGD(model.parameters(), lr=0.05))
        sl.attach_optimizer(model, opts[-1])
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
        fill_seeds(layers)
        for model, opt in zip((eager, seeded), opts):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    for a, b in zip(eager.parameters(), seeded.parameters()):
        assert torch.equal(a, b)
    assert all(l.seed_source.uses == 3 for l in layers)
    assert [l.mvue_calls for _, l in sl.sparse_layers(eager)] == [l.mvue_calls for l in layers] == [3, 3]
    release_device_seeds(layers)
    assert all(l.seed_source is None for l in layers)


def test_a_mixed_model_is_refused_before_any_layer_changes(registry):
    register_backend("device_seed_fake", DeviceSeedBackend)
    register_backend("host_drawing", HostSeedDrawingBackend)
    model = nn.Sequential(_mvue_mlp("device_seed_fake"), _mvue_mlp("host_drawing"))
    layers = mvue_layers(model)
    with pytest.raises(ValueError, match="reads_seed_from_device.*runs 'host_drawing', which draws on the host"):
        use_device_seeds(layers, torch.device("cpu"))
    assert all(l.seed_source is None for l in layers)


def test_device_seed_functions_check_their_use(registry):
    register_backend("device_seed_fake", DeviceSeedBackend)
    torch.manual_seed(0)
    layer = sl.SparseLinear(16, 8, method=sl.SSTE(mvue=True, transposable=True, backend="device_seed_fake"))
    with pytest.raises(RuntimeError, match="use_device_seed"):
        fill_device_seed(layer)
    use_device_seed(layer, "cpu")
    calls = layer.mvue_calls
    written = fill_device_seed(layer)
    assert int(layer.seed_source.tensor) == written and layer.mvue_calls == calls + 1
    plain = sl.SparseLinear(16, 8, method=sl.STE(backend="device_seed_fake"))
    with pytest.raises(ValueError, match="for MVUE layers"):
        use_device_seed(plain, "cpu")


class MeasuringBackend(MinimalBackend, MeasuresProducts):
    """Declares an auto policy that times products: graph_timing must switch it."""

    name = "measuring"

    def __init__(self):
        self.mode = "eager"

    @property
    def timing(self):
        return self.mode

    @timing.setter
    def timing(self, mode):
        self.mode = mode


def test_graph_timing_switches_the_backends_that_measure(registry):
    register_backend("measuring", MeasuringBackend)
    register_backend("minimal", MinimalBackend)
    torch.manual_seed(0)
    model = nn.Sequential(sl.SparseLinear(16, 16, method=sl.STE(backend="measuring")),
                          sl.SparseLinear(16, 16, method=sl.STE(backend="minimal")))
    measuring, minimal = model[0].backend, model[1].backend
    with graph_timing(model) as switched:
        assert measuring.timing == "graph" and list(switched.backends.values()) == [measuring]
    assert measuring.timing == "eager" and not measures_products(minimal)


def test_a_device_seed_given_to_a_host_draw_is_refused():
    with pytest.raises(TypeError, match="needs a torch.Generator; a device seed tensor"):
        TorchBackend().grad_weight(torch.randn(8, 4), torch.randn(8, 6), True, torch.zeros((), dtype=torch.int64))


# --- static: no probing, no private access ---------------------------------------------------------------
def _tree(relative: str) -> ast.Module:
    return ast.parse((ROOT / relative).read_text())


@pytest.mark.parametrize("relative", ["layers.py", "graph_step.py", "distributed/sharded_layer.py",
                                      "backends/cusparselt/auto.py", "sparsify.py"])
def test_no_getattr_or_hasattr_on_backends(relative):
    found = []
    for node in ast.walk(_tree(relative)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if "backend" in target.lower() or relative == "graph_step.py":
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not found, f"{relative} probes a backend instead of calling the declared interface: {found}"


def test_graph_step_touches_no_private_attribute_and_names_no_backend():
    tree = _tree("graph_step.py")
    private = [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    assert not private, f"graph_step reaches into private attributes of other objects: {private}"
    interfaces = {"backends.base", "backends.report"}  # the declared interfaces, no backend
    imports = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("backends") and node.module not in interfaces]
    assert not imports, f"graph_step imports backends (a new backend would need an edit there): {imports}"
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    names = {"torch", "triton", "cusparselt", "cusparselt_auto", "torch_fp8sim", "triton_fp8sim"}
    strings = [node.value for module in body for node in ast.walk(module)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]
    assert not strings, f"graph_step names backends in its code: {strings}"
