"""2:4 activation sparsity in the FFN (squared ReLU), as a module the lab GPT uses.

``Act24MLP`` is the squared-ReLU FFN whose down projection multiplies the 2:4-pruned activation
A24 = top2of4(relu(H)^2) as the *sparse* operand (Haziza et al. 2025, https://arxiv.org/abs/2503.16672).
The maths and the six products of one training step are written out in
``sparsity_lab.references.act24``; this module decides how they run:

    products           forward                 backward
    "reference"        dense products of A24   dense products of dH (any device, the ground truth)
    "cusparselt"       y  = A24 @ W2^T sparse  dx = dH @ W1 sparse (dH is 2:4 in A24's pattern);
                                               dA24 = dY W2, dW2 = dY^T A24, dW1 = dH^T x dense

Which of the six products run sparse (plain linears; ``weight_grads`` is an option of the module):

    product          sums over   weight_grads="dense" (default)   weight_grads="tokens24"
    y  = A24 W2^T    hidden      sparse, exact (A24)              sparse, exact (A24)
    dA24 = dY W2     d_model     dense                            dense
    dW2 = dY^T A24   tokens      dense, exact                     D dense + S sparse (2:4 along tokens)
    dx = dH W1       hidden      sparse, exact (dH)               sparse, exact (dH)
    dW1 = dH^T x     tokens      dense, exact                     D dense + S sparse (2:4 along tokens)
    H = x W1^T       d_model     dense                            dense

``weight_grads="tokens24"`` (``references.act24_tokens``, after the paper's idea as public summaries
describe it): the ``dense_fraction`` (default 0.05) of hidden features with the most non-zeros in the
batch (D) keep exact products; for the others (S) the tokens are shuffled by a fresh permutation per
product and the 2 largest |values| of every 4 consecutive permuted tokens are kept, so A_S^T
(|S|, tokens) is 2:4 along the summed dimension: on "cusparselt" it is gathered, pruned and compressed
in one pass (``kernels/prune24_tokens.py``) and multiplied by cuSPARSELt. An approximation of dW (what
is dropped is lost; ``record_dropped`` reports the share); |S| is rounded to whole 64-row tiles there.
The permutations come from a counter-based stream per module (``token_seed``, ``token_draws``:
buffers, so a resumed run draws the same ones), drawn on the host: a CUDA-graph capture is refused.
With 2:4 weights on the linears (below) the token-dimension products take the weight gradients in place
of the layers' own (dense or MVUE), the forwards and input gradients still on the 2:4 weights.

A24 and dH are produced compressed by the Triton kernels ``kernels/act24.py`` and
``kernels/act24_backward.py`` (activation, selection and cuSPARSELt's layout in one pass) and
multiplied through cuSPARSELt with the activation on the left: cuSPARSELt's structured operand A of
D = A @ B is 2:4 along its rows, i.e. along the summed dimension, which for y = A24 W2^T and
dx = dH W1 is exactly the hidden dimension.

Layouts of the FFN (``sparsify`` with ``weight_selector`` makes both linears 2:4, ``fc_only`` the
up projection alone):
* ``fc`` a plain ``nn.Linear`` (activation sparsity alone): one autograd function owns the whole FFN,
  so the input gradient dx = dH W1 can use dH's pattern (2 of the 6 products sparse);
* ``fc`` a ``SparseLinear`` (combined with 2:4 weights): ``fc`` runs its own products (forward and
  input gradient on S(W1), and MVUE(dH^T) x for dW1 with ``mvue=True``) and this module the down
  projection;
* ``proj`` a ``SparseLinear`` too: the forward still multiplies A24 as the sparse operand (times the
  dense-stored S(W2): both 2:4 operands cannot run sparse at once, one is enough), and the backward
  takes the layer's own products, dA24 = dY S(W2) sparse on S(W2)^T (a transposable mask) and
  dW2 = MVUE(dY^T) A24 with ``mvue=True``. With both linears 2:4 and MVUE, all six products run sparse.

Dense tail: ``dense_from`` (an optimizer step, or -1 for never) switches the module to the plain
dense squared-ReLU FFN for the last steps; ``attach_activation_schedule`` counts optimizer steps.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .activations import relu2  # fused on CUDA (kernels/relu2.py), the reference elsewhere
from .references.act24 import act24, act24_grad
from .references.act24_tokens import check_dense_fraction, dense_feature_count, tokens24_dropped, tokens24_weight_grad

PRODUCTS = ("reference", "cusparselt")
WEIGHT_GRADS = ("dense", "tokens24")
TILE = 64  # the Triton kernels take whole 64 x 64 tiles of (tokens, hidden)


class Act24FallbackWarning(UserWarning):
    """cuSPARSELt activation products were asked for but cannot run here; the reference runs."""


# --- how the products run -----------------------------------------------------------------------
class ReferenceProducts:
    """Dense products of the pruned activation (any device, any dtype): the ground truth."""

    name = "reference"

    def __init__(self, feature_multiple: int = 1) -> None:
        # |S| (the features pruned along the tokens) is rounded to this multiple; 64 reproduces the
        # cuSPARSELt products' choice of the dense features D (to compare the two)
        self.feature_multiple = feature_multiple

    def down(self, h: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(y without bias (tokens, d), A24 (tokens, hidden)) for h (tokens, hidden), w2 (d, hidden)."""
        a24, _ = act24(h)
        return a24 @ w2.t(), a24

    def grad_h(self, h: torch.Tensor, grad_a24: torch.Tensor) -> tuple[torch.Tensor, object]:
        """(dH dense, the operand ``grad_x`` reads)."""
        dh = act24_grad(h, grad_a24, h.dtype)
        return dh, dh

    def grad_x(self, operand, w1: torch.Tensor) -> torch.Tensor:
        """dx = dH W1 for w1 (hidden, d)."""
        return operand @ w1

    def token_weight_grad(self, a: torch.Tensor, g: torch.Tensor, perm: torch.Tensor, dense_count: int) -> torch.Tensor:
        """C (hidden, k) ~ A^T G with 2:4 along permuted tokens outside the dense features
        (``references.act24_tokens.tokens24_weight_grad``)."""
        return tokens24_weight_grad(a, g, perm, dense_count)


