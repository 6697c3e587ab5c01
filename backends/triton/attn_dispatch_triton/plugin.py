"""Entry point of the triton backend: ``triton:fused`` and ``triton:fused_atomic``.

One kernel source for NVIDIA (sm_80 and newer) and AMD (gfx942, gfx950): the forward and the
three-kernel backward in ``forward`` / ``backward``. Cheap to import: triton is imported only
when a kernel runs; ``supports`` reads package metadata alone.

Priorities: the default automatic choice on ROCm (60; FlyDSL, opt-in, ranks above it once
enabled); on NVIDIA a contender placed by the H200 measurements in docs/benchmarks.md
(design: docs/backends/triton.md).

Capabilities (class attributes; the core rejects what they exclude, with a reason): bf16/f16
only (fp32 accumulation inside); head dims 32-256, any value (tiles padded to a power of two); D
may differ from Dv; no causal restriction (both alignments), dense or varlen; GQA/MQA native;
sliding windows (``inp.band``) and logit soft-capping (``inp.softcap``) in forward and
backward, in the portable ``tl`` kernels and the Gluon sm_90 kernels (see ``_band``); attention
sinks (``inp.sinks``) in the forward's epilogue and a separate reduction for their gradient
(``_bwd_sinks``), with the ``tl`` backward kernels only (the Gluon ones are kept out).
Non-goals: dropout, bias, float32 inputs.

``triton:fused`` is deterministic (split dQ kernel, no atomics anywhere); ``triton:fused_atomic``
computes dQ in the dK/dV kernel and adds it with fp32 atomics or TMA reductions (5 tile products
per tile pair instead of 7), so it is not deterministic and the core rejects it when determinism
is requested.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

TRITON_REQUIREMENT = ">=3.2"
# Triton ships as "triton" (PyPI, NVIDIA and AMD wheels) and, with some PyTorch builds,
# as "pytorch-triton-rocm" / "pytorch-triton".
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")
MAX_GRID_Y = 65535  # programs along grid axis 1 (batch * heads)
SMALL_CAUSAL_MHA_PRIORITY = 55  # triton:fused inside SMALL_CAUSAL_MHA / GLUON_CAUSAL_MHA
GLUON_ATOMIC_PRIORITY = 56  # triton:fused_atomic inside GLUON_ATOMIC_FASTEST


@dataclass(frozen=True)
class Region:
    """Where an H200 benchmark measured an implementation ahead of cuDNN and the randomized
    conformance sweep found it correct: the only inputs whose priority it raises (a dense
    backward on sm_90 without window, soft cap or sinks, D = Dv = ``head_dim``, Sq = Sk). Outside,
    the arch's priority holds: a shape nobody measured is not assumed fast."""

    head_dim: int
    groups: tuple[int, ...]  # heads // kv_heads
    batch: tuple[int, int]  # inclusive
    heads: tuple[int, int]  # query heads, inclusive
    seqlen: tuple[int, int]  # Sq = Sk, inclusive
    causal: tuple[bool, ...]

    def contains(self, inp: adb.BackwardInputs) -> bool:
        return (
            not inp.is_varlen
            and inp.window is None
            and inp.softcap is None
            and inp.sinks is None
            and inp.head_dim == inp.head_dim_v == self.head_dim
            and inp.heads // inp.kv_heads in self.groups
            and self.batch[0] <= inp.batch <= self.batch[1]
            and self.heads[0] <= inp.heads <= self.heads[1]
            and inp.seqlen_q == inp.seqlen_k
            and self.seqlen[0] <= inp.seqlen_k <= self.seqlen[1]
            and inp.causal in self.causal
        )


