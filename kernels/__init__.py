"""Triton kernels for 2:4 training (imported as ``sparsity_lab.kernels``).

One module per kernel, each a literate file: the idea, the bytes it moves, the ``@triton.jit``
kernel and a checked Python wrapper. Every kernel has a plain PyTorch reference elsewhere in the
package (named in its docstring) and a test against it (tests/test_kernels_*.py), run on CPU under
``TRITON_INTERPRET=1`` and on a GPU with ``pytest -m gpu``.

    prune24            1. row-wise 2:4 magnitude prune, uint8 group mask
    transposable24     2. exact transposable 2:4 mask (90 patterns), pruned W and W^T
    soft_threshold24   3. S-STE soft threshold times beta
    mvue24             4. MVUE 2:4 with a counter-based RNG, groups along any dim
    masked_decay       5. g += lambda * (1 - m) * w, in place
    gated              6. SwiGLU / GEGLU forward and backward, row-major or transposed layout
    fp8_cast           7. FP8 per-tensor amax, scale, cast (E4M3 / E5M2) and back
    compress24         8. a 2:4 matrix into cuSPARSELt's sm90 compressed layout (values + metadata)
    count_flips        9. entries where two masks differ, counted on the device
    mvue_compress24   10. MVUE 2:4 of dZ along the tokens, written straight into cuSPARSELt's layout
    prepare24         11. S(W) and S(W)^T (soft threshold or mask) compressed straight from W, one pass
    act24             12. squared ReLU + 2:4 selection of an activation, compressed for cuSPARSELt, one pass
    act24_backward    13. its straight-through gradient dH, recomputing the selection, compressed, one pass
    fp8_cast_transpose 14. FP8 cast writing q and q^T in one pass (the weight gradient reads q(X)^T)
    scale_product     15. a product multiplied in place by two per-tensor scales read on the device
    relu2             16. squared ReLU forward and backward, one pass each
    prune24_tokens    17. permuted tokens of chosen features gathered, 2:4 along the tokens, compressed, one pass
    prepare24_fp8     18. q(S(W)) and q(S(W))^T in FP8 (kernel 11 casting before its stores), and amax(S(W))
    mvue_compress24   19. mvue_compress24_fp8: kernel 10 casting MVUE(dZ) to FP8 before its store, and its amax
    adamw_master      20. AdamW on float32 masters from bf16 gradients (+ masked decay), bf16 weights out, one pass
    refresh24         21. a step's mask refresh: kernels 2, 9 and 11 in one pass (mask in place, flips, S(W), S(W)^T)
    refresh24_fp8     21. the same with E4M3 operands: kernels 2, 9 and 18 in one pass (delayed scaling)
    prepare24_cutlass 22. S(W) and S(W)^T (bf16, or E4M3 with a given scale) straight from W into CUTLASS's SM90 layout
    mvue_compress24_cutlass 23. MVUE 2:4 of dZ along the tokens (bf16, or E4M3 and its amax) into CUTLASS's SM90 layout
    refresh24_cutlass 24. kernel 21 for CUTLASS: kernels 2, 9 and 22 in one pass (mask in place, flips, bf16 or E4M3 forms)
    fp8_scale_update  25. an FP8 layer's end-of-step scale update (amax window, scales, rolled history) in one launch
    adamw_prepare24   26. kernel 20's step of a 2:4 weight also writing kernel 11's S(W) and S(W)^T from the new W

Importing this package imports triton: set TRITON_INTERPRET=1 first to run on a CPU.
"""
from .act24 import act24
from .adamw_master import adamw_master_
from .adamw_prepare24 import adamw_master_prepare24_
from .act24_backward import act24_backward
from .compress24 import compress24
from .count_flips import count_flips
from .fp8_cast import amax, dequantize_fp8, quantize_fp8, quantize_fp8_with_scale
from .fp8_cast_transpose import quantize_fp8_transposed
from .fp8_scale_update import fp8_scale_update_
from .gated import gated_backward, gated_forward
from .masked_decay import masked_decay_
from .mvue24 import mvue24
from .mvue_compress24 import mvue24_amax, mvue_compress24, mvue_compress24_fp8
from .mvue_compress24_cutlass import mvue_compress24_cutlass, mvue_compress24_cutlass_amax, mvue_compress24_cutlass_fp8
from .prepare24 import prepare24
from .prepare24_fp8 import prepare24_amax, prepare24_fp8
from .prepare24_cutlass import prepare24_cutlass, prepare24_cutlass_amax, prepare24_cutlass_fp8
from .prune24 import pack_mask24, prune24, unpack_mask24
from .prune24_tokens import prune24_tokens
from .refresh24 import refresh24, refresh24_fp8
from .refresh24_cutlass import refresh24_cutlass, refresh24_cutlass_fp8
from .relu2 import relu2_backward, relu2_forward
from .scale_product import scale_product_
from .soft_threshold24 import soft_threshold24
from .transposable24 import transposable_mask24

__all__ = [
    "act24", "act24_backward", "adamw_master_", "adamw_master_prepare24_", "amax", "compress24", "count_flips", "dequantize_fp8", "fp8_scale_update_", "gated_backward", "gated_forward", "masked_decay_", "mvue24", "mvue24_amax", "mvue_compress24",
    "mvue_compress24_cutlass", "mvue_compress24_cutlass_amax", "mvue_compress24_cutlass_fp8", "mvue_compress24_fp8", "pack_mask24",
    "prepare24", "prepare24_amax", "prepare24_cutlass", "prepare24_cutlass_amax", "prepare24_cutlass_fp8", "prepare24_fp8", "prune24", "prune24_tokens", "quantize_fp8", "quantize_fp8_transposed", "quantize_fp8_with_scale", "refresh24", "refresh24_cutlass",
    "refresh24_cutlass_fp8", "refresh24_fp8", "relu2_backward",
    "relu2_forward", "scale_product_",
    "soft_threshold24", "transposable_mask24",
    "unpack_mask24",
]
