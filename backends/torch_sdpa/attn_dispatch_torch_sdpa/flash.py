"""``torch_sdpa:flash``: PyTorch's vendored FlashAttention-2 (``aten::_flash_attention_*``).

Layout: the ops take BSHD (dense) and THD (varlen) tensors, exactly our layouts: no copies.
The own node of ``layout="bhsd"`` calls is sdpa's flash op, which takes BHSD tensors and runs
the same kernels (``autograd_forward``).
lse: natural log, [B, H, Sq] dense and [H, Tq] varlen (unpadded), as ours; rows that see no
key hold ``+inf`` (converted at the boundary, see ``_common``).
GQA: native; the kernel writes H-head dK/dV and sums each group (an extra 2·(H/Hkv)·|dK|
written and read inside the op).
Causal: the kernel's mask is bottom-right; top-left is accepted only where the two agree
(Sq == Sk, or varlen with ``cu_seqlens_q is cu_seqlens_k``).
Sliding windows: the ops' ``window_size_left``/``window_size_right`` (bottom-right aligned like
the causal mask; checked in the installed schema), on NVIDIA only. The kernel treats a side
``>= max_seqlen_k`` as unbounded and an unbounded right side beside a bounded left one as
``max_seqlen_k``; where that changes the right side below ``max_seqlen_q - 1`` (so some row's
band would end elsewhere before the last key) the window is rejected. No soft cap: the ops take
none.
Determinism: dQ is accumulated with atomics unless torch's deterministic mode is on
(``torch.use_deterministic_algorithms(True)`` without ``warn_only``), which the op reads itself;
``deterministic`` follows that flag.
ROCm builds route these ops to AOTriton; there only Sq == Sk causal masks are accepted.
"""

from __future__ import annotations

import functools
import math

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import _common as c
from ._ops import (
    FLASH_BWD,
    FLASH_BWD_WINDOW,
    FLASH_FWD,
    FLASH_FWD_WINDOW,
    SDPA_FLASH,
    aten,
    empty_long,
    op_problem,
    ops_problems,
)

ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")


def _window_sides(inp: adb.ForwardInputs) -> tuple[int | None, int | None] | None:
    """The band's sides (causal folded in) when the call has a window; ``None`` otherwise (a
    plain causal mask goes to the ops' ``is_causal``)."""
    if inp.window is None:
        return None
    return inp.band.left, inp.band.right


def _window_kwargs(inp: adb.ForwardInputs) -> dict[str, int]:
    """The ops' window keywords (-1: unbounded); none at all without a window."""
    window = _window_sides(inp)
    if window is None:
        return {}
    left, right = (-1 if side is None else side for side in window)
    return {"window_size_left": left, "window_size_right": right}


def _inf(side: int | None) -> float:
    return math.inf if side is None else side


def _kernel_right(window: tuple[int | None, int | None], max_seqlen_k: int) -> int | None:
    """The right side the kernel applies: a side >= max_seqlen_k becomes unbounded, and an
    unbounded right side beside a bounded left one becomes max_seqlen_k."""
    left, right = (None if s is None or s >= max_seqlen_k else s for s in window)
    if right is None and left is not None:
        return max_seqlen_k
    return right


