"""What FlashAttention-4 runs, decided from installed metadata and the inputs alone.

Nothing here imports FA4 or CUTLASS (``import flash_attn.cute.interface`` takes seconds): the
version gate reads package metadata against the table of tested releases (``_releases``), and
the support rules restate FA4's own checks (``flash_attn/cute/interface.py`` of 4.0.0b36 and
4.0.0b40: ``_validate_head_dims``, the arch asserts of ``_flash_attn_fwd`` /
``_flash_attn_bwd``, ``_resolve_causal_local_window``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from importlib import metadata
from typing import NamedTuple

from attn_dispatch import backend as adb

from ._releases import Release, release_for, tested_versions

FA4_DISTRIBUTION = "flash-attn-4"
# The package's dependency (pyproject.toml), which pip resolves: the tested releases' span. The
# gate itself is the table of tested releases (``_releases.RELEASES``): a release inside this
# span without a row there (a beta between two tested ones) is refused all the same.
FA4_SPECIFIER = ">=4.0.0b36,<=4.0.0b40"
FA4_REQUIREMENT = FA4_DISTRIBUTION + FA4_SPECIFIER
# Where the two refusals below that are not the dQ accumulator defect were observed.
OBSERVED_ON = "4.0.0b36"
# The module whose functions the backend calls; FlashAttention-2 ('flash-attn') ships an older
# flash_attn/cute package of its own, and whichever distribution installs last owns the files.
FA4_INTERFACE_FILE = "flash_attn/cute/interface.py"

# Blackwell head dims (interface.py, _validate_head_dims): D and Dv each a multiple of 8 in
# 8..128, or exactly one of these pairs (Dv = 512 is MLA only, with a separate qv input).
SM100_LARGE_HEAD_DIMS = frozenset({(192, 128), (256, 256)})


@functools.cache
def installed_version() -> str | None:
    """The installed ``flash-attn-4`` version (``None``: not installed). Reads metadata; cached
    for the process."""
    try:
        return metadata.version(FA4_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def installed_release() -> Release | None:
    """The row of the installed FA4 release (``None``: absent or untested)."""
    version = installed_version()
    return None if version is None else release_for(version)


def fa4_problem() -> str | None:
    """Why FA4 cannot be used here (absent, a release without a row in the table of tested
    releases, or its files replaced by another distribution), or ``None``. Reads metadata
    only; cached."""
    version = installed_version()
    tested = ", ".join(tested_versions())
    if version is None:
        return f"{FA4_DISTRIBUTION} is not installed (tested releases: {tested})"
    if release_for(version) is None:
        return (
            f"{FA4_DISTRIBUTION} {version} is installed; tested releases: {tested}: the backend "
            "stays off on another FA4 release until the head-dim GPU test "
            "(tests/test_flash_attn_cute_head_dims_gpu.py) and the GPU suite pass on it"
        )
    return _interface_replaced(FA4_DISTRIBUTION)


@functools.cache
def _interface_replaced(distribution: str) -> str | None:
    """Whether ``flash_attn/cute/interface.py`` is still ``distribution``'s own file (its hash in
    the distribution's RECORD); an install of flash-attn 2 after FA4 overwrites it."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return f"{distribution} is not installed"
    entry = next((f for f in dist.files or () if f.as_posix() == FA4_INTERFACE_FILE), None)
    if entry is None:
        return f"{distribution} lists no {FA4_INTERFACE_FILE}: not a usable installation"
    path = dist.locate_file(entry)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"{FA4_INTERFACE_FILE} of {distribution} cannot be read ({exc})"
    if entry.hash is None or entry.hash.mode != "sha256":
        return None  # an install without hashes (e.g. from a source tree): nothing to compare
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if digest != entry.hash.value:
        return (
            f"{path} is not {distribution}'s own file (another distribution, e.g. flash-attn 2, "
            f"replaced it): reinstall {distribution}"
        )
    return None


