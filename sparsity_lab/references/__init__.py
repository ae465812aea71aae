"""Plain-PyTorch ground truth that the Triton kernels (``sparsity_lab.kernels``) are tested against.

    fp8                FP8 per-tensor quantization with current-amax scaling (E4M3 / E5M2)
    gated              SwiGLU / GEGLU forward and backward, row-major or transposed layout
    cusparselt_layout  cuSPARSELt's compressed 2:4 layout on sm90 (values + metadata), packed and unpacked
    cutlass_layout     CUTLASS's SM90 structured-sparse operand (values + metadata), packed and unpacked
    act24              squared ReLU pruned to 2:4 along the hidden dimension, its straight-through gradient
    relu2              squared ReLU relu(h)^2 and its gradient, as autograd computes them for F.relu(h).square()
    adamw_master       AdamW on a float32 master fed a bf16 gradient, the bf16 weight written back rounded

Each module imports only torch and the standard library, so a kernel may import it (and nothing
else from the package) without pulling in the layers or the backends.
"""
