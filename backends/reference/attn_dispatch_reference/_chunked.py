"""Exact attention forward and backward in plain PyTorch, processed in query chunks.

Math (per sequence, scaled scores ``S = scale · Q Kᵀ``, ``M`` the band mask, ``-inf`` where
hidden, ``c`` the optional soft cap):

    Z   = c · tanh(S / c)         (Z = S without a soft cap)
    lse = logsumexp(Z + M)        (-inf for a row that sees no key)
    P   = exp(Z + M - lse)        (0 for such a row)
    O   = P V
    Dr  = rowsum(dO ∘ O)
    dP  = dO Vᵀ
    dZ  = P ∘ (dP - Dr)
    dS  = dZ ∘ (1 - tanh²(S / c)) (dS = dZ without a soft cap)
    dQ  = scale · dS K       dK = scale · dSᵀ Q       dV = Pᵀ dO

With attention sinks (one logit ``σ_h`` per query head, no value) each row's normaliser gains
one term: ``lse = log(Σ_j exp(Z + M) + exp(σ_h))``, so ``P`` (computed from that lse) sums to
less than one and ``P_sink = exp(σ_h - lse)``; a row that sees no key has ``lse = σ_h`` and
output 0. The backward formulas above hold unchanged with that lse, and
``dσ_h = -Σ_rows P_sink · Dr`` (over the batch and every row of head h).

The band is the call's ``adb.Band`` (``inp.band``: causal mask and window as one value): row
``i``'s diagonal is ``d_i = i + band.offset(Sq, Sk)`` (per sequence when varlen) and key ``j`` is
visible iff ``d_i - left <= j <= d_i + right``; a side that is ``None`` is unbounded. The core
already made a side that excludes no key unbounded, so the mask arithmetic on int64 tensors
never meets a side near the int64 limit.

Queries are processed ``chunk`` rows at a time, so the live score-sized buffers hold
``batch · heads · chunk · keys`` elements rather than ``batch · heads · Sq · Sk``; the chunk is
derived from a byte budget. Each chunk reads only the keys its rows can see, so under a causal
mask it skips the keys after its last diagonal, and under a window bounded on both sides
(``width = left + right + 1`` keys per row) chunks are sized near the width, which makes the
work O(Sq · width) rather than O(Sq · Sk). GQA is handled by viewing the ``H = Hkv · G`` query
heads as ``[Hkv, G]`` and folding the group into the row axis, so one matmul per KV head
contracts over the whole group: dK/dV are accumulated directly with ``Hkv`` heads, never
expanded. Everything is computed in float32 (float64 for float64 inputs) and summed in a fixed
order, so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from attn_dispatch import backend as adb

#: Default budget for one score-sized buffer (``batch · heads · chunk · keys`` elements).
DEFAULT_BUDGET_BYTES = 128 * 1024 * 1024

#: Fewest query rows per chunk under a two-sided window (fewer would only add Python overhead).
MIN_BAND_ROWS = 64


def band_width(band: adb.Band) -> int | None:
    """Keys a row can see at most, or ``None`` when a side is unbounded."""
    if band.left is None or band.right is None:
        return None
    return band.left + band.right + 1


class Tile(NamedTuple):
    """Query rows ``i0:i1`` and the keys ``k0:k1`` they can see (``k0 == k1``: none)."""

    i0: int
    i1: int
    k0: int
    k1: int


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_rows(batch: int, heads: int, seqlen_k: int, elem_bytes: int, budget_bytes: int) -> int:
    """Query rows per chunk so one ``[batch, heads, chunk, seqlen_k]`` buffer fits the budget."""
    per_row = max(1, batch * heads * max(seqlen_k, 1) * elem_bytes)
    return max(1, budget_bytes // per_row)


def plan(
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    elem_bytes: int,
    budget_bytes: int,
    band: adb.Band,
) -> list[Tile]:
    """The tiles the forward and backward process, in order.

    Rows per chunk fit one ``[batch, heads, rows, keys]`` buffer in the budget. Under a window
    bounded on both sides the chunk is sized near the band width (a chunk of ``c`` rows reads at
    most ``c + width - 1`` keys), so the total work is about ``Sq · 2 · width``.
    """
    rows = chunk_rows(batch, heads, seqlen_k, elem_bytes, budget_bytes)
    width = band_width(band)
    if width is not None and width < seqlen_k:
        rows = max(MIN_BAND_ROWS, width)
        per_key = max(1, batch * heads * elem_bytes)
        while rows > 1 and rows * min(seqlen_k, rows + width - 1) * per_key > budget_bytes:
            rows //= 2
    tiles = []
    for i0 in range(0, seqlen_q, rows):
        i1 = min(seqlen_q, i0 + rows)
        tiles.append(Tile(i0, i1, *band.key_range(i0, i1, seqlen_q, seqlen_k)))
    return tiles


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


def _hidden(band: adb.Band, shift: int, tile: Tile, device: torch.device) -> Tensor:
    """Bool [c, k1 - k0]: True where row i0 + r (diagonal i0 + r + shift) cannot see key
    k0 + j."""
    diag = torch.arange(tile.i0, tile.i1, device=device)[:, None] + shift
    cols = torch.arange(tile.k0, tile.k1, device=device)[None, :]
    hidden = torch.zeros(diag.shape[0], cols.shape[1], dtype=torch.bool, device=device)
    if band.right is not None:
        hidden |= cols > diag + band.right
    if band.left is not None:
        hidden |= cols < diag - band.left
    return hidden


def _scores(
    qc: Tensor,
    kt: Tensor,
    tile: Tile,
    group: int,
    band: adb.Band,
    shift: int,
    softcap: float | None,
    derivative: bool,
) -> tuple[Tensor, Tensor | None]:
    """Capped, masked scores [B, Hkv, G·c, k1 - k0] of ``qc`` (already scaled) against the
    tile's keys, and, when ``derivative`` and capped, ``1 - tanh²(S / c)`` (the cap's slope)."""
    z = torch.matmul(qc, kt[..., tile.k0 : tile.k1])
    slope = None
    if softcap is not None:
        z.div_(softcap).tanh_()
        if derivative:
            slope = 1 - z.square()  # before masking: -inf would make it NaN
        z.mul_(softcap)
    if band.limited:
        z.masked_fill_(_hidden(band, shift, tile, z.device).repeat(group, 1), float("-inf"))
    return z, slope


def _sink_rows(sinks: Tensor, kv_heads: int, chunk: int) -> Tensor:
    """sinks [H] -> [Hkv, G·c], matching the row order of :func:`_group_rows`."""
    g = sinks.shape[0] // kv_heads
    return sinks.reshape(kv_heads, g, 1).expand(kv_heads, g, chunk).reshape(kv_heads, g * chunk)


def _finite(lse: Tensor) -> Tensor:
    """lse with -inf replaced by 0, so exp(-inf - lse) is 0 rather than NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def _plan_for(q: Tensor, k: Tensor, budget_bytes: int, band: adb.Band) -> list[Tile]:
    b, sq, h, _ = q.shape
    elem_bytes = torch.finfo(compute_dtype(q.dtype)).bits // 8
    return plan(b, h, sq, k.shape[1], elem_bytes, budget_bytes, band)