# docs/benchmarks.md: MHA 8 (B=1, D=128) causal, triton:fused 49 us against cuDNN's 57 us at 1K
# (dQ beside dK/dV); 4K and 8K with the Gluon kernels, 217 / 727 us against 269 / 756 us (at
# 2K and 16K cuDNN stays faster).
SMALL_CAUSAL_MHA = Region(128, (1,), (1, 1), (8, 8), (1024, 1024), (True,))
GLUON_CAUSAL_MHA = Region(128, (1,), (1, 1), (8, 8), (4096, 8192), (True,))
# GQA 64/8 (B=1, D=128), fused-atomic with the Gluon kernel against cuDNN: without a mask
# 1.10x / 1.06x / 1.02x / 1.02x / 1.01x faster at 1K-16K, causal 1.18x / 1.09x / 1.05x / 1.03x /
# 1.01x; and MHA 8 causal at 4K and 8K as above.
GLUON_ATOMIC_FASTEST = (
    Region(128, (8,), (1, 1), (64, 64), (1024, 16384), (False, True)),
    GLUON_CAUSAL_MHA,
)


def gluon_kernels_apply(inp: adb.BackwardInputs) -> bool:
    """Whether ``triton:fused`` would run its Gluon sm_90 kernels on these inputs (D = 128, no
    attention sinks, a triton they were checked with, tensors TMA can read as rows; the sm_90
    arch is the caller's condition), read from metadata: no triton import."""
    from ._tma_rows import gluon_triton_installed, rows_view

    return (
        inp.head_dim == inp.head_dim_v == 128
        and inp.sinks is None
        and gluon_triton_installed()
        and all(
            rows_view(t, inp.is_varlen) is not None for t in (inp.q, inp.k, inp.v, inp.grad_out)
        )
    )


def triton_missing() -> str | None:
    """Why no usable triton is installed, or ``None``."""
    reasons = []
    for dist in TRITON_DISTRIBUTIONS:
        reason = adb.missing_requirement(dist + TRITON_REQUIREMENT)
        if reason is None:
            return None
        reasons.append(reason)
    return (
        reasons[0]
        if all("not installed" in r for r in reasons[1:])
        else "; ".join(r for r in reasons if "not installed" not in r)
    )


