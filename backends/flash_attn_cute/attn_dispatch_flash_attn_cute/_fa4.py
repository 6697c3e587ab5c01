"""The calls into FlashAttention-4, imported on the first kernel call.

FA4's private entry points are used, as FA4's own autograd function uses them:
``_flash_attn_fwd(q, k, v, ...) -> (out, lse, p, row_max, o_lo)`` and
``_flash_attn_bwd(q, k, v, out, dout, lse, ...) -> (dq, dk, dv)``, every argument but the
tensors by keyword. Both run on the current CUDA device and stream, so each call sets the
device of ``q``.

Layouts need no conversion: FA4's tensors are ours (BSHD / THD, dK/dV with Hkv heads) and so
is its lse (float32, natural log, [B, H, Sq] dense and [H, Tq] varlen, contiguous; FA4 copies
an lse or a tensor whose strides it cannot read itself). Rows that see no key get lse = -inf
and a zero output row from FA4's forward (``Softmax.finalize``: a zero row sum gives -inf and
a unit rescale of a zero accumulator), and its backward reads lse = -inf as 0 for the softmax
recomputation while the mask zeroes every probability of such a row, so dQ is zero there: our
contract, with no conversion. Calls with no work (zero queries or keys) are answered here
without FA4.

JIT compilation: FA4 compiles a kernel the first time it sees a compile key (dtype, head dims,
GQA ratio, mask kind, varlen, deterministic, tile configuration, ...; sequence lengths, batch,
heads and the scale are runtime values) and keeps it for the process. Each call that added
kernels to FA4's caches is recorded here with its wall time (:func:`compile_log`) and logged
once at INFO on the ``attn_dispatch.flash_attn_cute`` logger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

import attn_dispatch as ad

from ._support import mask_args

log = logging.getLogger("attn_dispatch.flash_attn_cute")

# FA4's functions that keep a compile cache (``fn.compile_cache.cache``: key -> kernel) and that
# a forward or backward call of ours can reach.
_CACHED_FUNCTIONS = (
    "_flash_attn_fwd",
    "_flash_attn_bwd",
    "_bwd_preprocess",
    "_bwd_postprocess_convert",
    "_flash_attn_fwd_combine",
    "_compute_tile_cumsum",
    "_compute_blocks_to_batch",
    "_get_scheduler_metadata",
)

_interface: ModuleType | None = None
_import_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """One call that compiled (or loaded from FA4's disk cache) new kernels."""

    kind: str  # "forward" or "backward"
    variant: str  # what selects the kernels: dtype, head dims, GQA ratio, mask, varlen, ...
    seconds: float  # wall time of the whole call (compilation dominates it)
    kernels: int  # kernels added to FA4's in-process caches by this call


_records: list[CompileRecord] = []


def interface() -> ModuleType:
    """``flash_attn.cute.interface``, imported once (a few seconds: CUTLASS's DSL, TVM-FFI)."""
    global _interface, _import_seconds
    if _interface is None:
        start = time.perf_counter()
        import flash_attn.cute.interface as iface

        _import_seconds = time.perf_counter() - start
        _interface = iface
        log.info("flash_attn.cute imported in %.1f s", _import_seconds)
    return _interface


def import_seconds() -> float | None:
    """How long importing FA4 took in this process (``None``: not imported yet)."""
    return _import_seconds


def compile_log() -> list[CompileRecord]:
    """The calls of this process that compiled FA4 kernels, in order."""
    return list(_records)


def kernel_count() -> int:
    """Kernels in FA4's in-process compile caches (0 before FA4 is imported)."""
    if _interface is None:
        return 0
    total = 0
    for name in _CACHED_FUNCTIONS:
        cache = getattr(getattr(_interface, name, None), "compile_cache", None)
        entries = getattr(cache, "cache", None)
        if isinstance(entries, dict):
            total += len(entries)
    return total


def variant_of(inp: ad.ForwardInputs, kind: str) -> str:
    """A readable description of what selects FA4's kernels for ``inp``."""
    m = mask_args(inp)
    window = m.window_left is not None or m.window_right is not None
    mask = "causal" if m.causal else ("window" if window else "full")
    parts = [
        kind,
        str(inp.dtype).removeprefix("torch."),
        f"D={inp.head_dim}",
        f"Dv={inp.head_dim_v}",
        f"group={inp.group_size}",
        mask,
        "varlen" if inp.is_varlen else "dense",
    ]
    if inp.softcap is not None:
        parts.append(f"softcap={inp.softcap:g}")  # FA4 compiles one kernel per cap value
    if kind == "backward" and inp.deterministic:
        parts.append("deterministic")
    return " ".join(parts)


def _recorded(kind: str, inp: ad.ForwardInputs, call: Callable[[], Any]) -> Any:
    """Run ``call``; when it added kernels to FA4's caches, record its time."""
    before = kernel_count()
    start = time.perf_counter()
    result = call()
    added = kernel_count() - before
    if added > 0:
        record = CompileRecord(kind, variant_of(inp, kind), time.perf_counter() - start, added)
        _records.append(record)
        log.info(
            "FA4 compiled %d kernel(s) for %s in %.1f s", added, record.variant, record.seconds
        )
    return result


def _varlen_args(inp: ad.ForwardInputs) -> dict:
    if not inp.is_varlen:
        return {}
    return dict(
        cu_seqlens_q=inp.cu_seqlens_q.contiguous(),
        cu_seqlens_k=inp.cu_seqlens_k.contiguous(),
        max_seqlen_q=inp.max_seqlen_q,
        max_seqlen_k=inp.max_seqlen_k,
    )


def _on_device_of(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """``t``'s CUDA device made current (FA4 launches on the current device and stream).

    Fake tensors (``FakeTensorMode``: FA4 then compiles without launching, e.g. to fill its
    disk cache on a machine without a GPU) need no device and may run where CUDA is absent.
    """
    if is_fake(t):
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` is a FakeTensor (shape and dtype only)."""
    return isinstance(t, FakeTensor)


def has_no_work(inp: ad.ForwardInputs) -> bool:
    """Zero queries or zero keys (or heads, or batch): nothing for a kernel to do."""
    return inp.q.numel() == 0 or inp.k.numel() == 0


def empty_forward(inp: ad.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` when there is no work: zero rows, ``-inf`` lse."""
    out = inp.q.new_zeros((*inp.q.shape[:-1], inp.head_dim_v))
    shape = (inp.heads, inp.q.shape[0]) if inp.is_varlen else (inp.batch, inp.heads, inp.seqlen_q)
    lse = torch.full(shape, float("-inf"), dtype=ad.lse_dtype(inp.dtype), device=inp.q.device)
    return out, lse


def forward(inp: ad.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in our layout from FA4's forward."""
    if has_no_work(inp):
        return empty_forward(inp)
    fa = interface()
    m = mask_args(inp)

    def call():
        with _on_device_of(inp.q):
            return fa._flash_attn_fwd(
                inp.q,
                inp.k,
                inp.v,
                softmax_scale=inp.scale,
                causal=m.causal,
                window_size_left=m.window_left,
                window_size_right=m.window_right,
                softcap=inp.softcap,
                return_lse=True,
                **_varlen_args(inp),
            )

    out, lse, *_ = _recorded("forward", inp, call)
    return out, lse


def backward(inp: ad.BackwardInputs) -> ad.Gradients:
    """``(dq, dk, dv)`` from FA4's backward on the caller's out and lse."""
    if has_no_work(inp):
        return ad.Gradients(
            torch.zeros_like(inp.q), torch.zeros_like(inp.k), torch.zeros_like(inp.v)
        )
    fa = interface()
    m = mask_args(inp)

    def call():
        with _on_device_of(inp.q):
            return fa._flash_attn_bwd(
                inp.q,
                inp.k,
                inp.v,
                inp.out,
                inp.grad_out,
                inp.lse,
                softmax_scale=inp.scale,
                causal=m.causal,
                window_size_left=m.window_left,
                window_size_right=m.window_right,
                softcap=inp.softcap or 0.0,
                deterministic=inp.deterministic,
                **_varlen_args(inp),
            )

    dq, dk, dv = _recorded("backward", inp, call)
    return ad.Gradients(dq, dk, dv)
