"""Fused attention backward: the launcher that runs preprocess, dK/dV and dQ.

Three launches, no atomics, no fp32 scratch for the gradients (see the kernel modules for the
math): ``_bwd_preprocess`` (delta, lse2), ``_bwd_dkdv`` (one program per key block and kv head,
walking the GQA group), ``_bwd_dq`` (one program per query block and head).
"""

from __future__ import annotations

import torch
import triton

from ._bwd_dkdv import _attn_bwd_dkdv
from ._bwd_dq import _attn_bwd_dq
from ._bwd_preprocess import _attn_bwd_preprocess
from ._common import LOG2E, last_dim_contiguous, lse_strides, padded_dim, token_strides


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, grad_out: torch.Tensor, *, causal: bool,
                       bottom_right: bool, scale: float,
                       cu_seqlens_q: torch.Tensor | None = None,
                       cu_seqlens_k: torch.Tensor | None = None,
                       max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                       config: dict | None = None, dq: torch.Tensor | None = None,
                       dk: torch.Tensor | None = None, dv: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of attention, shaped and typed like ``(q, k, v)``.

    ``config`` maps "pre"/"dkdv"/"dq" to {BLOCK_M, BLOCK_N, num_warps, num_stages} (default:
    the tuning table). ``dq``/``dk``/``dv`` may be given preallocated (tests poison them).
    """
    varlen = cu_seqlens_q is not None
    q, k, v, out, grad_out = (last_dim_contiguous(t) for t in (q, k, v, out, grad_out))
    if varlen:
        batch = cu_seqlens_q.numel() - 1
        heads, kv_heads = q.shape[1], k.shape[1]
        seqlen_q, seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    else:
        batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
        seqlen_k, kv_heads = k.shape[1], k.shape[2]
    d, d_v = q.shape[-1], v.shape[-1]
    group = heads // kv_heads
    if config is None:
        from .tuning import get_backward_config

        config = get_backward_config(q.device, d, causal, group)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    lse2 = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse2)
    cu_q = cu_seqlens_q if varlen else q  # an unused pointer when dense
    cu_k = cu_seqlens_k if varlen else q
    block_d, block_dv = padded_dim(d), padded_dim(d_v)
    flags = dict(CAUSAL=causal, BOTTOM_RIGHT=bottom_right, IS_VARLEN=varlen)
    s_q, s_k, s_v = (token_strides(t, varlen) for t in (q, k, v))
    s_o, s_do = token_strides(out, varlen), token_strides(grad_out, varlen)
    s_t = lse_strides(lse2, varlen)

    pre = config["pre"]
    _attn_bwd_preprocess[(triton.cdiv(max(seqlen_q, 1), pre["BLOCK_M"]), batch * heads)](
        out, grad_out, lse, delta, lse2, cu_q, *s_o, *s_do, *lse_strides(lse, varlen), *s_t,
        seqlen_q, heads, DV=d_v, IS_VARLEN=varlen, BLOCK_M=pre["BLOCK_M"], BLOCK_DV=block_dv,
        num_warps=pre["num_warps"], num_stages=pre["num_stages"],
    )
    c = config["dkdv"]
    _attn_bwd_dkdv[(triton.cdiv(max(seqlen_k, 1), c["BLOCK_N"]), batch * kv_heads)](
        q, k, v, grad_out, dk, dv, lse2, delta, cu_q, cu_k,
        *s_q, *s_k, *s_v, *s_do, *token_strides(dk, varlen), *token_strides(dv, varlen), *s_t,
        seqlen_q, seqlen_k, kv_heads, group, scale * LOG2E, scale,
        D=d, DV=d_v, **flags, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
        BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=c["num_warps"], num_stages=c["num_stages"],
    )
    c = config["dq"]
    _attn_bwd_dq[(triton.cdiv(max(seqlen_q, 1), c["BLOCK_M"]), batch * heads)](
        q, k, v, grad_out, dq, lse2, delta, cu_q, cu_k,
        *s_q, *s_k, *s_v, *s_do, *token_strides(dq, varlen), *s_t,
        seqlen_q, seqlen_k, heads, group, scale * LOG2E, scale,
        D=d, DV=d_v, **flags, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
        BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=c["num_warps"], num_stages=c["num_stages"],
    )
    return dq, dk, dv
