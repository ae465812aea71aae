"""``python -m benchmarks kernels``: the Triton kernels against the copy ceiling and their baselines (GPU).

One run, one GPU, everything side by side:
* the ceiling: device-to-device copy bandwidth (bytes read + bytes written per second), measured first;
* memory-bound kernels (1 prune, 3 soft threshold, 4 MVUE, 5 masked decay, 7 FP8): tensors of at
  least 64 MiB, bytes counted as each input read once and each output written once, printed as a
  fraction of the ceiling (target >= 0.70); a few block sizes / warp counts are timed per kernel
  and the best is reported (all are in the JSON);
* 2 transposable mask: exact (checked against the 90-pattern reference in the same run), timed
  against ``torch._sparse_semi_structured_tile`` on the same matrix and against the plain PyTorch
  90-pattern search (``masks.patterns.solve_patterns`` plus the pruned W and W^T); targets >= 1x
  and >= 10x;
* 6 gated activations: fused against the unfused PyTorch sequence (forward: split, activation,
  product; backward: autograd of that sequence), both layouts, ratio printed;
* 16 squared ReLU: forward and backward as fractions of the ceiling, and forward + backward against
  the two-pass PyTorch expression F.relu(h).square() with its autograd backward, h (16384, 16384) bf16
  at the default size;
* 21 the mask refresh in one pass (mask in place, flips, S(W) and S(W)^T compressed) against the chain it
  replaces (kernel 2's mask, kernel 9's flips, the mask copy, kernel 11), bf16 W of 16384 x 4096 and
  4096 x 16384 at the default size, S-STE, STE, and the mask with its flips alone; bytes, ms and the
  fraction of the ceiling for both, and the chain's parts timed one by one (``--only 21`` runs just these);
* 24 the same refresh writing CUTLASS's layout (bf16 S-STE and STE, E4M3 with a given scale, the mask and
  flips alone) against its chain (kernels 2, 9, the mask copy, 22), likewise (``--only 24``).
``--only 16`` (numbers, comma-separated) runs only those sections, into <name>_only_<numbers>.json.
Every kernel's output is checked against its PyTorch reference on the benchmark tensors before it
is timed. Times: ``triton.testing.do_bench`` medians (it clears the L2 between runs).
The last line of the table is the worst fraction of the ceiling. Writes results/<name>.json.
``--smoke`` runs tiny sizes on the CPU through the Triton interpreter (a test of this script; its
numbers mean nothing).

One module per part: ``run`` (the command: sizes, the copy ceiling, the sections in order, the JSON),
``bench`` (what the sections share), ``checks``, ``report`` (the table), and the sections, one
function per kernel: ``masks`` (1, 2, 3, 9), ``gradients`` (4, 5), ``activations`` (6, 7, 16),
``compressed`` (8, 10, 11, 17, 22, 23), ``refresh`` (21, 24).
"""
from benchmarks.kernels.report import Report
from benchmarks.kernels.run import add_arguments, check_arguments, run

__all__ = ["Report", "add_arguments", "check_arguments", "run"]