def _pad_tokens(x: torch.Tensor) -> torch.Tensor:
    extra = -x.shape[0] % TILE
    return x if extra == 0 else F.pad(x, (0, 0, 0, extra))


class CusparseltProducts:
    """A24 and dH compressed by the Triton kernels, multiplied by cuSPARSELt (sparse on the left).

    Tokens that are not a multiple of 64 are padded with zero rows (zero H gives zero A24 and dH);
    the hidden width must be a multiple of 64. Algorithms: searched and checked once per product
    shape (``backends.cusparselt.algorithms.AlgorithmCache``).
    """

    name = "cusparselt"

    def __init__(self, ops=None, sweep: bool = True) -> None:
        from .backends.cusparselt.algorithms import AlgorithmCache
        from .backends.cusparselt.direct import make_ops
        from .kernels.act24 import act24 as act24_kernel
        from .kernels.act24_backward import act24_backward
        from .kernels.prune24_tokens import prune24_tokens
        self._tokens_kernel = prune24_tokens
        self.ops = ops if ops is not None else make_ops()
        self.algorithms = AlgorithmCache(self.ops, sweep=sweep)
        self._forward_kernel, self._backward_kernel = act24_kernel, act24_backward

    def _mm(self, compressed: torch.Tensor, b: torch.Tensor, m: int) -> torch.Tensor:
        from .backends.cusparselt.algorithms import ProductKey
        k, n = b.shape
        key = ProductKey(m, k, n, b.dtype, not b.is_contiguous(), False)
        return self.ops.mm(compressed, b, None, False, self.algorithms.get(key, b.device))

    def down(self, h, w2):
        tokens = h.shape[0]
        hp = _pad_tokens(h)
        compressed, a24 = self._forward_kernel(hp, out_dtype=h.dtype, dense=True)
        y = self._mm(compressed, w2.t(), hp.shape[0])  # A24 (tokens, hidden) @ W2^T (hidden, d)
        return y[:tokens], a24[:tokens]

    def grad_h(self, h, grad_a24):
        tokens = h.shape[0]
        compressed, dh = self._backward_kernel(_pad_tokens(h), _pad_tokens(grad_a24), out_dtype=h.dtype, dense=True)
        return dh[:tokens], (compressed, dh.shape[0], tokens)

    def grad_x(self, operand, w1):
        compressed, rows, tokens = operand
        return self._mm(compressed, w1.contiguous(), rows)[:tokens]  # dH (tokens, hidden) @ W1 (hidden, d)

    feature_multiple = TILE  # |S| a multiple of 64: whole tiles of the compressed operand

    def token_weight_grad(self, a, g, perm, dense_count):
        """C (hidden, k) ~ A^T G (``references.act24_tokens``): the dense features D by a dense product; the
        others by cuSPARSELt with B^T = top2of4_tokens(A[P][:, S])^T (|S|, tokens) gathered, pruned and
        compressed in one pass (``kernels/prune24_tokens.py``) times G[P] (tokens padded to 64 with zeros)."""
        from .references.act24_tokens import dense_features
        dense, sparse = dense_features(a, dense_count)
        out = torch.empty(a.shape[1], g.shape[1], dtype=a.dtype, device=a.device)
        if dense.numel():
            out[dense] = a[:, dense].t() @ g
        if sparse.numel():
            compressed = self._tokens_kernel(a, perm, sparse)
            out[sparse] = self._mm(compressed, _pad_tokens(g[perm]), sparse.numel())
        return out


