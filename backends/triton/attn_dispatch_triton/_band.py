"""The band of keys each query row sees (``adb.Band``, the call's ``inp.band``) as the kernels'
arguments.

Row ``i``'s diagonal is ``d_i = i`` (top-left) or ``i + Sk - Sq`` (``band.bottom_right``); key
``j`` is visible iff ``d_i - left <= j <= d_i + right``, a side ``None`` being unbounded. The
kernels take the two sides as runtime ints and whether each is bounded as constexprs
(``LIMIT_LEFT`` / ``LIMIT_RIGHT``), so an unbounded side costs no mask and no bound arithmetic;
with varlen inputs the diagonal is taken per sequence in the kernels. The core already folded
the causal mask in and made a side that excludes no key unbounded (no side is wider than a
sequence, so the kernels' int32 band arithmetic cannot overflow).

Host side only (no triton import).
"""

from __future__ import annotations

from attn_dispatch import backend as adb


def constexprs(band: adb.Band) -> dict[str, bool]:
    """The kernels' compile-time flags for ``band``."""
    return dict(
        LIMIT_LEFT=band.left is not None,
        LIMIT_RIGHT=band.right is not None,
        BOTTOM_RIGHT=band.bottom_right,
    )


def sides(band: adb.Band) -> tuple[int, int]:
    """The kernels' runtime ``(win_left, win_right)`` (0 for an unbounded side)."""
    return band.left or 0, band.right or 0
