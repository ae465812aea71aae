"""Kernel 25 (an FP8 layer's end-of-step scale update in one launch) against ``FP8ScalingState``'s PyTorch
operations (``_advance_ops``): scales, inverse scales, next scales and the rolled history, to the bit."""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.kernels import fp8_scale_update_
from sparsity_lab.methods import fp8_scaling
from sparsity_lab.methods.fp8_scaling import FP8Recipe, FP8ScalingState

# amaxes a window can hold: zeros (no step recorded), subnormal and huge values (next scales that underflow
# and overflow), the FP8 maxima themselves (r exactly a power of two or one), and the values an overflow leaves
SPECIAL = (0.0, 1e-45, 3e-41, 1.2e-38, 2.0 ** -120, 448.0, 57344.0, 448.0 * 2 ** -7, 0.1, 3.0, 1e30, 3.4e38,
           float("inf"), float("nan"))


def _states(recipe, history, scale, next_scale, device):
    """Two states with the same buffers on ``device``: one for the kernel, one for the PyTorch operations."""
    state = FP8ScalingState(recipe, device=device)
    state.amax_history.copy_(history)
    state.scale.copy_(scale)
    state.inv_scale.copy_(1.0 / scale)
    if recipe.lag:
        state.next_scale.copy_(next_scale)
    return state, copy.deepcopy(state)


def _buffers(state):
    return {name: buf.clone() for name, buf in state.named_buffers()}


def _check_one_update(rows, host_alpha, most_recent, margin, e5m2, seed, special, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    history = torch.rand(rows, 4, generator=gen) * torch.exp2(torch.randint(-30, 30, (rows, 4), generator=gen).float())
    picks = torch.rand(rows, 4, generator=gen) < special  # some entries from SPECIAL
    chosen = torch.tensor(SPECIAL)[torch.randint(len(SPECIAL), (rows, 4), generator=gen)]
    history = torch.where(picks, chosen, history)
    scale = torch.exp2(torch.randint(-10, 10, (4,), generator=gen).float()) * (1.0 if host_alpha else 1.37)
    recipe = FP8Recipe(scale_in_product="host_alpha" if host_alpha else "pass", history_len=rows,
                       amax_compute="most_recent" if most_recent else "max", margin=margin,
                       grad_format="e5m2" if e5m2 else "e4m3")
    kernel, ops = _states(recipe, history, scale, torch.exp2(torch.randint(-5, 5, (4,), generator=gen).float()), device)
    fp8_scale_update_(kernel.amax_history, kernel.fp8_max, kernel.scale, kernel.inv_scale,
                      kernel.next_scale if host_alpha else None, most_recent=most_recent, margin=margin)
    ops._advance_ops()
    got, want = _buffers(kernel), _buffers(ops)
    for name in want:
        assert torch.equal(got[name].view(torch.int32), want[name].view(torch.int32)), (name, got[name], want[name])


@settings(max_examples=40, deadline=None)
@given(rows=st.sampled_from([1, 2, 3, 16, 17]), host_alpha=st.booleans(), most_recent=st.booleans(),
       margin=st.integers(0, 3), e5m2=st.booleans(), seed=st.integers(0, 2**31 - 1), special=st.floats(0, 1))
def test_one_launch_updates_the_state_as_the_operations_do(rows, host_alpha, most_recent, margin, e5m2, seed, special):
    _check_one_update(rows, host_alpha, most_recent, margin, e5m2, seed, special)


@pytest.mark.gpu
def test_one_launch_on_the_gpu_as_the_operations_there():
    """The compiled kernel against the same operations on the GPU (division and rounding in CUDA's float32)."""
    gen = torch.Generator().manual_seed(11)
    for case in range(300):
        rows = (1, 2, 3, 16, 17, 1024)[case % 6]
        _check_one_update(rows, case % 2 == 0, case % 3 == 0, case % 4, case % 5 == 0,
                          int(torch.randint(2**31 - 1, (1,), generator=gen)), (case % 7) / 6, device="cuda")


def test_advance_runs_the_kernel_and_trains_its_scales_as_the_operations(monkeypatch):
    """A state whose advance takes kernel 25 (widened to the CPU interpreter here) and one that runs the operations:
    the same scales, histories, host exponents and extra state over several steps, for both recipes."""
    for recipe in (FP8Recipe(), FP8Recipe(scale_in_product="host_alpha", history_len=3)):
        states = {}
        for one_launch in (True, False):
            monkeypatch.setattr(fp8_scaling, "_one_launch", lambda h, one_launch=one_launch: one_launch)
            state = FP8ScalingState(recipe, device=DEVICE)
            for step in range(5):
                for i, tensor in enumerate(fp8_scaling.TENSORS):
                    state.record(tensor, torch.tensor(0.5 + step * (i + 1.0), device=DEVICE))
                state.advance()
            states[one_launch] = state
        a, b = states[True], states[False]
        assert all(torch.equal(x, y) for x, y in zip(_buffers(a).values(), _buffers(b).values()))
        assert a.host_exponents == b.host_exponents and a.updates == b.updates == 5
        assert torch.equal(a.get_extra_state(), b.get_extra_state())


def test_bad_inputs_are_refused_naming_the_argument():
    hist, four = torch.zeros(4, 4, device=DEVICE), torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match="history must be a contiguous float32"):
        fp8_scale_update_(hist.t().contiguous()[:, :3], four, four.clone(), four.clone())
    with pytest.raises(ValueError, match="history must be"):
        fp8_scale_update_(hist.double(), four, four.clone(), four.clone())
    with pytest.raises(ValueError, match="inv_scale must be"):
        fp8_scale_update_(hist, four, four.clone(), torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match="next_scale must be"):
        fp8_scale_update_(hist, four, four.clone(), four.clone(), torch.ones(4, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="margin must be"):
        fp8_scale_update_(hist, four, four.clone(), four.clone(), margin=-1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
def test_the_host_time_benchmark_without_a_gpu_says_so(capsys):
    from benchmarks.fp8_scale_update import main
    assert main([]) == 2 and "on a CUDA GPU" in capsys.readouterr().err