class Fused(adb.Implementation):
    """Triton FMHA: forward, and backward as preprocess + dK/dV (GQA-walking) + dQ."""

    backend = "triton"
    name = "fused"
    priority = {"gfx942": 60, "gfx950": 60, "sm_9*": 45, "sm_10*": 45, "sm_8*": 45}
    opt_in = False
    deterministic = True
    vendors = ("cuda", "rocm")
    archs = ("sm_*", "gfx942", "gfx950")  # AMD: the archs it is tuned and compile-tested for
    min_sm = 80  # tensor-core tiles of Ampere and newer
    dtypes = (torch.float16, torch.bfloat16)  # fp32 accumulation inside
    head_dims = range(32, 257)  # any value: tiles are padded to a power of two
    window = True  # sliding windows (band-limited loops in the tl kernels)
    softcap = True  # logit soft-capping (a compile-time path of the tl kernels)
    sinks = True  # attention sinks (the forward's epilogue; dsinks by _bwd_sinks)
    atomic_dq = False  # dQ by the split kernel (no atomics)

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Beyond the declarations: an installed triton, and batch*heads within one grid axis."""
        missing = triton_missing()
        reasons = [missing] if missing else []
        if inp.batch * inp.heads > MAX_GRID_Y:
            reasons.append(
                f"batch*heads={inp.batch * inp.heads}: needs at most {MAX_GRID_Y} (one grid axis)"
            )
        return reasons

    def priority_for_inputs(self, inp: adb.ForwardInputs, arch: ad.Arch) -> int | None:
        """Above cuDNN (50) inside :data:`SMALL_CAUSAL_MHA`, and inside
        :data:`GLUON_CAUSAL_MHA` where the Gluon kernels run; the arch's priority elsewhere."""
        if (
            type(self) is Fused
            and isinstance(inp, adb.BackwardInputs)
            and arch.name == "sm_90"
            and (
                SMALL_CAUSAL_MHA.contains(inp)
                or GLUON_CAUSAL_MHA.contains(inp)
                and gluon_kernels_apply(inp)
            )
        ):
            return SMALL_CAUSAL_MHA_PRIORITY
        return self.priority_for(arch)

    @staticmethod
    def _flags(inp: adb.ForwardInputs) -> dict:
        flags = dict(band=inp.band, scale=inp.scale, softcap=inp.softcap)
        if inp.is_varlen:
            flags.update(
                cu_seqlens_q=inp.cu_seqlens_q,
                cu_seqlens_k=inp.cu_seqlens_k,
                max_seqlen_q=inp.max_seqlen_q,
                max_seqlen_k=inp.max_seqlen_k,
            )
        return flags

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` in our layout."""
        from .forward import attention_forward

        sinks = None if inp.sinks is None else inp.sinks.float()
        return attention_forward(inp.q, inp.k, inp.v, **self._flags(inp), sinks=sinks)

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the caller's out and lse (and ``dsinks``: the lse includes the
        sinks, so the dQ/dK/dV kernels are those of a call without them)."""
        from .backward import attention_backward

        dq, dk, dv = attention_backward(
            inp.q,
            inp.k,
            inp.v,
            inp.out,
            inp.lse,
            inp.grad_out,
            **self._flags(inp),
            atomic_dq=self.atomic_dq,
            gluon=inp.sinks is None,
        )
        if inp.sinks is None:
            return ad.Gradients(dq, dk, dv)
        from ._bwd_sinks import sinks_backward

        dsinks = sinks_backward(
            inp.out,
            inp.lse,
            inp.grad_out,
            inp.sinks.float(),
            cu_seqlens_q=inp.cu_seqlens_q,
            max_seqlen_q=inp.max_seqlen_q,
        )
        return ad.Gradients(dq, dk, dv, dsinks.to(inp.sinks.dtype))


def gluon_fused_atomic_fastest(inp: adb.BackwardInputs, arch: ad.Arch) -> bool:
    """Inside :data:`GLUON_ATOMIC_FASTEST` on sm_90, where ``triton:fused_atomic`` runs the
    Gluon dK/dV kernel with dQ by TMA reductions."""
    return (
        arch.name == "sm_90"
        and any(region.contains(inp) for region in GLUON_ATOMIC_FASTEST)
        and gluon_kernels_apply(inp)
    )


class FusedAtomic(Fused):
    """Triton FMHA backward as preprocess + one dK/dV/dQ kernel (fp32 dQ reductions) + convert.

    Priorities: per arch, just below ``triton:fused`` (45 / 60) and above FA2 (40), so where
    ``triton:fused`` runs it is chosen only if that one is disabled or rejects the call. The
    exception is sm_90 with the Gluon kernel (dQ by TMA reductions, D = 128), inside the
    measured regions of :data:`GLUON_ATOMIC_FASTEST` (GQA 64/8 at 1K-16K, causal or not; MHA 8
    causal at 4K-8K), where it takes 56 (docs/benchmarks.md). The `tl` kernel it runs
    elsewhere was 1.00-1.13x ``triton:fused``'s time at the seed shapes on an H200. On AMD it is
    compile-tested only (never run). Not deterministic: a call asking for determinism rules it
    out.
    """

    name = "fused_atomic"
    priority = {"gfx942": 58, "gfx950": 58, "sm_9*": 43, "sm_10*": 43, "sm_8*": 43}
    deterministic = False
    atomic_dq = True

    def priority_for_inputs(self, inp: adb.ForwardInputs, arch: ad.Arch) -> int | None:
        """Above cuDNN (50) and ``triton:fused`` (55) where :func:`gluon_fused_atomic_fastest`;
        the arch's priority elsewhere."""
        if isinstance(inp, adb.BackwardInputs) and gluon_fused_atomic_fastest(inp, arch):
            return GLUON_ATOMIC_PRIORITY
        return self.priority_for(arch)


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    """The triton backend's implementations."""
    return [Fused(), FusedAtomic()]