def make_products(backend: str, hidden: int, device: torch.device):
    """The products for a weight ``backend`` name: cuSPARSELt for "cusparselt*" on a CUDA device
    (the hidden width a multiple of 64), the reference otherwise. A "cusparselt*" request on a machine
    without a CUDA GPU runs the reference with an :class:`Act24FallbackWarning`."""
    if not str(backend).startswith("cusparselt"):
        return ReferenceProducts()
    if device.type != "cuda" or not torch.cuda.is_available():
        warnings.warn(f"backend {backend!r}: 2:4 activation products need a CUDA GPU; the reference (dense "
                      "products of the pruned activations) runs instead", Act24FallbackWarning, stacklevel=2)
        return ReferenceProducts()
    if hidden % TILE:
        raise ValueError(f"2:4 activations on cuSPARSELt need the FFN hidden width to be a multiple of {TILE}, "
                         f"got {hidden}: choose --ffn-hidden (or --width) accordingly, or --backend torch")
    return CusparseltProducts()


# --- weight gradients 2:4 along the tokens (weight_grads="tokens24") -------------------------------
def permutation_seed(seed: int, draw: int) -> int:
    """Seed of token permutation ``draw`` of a module seeded ``seed``: a function of the two alone
    (counter-based), so a run resumed from a checkpoint draws the same permutations."""
    return (int(seed) * 1_000_003 + int(draw)) % (2**63 - 1)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def refuse_capture(device: torch.device) -> None:
    if _capturing(device):
        raise RuntimeError("weight_grads='tokens24' draws a token permutation on the host for every weight-gradient "
                           "product, which a CUDA-graph replay would freeze: run the step eagerly, or use "
                           "weight_grads='dense' under CudaGraphStep")


