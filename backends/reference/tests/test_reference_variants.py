"""Sliding-window attention and logit soft-capping in the reference backend.

The oracle here is written from the contract alone: a float64 masked softmax over the explicit
band ``d_i - left <= j <= d_i + right`` (``d_i = i`` top-left, ``i + Sk - Sq`` bottom-right,
causal: ``right = min(right, 0)``; the kit's ``visible_mask``, which ``tests/core/test_testing.py``
checks against the contract element by element) of the scores ``c · tanh(s / c)``, with gradients by
autograd through it. Inputs are fresh random tensors; every allocation of the backend is
poisoned with NaN (torch's deterministic mode fills uninitialised memory), so an element left
unwritten fails the comparison.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch
from attn_dispatch_reference import attention_backward, attention_forward
from attn_dispatch_reference._chunked import MIN_BAND_ROWS, dense_forward, plan
from attn_dispatch_reference.plugin import Chunked
from torch.utils.flop_counter import FlopCounterMode

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing import error_metrics, tolerance_for, visible_mask


@pytest.fixture(autouse=True)
def poisoned_allocations():
    """torch.empty returns NaN-filled memory while deterministic algorithms are on."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(before)


# ----------------------------------------------------------------------------------------------
# The oracle


def _dense_oracle(q, k, v, scale, mask, softcap):
    """out [B, Sq, H, Dv], lse [B, H, Sq] of float64 q [B, Sq, H, D], k/v [B, Sk, Hkv, *]."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    sees = mask.any(dim=-1)  # [Sq]
    # Rows that see nothing get zero scores before the logsumexp (so its gradient is finite)
    # and are zeroed afterwards.
    s = s.masked_fill(~mask, -math.inf).masked_fill(~sees[:, None], 0.0)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]) * mask
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse.masked_fill(~sees, -math.inf)


class Reference(NamedTuple):
    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def oracle(q, k, v, do, *, scale, causal, align, window, softcap, cu_q=None, cu_k=None):
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    q64, k64, v64 = leaves
    with torch.enable_grad():
        if cu_q is None:
            mask = visible_mask(q.shape[1], k.shape[1], causal, align, window=window)
            out, lse = _dense_oracle(q64, k64, v64, scale, mask, softcap)
        else:
            outs, lses = [], []
            oq, ok = cu_q.tolist(), cu_k.tolist()
            for q0, q1, k0, k1 in zip(oq, oq[1:], ok, ok[1:]):
                mask = visible_mask(q1 - q0, k1 - k0, causal, align, window=window)
                o, lse_s = _dense_oracle(
                    q64[None, q0:q1], k64[None, k0:k1], v64[None, k0:k1], scale, mask, softcap
                )
                outs.append(o[0])
                lses.append(lse_s[0])
            out, lse = torch.cat(outs), torch.cat(lses, dim=1)
        grads = torch.autograd.grad(out, leaves, do.detach().double(), allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]
    return Reference(out.detach(), lse.detach(), *grads)


# ----------------------------------------------------------------------------------------------
# Cases


class Variant(NamedTuple):
    sq: tuple[int, ...]  # one length: dense; several: varlen sequences
    sk: tuple[int, ...]
    heads: int
    kv_heads: int
    causal: bool
    align: str
    window: tuple[int | None, int | None] | None
    softcap: float | None

    @property
    def varlen(self) -> bool:
        return len(self.sq) > 1


VARIANTS = {
    "local-square": Variant((40,), (40,), 4, 2, False, "top_left", (3, 5), None),
    "local-sq<sk-br": Variant((25,), (61,), 4, 1, False, "bottom_right", (6, 2), None),
    "local-sq>sk-tl": Variant((50,), (20,), 2, 2, False, "top_left", (4, 1), None),
    "diagonal-only": Variant((30,), (30,), 3, 1, False, "bottom_right", (0, 0), None),
    "left-unbounded": Variant((33,), (47,), 4, 2, False, "bottom_right", (None, 4), None),
    "right-unbounded": Variant((33,), (29,), 4, 2, False, "top_left", (7, None), None),
    "causal-window": Variant((45,), (45,), 4, 2, True, "top_left", (8, 3), None),
    "causal-left-br": Variant((20,), (52,), 2, 1, True, "bottom_right", (5, None), None),
    "unbounded-window": Variant((24,), (31,), 2, 2, False, "top_left", (None, None), 1.5),
    "softcap": Variant((37,), (53,), 4, 2, False, "top_left", None, 0.7),
    "softcap-causal-br": Variant((41,), (23,), 4, 1, True, "bottom_right", None, 2.0),
    "softcap-window": Variant((48,), (48,), 6, 2, False, "bottom_right", (9, 9), 1.0),
    "varlen-window": Variant(
        (17, 0, 40, 9), (23, 5, 31, 0), 4, 2, False, "bottom_right", (4, 2), None
    ),
    "varlen-causal-window-cap": Variant(
        (12, 30, 5), (30, 12, 5), 4, 1, True, "top_left", (6, 10), 3.0
    ),
    "varlen-window-tl": Variant((26, 8), (9, 26), 2, 2, False, "top_left", (2, 3), 0.9),
}

#: Cases where some rows see no key, with the rows (dense) that must be empty.
EMPTY_BANDS = {
    # top-left diagonal i with i + 1 beyond the keys: rows 9.. see nothing
    "tl-right-of-keys": (Variant((20,), (8,), 4, 2, False, "top_left", (1, 1), None), range(9, 20)),
    # bottom-right with Sq > Sk: diagonals i - 12 < -2 for i < 10
    "br-before-keys": (
        Variant((20,), (8,), 2, 1, False, "bottom_right", (3, 2), 1.2),
        range(0, 10),
    ),
    # causal bottom-right Sq > Sk: the first Sq - Sk rows
    "causal-br": (Variant((16,), (6,), 2, 2, True, "bottom_right", (2, None), None), range(0, 10)),
}


def _inputs(case: Variant, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    d, dv = 16, 12

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    if case.varlen:
        tq, tk = sum(case.sq), sum(case.sk)
        q, do = rand(tq, case.heads, d), rand(tq, case.heads, dv)
        k, v = rand(tk, case.kv_heads, d), rand(tk, case.kv_heads, dv)
        cu_q = torch.tensor([0, *torch.tensor(case.sq).cumsum(0).tolist()], dtype=torch.int32)
        cu_k = torch.tensor([0, *torch.tensor(case.sk).cumsum(0).tolist()], dtype=torch.int32)
        return q, k, v, do, cu_q, cu_k
    b = 2
    q, do = rand(b, case.sq[0], case.heads, d), rand(b, case.sq[0], case.heads, dv)
    k, v = rand(b, case.sk[0], case.kv_heads, d), rand(b, case.sk[0], case.kv_heads, dv)
    return q, k, v, do, None, None


FULL = adb.Band(None, None, False)


def _flags(case: Variant, cu_q, cu_k, scale: float) -> dict:
    """The module functions' keywords (no window side here is wider than the sequences, so the
    band is the inputs' one)."""
    return dict(
        scale=scale,
        band=adb.Band.of(case.window, case.causal, case.align),
        softcap=case.softcap,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )


