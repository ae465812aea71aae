"""What every kernel module shares: argument checks and the group-of-4 register shuffles.

Groups of 4 along a contiguous dimension are handled the same way everywhere: a program loads a
flat, contiguous run of ``4 * BLOCK`` elements (wide, coalesced loads), reshapes it to
``[BLOCK, 2, 2]`` and splits the two size-2 axes, which leaves the four members of each group as
four ``[BLOCK]`` tensors held by the same thread. ``join4`` is the exact inverse. No data moves
between threads, so the 16-byte loads and stores survive (checked in the PTX: ``ld.global.v4``).

Two interpreter facts shape the kernels (triton 3.9, ``TRITON_INTERPRET=1``): bf16 arithmetic is
wrong there, so kernels convert to float32 right after loading; and float32 -> bf16 casts truncate
instead of rounding to nearest, so bf16 outputs of arithmetic may differ from the GPU by one ulp.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Offsets are int32: keep every tensor below 2**31 elements.
MAX_NUMEL = 2**31 - 1

HALF_AND_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` runs under TRITON_INTERPRET=1 (numpy on the CPU)."""
    return isinstance(kernel, InterpretedFunction)


def check_tensor(x, name: str, dtypes: tuple[torch.dtype, ...]) -> None:
    """A non-empty tensor of one of ``dtypes`` with fewer than 2**31 elements."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); expected at least one element")
    if x.numel() > MAX_NUMEL:
        raise ValueError(f"{name} has {x.numel()} elements; the kernels index with int32 (at most {MAX_NUMEL})")


def check_last_dim_divisible(x: torch.Tensor, name: str, m: int = 4) -> None:
    if x.dim() == 0 or x.shape[-1] % m != 0:
        raise ValueError(f"{name} must have a last dimension divisible by {m} (groups of {m}), "
                         f"got shape {tuple(x.shape)}")


def check_same_shape(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if x.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {ref_name}'s {tuple(ref.shape)}")


def check_device(kernel, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one device that ``kernel`` can run on; returns that device.

    CPU tensors need the interpreter (TRITON_INTERPRET=1 set before triton is imported); a
    compiled kernel given CPU tensors would fail deep inside the launcher.
    """
    devices = {name: t.device for name, t in tensors.items()}
    first_name, device = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != device:
            raise ValueError(f"{name} is on {dev} but {first_name} is on {device}; put them on one device")
    if device.type == "cpu" and not is_interpreted(kernel):
        raise RuntimeError(
            f"{first_name} is on the CPU but Triton kernels are compiled for a GPU here: move the "
            "tensors to CUDA, or set TRITON_INTERPRET=1 before triton is imported to run the "
            "kernels on the CPU through the (slow) interpreter")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{first_name} is on {device}; the Triton kernels run on CUDA (or CPU when interpreted)")
    return device


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """The kernels index flat row-major memory; non-contiguous inputs are copied first (one pass)."""
    return x if x.is_contiguous() else x.contiguous()


@triton.jit
def split4(x, BLOCK: tl.constexpr):
    """[4 * BLOCK] (groups of 4 consecutive elements) -> the four members, each [BLOCK]."""
    even, odd = tl.split(tl.reshape(x, [BLOCK, 2, 2]))  # even[g, i] = x[4g + 2i]
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def join4(x0, x1, x2, x3, BLOCK: tl.constexpr):
    """Inverse of :func:`split4`: four [BLOCK] tensors -> [4 * BLOCK], member j of group g at 4g + j."""
    return tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)), [BLOCK * 4])


@triton.jit
def keep_top2(a0, a1, a2, a3):
    """Which two of four magnitudes a 2:4 magnitude mask keeps; ties go to the lowest index.

    rank_i = #{j: a_j > a_i} + #{j < i: a_j == a_i}; keep_i = rank_i < 2. Six comparisons:
    ``gt_ij = a_i > a_j`` for i < j, and "j beats i" is ``a_j > a_i`` (j > i) or ``a_j >= a_i`` (j < i).
    """
    # NaN compares false with everything: the ranks would collide (3 kept, or 1). As in the
    # reference (masks.tiles.finite_magnitudes) a NaN ranks as the largest magnitude.
    a0 = tl.where(a0 == a0, a0, float("inf"))
    a1 = tl.where(a1 == a1, a1, float("inf"))
    a2 = tl.where(a2 == a2, a2, float("inf"))
    a3 = tl.where(a3 == a3, a3, float("inf"))
    # b_ji: does a_j beat a_i?  For j < i that is not (a_i > a_j).
    b10 = a1 > a0
    b20 = a2 > a0
    b30 = a3 > a0
    b21 = a2 > a1
    b31 = a3 > a1
    b32 = a3 > a2
    r0 = b10.to(tl.int32) + b20.to(tl.int32) + b30.to(tl.int32)
    r1 = (1 - b10.to(tl.int32)) + b21.to(tl.int32) + b31.to(tl.int32)
    r2 = (1 - b20.to(tl.int32)) + (1 - b21.to(tl.int32)) + b32.to(tl.int32)
    r3 = (1 - b30.to(tl.int32)) + (1 - b31.to(tl.int32)) + (1 - b32.to(tl.int32))
    return r0 < 2, r1 < 2, r2 < 2, r3 < 2
