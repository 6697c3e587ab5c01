"""Per-dtype tolerances for comparing a backend's results with the float64 oracle.

The table and its derivation live in the core (:mod:`attn_dispatch._tolerances`), where
autotune's cross-check reads it too; this is the kit's public name for it.
"""

from .._tolerances import *  # noqa: F403 (the kit's name for every one of them)
from .._tolerances import __all__  # noqa: F401