def _oracle_for(case: Variant, q, k, v, do, cu_q, cu_k, scale: float) -> Reference:
    return oracle(
        q,
        k,
        v,
        do,
        scale=scale,
        causal=case.causal,
        align=case.align,
        window=case.window,
        softcap=case.softcap,
        cu_q=cu_q,
        cu_k=cu_k,
    )


def _assert_close(name: str, got, want, tol, floor: float = 0.0) -> None:
    max_err, rel_l2 = error_metrics(got, want, floor)
    assert max_err <= tol.max_err and rel_l2 <= tol.rel_l2, (
        f"{name}: max_err {max_err:.2e} (<= {tol.max_err}), rel_l2 {rel_l2:.2e} (<= {tol.rel_l2})"
    )


def _assert_lse(got, want, tol) -> None:
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), "lse: -inf rows differ"
    fin = torch.isfinite(want)
    assert torch.isfinite(got[fin]).all()
    diff = (got[fin].double() - want[fin]).abs()
    assert (diff <= tol.lse_atol + tol.lse_rtol * want[fin].abs()).all(), diff.max()


def _check(case: Variant, dtype: torch.dtype, seed: int, budget: int | None = None) -> None:
    q, k, v, do, cu_q, cu_k = _inputs(case, dtype, seed)
    scale = 0.3
    flags = _flags(case, cu_q, cu_k, scale)
    if budget is not None:
        flags["budget_bytes"] = budget
    ref = _oracle_for(case, q, k, v, do, cu_q, cu_k, scale)
    tol = tolerance_for(dtype)

    out, lse = attention_forward(q, k, v, **flags)
    assert out.dtype == dtype and lse.dtype == adb.lse_dtype(dtype)
    _assert_close("out", out, ref.out, tol)
    _assert_lse(lse, ref.lse, tol)

    # The backward on the oracle's own out/lse (rounded to the input dtype, as a caller has them).
    grads = attention_backward(q, k, v, ref.out.to(dtype), ref.lse.to(lse.dtype), do, **flags)
    floor = 0.1 * max(g.abs().max().item() for g in (ref.dq, ref.dk, ref.dv))
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:], strict=True):
        assert got.shape == want.shape and got.dtype == dtype, name
        _assert_close(name, got, want, tol, floor)


# ----------------------------------------------------------------------------------------------
# Correctness


