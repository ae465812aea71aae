"""Triton kernels for 2:4 training (imported as sparsity_lab.kernels)."""
