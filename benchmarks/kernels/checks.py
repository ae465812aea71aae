"""Each kernel's output is checked against its PyTorch reference on the benchmark tensors before it
is timed; a failed check is recorded and that kernel's section is not timed."""
from __future__ import annotations

import contextlib

import torch


def ulp_ok(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 1.0) -> bool:
    """Every element within ``ulps`` units of the expected dtype's epsilon (relative), or tiny."""
    info = torch.finfo(expected.dtype)
    a, e = actual.float(), expected.float()
    return bool(((a - e).abs() <= ulps * info.eps * e.abs() + info.tiny).all())


class CheckFailed(AssertionError):
    pass


def check(name: str, ok: bool) -> None:
    """Print the check's outcome; a failed one raises CheckFailed (caught by :func:`section`)."""
    print(f"  check {name}: {'ok' if ok else 'FAILED'}")
    if not ok:
        raise CheckFailed(f"{name} does not match its reference")


@contextlib.contextmanager
def section(name: str, failures: list):
    """A kernel's check and timings: a failed check is recorded and the kernel is not timed."""
    try:
        yield
    except CheckFailed as err:
        failures.append(str(err))
        print(f"  {name}: NOT timed ({err})")
