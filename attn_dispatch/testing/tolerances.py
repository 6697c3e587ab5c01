"""Per-dtype tolerances for comparing a backend's results with the float64 oracle.

The table and its derivation live in the core (:mod:`attn_dispatch._tolerances`), where
autotune's cross-check reads it too; this is the kit's public name for it.
"""

from .._tolerances import (
    BFLOAT16,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    TF32,
    Tolerance,
    error_metrics,
    tolerance_for,
)

__all__ = [
    "BFLOAT16",
    "FLOAT16",
    "FLOAT32",
    "FLOAT64",
    "TF32",
    "Tolerance",
    "error_metrics",
    "tolerance_for",
]
