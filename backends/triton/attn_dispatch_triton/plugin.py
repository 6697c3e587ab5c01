"""Entry point of the triton backend: ``triton:fused`` and ``triton:fused_atomic``.

One kernel source for NVIDIA (sm_80 and newer) and AMD (gfx942, gfx950): the forward and the
three-kernel backward in ``forward`` / ``backward``. Cheap to import: triton is imported only
when a kernel runs; ``supports`` reads package metadata alone.

Priorities: the default automatic choice on ROCm (60; FlyDSL, opt-in, ranks above it once
enabled); on NVIDIA below cuDNN (50). On sm_90 the shipped cost table (``costs/sm_90.json``,
measured by benchmarks/cost_grid.py) ranks it by measured time wherever it covers a call
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

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from ._plan import PLANS_VARIABLE

TRITON_REQUIREMENT = ">=3.2"
# Triton ships as "triton" (PyPI, NVIDIA and AMD wheels) and, with some PyTorch builds,
# as "pytorch-triton-rocm" / "pytorch-triton".
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")
MAX_GRID_Y = 65535  # programs along grid axis 1 (batch * heads)


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
    cost_requires = ("triton",)  # its kernels' versions, recorded by its cost tables (costs/)
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

    def fast_paths(self) -> list[adb.FastPath]:
        """The Gluon sm_90 kernels and the launch-plan replay, each on only with a triton it
        was checked with (``_gates``)."""
        from . import _gates

        return _gates.fast_paths()

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Beyond the declarations: an installed triton, and batch*heads within one grid axis."""
        missing = triton_missing()
        reasons = [missing] if missing else []
        if inp.batch * inp.heads > MAX_GRID_Y:
            reasons.append(
                f"batch*heads={inp.batch * inp.heads}: needs at most {MAX_GRID_Y} (one grid axis)"
            )
        return reasons

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

    def prepare(self, inp: adb.ForwardInputs) -> object:
        """A backward signature's launch plans (``_plan.Prepared``), so that a repeated call
        replays them without building a plan key; ``None`` for a forward decision (the forward
        has no plans) and where plans never run (not CUDA, plans off)."""
        if not isinstance(inp, adb.BackwardInputs):
            return None
        from .backward import plannable, signature

        if not plannable(inp.q):
            return None
        flags = self._backward_flags(inp)
        del flags["scale"]  # a per-call value of a plan, not part of its signature
        return signature(inp.q, inp.k, inp.v, inp.out, inp.lse, inp.grad_out, **flags)

    def _backward_flags(self, inp: adb.BackwardInputs) -> dict:
        return dict(self._flags(inp), atomic_dq=self.atomic_dq, gluon=inp.sinks is None)

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
            **self._backward_flags(inp),
            plan=inp.plan,
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


class FusedAtomic(Fused):
    """Triton FMHA backward as preprocess + one dK/dV/dQ kernel (fp32 dQ reductions) + convert.

    Priorities: per arch, just below ``triton:fused`` (45 / 60) and above FA2 (40), so where
    no cost table covers a call it is chosen only if ``triton:fused`` is disabled or rejects
    it; on sm_90 the cost table ranks the two by measured time (with D = 128 it runs the Gluon
    kernel, dQ by TMA reductions). On AMD it is compile-tested only (never run). Not
    deterministic: a call asking for determinism rules it out.
    """

    name = "fused_atomic"
    priority = {"gfx942": 58, "gfx950": 58, "sm_9*": 43, "sm_10*": 43, "sm_8*": 43}
    deterministic = False
    atomic_dq = True


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    """The triton backend's implementations."""
    # Checked when the plugins load, whatever triton is installed: a bad value is an error
    # even where plans are never used (the interpreter, ROCm, another triton release).
    adb.env_flag(PLANS_VARIABLE, True)
    return [Fused(), FusedAtomic()]
