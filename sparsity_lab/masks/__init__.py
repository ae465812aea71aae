"""N:M masks, transposable-mask solvers, validation, mask diversity and solver quality."""
from .diversity import count_fixed_line_sums, mask_diversity
from .nm import is_nm, kept_fraction, nm_mask
from .patterns import transposable_patterns
from .tiles import from_tiles, is_transposable, to_tiles, validate_transposable_mask
from .transposable import EXACT_SOLVERS, SOLVERS, transposable_mask

__all__ = [
    "EXACT_SOLVERS", "SOLVERS", "count_fixed_line_sums", "from_tiles", "is_nm", "is_transposable",
    "kept_fraction", "mask_diversity", "nm_mask", "to_tiles", "transposable_mask",
    "transposable_patterns", "validate_transposable_mask",
]
