"""The MVUE variants benchmark: its checks can fail, and its smoke run (CPU interpreter) passes."""
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.mvue_checks import check_independent_neighbours, check_support_and_values, check_unbiased
from benchmarks.mvue_variants import CONFIGS, DIAGNOSTICS, SAME_KERNEL
from sparsity_lab.methods.mvue import mvue24 as reference_mvue24
from sparsity_lab.methods.mvue import mvue_probabilities

# the v2 baselines are run on purpose here; test_baseline_variants_warn checks the warning
pytestmark = pytest.mark.filterwarnings("ignore:MVUE variant .* is a measurement baseline")


def _groups(n=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen, dtype=torch.float64)
    x[x.abs() < 0.3] = 0
    x[0] = torch.tensor([0.0, 2.0, 0.0, 0.0])
    x[5] = torch.tensor([1.0, -2.0, 3.0, 4.0])
    x[6] = torch.tensor([1.0, 0.0, -3.0, 0.0])
    return x, mvue_probabilities(x)


def test_support_and_values_check_accepts_the_reference_and_rejects_wrong_outputs():
    x, p = _groups()
    y = reference_mvue24(x, generator=torch.Generator().manual_seed(1))
    assert check_support_and_values(x, y, p) == (True, "ok")
    three = y.clone()
    three[5] = x[5] / p[5]  # all four kept, each with its right value
    assert check_support_and_values(x, three, p) == (False, "a group keeps 4 entries")
    wrong = y.clone()
    kept = wrong != 0
    wrong[kept] *= 1.1
    assert not check_support_and_values(x, wrong, p)[0]
    changed = y.clone()
    changed[0, 1] = 0.0  # the single non-zero of group 0 dropped
    assert not check_support_and_values(x, changed, p)[0]
    zero_kept = y.clone()
    zero_kept[6] = torch.tensor([0.0, 1.0, -3.0, 0.0])  # x = [1, 0, -3, 0]: its zero (p = 0) kept
    assert check_support_and_values(x, zero_kept, p) == (False, "an entry with p = 0 was kept")


def test_unbiasedness_check_accepts_the_reference_and_rejects_a_bias():
    x, p = _groups(n=32, seed=2)
    draws = 200
    ys = reference_mvue24(x.unsqueeze(0).expand(draws, -1, -1).contiguous(), generator=torch.Generator().manual_seed(3))
    mean, freq = ys.mean(0), (ys != 0).double().mean(0)
    assert check_unbiased(x, mean, freq, p, draws, ulp=0.0)[0]
    assert not check_unbiased(x, mean * 1.5, freq, p, draws, ulp=0.0)[0]  # every kept value 1.5x too large
    top2 = torch.zeros_like(x).scatter(1, x.abs().topk(2, 1).indices, 1.0).bool()  # deterministic top-2
    assert not check_unbiased(x, torch.where(top2, x / p.clamp_min(1e-300), 0.0), top2.double(), p, draws, 0.0)[0]


def test_independence_check_rejects_duplicated_draws():
    gen = torch.Generator().manual_seed(4)
    code = torch.where(torch.rand(128, 32, generator=gen) < 0.5, 5, 10)
    assert check_independent_neighbours(code) == (True, "ok")
    shared = code.clone()
    shared[:, 1::4] = shared[:, 0::4]  # groups 4q and 4q+1 share a uniform
    assert not check_independent_neighbours(shared)[0]
    assert not check_independent_neighbours(torch.full((8, 8), 6))[0]


@pytest.mark.triton  # runs the Triton variants (interpreted on the CPU)
def test_smoke_run_checks_every_variant_and_writes_json(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    out = tmp_path / "variants.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.mvue_variants", "--smoke", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["smoke"] is True and "provenance" in result and not result["failures"]
    timed = {(r["variant"], r["dim"], r["block"], r["num_warps"]) for r in result["rows"] if not r["diagnostic"]}
    expected = {(v, d, b, w) for (v, d), cfgs in CONFIGS.items() for b, w in cfgs if (v, d) not in SAME_KERNEL}
    assert timed == expected
    assert all(r["correct"] for r in result["rows"] if not r["diagnostic"])
    diagnostics = {(r["variant"], r["dim"]) for r in result["rows"] if r["diagnostic"]}
    assert diagnostics == {(f"{v} constant u", d) for v, d in DIAGNOSTICS}
    assert all(not r["correct"] for r in result["rows"] if r["diagnostic"])  # never eligible as a winner
    assert "best correct configuration" in proc.stdout