@pytest.mark.parametrize("name", list(VARIANTS))
def test_float64_matches_the_oracle(name):
    _check(VARIANTS[name], torch.float64, seed=list(VARIANTS).index(name))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "name", ["local-sq<sk-br", "causal-window", "softcap-window", "varlen-causal-window-cap"]
)
def test_lower_precision_within_dtype_tolerance(name, dtype):
    _check(VARIANTS[name], dtype, seed=11)


@pytest.mark.parametrize("budget", [1, 2000, 30_000])
@pytest.mark.parametrize("name", ["local-sq<sk-br", "softcap-window", "varlen-window"])
def test_chunking_does_not_change_the_result(name, budget):
    _check(VARIANTS[name], torch.float64, seed=5, budget=budget)


@pytest.mark.parametrize("name", list(EMPTY_BANDS))
def test_rows_without_keys(name):
    case, empty = EMPTY_BANDS[name]
    _check(case, torch.float64, seed=3, budget=3000)
    q, k, v, do, _, _ = _inputs(case, torch.float32, seed=4)
    flags = _flags(case, None, None, 0.25)
    out, lse = attention_forward(q, k, v, **flags)
    rows = list(empty)
    mask = visible_mask(case.sq[0], case.sk[0], case.causal, case.align, window=case.window)
    assert rows == [i for i in range(case.sq[0]) if not mask[i].any()]  # the case is as claimed
    assert torch.isneginf(lse[:, :, rows]).all()
    assert torch.isfinite(lse[:, :, [i for i in range(case.sq[0]) if i not in empty]]).all()
    assert (out[:, rows] == 0).all()
    dq, dk, dv = attention_backward(q, k, v, out, lse, do, **flags)
    assert (dq[:, rows] == 0).all()
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))


def test_keys_outside_every_band_get_zero_gradients():
    # Sq=10 queries, Sk=40 keys, top-left window (2, 2): keys 12.. are seen by no row.
    case = Variant((10,), (40,), 2, 1, False, "top_left", (2, 2), 1.3)
    q, k, v, do, _, _ = _inputs(case, torch.float64, seed=8)
    flags = _flags(case, None, None, 0.5)
    out, lse = attention_forward(q, k, v, **flags)
    _, dk, dv = attention_backward(q, k, v, out, lse, do, **flags)
    assert (dk[:, 12:] == 0).all() and (dv[:, 12:] == 0).all()
    assert (dk[:, :12] != 0).any()


def test_softcap_changes_the_result_and_large_cap_approaches_none():
    case = VARIANTS["softcap"]
    q, k, v, do, _, _ = _inputs(case, torch.float64, seed=9)
    plain = attention_forward(q, k, v, scale=1.0, band=FULL)
    capped = attention_forward(q, k, v, scale=1.0, band=FULL, softcap=0.5)
    loose = attention_forward(q, k, v, scale=1.0, band=FULL, softcap=1e6)
    assert (plain[0] - capped[0]).abs().max() > 1e-2
    torch.testing.assert_close(loose[0], plain[0], rtol=1e-8, atol=1e-8)


def test_implementation_reads_band_and_softcap_from_the_inputs():
    """Through ``Chunked.forward``/``backward``: inputs with a window and a soft cap get the
    banded, capped result; inputs without them the plain one."""
    case = VARIANTS["softcap-window"]
    q, k, v, do, _, _ = _inputs(case, torch.float64, seed=12)
    ref = _oracle_for(case, q, k, v, do, None, None, 0.4)
    flags = dict(causal=False, causal_align="bottom_right", scale=0.4, deterministic=True)
    inp = adb.make_inputs(
        q, k, v, ref.out, ref.lse, do, **flags, window=case.window, softcap=case.softcap
    )
    plain = adb.make_inputs(q, k, v, ref.out, ref.lse, do, **flags)
    impl = Chunked()
    assert impl.window and impl.softcap
    out, lse = impl.forward(inp)
    _assert_close("out", out, ref.out, tolerance_for(torch.float64))
    grads = impl.backward(inp)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:], strict=True):
        _assert_close(name, got, want, tolerance_for(torch.float64))
    unbanded, _ = impl.forward(plain)
    assert (unbanded - ref.out).abs().max() > 1e-2


# ----------------------------------------------------------------------------------------------
# Work follows the band


def _matmul_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _local_problem(seqlen: int, window: int):
    q = torch.randn(1, seqlen, 2, 16)
    flags = dict(scale=0.25, band=adb.Band(window, window, False))
    return q, flags


