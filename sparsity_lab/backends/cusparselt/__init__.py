"""The cuSPARSELt backend: 2:4 products on the sparse tensor cores (validated on the H100).

    backend     CusparseltBackend (the backend interface of ``backends/base.py``) and its CPU fallback
    operand     the step's weight operand and its compression (the backend's part before the products)
    measure     the auto policy's timing of one product, dense against sparse
    ops         the contract of PyTorch's ``torch._cslt_*`` ops, checked shapes and dtypes
    direct      the direct ctypes binding with a cached plan (about 0.01 ms of host time per product)
    algorithms  the matmul algorithm chosen per product shape, cached
    auto        the "cusparselt_auto" policy: sparse per product shape only where it beats dense
    fp8         the FP8 sparse product (E4M3 operands, ``torch._scaled_mm`` for the dense side)

The compressed layout itself (what ``_cslt_compress`` writes) is a reference:
``sparsity_lab.references.cusparselt_layout``. Importing this package imports no triton.
"""
