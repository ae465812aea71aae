"""Training methods (config objects) and the functions they are built from."""
from .config import (METHODS, SRSTE, SSTE, STE, Dense, MaskedDecay, MaskedDecayOnWeights, SparsityMethod,
                     method_from_name)
from .flip_rate import flip_rate, mask_flips, overall_flip_rate
from .handlers import MethodHandler, method_handler, register_method
from .mvue import mvue24, mvue_probabilities, sequential_probabilities, top2_24
from .soft_threshold import soft_threshold, sste_beta

__all__ = [
    "METHODS", "SRSTE", "SSTE", "STE", "Dense", "MaskedDecay", "MaskedDecayOnWeights", "MethodHandler",
    "SparsityMethod", "flip_rate", "mask_flips", "method_from_name", "method_handler", "mvue24", "mvue_probabilities",
    "overall_flip_rate", "register_method", "sequential_probabilities", "soft_threshold", "sste_beta", "top2_24",
]
