r"""Fused attention forward: ``(out, lse)`` in one pass over the keys (online softmax).

For one query row :math:`q_i` and the keys it may see (:math:`j \in V(i)`):

.. math::

    s_{ij} = \text{scale}\; q_i \cdot k_j, \qquad
    \mathrm{lse}_i = \log \sum_{j \in V(i)} e^{s_{ij}}, \qquad
    o_i = \sum_{j \in V(i)} e^{s_{ij} - \mathrm{lse}_i}\, v_j .

The kernel works in base 2: ``qk_scale = scale * log2(e)`` turns every ``exp`` into ``exp2``,
and the running max ``m_i`` and sum ``l_i`` live in that domain; the stored lse is converted back
to the natural log, ``lse = (m_i + log2 l_i) * ln 2``. A row that sees no key (possible with
``causal_align="bottom_right"`` when Sq > Sk, or an empty key sequence) gets ``lse = -inf`` and
``o = 0``.

Visible keys form a band around each row's diagonal (``_band``: causal mask and sliding window);
with ``SOFTCAP`` the scores are capped first, :math:`s \to c \tanh(s / c)`, and the lse is over
the capped scores.

With ``HAS_SINKS`` each head has one more logit :math:`\sigma_h` in every row's normaliser, with
no value: the epilogue folds it into the running max and sum once the keys are done,
:math:`\mathrm{lse}_i = \log(\sum_j e^{s_{ij}} + e^{\sigma_h})` (never ``-inf``: a row that
sees no key has ``lse = sigma_h`` and ``o = 0``), and the output is divided by that sum.

One program owns BLOCK_M query rows of one (sequence, head). It walks only the key blocks that
meet its rows' band (``_common.key_block_ranges``): whole blocks every row sees without a mask,
the few at the band's edges and the last partial block with one; blocks wholly outside the band
are never visited.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attn_dispatch import backend as adb

from . import _band
from ._common import (
    LOG2E,
    band_offsets,
    band_where,
    dense_vector,
    kernel_operands,
    key_block_ranges,
    load_strided_tile,
    log2_scores,
    lse_strides,
    padded_dim,
    query_program,
    seq_bounds,
    softcap_mode,
    store_tile,
    token_strides,
)


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_ks,
    stride_vs,
    lo,
    hi,
    offs_m,
    band,
    k_len,
    qk_scale,
    cap,
    D,
    DV,
    MASKED: tl.constexpr,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Accumulate key blocks [lo, hi) into (acc, l_i, m_i); MASKED applies bounds + band.
    ``band``: ``(lo_off, hi_off)``; ``cap``: ``(cap_in, cap_out)`` of the soft cap."""
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + offs_n0
        # -- s = q k^T, in the log2 domain
        k = load_strided_tile(k_base, stride_ks, offs_n, k_len, offs_d, D, MASKED, BLOCK_D)
        qk, _ = log2_scores(tl.dot(q, tl.trans(k)), qk_scale, cap, SOFTCAP)
        if MASKED:
            keep = offs_n[None, :] < k_len
            qk = band_where(
                qk,
                float("-inf"),
                keep,
                offs_m[:, None],
                offs_n[None, :],
                band,
                LIMIT_LEFT,
                LIMIT_RIGHT,
            )
        # -- online softmax update; a row with no key so far keeps m = -inf, guard the shift
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        # -- o += p v
        v = load_strided_tile(v_base, stride_vs, offs_n, k_len, offs_dv, DV, MASKED, BLOCK_DV)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "heads", "group"])
