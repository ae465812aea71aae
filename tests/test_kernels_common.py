"""The shared argument checks of the kernel wrappers."""
import pytest
import torch
import _kernel_testing  # noqa: F401  (skips this file where triton is not installed)

from sparsity_lab.kernels._common import check_device, check_tensor


def test_cpu_tensors_for_a_compiled_kernel_are_a_clear_error():
    compiled = object()  # anything that is not an interpreted kernel
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        check_device(compiled, w=torch.randn(4))


def test_tensors_on_two_devices_are_named():
    meta = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match="mask is on meta but w is on cpu"):
        check_device(object(), w=torch.randn(4), mask=meta)


def test_dtype_and_emptiness_are_named():
    with pytest.raises(TypeError, match="w must have dtype in"):
        check_tensor(torch.ones(3, dtype=torch.int8), "w", (torch.float32,))
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        check_tensor([1.0], "w", (torch.float32,))
    with pytest.raises(ValueError, match="w is empty"):
        check_tensor(torch.ones(0), "w", (torch.float32,))