class TokenWeightGrads:
    """The weight gradients of one ``Act24MLP`` with ``weight_grads="tokens24"``.

    ``grad(a, g, name)`` returns C (hidden, k) ~ A^T G (``references.act24_tokens``): dW1 = C(dH, x),
    dW2 = C(A24, dY)^T. Each call draws a fresh permutation of the tokens from the module's
    counter-based stream (``Act24MLP.next_token_permutation``); |D| = ``dense_feature_count(hidden,
    dense_fraction, products.feature_multiple)``. With ``module.record_dropped`` the dropped share of
    A is kept in ``module.last_dropped[name]`` (an extra pass and a synchronisation: for reports).
    """

    def __init__(self, module: "Act24MLP", products) -> None:
        self.module, self.products = module, products

    def grad(self, a: torch.Tensor, g: torch.Tensor, name: str) -> torch.Tensor:
        refuse_capture(a.device)
        mod = self.module
        perm = mod.next_token_permutation(a.shape[0], a.device)
        count = dense_feature_count(a.shape[1], mod.dense_fraction, self.products.feature_multiple)
        out = self.products.token_weight_grad(a, g, perm, count)
        if mod.record_dropped:
            mod.last_dropped[name] = tokens24_dropped(a, perm, count)
        return out


# --- autograd ----------------------------------------------------------------------------------
def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev) and x.dtype != torch.float64:
        return torch.get_autocast_dtype(dev)
    return x.dtype


def _acc(t: torch.Tensor) -> torch.dtype:
    """Sums of 16-bit values accumulate in float32; float32 / float64 stay as they are."""
    return torch.float32 if t.element_size() < 4 else t.dtype


class _Act24FFNFn(torch.autograd.Function):
    """y = act24(x W1^T + b1) W2^T + b2 over x (tokens, d); see the module docstring for the products."""

    @staticmethod
    def forward(ctx, x2, w1, b1, w2, b2, products, dtype, token_grads=None):
        with torch.autocast(x2.device.type, enabled=False):
            xc, w1c, w2c = x2.to(dtype), w1.to(dtype), w2.to(dtype)
            h = F.linear(xc, w1c, None if b1 is None else b1.to(dtype))
            y, a24 = products.down(h, w2c)
            if b2 is not None:
                y = y + b2.to(dtype)
        ctx.save_for_backward(xc, h, a24, w1c, w2c)
        ctx.products, ctx.has_b1, ctx.has_b2 = products, b1 is not None, b2 is not None
        ctx.param_dtypes, ctx.token_grads = (w1.dtype, w2.dtype), token_grads
        return y

    @staticmethod
    def backward(ctx, dy):
        xc, h, a24, w1c, w2c = ctx.saved_tensors
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.to(h.dtype)
            grad_a24 = dy @ w2c                                    # dense: neither operand is 2:4
            tg = ctx.token_grads
            if tg is None:
                dw2 = (dy.t() @ a24).to(ctx.param_dtypes[1])       # sums over tokens: dense
            else:                                                  # 2:4 along permuted tokens, off D
                dw2 = tg.grad(a24, dy, "dW2").t().to(ctx.param_dtypes[1])
            dh, operand = ctx.products.grad_h(h, grad_a24)         # 2:4 in A24's pattern
            dx = ctx.products.grad_x(operand, w1c)                 # sparse dH on the left
            if tg is None:
                dw1 = (dh.t() @ xc).to(ctx.param_dtypes[0])        # sums over tokens: dense
            else:
                dw1 = tg.grad(dh, xc, "dW1").to(ctx.param_dtypes[0])
            db1 = dh.sum(0, dtype=_acc(dh)) if ctx.has_b1 else None
            db2 = dy.sum(0, dtype=_acc(dy)) if ctx.has_b2 else None
        return dx, dw1, db1, dw2, db2, None, None, None