def sm90_head_dim_problem(
    head_dim: int, head_dim_v: int, gqa: bool, release: Release | None = None
) -> str | None:
    """Why FA4 ``release`` (default: the installed one) on sm_90 is not trusted with
    ``(head_dim, head_dim_v)`` (with GQA or not), naming the FA4 defect where one is known, or
    ``None`` when its row proves the head dims. ``None`` too without a row: the version gate
    refuses such a release, with its own reason."""
    release = release or installed_release()
    if release is None:
        return None
    proven = release.sm90_head_dims
    if head_dim == head_dim_v and head_dim in proven:
        return None
    kind = "GQA" if gqa else "MHA"
    admitted = ", ".join(str(d) for d in sorted(proven))
    tail = f"; admitted for {kind} (D = Dv): {admitted}"
    wrong = sorted({head_dim, head_dim_v} & release.sm90_wrong_backward)
    if wrong:
        grads = "dQ (and dK/dV with GQA)"
        return (
            f"FA4 {release.version}'s sm_90 backward returns wrong {grads} at head_dim="
            f"{wrong[0]}: its dQ accumulator is rounded to 32 while the kernel rounds the head "
            f"dim to 16{tail}"
        )
    if gqa and head_dim != head_dim_v:
        return (
            f"head_dim={head_dim} != head_dim_v={head_dim_v} with GQA: FA4 {OBSERVED_ON}'s sm_90 "
            f"backward asserts equal head dims{tail}"
        )
    if head_dim == 8 and head_dim_v > head_dim:
        return (
            f"head_dim=8 < head_dim_v={head_dim_v}: FA4 {OBSERVED_ON}'s sm_90 forward makes an "
            f"illegal memory access{tail}"
        )
    return (
        f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) with {kind}: not proven correct on "
        f"sm_90 with FA4 {release.version} by the head-dim GPU test{tail}"
    )


def sm100_head_dim_problem(head_dim: int, head_dim_v: int) -> str | None:
    """Blackwell's rule for the (D, Dv) pair beyond the per-dim declaration (8..128 in steps of
    8, 192, 256): above 128 only (192, 128) and (256, 256) run."""
    if max(head_dim, head_dim_v) <= 128 or (head_dim, head_dim_v) in SM100_LARGE_HEAD_DIMS:
        return None
    pairs = " or ".join(str(p) for p in sorted(SM100_LARGE_HEAD_DIMS))
    return (
        f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}): on Blackwell FA4 runs both <= 128, "
        f"or {pairs}"
    )


class MaskArgs(NamedTuple):
    """FA4's mask arguments: ``causal`` and the window sides (``None``: unbounded)."""

    causal: bool
    window_left: int | None
    window_right: int | None


def top_left_shift(inp: adb.ForwardInputs) -> bool:
    """A band on the top-left diagonal that differs from FA4's bottom-right one (dense Sq !=
    Sk, or varlen with distinct cu_seqlens tensors)."""
    if not inp.band.limited or inp.band.bottom_right:
        return False
    if inp.is_varlen:
        return inp.cu_seqlens_q is not inp.cu_seqlens_k
    return inp.seqlen_q != inp.seqlen_k


def mask_problem(inp: adb.ForwardInputs) -> str | None:
    """Why FA4 cannot compute ``inp``'s band (causal mask and window), or ``None``.

    FA4's mask lets query row i see key j when ``i + off - left <= j <= i + off + right`` with
    ``off = Sk - Sq`` per sequence (bottom-right aligned). A top-left band shifts both sides by
    ``Sk - Sq``, one value for the whole call: expressible for dense inputs, not for varlen
    sequences whose lengths differ between q and k.
    """
    if inp.is_varlen and top_left_shift(inp):
        return (
            "causal_align='top_left' with a causal mask or window, varlen and distinct "
            "cu_seqlens_q / cu_seqlens_k: FA4's band is bottom-right aligned per sequence and "
            "its window is one value per call (pass the same cu_seqlens tensor for q and k when "
            "the lengths are equal, or causal_align='bottom_right')"
        )
    return None


def mask_args(inp: adb.ForwardInputs) -> MaskArgs:
    """The FA4 arguments that compute exactly ``inp``'s band (see :func:`mask_problem`)."""
    left, right = inp.band.left, inp.band.right
    if top_left_shift(inp):
        if inp.is_varlen:
            raise ValueError(mask_problem(inp))
        # i - left <= j <= i + right is i + off - (left + off) <= j <= i + off + (right - off).
        # One side may turn negative (e.g. right = Sq - Sk < 0 for causal with Sq < Sk): FA4
        # keeps it as a 'local' side; both never are (that needs Sq > Sk and Sq < Sk).
        off = inp.seqlen_k - inp.seqlen_q
        left = None if left is None else left + off
        right = None if right is None else right - off
    if left is None and right == 0:
        return MaskArgs(True, None, None)
    return MaskArgs(False, left, right)


def softcap_problem(inp: adb.ForwardInputs, head_dim_pair: tuple[int, int]) -> str | None:
    """FA4's Blackwell backward for ``(256, 256)`` head dims has no soft cap."""
    backward = isinstance(inp, adb.BackwardInputs)
    if backward and inp.softcap is not None and head_dim_pair == (256, 256):
        return "softcap with (head_dim, head_dim_v)=(256, 256): FA4's Blackwell backward has none"
    return None
