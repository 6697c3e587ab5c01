"""The input contract: what an implementation receives (``ForwardInputs`` / ``BackwardInputs``
around one signature's ``Facts``), the ``Band`` of visible keys, and the lse layout.

Validation (``_validation``) runs once per input *signature* (shapes, strides, dtypes, devices,
flags); the dispatcher caches the resulting ``Facts`` so repeated calls only rebuild the light
inputs object.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

import torch


class Kind(StrEnum):
    """Which pass a call runs; equal to (and formatted as) its name, ``"forward"`` or
    ``"backward"``, the public ``mode`` strings."""

    FORWARD = "forward"
    BACKWARD = "backward"


CAUSAL_ALIGNS = ("top_left", "bottom_right")
# A sliding window (left, right): keys d_i - left .. d_i + right of row i; None: unbounded side.
Window = tuple[int | None, int | None]
QUERY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# A window side beyond int64 cannot be a tensor extent: it bounds nothing and means unbounded.
INT64_MAX = 2**63 - 1
# ``attention``'s layouts of dense q, k, v: [B, S, H, D] and [B, H, S, D]
LAYOUTS = ("bshd", "bhsd")
# ``scale`` and ``softcap`` stay in this range so that they, their reciprocals and their products
# with log2(e) are normal float32 numbers in every kernel (1e39 is inf in float32, 1e-39 is
# subnormal and flushes to zero on GPUs: either turns scores into inf or NaN).
FLOAT_ARG_RANGE = (1e-30, 1e30)


class Band(NamedTuple):
    """The keys each query row sees, from the call's window, causal flag and alignment.

    Row ``i``'s diagonal is ``d_i = i + offset``, with ``offset`` 0 (top-left) or ``Sk - Sq``
    (bottom-right, per sequence when varlen: :meth:`offset`); key ``j`` is visible iff
    ``d_i - left <= j <= d_i + right``, a side ``None`` being unbounded. ``causal`` is folded in
    (``right`` at most 0), and a side that cannot exclude any key at the call's (longest) lengths
    is already ``None``, so no side is ever larger than a sequence (int64- and int32-safe).
    Neither side bounded: ``bottom_right`` is False, so a full band has one value.
    """

    left: int | None
    right: int | None
    bottom_right: bool

    @classmethod
    def of(cls, window: Window | None, causal: bool, causal_align: str) -> Band:
        """The band of ``window`` (sides as given, ``None`` unbounded) with ``causal`` folded in
        (``right`` at most 0) and the diagonal aligned by ``causal_align``."""
        left, right = (None, None) if window is None else window
        if causal:
            right = 0 if right is None else min(right, 0)
        if left is None and right is None:
            return cls(None, None, False)
        return cls(left, right, causal_align == "bottom_right")

    @property
    def limited(self) -> bool:
        """Whether any key is ever outside the band (a mask exists at all)."""
        return self.left is not None or self.right is not None

    def offset(self, seqlen_q: int, seqlen_k: int) -> int:
        """The diagonal's offset ``d_i - i`` for a sequence of these lengths."""
        return seqlen_k - seqlen_q if self.bottom_right else 0

    def key_range(self, i0: int, i1: int, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
        """The keys rows ``i0 .. i1 - 1`` see together, as ``(k0, k1)`` with ``k0 <= k1``."""
        shift = self.offset(seqlen_q, seqlen_k)
        lo = 0 if self.left is None else i0 + shift - self.left
        hi = seqlen_k if self.right is None else i1 + shift + self.right
        lo = min(seqlen_k, max(0, lo))
        return lo, max(lo, min(seqlen_k, hi))

    def mask(
        self, seqlen_q: int, seqlen_k: int, device: torch.device | str = "cpu"
    ) -> torch.Tensor | None:
        """``[seqlen_q, seqlen_k]`` booleans, True where a key is visible; ``None`` when the
        band limits nothing."""
        if not self.limited:
            return None
        rows = torch.arange(seqlen_q, device=device)[:, None] + self.offset(seqlen_q, seqlen_k)
        keys = torch.arange(seqlen_k, device=device)[None, :]
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
        if self.left is not None:
            visible &= keys >= rows - self.left
        if self.right is not None:
            visible &= keys <= rows + self.right
        return visible


FULL_BAND = Band(None, None, False)


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of lse for queries of ``dtype``: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def lse_shape(q_shape: tuple[int, ...], varlen: bool) -> tuple[int, int] | tuple[int, int, int]:
    """The shape of lse for queries of ``q_shape``: ``[B, H, Sq]`` dense (q ``[B, Sq, H, D]``),
    ``[H, Tq]`` varlen (q ``[Tq, H, D]``)."""
    if varlen:
        return (q_shape[1], q_shape[0])
    return (q_shape[0], q_shape[2], q_shape[1])


def packed_unit_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the stride of each size-1 dim set to what a packed tensor would have there.

    A size-1 dim is never stepped, so its stride is free (the core's alignment check ignores
    it, and torch calls a tensor contiguous whatever it is), but a kernel that reads every
    stride may test it for alignment or address with it (backends/*: PyTorch's
    memory-efficient kernels, FlashAttention-4's backward). Same memory and values; ``t``
    itself when nothing changes."""
    if 1 not in t.shape:  # the usual call: nothing to pack, one check
        return t
    strides, inner = list(t.stride()), 1
    for dim in reversed(range(t.dim())):
        if t.shape[dim] == 1:
            strides[dim] = inner
        inner = strides[dim] * t.shape[dim]
    if strides == list(t.stride()):
        return t
    return t.as_strided(t.shape, strides)


class Facts(NamedTuple):
    """Derived, validated facts about one input signature (shared by every call with it)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    device: torch.device
    is_varlen: bool
    scale: float
    max_seqlen_q: int
    max_seqlen_k: int
    # the call's sliding window (validated, sides that bound nothing set to None: see
    # effective_window) and soft cap (validated); part of the signature like the flags
    window: Window | None = None
    softcap: float | None = None
    # the visible keys of each row: window, causal flag and alignment as one value
    band: Band = FULL_BAND


class ForwardInputs:
    """Validated inputs of a forward call. Treat as read-only.

    Tensors: ``q``, ``k``, ``v``, ``cu_seqlens_q``, ``cu_seqlens_k`` (``None`` when dense).
    Flags: ``causal``, ``causal_align``, ``scale`` (resolved), ``deterministic`` (resolved),
    ``max_seqlen_q`` / ``max_seqlen_k`` (the sequence lengths when dense), ``window`` (``None``
    or ``(left, right)``, each side an int >= 0 or ``None`` for unbounded; the causal mask is
    not folded in, but a side that excludes no key at these lengths is already ``None``, see
    ``effective_window``) and ``softcap`` (``None`` or a float in ``FLOAT_ARG_RANGE``).
    Derived: ``batch``, ``seqlen_q``, ``seqlen_k`` (max lengths when varlen), ``heads``,
    ``kv_heads``, ``head_dim``, ``head_dim_v``, ``dtype``, ``device``, ``is_varlen``,
    ``group_size``. ``plan``: what the implementation's ``prepare`` returned for this call's
    signature (see ``Implementation.prepare``); ``None`` when it has no ``prepare``, on the
    ``meta`` device and on inputs the dispatcher did not build (``make_inputs``). Built by the
    dispatcher and ``make_inputs`` around the call's ``Call`` (its flags) and ``Facts``.
    """

    __slots__ = (
        "q",
        "k",
        "v",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "causal",
        "causal_align",
        "deterministic",
        "facts",
        "sinks",
        "plan",
    )

    def __init__(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        call: tuple,  # the call's _call.Call (not imported: _call imports this module)
        facts: Facts,
        sinks=None,
        plan=None,
    ) -> None:
        self.q = q
        self.k = k
        self.v = v
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_k = cu_seqlens_k
        self.causal = call.causal
        self.causal_align = call.causal_align
        self.deterministic = call.deterministic
        self.facts = facts
        self.sinks = sinks
        self.plan = plan

    scale = property(lambda self: self.facts.scale)
    window = property(lambda self: self.facts.window)
    softcap = property(lambda self: self.facts.softcap)
    max_seqlen_q = property(lambda self: self.facts.max_seqlen_q)
    max_seqlen_k = property(lambda self: self.facts.max_seqlen_k)
    batch = property(lambda self: self.facts.batch)
    seqlen_q = property(lambda self: self.facts.seqlen_q)
    seqlen_k = property(lambda self: self.facts.seqlen_k)
    heads = property(lambda self: self.facts.heads)
    kv_heads = property(lambda self: self.facts.kv_heads)
    head_dim = property(lambda self: self.facts.head_dim)
    head_dim_v = property(lambda self: self.facts.head_dim_v)
    dtype = property(lambda self: self.facts.dtype)
    device = property(lambda self: self.facts.device)
    is_varlen = property(lambda self: self.facts.is_varlen)
    group_size = property(lambda self: self.facts.heads // self.facts.kv_heads)
    band = property(lambda self: self.facts.band)

    def device_vendor(self, arch) -> str:
        """``cpu``, ``cuda`` or ``rocm`` for where the tensors live (another device type as is).

        A ``meta`` tensor stands for a tensor on ``arch``'s device, so it answers ``arch.vendor``.
        """
        kind = self.facts.device.type
        if kind == "meta":
            return arch.vendor
        if kind == "cuda":
            return "rocm" if torch.version.hip else "cuda"
        return kind

    def describe(self) -> str:
        """One line per tensor: shape, dtype, strides, device; then the flags."""
        lines = [_describe_tensor(name, getattr(self, name)) for name in self._tensor_names()]
        lines.append(
            f"causal={self.causal} causal_align={self.causal_align!r} scale={self.scale:.6g} "
            f"deterministic={self.deterministic} max_seqlen_q={self.max_seqlen_q} "
            f"max_seqlen_k={self.max_seqlen_k} window={self.window} softcap={self.softcap}"
        )
        return "\n".join(lines)

    def _tensor_names(self) -> tuple[str, ...]:
        names = ("q", "k", "v")
        names += ("cu_seqlens_q", "cu_seqlens_k") if self.is_varlen else ()
        return names + (() if self.sinks is None else ("sinks",))

    def __repr__(self) -> str:
        f = self.facts
        layout = "varlen" if f.is_varlen else "dense"
        return (
            f"{type(self).__name__}({layout}, batch={f.batch}, seqlen_q={f.seqlen_q}, "
            f"seqlen_k={f.seqlen_k}, heads={f.heads}, kv_heads={f.kv_heads}, "
            f"head_dim={f.head_dim}, "
            f"head_dim_v={f.head_dim_v}, dtype={f.dtype}, device={f.device}, causal={self.causal}, "
            f"causal_align={self.causal_align!r}, scale={f.scale:.6g}, "
            f"deterministic={self.deterministic}, window={f.window}, softcap={f.softcap}"
            f"{'' if self.sinks is None else ', sinks=True'})"
        )


class BackwardInputs(ForwardInputs):
    """Validated inputs of a backward call: ``ForwardInputs`` plus out, lse, grad_out (with
    ``sinks``, ``lse`` includes the sink and the gradients include ``dsinks``)."""

    __slots__ = ("out", "lse", "grad_out")

    def __init__(
        self,
        q,
        k,
        v,
        out,
        lse,
        grad_out,
        cu_seqlens_q,
        cu_seqlens_k,
        call: tuple,  # the call's _call.Call (not imported: _call imports this module)
        facts: Facts,
        sinks=None,
        plan=None,
    ) -> None:
        # the slots are set here rather than by ForwardInputs.__init__: one call less per dispatch
        self.q = q
        self.k = k
        self.v = v
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_k = cu_seqlens_k
        self.causal = call.causal
        self.causal_align = call.causal_align
        self.deterministic = call.deterministic
        self.facts = facts
        self.out = out
        self.lse = lse
        self.grad_out = grad_out
        self.sinks = sinks
        self.plan = plan

    def _tensor_names(self) -> tuple[str, ...]:
        names = ("q", "k", "v", "out", "lse", "grad_out")
        names += ("cu_seqlens_q", "cu_seqlens_k") if self.is_varlen else ()
        return names + (() if self.sinks is None else ("sinks",))


def _describe_tensor(name: str, t: torch.Tensor) -> str:
    return (
        f"{name}: shape={tuple(t.shape)} dtype={str(t.dtype).replace('torch.', '')} "
        f"stride={tuple(t.stride())} device={t.device}"
    )