class _Act24DownFn(torch.autograd.Function):
    """y = act24(h) W2^T + b2 over h (tokens, hidden); the up projection runs its own products."""

    @staticmethod
    def forward(ctx, h2, w2, b2, products, dtype, token_grads=None):
        with torch.autocast(h2.device.type, enabled=False):
            hc, w2c = h2.to(dtype), w2.to(dtype)
            y, a24 = products.down(hc, w2c)
            if b2 is not None:
                y = y + b2.to(dtype)
        ctx.save_for_backward(hc, a24, w2c)
        ctx.products, ctx.has_b2, ctx.w_dtype, ctx.h_dtype = products, b2 is not None, w2.dtype, h2.dtype
        ctx.token_grads = token_grads
        return y

    @staticmethod
    def backward(ctx, dy):
        hc, a24, w2c = ctx.saved_tensors
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.to(hc.dtype)
            grad_a24 = dy @ w2c
            if ctx.token_grads is None:
                dw2 = (dy.t() @ a24).to(ctx.w_dtype)
            else:
                dw2 = ctx.token_grads.grad(a24, dy, "dW2").t().to(ctx.w_dtype)
            dh, _ = ctx.products.grad_h(hc, grad_a24)
            db2 = dy.sum(0, dtype=_acc(dy)) if ctx.has_b2 else None
        return dh.to(ctx.h_dtype), dw2, db2, None, None, None


class _Act24SparseDownFn(torch.autograd.Function):
    """y = act24(h) S(W2)^T + b2, the backward through the 2:4 layer ``proj``'s own products
    (``layer_products.products_backward`` with A24 as the layer's input)."""

    @staticmethod
    def forward(ctx, h2, w2, b2, products, plan, sparse_w2, token_grads=None):
        with torch.autocast(h2.device.type, enabled=False):
            hc = h2.to(plan.dtype)
            y, a24 = products.down(hc, sparse_w2)
            if b2 is not None:
                y = y + b2.to(plan.dtype)
        ctx.save_for_backward(hc, a24, w2)
        ctx.products, ctx.plan, ctx.h_dtype, ctx.token_grads = products, plan, h2.dtype, token_grads
        ctx.b2_dtype = b2.dtype if b2 is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        from .layer_products import products_backward

        hc, a24, w2 = ctx.saved_tensors
        tg, plan = ctx.token_grads, ctx.plan
        needs = (True, ctx.needs_input_grad[1] and tg is None, ctx.needs_input_grad[2])
        grad_a24, dw2, db2 = products_backward(plan, dy, a24, a24.shape, a24.dtype, w2, ctx.b2_dtype, needs)
        if tg is not None and ctx.needs_input_grad[1]:  # in place of the layer's dW2 = dY^T A24 (or MVUE's)
            dy2 = dy.reshape(-1, dy.shape[-1]).to(plan.dtype)
            with torch.autocast(dy.device.type, enabled=False):
                dw2 = tg.grad(a24, dy2, "dW2").t().contiguous().to(w2.dtype)
            if plan.decay:  # SR-STE's term, as products_backward adds it
                plan.backend.masked_decay_(dw2, w2, plan.mask, plan.decay)
        with torch.autocast(dy.device.type, enabled=False):
            dh, _ = ctx.products.grad_h(hc, grad_a24.to(hc.dtype))
        return dh.to(ctx.h_dtype), dw2, db2, None, None, None, None


class _TokenGradLinearFn(torch.autograd.Function):
    """h = x W1^T + b1 (the up projection: plain, or a ``SparseLinear``'s forward and input-gradient
    products through its ``CallPlan``) whose weight gradient is dW1 = C(dH, x), 2:4 along the tokens."""

    @staticmethod
    def forward(ctx, x2, w1, b1, plan, dtype, token_grads):
        from .layer_products import products_forward

        with torch.autocast(x2.device.type, enabled=False):
            if plan is None:
                xc, w1c = x2.to(dtype), w1.to(dtype)
                h = F.linear(xc, w1c, None if b1 is None else b1.to(dtype))
            else:
                xc, w1c = x2.to(plan.dtype), w1
                h = products_forward(xc, b1, plan)
        ctx.save_for_backward(xc, w1c, w1)
        ctx.plan, ctx.token_grads, ctx.x_dtype = plan, token_grads, x2.dtype
        ctx.b1_dtype = None if b1 is None else b1.dtype
        return h

    @staticmethod
    def backward(ctx, dh):
        from .layer_products import products_backward

        xc, w1c, w1 = ctx.saved_tensors
        plan, dx, dw1, db1 = ctx.plan, None, None, None
        dh2 = dh.to(xc.dtype)
        if plan is None:
            with torch.autocast(dh.device.type, enabled=False):
                dx = (dh2 @ w1c).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
                db1 = dh2.sum(0, dtype=_acc(dh2)).to(ctx.b1_dtype) if ctx.b1_dtype and ctx.needs_input_grad[2] else None
        else:
            needs = (ctx.needs_input_grad[0], False, ctx.needs_input_grad[2])
            dx, _, db1 = products_backward(plan, dh2, xc, xc.shape, ctx.x_dtype, w1, ctx.b1_dtype, needs)
        if ctx.needs_input_grad[1]:
            with torch.autocast(dh.device.type, enabled=False):
                dw1 = ctx.token_grads.grad(dh2, xc, "dW1").to(w1.dtype)
            if plan is not None and plan.decay:
                plan.backend.masked_decay_(dw1, w1, plan.mask, plan.decay)
        return dx, dw1, db1, None, None, None


