"""The CUTLASS backends: 2:4 products on Hopper's sparse tensor cores through CUTLASS's SM90 sparse GEMMs.

    sparse_gemm.cu  the kernels (CUTLASS's structured-sparse collective, bf16 and E4M3, scales read in the
                    epilogue) and CUTLASS's compressor, behind extern "C" entry points
    build           builds that source on demand with nvcc, cached by a hash of source, flags and tools
    ops             the entry points as tensor functions (ctypes): compress, mm, the shape rules
    backend         "cutlass": bfloat16 products for SparseLinear (weight operands written by kernel 22,
                    ``kernels/prepare24_cutlass.py``, the weight gradient's MVUE(dZ^T) by kernel 23,
                    ``kernels/mvue_compress24_cutlass.py``, in the layout of ``references/cutlass_layout.py``)
    fp8             "cutlass_fp8": the FP8 training recipe's products, E4M3 with device scales

Importing this package imports neither CUDA tools nor triton; nothing is built until a backend or
``ops`` function is first used.
"""
