"""``torch_sdpa:cudnn``: cuDNN's fused attention (through PyTorch's private SDPA ops).

Layout: cuDNN takes BHSD *views*; our BSHD tensors are passed as ``transpose(1, 2)`` (no copy)
and the gradients come back in the inputs' memory order, so transposing them back is free.
The output and its gradient go in q's memory order, copied where they are not (see
``_run_backward``).
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

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import _common as c
from ._ops import CUDNN_BWD, CUDNN_FWD, aten, empty_long, ops_problems

_stats_rank: list[int] = [4, 3]  # ranks of lse to try for the backward, working one first


def heads_first_memory(q: torch.Tensor) -> bool:
    """Whether q's memory runs [B, H, S, D] (its sequence stride below its head stride)."""
    return q.stride(1) < q.stride(2)


def in_memory_order(t: torch.Tensor, heads_first: bool) -> torch.Tensor:
    """``t`` ([B, S, H, D]) itself where its memory is contiguous in that order, else a copy
    that is ([B, H, S, D] memory where ``heads_first``, rows otherwise)."""
    if not heads_first:
        return t if t.is_contiguous() else t.contiguous()
    heads = t.transpose(1, 2)
    return t if heads.is_contiguous() else heads.contiguous().transpose(1, 2)


def _run_backward(inp: adb.BackwardInputs, lse: torch.Tensor):
    seed = empty_long(inp.q.device)
    # PyTorch caches the backward graph it builds for cuDNN under q, k and v's layouts, and a
    # graph built for one layout of O and dO returned wrong gradients for another (benchmarks.md
    # section 9): O and dO go in q's memory order, so one layout of q, k, v brings one of them.
    heads_first = heads_first_memory(inp.q)
    grad_out = in_memory_order(inp.grad_out, heads_first)
    out = in_memory_order(inp.out, heads_first)
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

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the caller's out and lse (no recomputation)."""
        if c.is_empty(inp):
            return c.zero_gradients(inp)
        dq, dk, dv = _run_backward(inp, inp.lse.contiguous())
        return ad.Gradients(dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2))
