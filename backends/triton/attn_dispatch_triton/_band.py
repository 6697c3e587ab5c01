"""The band of keys each query row sees: causal mask and sliding window as one description.

Row ``i``'s diagonal is ``d_i = i`` (``causal_align="top_left"``) or ``i + Sk - Sq``
(``"bottom_right"``); key ``j`` is visible iff ``d_i - left <= j <= d_i + right``, a side set to
``None`` being unbounded. ``causal=True`` caps ``right`` at 0. The kernels take the two sides as
runtime ints and whether each is bounded as constexprs (``LIMIT_LEFT`` / ``LIMIT_RIGHT``), so an
unbounded side costs no mask and no bound arithmetic; with varlen inputs the diagonal is taken
per sequence in the kernels.

Host side only (no triton import): the plugin reads it to route calls.
"""

from __future__ import annotations

from typing import NamedTuple

import attn_dispatch as ad

Window = tuple[int | None, int | None]
CAUSAL_ALIGNS = ("top_left", "bottom_right")


class Band(NamedTuple):
    """Keys ``d_i - left .. d_i + right`` of row ``i`` (``None``: that side unbounded)."""

    left: int | None
    right: int | None
    bottom_right: bool  # the diagonal's alignment (meaningless when neither side is bounded)

    @property
    def limited(self) -> bool:
        """Whether any key is ever outside the band (a mask exists at all)."""
        return self.left is not None or self.right is not None

    def constexprs(self) -> dict[str, bool]:
        """The kernels' compile-time flags for this band."""
        return dict(
            LIMIT_LEFT=self.left is not None,
            LIMIT_RIGHT=self.right is not None,
            BOTTOM_RIGHT=self.bottom_right,
        )

    def sides(self) -> tuple[int, int]:
        """The kernels' runtime ``(win_left, win_right)`` (0 for an unbounded side)."""
        return self.left or 0, self.right or 0


def effective_band(
    causal: bool, causal_align: str, window: Window | None, seqlen_q: int, seqlen_k: int
) -> Band:
    """The band a call computes, from the user's flags (``window`` as given: causal not folded
    in; ``seqlen_q`` / ``seqlen_k`` the longest sequences when varlen).

    A side that excludes no key at these lengths becomes ``None`` (top-left: ``left >= Sq``,
    ``right >= Sk``; bottom-right: ``left >= Sk``, ``right >= Sq``), so a window wider than the
    sequences runs the unmasked kernels. Neither side bounded: ``bottom_right`` is normalised to
    False (one compiled variant).
    """
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align={causal_align!r}: must be one of {CAUSAL_ALIGNS}")
    left, right = ad.band_sides(None if window is None else _checked_window(window), causal)
    bottom_right = causal_align == "bottom_right"
    left_reach, right_reach = (seqlen_k, seqlen_q) if bottom_right else (seqlen_q, seqlen_k)
    if left is not None and left >= left_reach:
        left = None
    if right is not None and right >= right_reach:
        right = None
    if left is None and right is None:
        bottom_right = False
    return Band(left, right, bottom_right)


def _checked_window(window: object) -> Window:
    if not (isinstance(window, tuple) and len(window) == 2):
        raise TypeError(f"window={window!r}: must be a (left, right) tuple")
    for side in window:
        if side is not None and (isinstance(side, bool) or not isinstance(side, int) or side < 0):
            raise ValueError(f"window={window!r}: each side must be an int >= 0 or None")
    return window  # type: ignore[return-value]
