r"""The attention sinks' gradient: ``dsinks_h = -sum_{b,i} exp(sigma_h - lse_bhi) delta_bhi``.

A sink is one more logit :math:`\sigma_h` in every row's softmax, with no value. Its probability
in row :math:`i` is :math:`P^{sink}_i = e^{\sigma_h - lse_i}` (the lse includes the sink), and
the softmax backward gives it :math:`-P^{sink}_i \delta_i` with
:math:`\delta_i = \mathrm{rowsum}(dO_i \circ O_i)`, summed over every row of head ``h``.

The dQ/dK/dV kernels need nothing of the sinks (their probabilities read the lse, which already
has them); this kernel reads O and dO once more, one program per (query block, sequence, head)
writing its partial sum, and the partials are summed in a fixed order afterwards, so the result
is deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    dense_vector,
    lse_strides,
    padded_dim,
    query_block,
    row_delta_lse,
    token_strides,
)


@triton.jit(do_not_specialize=["seqlen_q", "heads"])
def _attn_bwd_sinks(
    Out,
    DO,
    Lse,
    Sinks,
    Partial,
    CU_Q,
    stride_ob,
    stride_os,
    stride_oh,
    stride_dob,
    stride_dos,
    stride_doh,
    stride_lb,
    stride_lh,
    stride_ls,
    seqlen_q,
    heads,
    DV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    b64, row0, h, q_len, offs_m = query_block(CU_Q, seqlen_q, heads, IS_VARLEN, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= q_len:  # the partial stays the zero it was allocated as
        return
    delta, lse = row_delta_lse(
        Out,
        DO,
        Lse,
        b64,
        row0,
        h,
        (stride_ob, stride_os, stride_oh),
        (stride_dob, stride_dos, stride_doh),
        (stride_lb, stride_lh, stride_ls),
        offs_m,
        q_len,
        float("inf"),  # rows past the sequence: P_sink = 0
        DV,
        BLOCK_DV,
    )
    sink = tl.load(Sinks + h).to(tl.float32)
    p_sink = tl.math.exp2((sink - lse) * 1.4426950408889634)
    tl.store(
        Partial + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1),
        -tl.sum(p_sink * delta, axis=0),
    )


def sinks_backward(
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    sinks: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    block_m: int = 64,
) -> torch.Tensor:
    """``dsinks`` (``sinks``' shape, dtype and device) from the forward's ``out`` and ``lse``
    (which includes the sinks) and ``grad_out``; dense [B, S, H, Dv] or varlen [T, H, Dv]."""
    varlen = cu_seqlens_q is not None
    # the kernel reads sinks[h] and cu_seqlens[b] as X + i: strided views through dense copies
    sinks, cu_seqlens_q = dense_vector(sinks), dense_vector(cu_seqlens_q)
    if out.stride(-1) != 1:
        out = out.contiguous()
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    if varlen:
        batch, heads, seqlen_q = cu_seqlens_q.numel() - 1, out.shape[1], int(max_seqlen_q)
    else:
        batch, seqlen_q, heads = out.shape[0], out.shape[1], out.shape[2]
    blocks = triton.cdiv(max(seqlen_q, 1), block_m)
    partial = torch.zeros((blocks, batch, heads), dtype=torch.float32, device=out.device)
    if batch * heads and seqlen_q:
        _attn_bwd_sinks[(blocks, batch * heads)](
            out,
            grad_out,
            lse,
            sinks,
            partial,
            cu_seqlens_q if varlen else out,  # an unused pointer when dense
            *token_strides(out, varlen),
            *token_strides(grad_out, varlen),
            *lse_strides(lse, varlen),
            seqlen_q,
            heads,
            DV=out.shape[-1],
            IS_VARLEN=varlen,
            BLOCK_M=block_m,
            BLOCK_DV=padded_dim(out.shape[-1]),
            num_warps=4,
        )
    return partial.sum((0, 1)).to(sinks.dtype)