# --- the module ----------------------------------------------------------------------------------
class Act24MLP(nn.Module):
    """Squared-ReLU FFN with 2:4 activations on the down projection (the lab GPT's ``mlp``).

    x (..., d) -> (..., d). ``fc`` (hidden, d) and ``proj`` (d, hidden) are named as in the plain MLP,
    so ``sparsify`` can make ``fc`` 2:4 (``weight_selector`` picks it alone). ``products`` is set by
    ``configure_activation_sparsity`` (default: the reference). ``weight_grads``, ``dense_fraction`` and
    ``token_seed``: the weight gradients dense (exact) or "tokens24" (module docstring,
    ``set_weight_grads``).
    """

    def __init__(self, d_model: int, hidden: int, bias: bool = False, dropout: float = 0.0,
                 weight_grads: str = "dense", dense_fraction: float = 0.05, token_seed: int = 0) -> None:
        super().__init__()
        if hidden % 4:
            raise ValueError(f"FFN hidden width {hidden} must be divisible by 4 for 2:4 activations")
        self.fc = nn.Linear(d_model, hidden, bias=bias)
        self.proj = nn.Linear(hidden, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)
        self.products = ReferenceProducts()
        # optimizer steps taken, and the first dense step (-1: never): buffers, so checkpoints keep them
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("dense_from", torch.full((), -1, dtype=torch.int64))
        self._dense_from = -1  # host copies: no device sync per forward
        self._step = 0
        # weight_grads="tokens24": the token permutations' seed and how many were drawn (buffers, so a
        # resumed run draws the same ones; host copies for the draws)
        self.register_buffer("token_seed", torch.zeros((), dtype=torch.int64))
        self.register_buffer("token_draws", torch.zeros((), dtype=torch.int64))
        self._token_seed = self._token_draws = 0
        self.record_dropped = False  # True: keep the dropped share of each weight-gradient operand (reports)
        self.last_dropped: dict[str, dict] = {}
        self.set_weight_grads(weight_grads, dense_fraction, token_seed)

    def set_weight_grads(self, weight_grads: str = "dense", dense_fraction: float = 0.05,
                         token_seed: int | None = None) -> None:
        """How the weight gradients dW2 = dY^T A24 and dW1 = dH^T x run: "dense" (exact), or "tokens24":
        the ``dense_fraction`` of hidden features with the most non-zeros exact, the others 2:4 along a
        fresh permutation of the tokens per product (``references.act24_tokens``), drawn from
        ``token_seed``'s stream (None: keep the current seed and draw count)."""
        if weight_grads not in WEIGHT_GRADS:
            raise ValueError(f"weight_grads must be one of {WEIGHT_GRADS}, got {weight_grads!r}")
        check_dense_fraction(dense_fraction)
        if token_seed is not None:
            if isinstance(token_seed, bool) or not isinstance(token_seed, int) or not 0 <= token_seed < 2**62:
                raise ValueError(f"token_seed must be an int in [0, 2**62), got {token_seed!r}")
            self._token_seed, self._token_draws = token_seed, 0
            self.token_seed.fill_(token_seed)
            self.token_draws.zero_()
        self.weight_grads, self.dense_fraction = weight_grads, float(dense_fraction)

    def check_weight_grads(self) -> None:
        """With "tokens24" the token-dimension products compute the weight gradients of fc and proj: a 2:4
        layer there whose method asks for MVUE weight gradients is refused (the two would compete)."""
        from .layers import SparseLinear

        if self.weight_grads != "tokens24":
            return
        for name in ("fc", "proj"):
            layer = getattr(self, name)
            if isinstance(layer, SparseLinear) and layer.method.mvue:
                raise ValueError(f"weight_grads='tokens24' computes the weight gradients of {name}, whose 2:4 method "
                                 f"({layer.method.describe()}) asks for MVUE weight gradients: use mvue=False with "
                                 "tokens24, or weight_grads='dense' with MVUE")

    def next_token_permutation(self, tokens: int, device: torch.device) -> torch.Tensor:
        """Permutation number ``token_draws`` of range(tokens), on ``device`` (int64): drawn on the host from
        a generator seeded by ``permutation_seed(token_seed, token_draws)`` (no device sync)."""
        gen = torch.Generator().manual_seed(permutation_seed(self._token_seed, self._token_draws))
        perm = torch.randperm(tokens, generator=gen)
        self._token_draws += 1
        self.token_draws.add_(1)
        if device.type == "cuda":
            return perm.pin_memory().to(device, non_blocking=True)
        return perm.to(device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("token_seed", "token_draws"):  # checkpoints written before these buffers existed
            state_dict.setdefault(prefix + name, torch.zeros((), dtype=torch.int64))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._step, self._dense_from = int(self.step), int(self.dense_from)
        self._token_seed, self._token_draws = int(self.token_seed), int(self.token_draws)

    @property
    def sparse_now(self) -> bool:
        """False in the dense tail (from step ``dense_from`` on)."""
        return self._dense_from < 0 or self._step < self._dense_from

    def set_dense_from(self, step: int | None) -> None:
        value = -1 if step is None else int(step)
        self._dense_from = value
        self.dense_from.fill_(value)

    def advance(self) -> None:
        self._step += 1
        self.step.add_(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .layers import SparseLinear

        if type(self.proj) not in (nn.Linear, SparseLinear) or type(self.fc) not in (nn.Linear, SparseLinear):
            raise TypeError(f"Act24MLP runs fc and proj as nn.Linear or SparseLinear, got {type(self.fc).__name__} "
                            f"and {type(self.proj).__name__}")
        if not self.sparse_now:
            return self.drop(self.proj(relu2(self.fc(x))))
        dtype = _compute_dtype(x)
        tg = None
        if self.weight_grads == "tokens24" and torch.is_grad_enabled():
            refuse_capture(x.device)
            self.check_weight_grads()
            tg = TokenWeightGrads(self, self.products)
        if isinstance(self.proj, SparseLinear):
            h = self._up(x, dtype, tg)
            h2 = h.reshape(-1, h.shape[-1])
            grad = torch.is_grad_enabled()
            plan = self.proj.call_plan(h2, self.training and grad, grad and self.proj.weight.requires_grad, dtype)
            if plan is not None:  # None: the weights' dense phase; the plain-weight path below runs
                sparse_w2 = self.proj.sparse_weight().to(plan.dtype)
                y = _Act24SparseDownFn.apply(h2, self.proj.weight, self.proj.bias, self.products, plan, sparse_w2, tg)
                return self.drop(y.reshape(*x.shape[:-1], y.shape[-1]))
            y = _Act24DownFn.apply(h2, self.proj.weight, self.proj.bias, self.products, dtype, tg)
            return self.drop(y.reshape(*x.shape[:-1], y.shape[-1]))
        if type(self.fc) is nn.Linear:
            x2 = x.reshape(-1, x.shape[-1])
            y = _Act24FFNFn.apply(x2, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias,
                                  self.products, dtype, tg)
        else:
            h = self._up(x, dtype, tg)
            y = _Act24DownFn.apply(h.reshape(-1, h.shape[-1]), self.proj.weight, self.proj.bias, self.products,
                                   dtype, tg)
        return self.drop(y.reshape(*x.shape[:-1], y.shape[-1]))

    def _up(self, x: torch.Tensor, dtype: torch.dtype, tg: TokenWeightGrads | None) -> torch.Tensor:
        """h = fc(x); with token-dimension weight gradients its dW1 is C(dH, x) (``_TokenGradLinearFn``),
        the forward and dx running as fc runs them (its 2:4 products for a ``SparseLinear``). fc is still
        called as a module, so its hooks run (the trainer measures the activations' sparsity there)."""
        if tg is None:
            return self.fc(x)
        from .layers import SparseLinear

        fc = self.fc

        def forward(inp: torch.Tensor) -> torch.Tensor:
            x2 = inp.reshape(-1, inp.shape[-1])
            plan = None
            if isinstance(fc, SparseLinear):
                plan = fc.call_plan(x2, self.training, fc.weight.requires_grad, dtype)
            h = _TokenGradLinearFn.apply(x2, fc.weight, fc.bias, plan, dtype, tg)
            return h.reshape(*inp.shape[:-1], h.shape[-1])

        fc.forward = forward  # for this call only: fc's hooks run around it as around its own forward
        try:
            return fc(x)
        finally:
            del fc.forward


def act24_modules(model: nn.Module) -> list[tuple[str, Act24MLP]]:
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, Act24MLP)]


