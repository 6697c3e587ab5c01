"""``torch_sdpa:cudnn``: cuDNN's fused attention (through PyTorch's private SDPA ops).

Layout: cuDNN takes BHSD *views*; our BSHD tensors are passed as ``transpose(1, 2)`` (no copy)
and the gradients come back in the inputs' memory order, so transposing them back is free.
The output and its gradient go with strides that q's decide, copied where they differ
(``BackwardLayouts``, worked out once per signature). Eager ``attention`` calls record the
forward op's own PyTorch node (``autograd_forward``), with a hook that hands its backward the
gradient in those strides too.
GQA: native (cuDNN reads K/V with Hkv heads and writes Hkv-head dK/dV).
lse: cuDNN's softmax statistics are the natural-log logsumexp, shape [B, H, Sq, 1]. Whether
the backward op takes them as [B, H, Sq] (it adds the unit dim itself) or [B, H, Sq, 1] changed
between torch releases; the first call tries the 4-D form, falls back to 3-D when cuDNN rejects
the Stats dims (an error raised while building the graph, before any kernel runs), and the
working form is kept for the rest of the process.
Non-goals, each rejected with a reason: varlen, bottom-right causal with Sq != Sk (PyTorch's
cuDNN op only knows top-left), deterministic requests (dQ is accumulated with atomics and the
op exposes no deterministic mode), ROCm, head dims above 128, float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import _common as c
from ._ops import CUDNN_BWD, CUDNN_FWD, aten, empty_long, ops_problems

_stats_rank: list[int] = [4, 3]  # ranks of lse to try for the backward, working one first


def strides_like(shape: torch.Size, like: torch.Tensor) -> tuple[int, ...]:
    """Packed strides for ``shape`` with its dims in the memory order of ``like``'s (largest
    stride outermost; equal strides, as size-1 dims may have, in dim order)."""
    order = sorted(range(like.dim()), key=lambda dim: (-like.stride(dim), dim))
    strides, inner = [0] * len(shape), 1
    for dim in reversed(order):
        strides[dim] = inner
        inner *= shape[dim]
    return tuple(strides)


class BackwardLayouts(NamedTuple):
    """The strides O and dO go to the backward with, for one signature (``None``: their own).

    By its source PyTorch caches the backward graph it builds for cuDNN under q, k and v's
    layouts, and gradients came back wrong for a second layout of dO at one layout of q, k, v
    (benchmarks.md section 9): O and dO go with strides that q's alone decide
    (:func:`strides_like`), so one layout of q, k, v always brings the same ones."""

    out: tuple[int, ...] | None
    grad_out: tuple[int, ...] | None


def backward_layouts(inp: adb.BackwardInputs) -> BackwardLayouts:
    """What ``inp``'s signature needs (the plan :meth:`Cudnn.prepare` makes of it)."""
    wanted = (strides_like(t.shape, inp.q) for t in (inp.out, inp.grad_out))
    given = (inp.out.stride(), inp.grad_out.stride())
    return BackwardLayouts(*(w if w != g else None for w, g in zip(wanted, given, strict=True)))


def with_strides(t: torch.Tensor, strides: tuple[int, ...] | None) -> torch.Tensor:
    """``t`` with ``strides`` (``None``: itself): a view where only size-1 dims' strides
    differ, else a copy."""
    if strides is None:
        return t
    if _same_memory(t.stride(), strides, t.shape):
        return t.as_strided(t.shape, strides)  # same memory and values
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _run_backward(inp: adb.BackwardInputs, lse: torch.Tensor, layouts: BackwardLayouts):
    seed = empty_long(inp.q.device)
    grad_out = with_strides(inp.grad_out, layouts.grad_out)
    out = with_strides(inp.out, layouts.out)
    for attempt, rank in enumerate(list(_stats_rank)):
        stats = lse.unsqueeze(-1) if rank == 4 else lse
        try:
            return aten(CUDNN_BWD)(
                grad_out.transpose(1, 2),
                inp.q.transpose(1, 2),
                inp.k.transpose(1, 2),
                inp.v.transpose(1, 2),
                out.transpose(1, 2),
                stats,
                seed,
                seed,
                None,
                None,
                None,
                inp.seqlen_q,
                inp.seqlen_k,
                0.0,
                inp.causal,
                scale=inp.scale,
            )
        except RuntimeError as exc:
            if "Stats" not in str(exc) or attempt == len(_stats_rank) - 1:
                raise
            _stats_rank.reverse()
    raise AssertionError("unreachable")