def test_local_attention_work_is_linear_in_the_sequence():
    """Matmul FLOPs of a (32, 32) window grow linearly with S (not quadratically), and stay
    within about 2x of the band itself (rows per chunk are sized near the band width)."""
    w = 32
    flops = {}
    for s in (1024, 2048, 4096):
        q, flags = _local_problem(s, w)
        flops[s] = _matmul_flops(lambda q=q, flags=flags: attention_forward(q, q, q, **flags))
    assert 1.9 < flops[2048] / flops[1024] < 2.1
    assert 1.9 < flops[4096] / flops[2048] < 2.1
    q, _ = _local_problem(4096, w)
    full = _matmul_flops(lambda: attention_forward(q, q, q, scale=0.25, band=FULL))
    band = 2 * (2 * w + 1) / 4096  # fraction of the score matrix inside the band
    assert flops[4096] / full < 2.5 * band


def test_local_attention_backward_skips_keys_outside_the_band():
    q, flags = _local_problem(2048, 16)
    out, lse = attention_forward(q, q, q, **flags)
    do = torch.randn_like(out)
    local = _matmul_flops(lambda: attention_backward(q, q, q, out, lse, do, **flags))
    flags["band"] = FULL
    full = _matmul_flops(lambda: attention_backward(q, q, q, out, lse, do, **flags))
    assert local / full < 2.5 * (2 * 33) / 2048


def test_plan_tiles_cover_exactly_the_visible_keys():
    band = adb.Band(7, 3, bottom_right=True)  # diagonal i + 20
    tiles = plan(1, 4, 300, 320, 4, 1 << 30, band)
    assert tiles[0].i0 == 0 and tiles[-1].i1 == 300
    assert all(a.i1 == b.i0 for a, b in zip(tiles, tiles[1:]))
    assert max(t.i1 - t.i0 for t in tiles) == MIN_BAND_ROWS  # width 11 < MIN_BAND_ROWS
    for t in tiles:
        # the first row's first key and the last row's last key, clipped to [0, Sk)
        assert t.k0 == max(0, t.i0 + 20 - 7)
        assert t.k1 == min(320, t.i1 - 1 + 20 + 3 + 1)
    # a small budget shrinks the tile, never growing a buffer beyond it
    small = plan(1, 4, 300, 320, 4, 4 * 4 * 40 * 50, adb.Band(20, 20, False))
    assert all(4 * 4 * (t.i1 - t.i0) * (t.k1 - t.k0) <= 4 * 4 * 40 * 50 for t in small)


def test_dense_forward_writes_every_row_of_a_tile_without_keys():
    q = torch.randn(1, 12, 2, 8)
    k = torch.randn(1, 4, 2, 8)
    out = torch.full((1, 12, 2, 8), math.nan)
    lse = torch.full((1, 2, 12), math.nan)
    # top-left window (0, 0): rows 4.. see nothing; tiles of 1 row make whole tiles keyless
    dense_forward(q, k, k, out, lse, scale=1.0, band=adb.Band(0, 0, False), budget_bytes=1)
    assert (out[:, 4:] == 0).all() and torch.isneginf(lse[:, :, 4:]).all()
    assert not out.isnan().any() and not lse.isnan().any()


@pytest.mark.parametrize(
    ("sq", "sk", "align", "huge"),
    [
        (9, 9, "top_left", (0, 2**63 - 1)),
        (11, 5, "bottom_right", (2**63 - 1, 4)),
        (9, 9, "top_left", (2**64, 0)),
        (6, 10, "bottom_right", (3, 2**63 - 1)),
    ],
)
def test_window_sides_near_int64_match_the_oracle(sq, sk, align, huge):
    """A side near or beyond the int64 limit reaches every key: the dispatched call, and the
    module's own functions given the inputs' band, compute the unbounded side."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, sq, 2, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, sk, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    do = torch.randn(1, sq, 2, 8, generator=g, dtype=torch.float64)
    scale = 8**-0.5
    mask = torch.ones(sq, sk, dtype=torch.bool)
    shift = 0 if align == "top_left" else sk - sq
    for i in range(sq):  # the band written out in Python ints, which do not overflow
        for j in range(sk):
            mask[i, j] = i + shift - huge[0] <= j <= i + shift + huge[1]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want_out, want_lse = _dense_oracle(*leaves, scale, mask, None)
    want_grads = torch.autograd.grad(want_out, leaves, do)
    flags = dict(scale=scale, causal=False, causal_align=align, window=huge)
    band = adb.make_inputs(q, k, v, **flags).band
    assert all(side is None or side <= max(sq, sk) for side in (band.left, band.right))
    for out, lse in (
        attention_forward(q, k, v, scale=scale, band=band),
        ad.forward(q, k, v, **flags, backend="reference"),
    ):
        torch.testing.assert_close(out, want_out.detach())
        torch.testing.assert_close(lse, want_lse.detach())
    for grads in (
        attention_backward(q, k, v, out, lse, do, scale=scale, band=band),
        ad.backward(q, k, v, out, lse, do, **flags, backend="reference"),
    ):
        for got, want in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, want)
