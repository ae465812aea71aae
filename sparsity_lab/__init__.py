"""sparsity-lab: learn and do 2:4 sparse pre-training of transformers.

    import sparsity_lab as sl
    sl.sparsify(model, sl.MaskedDecay(decay=6e-5, total_steps=10_000))
    opt = torch.optim.AdamW(model.parameters())
    sl.attach_optimizer(model, opt)        # masked decay on gradients before each step, counters after it
"""
from .layers import SparseLinear
from .masks import (is_nm, is_transposable, kept_fraction, mask_diversity, nm_mask, transposable_mask,
                    validate_transposable_mask)
from .methods import (SRSTE, SSTE, STE, Dense, MaskedDecay, MaskedDecayOnWeights, MethodHandler, SparsityMethod,
                      flip_rate, method_from_name, method_handler, mvue24, register_method, soft_threshold, sste_beta)
from .sparsify import flip_report, sparsify, sparsity_summary
from .training_hooks import (advance_step, apply_decay_on_weights, apply_masked_decay, attach_optimizer,
                             sparse_layers)
from .graph_step import CudaGraphStep
from .export import Sparse24Linear, export, save_compressed_tensors

__version__ = "0.1.0"


__all__ = [
    "CudaGraphStep", "Sparse24Linear", "export", "save_compressed_tensors", "SRSTE", "SSTE", "STE", "Dense",
    "MaskedDecay", "MaskedDecayOnWeights", "MethodHandler", "SparseLinear", "SparsityMethod", "advance_step",
    "apply_decay_on_weights", "apply_masked_decay", "attach_optimizer", "flip_rate", "flip_report", "is_nm", "is_transposable",
    "kept_fraction", "mask_diversity", "method_from_name", "method_handler", "mvue24", "nm_mask", "register_method",
    "soft_threshold",
    "sparse_layers", "sparsify", "sparsity_summary", "sste_beta", "transposable_mask",
    "validate_transposable_mask",
]