class Cudnn(c.SdpaImplementation):
    """cuDNN SDPA forward/backward (NVIDIA sm80+)."""

    name = "cudnn"
    priority = {"sm_90": 50, "sm_10*": 50, "sm_8*": 35}
    deterministic = False
    vendors = ("cuda",)
    min_sm = 80
    dtypes = c.HALF_DTYPES
    head_dims = range(8, 129, 8)  # 16-byte rows, at most 128
    varlen = False  # not through this cuDNN op
    causal_aligns = ("top_left",)  # PyTorch's cuDNN op knows no other

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Beyond the declarations: at least one key, not one query with one key, and the
        private ops' schemas."""
        reasons = []
        if inp.seqlen_k == 0:
            reasons.append("Sk=0: cuDNN needs at least one key")
        if inp.seqlen_q == inp.seqlen_k == 1:  # "cuDNN Frontend error: s_q = s_kv = 1"
            reasons.append("Sq=Sk=1: cuDNN's frontend does not support one query and one key")
        return reasons + ops_problems(CUDNN_FWD, CUDNN_BWD)

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [B,Sq,H,Dv], lse [B,H,Sq])``."""
        if c.is_empty(inp):
            return c.empty_forward(inp)
        res = aten(CUDNN_FWD)(
            inp.q.transpose(1, 2),
            inp.k.transpose(1, 2),
            inp.v.transpose(1, 2),
            None,
            True,
            0.0,
            inp.causal,
            False,
            scale=inp.scale,
        )
        out, lse = res[0], res[1]
        lse = lse.reshape(inp.batch, inp.heads, inp.seqlen_q).contiguous()
        return out.transpose(1, 2), lse

    def fast_paths(self) -> list[adb.FastPath]:
        """PyTorch's own autograd node for eager ``attention`` calls (``_common``'s gate)."""
        return [c.own_node_path()]

    def autograd_forward(self, inp: adb.ForwardInputs, layout: str):
        """The forward op itself, whose PyTorch autograd node runs cuDNN's backward with O and
        dO in the strides :meth:`backward` gives them (a pre-hook on the node lays dO out so):
        for dense calls whose output q's layout alone decides (q packed, Dv = D), where the
        gate allows it."""
        if c.is_empty(inp) or not c.own_node_path().on:
            return None
        q = inp.q.transpose(1, 2)  # as the op takes it
        strides = strides_like(q.shape, q)
        if inp.head_dim_v != inp.head_dim or not _same_memory(q.stride(), strides, q.shape):
            # PyTorch allocates O otherwise than :func:`strides_like` would
            return None
        return functools.partial(
            _own_node_output, aten(CUDNN_FWD), inp.causal, inp.scale, strides, layout == "bshd"
        )

    def prepare(self, inp: adb.ForwardInputs) -> BackwardLayouts | None:
        """A backward signature's :class:`BackwardLayouts` (forward signatures need none)."""
        return backward_layouts(inp) if isinstance(inp, adb.BackwardInputs) else None

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the caller's out and lse (no recomputation)."""
        if c.is_empty(inp):
            return c.zero_gradients(inp)
        layouts = inp.plan if inp.plan is not None else backward_layouts(inp)
        dq, dk, dv = _run_backward(inp, inp.lse.contiguous(), layouts)
        return ad.Gradients(dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2))


def _same_memory(strides: tuple[int, ...], wanted: tuple[int, ...], shape: torch.Size) -> bool:
    """Whether ``strides`` lay ``shape`` out in memory as ``wanted`` do (size-1 dims aside)."""
    return all(s == w for s, w, n in zip(strides, wanted, shape, strict=True) if n != 1)


def _own_node_output(op, causal: bool, scale: float, strides, rows: bool, q, k, v):
    """The forward op's output for the caller's q, k, v ([B, S, H, D] where ``rows``, else
    [B, H, S, D]), its node's dO laid out in ``strides`` (O's, which q's decide)."""
    if rows:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = op(q, k, v, None, True, 0.0, causal, False, scale=scale)[0]
    if out.grad_fn is not None:
        out.grad_fn.register_prehook(functools.partial(_gradient_in, strides))
    return out.transpose(1, 2) if rows else out


def _gradient_in(strides: tuple[int, ...], grads: tuple):
    """The node's output gradients with dO in ``strides`` (``None``: as they are). PyTorch
    keeps one backward graph per layout of q, k and v, which fixes dO's: another layout of dO
    would run that graph on the wrong memory (benchmarks.md section 9)."""
    grad_out = grads[0]
    if grad_out is None or grad_out.stride() == strides:
        return None
    return (with_strides(grad_out, strides), *grads[1:])