def _attn_fwd(
    Q,
    K,
    V,
    Out,
    Lse,
    Sinks,
    CU_Q,
    CU_K,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_lh,
    stride_ls,
    seqlen_q,
    seqlen_k,
    heads,
    group,
    qk_scale,
    win_left,
    win_right,
    softcap,
    D: tl.constexpr,
    DV: tl.constexpr,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m, b, h, hk = query_program(heads, group, False)
    q_start, q_len, k_start, k_len = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= q_len:
        return
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qs + h * stride_qh
    k_base = K + b64 * stride_kb + k_start.to(tl.int64) * stride_ks + hk * stride_kh
    v_base = V + b64 * stride_vb + k_start.to(tl.int64) * stride_vs + hk * stride_vh
    o_base = Out + b64 * stride_ob + q_start.to(tl.int64) * stride_os + h * stride_oh
    l_base = Lse + b64 * stride_lb + q_start.to(tl.int64) * stride_ls + h * stride_lh

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_strided_tile(q_base, stride_qs, offs_m, q_len, offs_d, D, True, BLOCK_D)

    # Key ranges: [lo, full_lo) and [full_hi, hi) masked (band edges, partial tail), between
    # them whole blocks without a mask; nothing outside [lo, hi).
    band = band_offsets(q_len, k_len, win_left, win_right, BOTTOM_RIGHT)
    lo, full_lo, full_hi, hi = key_block_ranges(
        m0, q_len, k_len, band[0], band[1], LIMIT_LEFT, LIMIT_RIGHT, BLOCK_M, BLOCK_N
    )
    if SOFTCAP:
        cap = (qk_scale / (softcap * 1.4426950408889634), softcap * 1.4426950408889634)
    else:
        cap = (qk_scale, qk_scale)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    ranges = (lo, full_lo, full_hi, hi)
    for seg in tl.static_range(3):  # [lo, full_lo) masked, [full_lo, full_hi), [full_hi, hi) masked
        if seg > 0 or LIMIT_LEFT:  # without a left bound [lo, full_lo) is empty
            acc, l_i, m_i = _attn_fwd_inner(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                stride_ks,
                stride_vs,
                ranges[seg],
                ranges[seg + 1],
                offs_m,
                band,
                k_len,
                qk_scale,
                cap,
                D,
                DV,
                seg != 1,
                LIMIT_LEFT,
                LIMIT_RIGHT,
                SOFTCAP,
                BLOCK_N,
                BLOCK_D,
                BLOCK_DV,
            )

    if HAS_SINKS:
        # the sink (log2 domain) joins the running max and sum: one more term, no value
        sink = tl.load(Sinks + h) * 1.4426950408889634
        m_new = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_new)  # 0 for a row that saw no key (m_i = -inf)
        l_i = l_i * alpha + tl.math.exp2(sink - m_new)
        acc = acc * alpha[:, None]
        m_i = m_new
    # Epilogue: normalise; rows that saw no key get out = 0 and lse = -inf (without sinks).
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    store_tile(
        o_base + offs_m[:, None] * stride_os + offs_dv[None, :],
        out.to(Out.dtype.element_ty),
        offs_m,
        q_len,
        offs_dv,
        DV,
        BLOCK_DV != DV,
    )
    tl.store(l_base + offs_m * stride_ls, lse, mask=offs_m < q_len)


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    band: adb.Band,
    scale: float,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softcap: float | None = None,
    config: dict | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel; returns ``(out, lse)`` in our layout (BSHD / THD, lse fp32).

    ``band``: the keys around each row's diagonal (the call's ``inp.band``: causal mask and
    sliding window, no side wider than the sequences); ``softcap``: ``c`` caps the scores at
    ``c * tanh(s / c)`` (validated, as on the inputs). See ``_band``.
    ``config`` holds BLOCK_M, BLOCK_N, num_warps, num_stages (default: the tuning table).
    ``out`` / ``lse`` may be given preallocated (tests poison them). ``sinks``: ``None`` or a
    float32 ``[heads]`` tensor of sink logits (the lse then includes them).
    """
    varlen = cu_seqlens_q is not None
    q, k, v = kernel_operands(q, k, v)
    cu_seqlens_q, cu_seqlens_k, sinks = (
        dense_vector(t) for t in (cu_seqlens_q, cu_seqlens_k, sinks)
    )
    if varlen:
        batch = cu_seqlens_q.numel() - 1
        heads, kv_heads = q.shape[1], k.shape[1]
        seqlen_q, seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        lse_shape = (heads, q.shape[0])
    else:
        batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
        seqlen_k, kv_heads = k.shape[1], k.shape[2]
        lse_shape = (batch, heads, seqlen_q)
    d, dv = q.shape[-1], v.shape[-1]
    if out is None:
        out = torch.empty((*q.shape[:-1], dv), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if config is None:
        from .tuning import get_backward_config

        group = heads // kv_heads
        configs = get_backward_config(q.device, d, band.limited, group, seqlen_k, head_dim_v=dv)
        config = configs["fwd"]
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    cu_q = cu_seqlens_q if varlen else q  # an unused pointer when dense
    cu_k = cu_seqlens_k if varlen else q
    grid = (triton.cdiv(max(seqlen_q, 1), block_m), batch * heads)
    _attn_fwd[grid](
        q,
        k,
        v,
        out,
        lse,
        q if sinks is None else sinks,  # an unused pointer without sinks
        cu_q,
        cu_k,
        *token_strides(q, varlen),
        *token_strides(k, varlen),
        *token_strides(v, varlen),
        *token_strides(out, varlen),
        *lse_strides(lse, varlen),
        seqlen_q,
        seqlen_k,
        heads,
        heads // kv_heads,
        scale * LOG2E,
        *_band.sides(band),
        softcap or 1.0,
        D=d,
        DV=dv,
        **_band.constexprs(band),
        SOFTCAP=softcap_mode(softcap, q.device),
        HAS_SINKS=sinks is not None,
        IS_VARLEN=varlen,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=padded_dim(d),
        BLOCK_DV=padded_dim(dv),
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return out, lse