def _window_reasons(inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
    """Where the kernel's window differs from ours, or the ops lack one."""
    window = _window_sides(inp)
    if window is None:
        return []
    given = inp.window
    if arch.vendor == "rocm":
        return [f"window={given} on ROCm: AOTriton's sliding window is not relied on"]
    reasons = []
    if not c.causal_matches(inp, "bottom_right", masked=True):
        reasons.append(
            f"window={given} with causal_align={inp.causal_align!r}, Sq={inp.seqlen_q} != "
            f"Sk={inp.seqlen_k} (or varlen with distinct cu_seqlens): the kernel's window is "
            "bottom_right aligned"
        )
    kernel_right = _kernel_right(window, inp.max_seqlen_k)
    if (
        kernel_right != window[1]
        and min(_inf(kernel_right), _inf(window[1])) < inp.max_seqlen_q - 1
    ):
        bound = (
            "leaves the right side unbounded"
            if kernel_right is None
            else f"bounds the right side at {kernel_right} instead"
        )
        reasons.append(
            f"window={given} with Sk={inp.max_seqlen_k}, Sq={inp.max_seqlen_q}: the kernel "
            f"{bound}, which changes the keys of rows whose band ends before the last key"
        )
    return reasons + ops_problems(FLASH_FWD_WINDOW, FLASH_BWD_WINDOW)


def _empty_query_sequence_reasons(inp: adb.ForwardInputs) -> list[str]:
    """With max_seqlen_q = 1 and GQA, the op folds the group into the query rows assuming one
    query per sequence; a varlen call with fewer query tokens than sequences (some are empty)
    then fails inside it (seen with torch 2.11: "shape '[4, 3, 6, 32]' is invalid")."""
    if not (inp.is_varlen and inp.max_seqlen_q == 1 and inp.heads > inp.kv_heads):
        return []
    sequences, tokens = inp.cu_seqlens_q.shape[0] - 1, inp.q.shape[0]
    if tokens >= sequences:
        return []
    return [
        f"varlen with max_seqlen_q=1, GQA and {tokens} query tokens for {sequences} "
        "sequences (some empty): the op assumes one query per sequence"
    ]


def _varlen_args(inp: adb.ForwardInputs) -> tuple:
    """cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, as both ops take them."""
    return (*c.dense_cu_seqlens(inp), inp.max_seqlen_q, inp.max_seqlen_k)


def _torch_deterministic() -> bool:
    return torch.are_deterministic_algorithms_enabled() and not (
        torch.is_deterministic_algorithms_warn_only_enabled()
    )


class Flash(c.SdpaImplementation):
    """FlashAttention-2 forward/backward (NVIDIA sm80+, AMD through AOTriton)."""

    name = "flash"
    priority = {"sm_90": 40, "sm_8*": 40, "sm_1*": 40, "gfx9*": 20, "gfx1*": 20}
    vendors = ("cuda", "rocm")
    archs = ("sm_*", *ROCM_ARCHS)  # ROCm: where AOTriton builds these kernels
    min_sm = 80
    dtypes = c.HALF_DTYPES
    head_dims = range(8, 257, 8)  # 16-byte rows, at most 256
    same_head_dims = True
    window = True  # NVIDIA, bottom-right aligned, where the ops take it (see supports)

    @property
    def deterministic(self) -> bool:  # type: ignore[override]
        """True while torch's deterministic mode (not warn-only) is on: the op reads it."""
        return _torch_deterministic()

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Beyond the declarations: the causal mask (bottom-right on NVIDIA, Sq == Sk only on
        ROCm), D > 192 only on sm_80/sm_90, no varlen on ROCm, the window's alignment and
        clamping, the private ops' schemas."""
        reasons = []
        rocm = arch.vendor == "rocm"
        if not rocm and inp.head_dim > 192 and arch.sm not in (80, 90):
            reasons.append(
                f"head_dim={inp.head_dim} > 192 on {arch.name}: the backward needs sm_80 or sm_90"
            )
        if rocm and inp.causal and not c.causal_matches(inp, "never"):
            reasons.append(
                f"causal with Sq={inp.seqlen_q} != Sk={inp.seqlen_k} on ROCm: "
                "the alignment of AOTriton's mask is not relied on"
            )
        elif not rocm and not c.causal_matches(inp, "bottom_right"):
            reasons.append(
                f"causal_align={inp.causal_align!r} with Sq={inp.seqlen_q} != "
                f"Sk={inp.seqlen_k} (or varlen with distinct cu_seqlens): the "
                "kernel's causal mask is bottom_right"
            )
        if rocm and inp.is_varlen:
            reasons.append("varlen on ROCm: not supported by this backend")
        reasons += _empty_query_sequence_reasons(inp)
        reasons += _window_reasons(inp, arch)
        return reasons + ops_problems(FLASH_FWD, FLASH_BWD)

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` in our layout."""
        if c.is_empty(inp):
            return c.empty_forward(inp)
        res = _forward_op(inp)
        out, lse = res[0], res[1]
        expected = 2 if inp.is_varlen else 3
        if lse.dim() != expected:
            raise RuntimeError(
                f"aten::_flash_attention_forward returned lse of shape "
                f"{tuple(lse.shape)}; this backend expects the unpadded layout"
            )
        return c.clean_empty_rows(out, lse, inp)

    def fast_paths(self) -> list[adb.FastPath]:
        """PyTorch's own autograd node for eager ``attention`` calls (``_common``'s gate)."""
        return [c.own_node_path()]

    def autograd_forward(self, inp: adb.ForwardInputs, layout: str):
        """The forward op itself, whose PyTorch autograd node runs the flash backward as
        :meth:`backward` does: for dense calls where every row sees a key (elsewhere the
        forward's clean-up of such rows is not the op's), where the gate allows it. On
        [B, H, S, D] tensors the op is sdpa's own, which takes them as they are: one node, the
        one sdpa records, where views into the op's layout would record four more."""
        if inp.is_varlen or c.is_empty(inp) or c.may_have_empty_rows(inp):
            return None
        if not c.own_node_path().on:
            return None
        if layout == "bshd":
            return functools.partial(_op_output, *_op_arguments(inp))
        if op_problem(SDPA_FLASH) is not None:
            return None
        return functools.partial(_sdpa_output, aten(SDPA_FLASH), inp.causal, inp.scale)

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the caller's out and lse (no recomputation)."""
        if c.is_empty(inp):
            return c.zero_gradients(inp)
        rng = empty_long(inp.q.device)
        dq, dk, dv = aten(FLASH_BWD)(
            inp.grad_out,
            inp.q,
            inp.k,
            inp.v,
            inp.out,
            c.lse_to_kernel(inp),
            *_varlen_args(inp),
            0.0,
            inp.causal,
            rng,
            rng,
            scale=inp.scale,
            **_window_kwargs(inp),
        )
        return ad.Gradients(dq, dk, dv)


def _forward_op(inp: adb.ForwardInputs) -> tuple:
    """``aten::_flash_attention_forward``'s results for ``inp`` (recording the op's autograd node
    where grad recording is on and an input requires grad)."""
    op, after_qkv, keywords = _op_arguments(inp)
    return op(inp.q, inp.k, inp.v, *after_qkv, **keywords)


def _op_arguments(inp: adb.ForwardInputs) -> tuple:
    """What the forward op takes besides q, k and v for ``inp``'s signature: the op, its
    arguments after q, k and v, and its keywords."""
    after_qkv = (*_varlen_args(inp), 0.0, inp.causal, False)
    return aten(FLASH_FWD), after_qkv, {"scale": inp.scale, **_window_kwargs(inp)}


def _op_output(op, after_qkv: tuple, keywords: dict, q, k, v) -> torch.Tensor:
    """The output of the forward op for dense [B, S, H, D] q, k, v (the own node's function)."""
    return op(q, k, v, *after_qkv, **keywords)[0]


def _sdpa_output(op, causal: bool, scale: float, q, k, v) -> torch.Tensor:
    """sdpa's flash op's output for [B, H, S, D] q, k, v (no dropout, no debug mask)."""
    return op(q, k, v, 0.0, causal, False, scale=scale)[0]
