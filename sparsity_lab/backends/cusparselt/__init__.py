"""The cuSPARSELt backend: 2:4 products on the sparse tensor cores (validated on the H100).

    backend     CusparseltBackend (the backend interface of ``backends/base.py``) and its CPU fallback
    operand     the step's weight operand and its compression (the backend's part before the products)
    activation  the 2:4 activation products (the activation the sparse operand: Act24MLP)
    measure     the auto policy's timing of one product, dense against sparse
    ops         the contract of PyTorch's ``torch._cslt_*`` ops, checked shapes and dtypes
    direct      the direct ctypes binding with a cached plan (little host time per product)
    algorithms  the matmul algorithm chosen per product shape, cached
    auto        the "cusparselt_auto" policy: sparse per product shape only where it beats dense
    fp8_train   the FP8 training backends "cusparselt_fp8", "fp8_dense", "fp8_reference" (one recipe,
                three ways to run the products; per-layer scaling state)
    fp8_direct  the direct binding for FP8 (E4M3) 2:4 products, scales read on the device
    fp8_algorithms  the FP8 algorithm (id, split-k) chosen per product shape, each checked first

The compressed layout itself (what ``_cslt_compress`` writes) is a reference:
``sparsity_lab.references.cusparselt_layout``. Importing this package imports no triton.
"""
