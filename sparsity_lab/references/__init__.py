"""Plain-PyTorch ground truth that the kernels and fast backends are tested against."""
