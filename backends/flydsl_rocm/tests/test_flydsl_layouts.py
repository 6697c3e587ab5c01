"""CPU simulator of the main kernel's data movement: MFMA lane/register layouts, the gfx950 LDS
transpose read, the swizzled LDS staging, all composed exactly as ``_kernel_main`` composes them
(the index functions come from ``_layout``, the module the kernel is built from), checked
against plain NumPy matrix products on random data.

Instruction semantics modelled here, with their sources:

* ``v_mfma_f32_32x32x8_bf16`` (gfx942; LLVM spells it ``v_mfma_f32_32x32x8bf16_1k``) and
  ``v_mfma_f32_16x16x16_bf16``: AMD's matrix instruction calculator
  (github.com/ROCm/amd_matrix_instruction_calculator, ``matrix_calculator.py -a CDNA3 -i
  v_mfma_f32_32x32x8_bf16 -d``): A[i][k] in lane ``32*(k//4) + i`` element ``k%4``; B[k][j] in
  lane ``32*(k//4) + j`` element ``k%4``; D[i][j] in lane ``32*((i//4)%2) + j``, register
  ``4*(i//8) + i%4``. For 16x16: lane ``16*(k//4) + i``; D lane ``16*(i//4) + j``, register
  ``i%4``.
* ``v_mfma_f32_16x16x32_bf16`` (gfx950; not in the calculator release we could read):
  composable_kernel ``include/ck_tile/ops/gemm/warp/warp_gemm_attribute_mfma_impl.hpp``
  (``WarpGemmAttributeMfmaImplBf16Bf16F32M16N16K32``: kAMLane = kBNLane = 16, kABKLane = 4,
  kABKPerLane = 8, kCMLane = 4, kCNLane = 16, kCM1PerLane = 4) and triton
  ``lib/Dialect/TritonGPU/IR/LinearLayoutConversions.cpp`` (``mfmaDotToLinearLayout`` with
  kWidth = 8): A[i][k] in lane ``16*(k//8) + i`` element ``k%8``, B likewise with j; D as for
  16x16x16. (A and B share one k mapping, so a dot product only depends on it through the
  pairing, which the kernel relies on for P and dS.)
* ``ds_read_b64_tr_b16`` (gfx950): triton ``chooseLLDsReadB64TrLayout`` (same file; diagram of
  the 16x4 "base unit"): in each 16-lane group every lane reads 64 bits (four 16-bit values at
  its own address) and output lane n, element k, is element ``n % 4`` of what lane
  ``4*k + n//4`` read.

What this does not check: silicon behaviour (a run on an MI300X / MI350X is still needed),
numerics of the bf16 roundings (the simulator computes in float64), scheduling, the row
kernels, and whether FlyDSL lowers each op to the instruction modelled here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from attn_dispatch_flydsl_rocm._layout import THREADS, Geometry, crow, head_dim_problems
from attn_dispatch_flydsl_rocm._tiles import WAVES, main_tiles

LANES = 64
HEAD_DIMS = [32, 64, 96, 128, 160, 192, 224, 256]

# --------------------------------------------------------------------------- instructions


def mfma_maps(shape: tuple[int, int, int]):
    """(lane, element) -> A (i, k) / B (k, j) and (lane, register) -> D (i, j) tables."""
    m, n, k = shape
    assert m == n and m in (16, 32)
    kv = k // (LANES // m)  # values per lane of A/B
    lane = np.arange(LANES)[:, None]
    e = np.arange(kv)[None, :]
    ab_mn = np.broadcast_to(lane % m, (LANES, kv))
    ab_k = (lane // m) * kv + e
    r = np.arange(m * m // LANES)[None, :]
    if m == 32:  # calculator: i = (8*(GPR//4) % 32) + 4*(lane//32) + GPR % 4
        d_i = (8 * (r // 4)) % 32 + 4 * (lane // 32) + r % 4
    else:  # calculator (16x16x16) / CK kCMLane=4, kCM1PerLane=4: i = 4*(lane//16) + GPR
        d_i = 4 * (lane // 16) + r
    d_j = np.broadcast_to(lane % m, d_i.shape)
    return ab_mn, ab_k, d_i, d_j


def mfma(shape, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """D = A B + C with A, B, C given as per-lane register contents [64, ...]."""
    m, n, k = shape
    ab_mn, ab_k, d_i, d_j = mfma_maps(shape)
    am = np.full((m, k), np.nan)
    bm = np.full((k, n), np.nan)
    am[ab_mn, ab_k] = a  # the maps are bijections (tested below), so every entry is set;
    bm[ab_k, ab_mn] = b  # NaN in a register (unstaged LDS, a column past D) propagates
    cm = np.full((m, n), np.nan)
    cm[d_i, d_j] = c
    return (am @ bm + cm)[d_i, d_j]


def ds_read_tr16_b64(lds: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """gfx950 ``ds_read_b64_tr_b16``: per-lane byte addresses -> [64, 4] 16-bit results."""
    assert (addr % 8 == 0).all(), "ds_read_b64 needs 8-byte aligned addresses"
    loaded = lds[(addr // 2)[:, None] + np.arange(4)[None, :]]  # what each lane addressed
    lane = np.arange(LANES)[:, None]
    kk = np.arange(4)[None, :]
    grp, n = lane // 16, lane % 16
    return loaded[16 * grp + 4 * kk + n // 4, n % 4]


def lds_read(lds: np.ndarray, addr, count: int, align: int) -> np.ndarray:
    addr = np.asarray(addr)
    assert (addr % align == 0).all(), f"LDS access misaligned for {align} bytes"
    return lds[(addr // 2)[..., None] + np.arange(count)]


# --------------------------------------------------------------------------- instruction tests


def test_mfma_maps_match_calculator_entries():
    """Spot entries printed by the matrix instruction calculator (CDNA3, 32x32x8 bf16)."""
    ab_mn, ab_k, d_i, d_j = mfma_maps((32, 32, 8))
    # A[0][4] = v0{32}.[15:0] -> lane 32, element 0; A[3][7] = v1{35}.[31:16] -> lane 35, elem 3
    assert (ab_mn[32, 0], ab_k[32, 0]) == (0, 4)
    assert (ab_mn[35, 3], ab_k[35, 3]) == (3, 7)
    # D[1][5] = v1{5}; D[4][0] = v0{32}; D[8][0] = v4{0}
    assert (d_i[5, 1], d_j[5, 1]) == (1, 5)
    assert (d_i[32, 0], d_j[32, 0]) == (4, 0)
    assert (d_i[0, 4], d_j[0, 4]) == (8, 0)
    for shape in [(32, 32, 8), (16, 16, 32)]:  # every element exactly once
        ab_mn, ab_k, d_i, d_j = mfma_maps(shape)
        m, _, k = shape
        assert len({(a, b) for a, b in zip(ab_mn.ravel(), ab_k.ravel(), strict=True)}) == m * k
        assert len({(a, b) for a, b in zip(d_i.ravel(), d_j.ravel(), strict=True)}) == m * m


@pytest.mark.parametrize("shape", [(32, 32, 8), (16, 16, 32)])
def test_crow_is_the_documented_accumulator_row(shape):
    _, _, d_i, d_j = mfma_maps(shape)
    t = shape[0]
    lane = np.arange(LANES)
    for i in range(t * t // LANES):
        assert (crow(i, lane // t, t) == d_i[:, i]).all()
    assert (d_j == (lane % t)[:, None]).all()


def test_ds_read_tr_matches_triton_base_unit_diagram():
    """Triton's diagram: a 16 (M, contiguous) x 4 (K) unit; lane 4*k + b reads M 4b..4b+3 of
    K column k; afterwards lane m holds M = m of K = 0..3."""
    mem = np.arange(4 * 16, dtype=float)  # [K=4][M=16] row-major: value = 16*k + m
    lane = np.arange(LANES)
    t = lane % 16
    addr = ((t // 4) * 16 + (t % 4) * 4) * 2
    out = ds_read_tr16_b64(mem, addr)
    want = 16 * np.arange(4)[None, :] + (lane % 16)[:, None]
    np.testing.assert_array_equal(out, want)


# --------------------------------------------------------------------------- the kernel


def _frag(mat: np.ndarray, rows, cols) -> np.ndarray:
    """mat[rows, cols] with zeros past the row count (buffer bounds) and NaN past the columns
    (a read there would pick up another head's data)."""
    rows, cols = np.broadcast_arrays(np.asarray(rows), np.asarray(cols))
    out = np.zeros(rows.shape)
    inside = rows < mat.shape[0]
    bad_col = cols >= mat.shape[1]
    out[inside & ~bad_col] = mat[rows[inside & ~bad_col], cols[inside & ~bad_col]]
    out[bad_col] = np.nan
    return out


def simulate_program(geo: Geometry, n_blk: int, causal: bool, q, k, v, do, lse, dvec, scale):
    """One program (key block ``n_blk``, one query head) of ``_kernel_main`` on the CPU.

    Returns (dK rows of the block [BN, D] (scaled), dV rows [BN, D], dQacc [Sq, D + pad]);
    columns past D of dQacc collect stray atomics."""
    T, KV, KT = geo.T, geo.KV, geo.KT  # noqa: N806
    BM, BN, SUB, ACC, D = geo.BM, geo.BN, geo.SUB, geo.ACC, geo.head_dim  # noqa: N806
    shape = geo.tiles.mfma
    sq, sk = q.shape[0], k.shape[0]
    lane = np.arange(LANES)
    g, li = lane // T, lane % T
    n0 = n_blk * BN
    lds = np.full(geo.tiles.lds_bytes(D) // 2, np.nan)
    dq_acc = np.zeros((sq, D + 64))
    dk_out = np.full((BN, D), np.nan)
    dv_out = np.full((BN, D), np.nan)

    waves = []
    for wave in range(WAVES):
        kw0 = n0 + wave * T
        st_kq = BN // KT
        w = {
            "k": [
                _frag(
                    k,
                    kw0 + geo.kv_frag(c, g, li)[0][:, None],
                    geo.kv_frag(c, g, li)[1][:, None] + np.arange(KV),
                )
                for c in range(geo.DC)
            ],
            "v": [
                _frag(
                    v,
                    kw0 + geo.kv_frag(c, g, li)[0][:, None],
                    geo.kv_frag(c, g, li)[1][:, None] + np.arange(KV),
                )
                for c in range(geo.DC)
            ],
            "kq": [
                _frag(
                    k,
                    n0 + geo.kq_row(st, g[:, None], np.arange(KV)),
                    geo.dq_col(wave, nt, li)[:, None],
                )
                for st in range(st_kq)
                for nt in range(geo.DQ_NT)
            ],
            "dk": [np.zeros((LANES, ACC)) for _ in range(geo.DT)],
            "dv": [np.zeros((LANES, ACC)) for _ in range(geo.DT)],
        }
        waves.append(w)

    m_first = n0 // BM if causal else 0
    m_last = math.ceil(sq / BM) if n0 < sk else m_first
    for m in range(m_first, m_last):
        m0 = m * BM
        # Stage the Q / dO tile: each thread moves LOADS 16-byte chunks.
        for tid in range(THREADS):
            for j in range(geo.LOADS):
                r, cc = geo.stage_chunk(tid, j)
                a = geo.stage_addr(r, cc)
                for base, src in ((geo.Q_LDS, q), (geo.DO_LDS, do)):
                    lds[(base + a) // 2 + np.arange(8)] = _frag(src, m0 + r, cc * 8 + np.arange(8))
        ds_rows = []
        for wave, w in enumerate(waves):
            kw0 = n0 + wave * T
            p_t, ds_t = [], []
            for s in range(SUB):
                s_acc = np.zeros((LANES, ACC))
                dp_acc = np.zeros((LANES, ACC))
                for c in range(geo.DC):
                    ar, ac = geo.a_rowfrag(s, c, g, li)
                    qa = lds_read(lds, geo.Q_LDS + geo.swz_addr(ar, ac), KV, KV * 2)
                    oa = lds_read(lds, geo.DO_LDS + geo.swz_addr(ar, ac), KV, KV * 2)
                    s_acc = mfma(shape, qa, w["k"][c], s_acc)
                    dp_acc = mfma(shape, oa, w["v"][c], dp_acc)
                qrow = m0 + s * T + np.stack([crow(i, g, T) for i in range(ACC)], axis=1)
                key = (kw0 + li)[:, None]
                lse_r = np.where(qrow < sq, lse[np.minimum(qrow, sq - 1)], 0.0)
                d_r = np.where(qrow < sq, dvec[np.minimum(qrow, sq - 1)], 0.0)
                ok = (qrow < sq) & (key < sk) & (lse_r > -np.inf)
                if causal:
                    ok &= key <= qrow
                with np.errstate(invalid="ignore", over="ignore"):
                    p = np.where(
                        ok, np.exp2(s_acc * scale * np.log2(np.e) - lse_r * np.log2(np.e)), 0.0
                    )
                p_t.append(p)
                ds_t.append(p * (dp_acc - d_r))
            for st in range(geo.pt_steps()):
                pa = np.stack([p_t[s][:, i] for s, i in geo.pt_a_elems(st)], axis=1)
                dsa = np.stack([ds_t[s][:, i] for s, i in geo.pt_a_elems(st)], axis=1)
                rows = geo.pt_b_rows(st, g)
                for nt in range(geo.DT):
                    col0 = nt * T
                    ops = []
                    for base in (geo.DO_LDS, geo.Q_LDS):
                        if geo.tiles.transpose_reads:
                            parts = [
                                ds_read_tr16_b64(
                                    lds, base + geo.swz_addr(*Geometry.tr_source(r0, col0, li % 16))
                                )
                                for r0 in rows
                            ]
                            ops.append(np.concatenate(parts, axis=1))
                        else:
                            ops.append(
                                np.stack(
                                    [
                                        lds_read(
                                            lds, base + geo.swz_addr(rows[0] + j, col0 + li), 1, 2
                                        )[:, 0]
                                        for j in range(4)
                                    ],
                                    axis=1,
                                )
                            )
                    w["dv"][nt] = mfma(shape, pa, ops[0], w["dv"][nt])
                    w["dk"][nt] = mfma(shape, dsa, ops[1], w["dk"][nt])
            for s in range(SUB):
                for i in range(ACC):
                    ds_rows.append(
                        (geo.ds_store_addr(s * T + crow(i, g, T), wave, li), ds_t[s][:, i])
                    )
        for addr, val in ds_rows:  # all waves store dS, then the barrier
            assert (addr % 2 == 0).all()
            lds[addr // 2] = val
        for wave, w in enumerate(waves):
            if wave * geo.DQ_COLS >= D:
                continue
            for s in range(SUB):
                for nt in range(geo.DQ_NT):
                    acc = np.zeros((LANES, ACC))
                    for st in range(BN // KT):
                        a = lds_read(lds, geo.dq_a_addr(s, st, g, li), KV, KV * 2)
                        acc = mfma(shape, a, w["kq"][st * geo.DQ_NT + nt], acc)
                    col = geo.dq_col(wave, nt, li)
                    for i in range(ACC):
                        qrow = m0 + s * T + crow(i, g, T)
                        keep = qrow < sq
                        np.add.at(dq_acc, (qrow[keep], col[keep]), acc[keep, i])
    for wave, w in enumerate(waves):
        for nt in range(geo.DT):
            for i in range(ACC):
                key = wave * T + crow(i, g, T)
                dk_out[key, nt * T + li] = w["dk"][nt][:, i] * scale
                dv_out[key, nt * T + li] = w["dv"][nt][:, i]
    return dk_out, dv_out, dq_acc


def reference(n0: int, bn: int, causal: bool, q, k, v, do, lse, dvec, scale):
    sq, sk = q.shape[0], k.shape[0]
    kb = np.zeros((bn, k.shape[1]))
    vb = np.zeros((bn, v.shape[1]))
    kb[: max(0, min(bn, sk - n0))] = k[n0 : n0 + bn]
    vb[: max(0, min(bn, sk - n0))] = v[n0 : n0 + bn]
    keys = n0 + np.arange(bn)[None, :]
    rows = np.arange(sq)[:, None]
    ok = (keys < sk) & (lse[:, None] > -np.inf)
    if causal:
        ok &= keys <= rows
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(ok, np.exp(q @ kb.T * scale - lse[:, None]), 0.0)
    ds = p * (do @ vb.T - dvec[:, None])
    return scale * ds.T @ q, p.T @ do, ds @ kb


def _inputs(rng, sq, sk, d):
    q, do = rng.standard_normal((sq, d)), rng.standard_normal((sq, d))
    k, v = rng.standard_normal((sk, d)), rng.standard_normal((sk, d))
    lse = rng.standard_normal(sq) + 2.0
    lse[3] = -np.inf  # a row that sees no key
    return q, k, v, do, lse, rng.standard_normal(sq)


def _run(variant, d, causal, n_blk, seed=0):
    geo = Geometry(main_tiles(variant), d)
    rng = np.random.default_rng(seed)
    bn = geo.BN
    sq = sk = bn * (n_blk + 1) - 7  # a ragged tail in both the key block and the query tiles
    q, k, v, do, lse, dvec = _inputs(rng, sq, sk, d)
    scale = 1.0 / math.sqrt(d)
    dk, dv, dq = simulate_program(geo, n_blk, causal, q, k, v, do, lse, dvec, scale)
    n0 = n_blk * bn
    rk, rv, rq = reference(n0, bn, causal, q, k, v, do, lse, dvec, scale)
    valid = min(bn, sk - n0)
    ok = (
        np.allclose(dk[:valid], rk[:valid], rtol=1e-9, atol=1e-9)
        and np.allclose(dv[:valid], rv[:valid], rtol=1e-9, atol=1e-9)
        and np.allclose(dq[:, :d], rq, rtol=1e-9, atol=1e-9)
        and not dq[:, d:].any()  # no atomic strayed past the head dim
    )
    return ok, geo


@pytest.mark.parametrize("variant", ["gfx950_fused", "gfx942_mfma"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_index_math_composes_to_the_products(variant, d, causal):
    ok, geo = _run(variant, d, causal, n_blk=1)
    assert geo.problems() == []
    assert ok


@pytest.mark.parametrize("variant", ["gfx950_fused", "gfx942_mfma"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_head_dim_problems_are_exactly_the_failing_builds(variant, d):
    """The simulator agrees with the reference exactly where ``Geometry.problems`` is empty, so
    the head-dim guard in ``supports`` rejects precisely the builds whose index math breaks."""
    ok, geo = _run(variant, d, causal=True, n_blk=0)
    assert ok == (geo.problems() == []), geo.problems()
    if variant == "gfx950_fused" and d in (32, 64, 128, 256):
        assert head_dim_problems(geo.tiles, d) == []


def _swapped_tr_source(r0, col0, li):
    return r0 + li % 4, col0 + (li // 4) * 4


def _reversed_a_k(self, s, c, g, li):
    return s * self.T + li, c * self.KT + (self.G - 1 - g) * self.KV


@pytest.mark.parametrize(
    "attr,fake",
    [
        ("tr_source", staticmethod(_swapped_tr_source)),
        ("a_rowfrag", _reversed_a_k),
    ],
)
def test_simulator_catches_a_wrong_mapping(monkeypatch, attr, fake):
    """The check can fail: a transposed-read address with the lane roles swapped, or an A
    operand whose k order differs from B's, breaks the gfx950 products."""
    monkeypatch.setattr(Geometry, attr, fake)
    ok, _ = _run("gfx950_fused", 64, causal=True, n_blk=1)
    assert not ok