def weight_selector(name: str, module: nn.Module) -> bool:
    """``sparsify`` selector for the combined method: 2:4 weights on both FFN linears (``mlp.fc``, ``mlp.proj``)."""
    return name.endswith(("mlp.fc", "mlp.proj"))


def fc_only(name: str, module: nn.Module) -> bool:
    """``sparsify`` selector: 2:4 weights on the up projections (``mlp.fc``) only."""
    return name.endswith("mlp.fc")


def configure_activation_sparsity(model: nn.Module, backend: str = "torch", total_steps: int | None = None,
                                  dense_finetune_at: float | None = None, weight_grads: str | None = None,
                                  dense_fraction: float = 0.05, token_seed: int = 0) -> list[tuple[str, Act24MLP]]:
    """Give every ``Act24MLP`` of ``model`` its products (from the weight ``backend`` name) and its dense
    tail (the first dense step = round(dense_finetune_at * total_steps), as the weight methods count).
    ``weight_grads`` (None: leave each module's setting): "dense" or "tokens24" with ``dense_fraction``
    (``Act24MLP.set_weight_grads``); module i draws its token permutations from seed
    ``permutation_seed(token_seed, i)``, so the blocks draw distinct ones."""
    mods = act24_modules(model)
    if not mods:
        raise ValueError("the model has no Act24MLP (build the GPT with ffn_kind='relu2', activation_sparsity='2:4')")
    if dense_finetune_at is not None and total_steps is None:
        raise ValueError("dense_finetune_at needs total_steps (the planned optimizer steps)")
    dense_from = None if dense_finetune_at is None else int(round(dense_finetune_at * total_steps))
    for i, (_, mod) in enumerate(mods):
        mod.products = make_products(backend, mod.fc.out_features, mod.fc.weight.device)
        mod.set_dense_from(dense_from)
        if weight_grads is not None:
            mod.set_weight_grads(weight_grads, dense_fraction, permutation_seed(token_seed, i) % 2**62)
        mod.check_weight_grads()
    return mods


def attach_activation_schedule(model: nn.Module, optimizer: torch.optim.Optimizer):
    """Advance every ``Act24MLP``'s step counter after each optimizer step (the dense tail's clock)."""
    mods = [mod for _, mod in act24_modules(model)]

    def after_step(opt, args, kwargs):
        for mod in mods:
            mod.advance()
    return optimizer.register_step_post_hook(after_step)
