"""Exact attention forward and backward in plain PyTorch, processed in query chunks.

Math (per sequence, scores ``S = scale · Q Kᵀ``, ``M`` the causal mask, ``-inf`` where hidden):

    lse = logsumexp(S + M)            (-inf for a row that sees no key)
    P   = exp(S + M - lse)            (0 for such a row)
    O   = P V
    Dr  = rowsum(dO ∘ O)
    dP  = dO Vᵀ
    dS  = P ∘ (dP - Dr)
    dQ  = scale · dS K       dK = scale · dSᵀ Q       dV = Pᵀ dO

Queries are processed ``chunk`` rows at a time, so the live score-sized buffers hold
``batch · heads · chunk · Sk`` elements rather than ``batch · heads · Sq · Sk``; the chunk is
derived from a byte budget. Under causal masking each chunk only reads the keys it can see.
GQA is handled by viewing the ``H = Hkv · G`` query heads as ``[Hkv, G]`` and folding the group
into the row axis, so one matmul per KV head contracts over the whole group: dK/dV are
accumulated directly with ``Hkv`` heads, never expanded. Everything is computed in float32
(float64 for float64 inputs) and summed in a fixed order, so results are deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

import attn_dispatch as ad

#: Default budget for one score-sized buffer (``batch · heads · chunk · keys`` elements).
DEFAULT_BUDGET_BYTES = 128 * 1024 * 1024


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_rows(batch: int, heads: int, seqlen_k: int, elem_bytes: int, budget_bytes: int) -> int:
    """Query rows per chunk so one ``[batch, heads, chunk, seqlen_k]`` buffer fits the budget."""
    per_row = max(1, batch * heads * max(seqlen_k, 1) * elem_bytes)
    return max(1, budget_bytes // per_row)


def _host_offsets(cu_seqlens: Tensor) -> list[int]:
    # The reference is an oracle, not a hot path: reading the offsets on the host is a device
    # synchronisation when cu_seqlens lives on a GPU, which is acceptable here.
    return [int(x) for x in cu_seqlens.tolist()]


def _to_bhsd(x: Tensor, ctype: torch.dtype) -> Tensor:
    """[B, S, Hkv, D] -> [B, Hkv, S, D] in the compute dtype."""
    return x.to(ctype).permute(0, 2, 1, 3)


def _group_rows(x: Tensor, kv_heads: int, ctype: torch.dtype) -> Tensor:
    """[B, c, H, E] -> [B, Hkv, G·c, E] with row index g·c + i (group-major)."""
    b, c, h, e = x.shape
    g = h // kv_heads
    x = x.to(ctype).reshape(b, c, kv_heads, g, e).permute(0, 2, 3, 1, 4)
    return x.reshape(b, kv_heads, g * c, e)


def _ungroup_rows(x: Tensor, chunk: int) -> Tensor:
    """[B, Hkv, G·c, E] -> [B, c, H, E]: the inverse of :func:`_group_rows`."""
    b, hkv, gc, e = x.shape
    g = gc // chunk
    return x.reshape(b, hkv, g, chunk, e).permute(0, 3, 1, 2, 4).reshape(b, chunk, hkv * g, e)


def _lse_rows(lse: Tensor, kv_heads: int, i0: int, i1: int, ctype: torch.dtype) -> Tensor:
    """lse [B, H, Sq] -> [B, Hkv, G·c] for rows i0:i1, matching :func:`_group_rows`."""
    b, h, _ = lse.shape
    return lse[:, :, i0:i1].to(ctype).reshape(b, kv_heads, (h // kv_heads) * (i1 - i0))


def _scores(
    qc: Tensor, kt: Tensor, i0: int, c: int, group: int, n_keys: int, offset: int | None
) -> Tensor:
    """Scaled scores [B, Hkv, G·c, n_keys] for query rows i0..i0+c, -inf where masked."""
    s = torch.matmul(qc, kt[..., :n_keys])
    if offset is not None:
        rows = torch.arange(i0, i0 + c, device=s.device)
        cols = torch.arange(n_keys, device=s.device)
        hidden = cols[None, :] > rows[:, None] + offset  # [c, n_keys]
        s.masked_fill_(hidden.repeat(group, 1), float("-inf"))
    return s


def _visible_keys(i1: int, seqlen_k: int, offset: int | None) -> int:
    """How many leading keys the rows before i1 can see (all of them without causal)."""
    if offset is None:
        return seqlen_k
    return max(0, min(seqlen_k, i1 + offset))


def _finite(lse: Tensor) -> Tensor:
    """lse with -inf replaced by 0, so exp(-inf - lse) is 0 rather than NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def dense_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    scale: float,
    offset: int | None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> None:
    """Write out [B, Sq, H, Dv] and lse [B, H, Sq] for dense q/k/v; ``offset`` None = no mask.

    Causal row i sees key j iff ``j <= i + offset``.
    """
    b, sq, h, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = h // hkv
    ctype = compute_dtype(q.dtype)
    kt = _to_bhsd(k, ctype).transpose(-1, -2)
    vh = _to_bhsd(v, ctype)
    chunk = chunk_rows(b, h, sk, torch.finfo(ctype).bits // 8, budget_bytes)
    for i0 in range(0, sq, chunk):
        i1 = min(sq, i0 + chunk)
        c = i1 - i0
        n_keys = _visible_keys(i1, sk, offset)
        if n_keys == 0:
            out[:, i0:i1].zero_()
            lse[:, :, i0:i1] = float("-inf")
            continue
        qc = _group_rows(q[:, i0:i1], hkv, ctype) * scale
        s = _scores(qc, kt, i0, c, g, n_keys, offset)
        lse_c = torch.logsumexp(s, dim=-1)  # [B, Hkv, G·c]
        p = s.sub_(_finite(lse_c)[..., None]).exp_()
        out[:, i0:i1] = _ungroup_rows(torch.matmul(p, vh[..., :n_keys, :]), c)
        lse[:, :, i0:i1] = lse_c.reshape(b, h, c)


def dense_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    *,
    scale: float,
    offset: int | None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> None:
    """Write dq [B, Sq, H, D], dk [B, Sk, Hkv, D], dv [B, Sk, Hkv, Dv] for dense inputs.

    Uses the given ``out`` and ``lse``; ``offset`` as in :func:`dense_forward`.
    """
    b, sq, h, d = q.shape
    sk, hkv, dv_dim = k.shape[1], k.shape[2], v.shape[3]
    g = h // hkv
    ctype = compute_dtype(q.dtype)
    kh = _to_bhsd(k, ctype)
    vt = _to_bhsd(v, ctype).transpose(-1, -2)
    dk_acc = torch.zeros(b, hkv, sk, d, dtype=ctype, device=q.device)
    dv_acc = torch.zeros(b, hkv, sk, dv_dim, dtype=ctype, device=q.device)
    chunk = chunk_rows(b, h, sk, torch.finfo(ctype).bits // 8, budget_bytes)
    for i0 in range(0, sq, chunk):
        i1 = min(sq, i0 + chunk)
        c = i1 - i0
        n_keys = _visible_keys(i1, sk, offset)
        if n_keys == 0:
            dq[:, i0:i1].zero_()
            continue
        qc = _group_rows(q[:, i0:i1], hkv, ctype)
        doc = _group_rows(grad_out[:, i0:i1], hkv, ctype)
        oc = _group_rows(out[:, i0:i1], hkv, ctype)
        lse_c = _finite(_lse_rows(lse, hkv, i0, i1, ctype))
        drow = (doc * oc).sum(dim=-1, keepdim=True)  # [B, Hkv, G·c, 1]
        p = _scores(qc * scale, kh.transpose(-1, -2), i0, c, g, n_keys, offset)
        p.sub_(lse_c[..., None]).exp_()
        dv_acc[:, :, :n_keys] += torch.matmul(p.transpose(-1, -2), doc)
        ds = torch.matmul(doc, vt[..., :n_keys]).sub_(drow).mul_(p)
        del p
        dq[:, i0:i1] = _ungroup_rows(torch.matmul(ds, kh[:, :, :n_keys]) * scale, c)
        dk_acc[:, :, :n_keys] += torch.matmul(ds.transpose(-1, -2), qc).mul_(scale)
    dk.copy_(dk_acc.permute(0, 2, 1, 3))
    dv.copy_(dv_acc.permute(0, 2, 1, 3))


def _causal_offset(causal: bool, align: str, sq: int, sk: int) -> int | None:
    if not causal:
        return None
    return 0 if align == "top_left" else sk - sq


def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    causal_align: str,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> tuple[Tensor, Tensor]:
    """(out, lse) for dense [B, S, H, D] or varlen [T, H, D] inputs (varlen iff cu_seqlens)."""
    lse_dtype = ad.lse_dtype(q.dtype)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if cu_seqlens_q is None:
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=lse_dtype, device=q.device)
        off = _causal_offset(causal, causal_align, q.shape[1], k.shape[1])
        dense_forward(q, k, v, out, lse, scale=scale, offset=off, budget_bytes=budget_bytes)
        return out, lse
    lse = torch.empty(q.shape[1], q.shape[0], dtype=lse_dtype, device=q.device)
    for (q0, q1), (k0, k1) in _sequences(cu_seqlens_q, cu_seqlens_k):
        if q1 == q0:
            continue
        off = _causal_offset(causal, causal_align, q1 - q0, k1 - k0)
        dense_forward(
            q[q0:q1].unsqueeze(0),
            k[k0:k1].unsqueeze(0),
            v[k0:k1].unsqueeze(0),
            out[q0:q1].unsqueeze(0),
            lse[:, q0:q1].unsqueeze(0),
            scale=scale,
            offset=off,
            budget_bytes=budget_bytes,
        )
    return out, lse


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    *,
    scale: float,
    causal: bool,
    causal_align: str,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) with the shapes and dtype of (q, k, v); dense or varlen as above."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if cu_seqlens_q is None:
        off = _causal_offset(causal, causal_align, q.shape[1], k.shape[1])
        dense_backward(
            q,
            k,
            v,
            out,
            lse,
            grad_out,
            dq,
            dk,
            dv,
            scale=scale,
            offset=off,
            budget_bytes=budget_bytes,
        )
        return dq, dk, dv
    dq.zero_()
    dk.zero_()
    dv.zero_()
    for (q0, q1), (k0, k1) in _sequences(cu_seqlens_q, cu_seqlens_k):
        if q1 == q0:
            continue
        off = _causal_offset(causal, causal_align, q1 - q0, k1 - k0)
        dense_backward(
            q[q0:q1].unsqueeze(0),
            k[k0:k1].unsqueeze(0),
            v[k0:k1].unsqueeze(0),
            out[q0:q1].unsqueeze(0),
            lse[:, q0:q1].unsqueeze(0),
            grad_out[q0:q1].unsqueeze(0),
            dq[q0:q1].unsqueeze(0),
            dk[k0:k1].unsqueeze(0),
            dv[k0:k1].unsqueeze(0),
            scale=scale,
            offset=off,
            budget_bytes=budget_bytes,
        )
    return dq, dk, dv


def _sequences(cu_q: Tensor, cu_k: Tensor | None) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    if cu_k is None:
        raise ValueError("cu_seqlens_k: expected a tensor when cu_seqlens_q is given, got None")
    oq, ok = _host_offsets(cu_q), _host_offsets(cu_k)
    return [((oq[i], oq[i + 1]), (ok[i], ok[i + 1])) for i in range(len(oq) - 1)]
