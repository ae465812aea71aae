"""Baselines of the measurements: kernel variants that were measured against the shipped kernels and
lost, kept so that the measurement that chose the shipped kernel can be run again
(``python -m benchmarks mvue_variants``, ``python -m benchmarks.kernel_configs --sections gelu``). Not installed,
never imported by the library.

    mvue24      the MVUE 2:4 variants measured against ``sparsity_lab.kernels.mvue24`` (``mvue24(x, variant=...)``)
    mvue24_v2   the group arithmetic of the "v2" variants (known wrong: float32 cancellation)
    gelu_mvue_compress24  kernel 10 fused into GELU's backward (``kernel_configs --sections gelu``)
"""