def dense_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    scale: float,
    band: adb.Band,
    softcap: float | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    sinks: Tensor | None = None,
) -> None:
    """Write out [B, Sq, H, Dv] and lse [B, H, Sq] for dense q/k/v (``sinks``: [H] logits
    joining every row's normaliser, in the compute dtype)."""
    b, sq, h, _ = q.shape
    hkv = k.shape[2]
    shift = band.offset(sq, k.shape[1])
    ctype = compute_dtype(q.dtype)
    kt = _to_bhsd(k, ctype).transpose(-1, -2)
    vh = _to_bhsd(v, ctype)
    for tile in _plan_for(q, k, budget_bytes, band):
        i0, i1, k0, k1 = tile
        c = i1 - i0
        if k1 == k0:
            out[:, i0:i1].zero_()
            lse[:, :, i0:i1] = float("-inf") if sinks is None else sinks[None, :, None]
            continue
        qc = _group_rows(q[:, i0:i1], hkv, ctype) * scale
        z, _ = _scores(qc, kt, tile, h // hkv, band, shift, softcap, derivative=False)
        lse_c = torch.logsumexp(z, dim=-1)  # [B, Hkv, G·c]
        if sinks is not None:
            lse_c = torch.logaddexp(lse_c, _sink_rows(sinks, hkv, c))
        p = z.sub_(_finite(lse_c)[..., None]).exp_()
        out[:, i0:i1] = _ungroup_rows(torch.matmul(p, vh[..., k0:k1, :]), c)
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
    band: adb.Band,
    softcap: float | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> None:
    """Write dq [B, Sq, H, D], dk [B, Sk, Hkv, D], dv [B, Sk, Hkv, Dv] for dense inputs.

    Uses the given ``out`` and ``lse``; ``band`` and ``softcap`` as in :func:`dense_forward`.
    """
    b, sq, h, d = q.shape
    sk, hkv, dv_dim = k.shape[1], k.shape[2], v.shape[3]
    shift = band.offset(sq, sk)
    ctype = compute_dtype(q.dtype)
    kh = _to_bhsd(k, ctype)
    vt = _to_bhsd(v, ctype).transpose(-1, -2)
    dk_acc = torch.zeros(b, hkv, sk, d, dtype=ctype, device=q.device)
    dv_acc = torch.zeros(b, hkv, sk, dv_dim, dtype=ctype, device=q.device)
    for tile in _plan_for(q, k, budget_bytes, band):
        i0, i1, k0, k1 = tile
        c = i1 - i0
        if k1 == k0:
            dq[:, i0:i1].zero_()
            continue
        qc = _group_rows(q[:, i0:i1], hkv, ctype)
        doc = _group_rows(grad_out[:, i0:i1], hkv, ctype)
        oc = _group_rows(out[:, i0:i1], hkv, ctype)
        lse_c = _finite(_lse_rows(lse, hkv, i0, i1, ctype))
        drow = (doc * oc).sum(dim=-1, keepdim=True)  # [B, Hkv, G·c, 1]
        kt = kh.transpose(-1, -2)
        p, slope = _scores(qc * scale, kt, tile, h // hkv, band, shift, softcap, derivative=True)
        p.sub_(lse_c[..., None]).exp_()
        dv_acc[:, :, k0:k1] += torch.matmul(p.transpose(-1, -2), doc)
        ds = torch.matmul(doc, vt[..., k0:k1]).sub_(drow).mul_(p)
        del p
        if slope is not None:
            ds.mul_(slope)
            del slope
        dq[:, i0:i1] = _ungroup_rows(torch.matmul(ds, kh[:, :, k0:k1]) * scale, c)
        dk_acc[:, :, k0:k1] += torch.matmul(ds.transpose(-1, -2), qc).mul_(scale)
    dk.copy_(dk_acc.permute(0, 2, 1, 3))
    dv.copy_(dv_acc.permute(0, 2, 1, 3))


def _sequences(cu_q: Tensor, cu_k: Tensor | None) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    if cu_k is None:
        raise ValueError("cu_seqlens_k: expected a tensor when cu_seqlens_q is given, got None")
    oq, ok = _host_offsets(cu_q), _host_offsets(cu_k)
    return [((oq[i], oq[i + 1]), (ok[i], ok[i + 1])) for i in range(len(oq) - 1)]


def _pieces(
    q_side: tuple[Tensor, ...],
    k_side: tuple[Tensor, ...],
    lse: Tensor,
    cu_q: Tensor | None,
    cu_k: Tensor | None,
) -> Iterator[tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor]]:
    """Dense problems: the inputs themselves, or per varlen sequence with queries, views
    ``[1, S, H, *]`` of the query-side and key-side tensors and lse ``[1, H, Sq]``."""
    if cu_q is None:
        yield q_side, k_side, lse
        return
    for (q0, q1), (k0, k1) in _sequences(cu_q, cu_k):
        if q1 > q0:
            yield (
                tuple(t[q0:q1].unsqueeze(0) for t in q_side),
                tuple(t[k0:k1].unsqueeze(0) for t in k_side),
                lse[:, q0:q1].unsqueeze(0),
            )


def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    band: adb.Band,
    softcap: float | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(out, lse) for dense [B, S, H, D] or varlen [T, H, D] inputs (varlen iff cu_seqlens).

    ``band``: the call's visible keys (``inp.band``; the diagonal aligned per sequence when
    varlen). ``softcap``: scores become ``softcap · tanh(s / softcap)`` before the softmax.
    ``sinks``: ``None`` or [H] attention-sink logits (lse includes them).
    Arguments are taken as validated (``adb.make_inputs`` builds them from a call's flags).
    """
    if sinks is not None:
        sinks = sinks.to(compute_dtype(q.dtype))
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse_shape = adb.lse_shape(q.shape, cu_seqlens_q is not None)
    lse = torch.empty(lse_shape, dtype=adb.lse_dtype(q.dtype), device=q.device)
    for (qs, outs), (ks, vs), lses in _pieces((q, out), (k, v), lse, cu_seqlens_q, cu_seqlens_k):
        dense_forward(
            qs,
            ks,
            vs,
            outs,
            lses,
            scale=scale,
            band=band,
            softcap=softcap,
            budget_bytes=budget_bytes,
            sinks=sinks,
        )
    return out, lse


def sinks_gradient(out: Tensor, lse: Tensor, grad_out: Tensor, sinks: Tensor) -> Tensor:
    """``dsinks[h] = -Σ_rows exp(sinks[h] - lse) · rowsum(dO ∘ O)`` over the batch and every row,
    for dense (lse [B, H, Sq]) or varlen (lse [H, T]) tensors, in ``sinks``' dtype."""
    ctype = compute_dtype(out.dtype)
    delta = (grad_out.to(ctype) * out.to(ctype)).sum(dim=-1)  # [B, Sq, H] or [T, H]
    delta = delta.movedim(-1, -2) if lse.dim() == 3 else delta.t()  # as lse
    heads = (None, slice(None), None) if lse.dim() == 3 else (slice(None), None)
    p_sink = torch.exp(sinks.to(ctype)[heads] - lse.to(ctype))
    dims = (0, 2) if lse.dim() == 3 else (1,)
    return (-(p_sink * delta).sum(dim=dims)).to(sinks.dtype)


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    *,
    scale: float,
    band: adb.Band,
    softcap: float | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) with the shapes and dtype of (q, k, v); arguments as in the forward."""
    # Varlen: tokens of sequences without queries are not visited, so start from zeros.
    alloc = torch.empty if cu_seqlens_q is None else torch.zeros
    dq, dk, dv = (alloc(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    for (qs, os_, dos, dqs), (ks, vs, dks, dvs), lses in _pieces(
        (q, out, grad_out, dq), (k, v, dk, dv), lse, cu_seqlens_q, cu_seqlens_k
    ):
        dense_backward(
            qs,
            ks,
            vs,
            os_,
            lses,
            dos,
            dqs,
            dks,
            dvs,
            scale=scale,
            band=band,
            softcap=softcap,
            budget_bytes=budget_bytes,
        )
    return dq, dk, dv
