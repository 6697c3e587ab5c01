"""Numerics of every Triton kernel (forward, preprocess, dK/dV, dQ, the fused-atomic dK/dV/dQ
and its dQ convert, the attention sinks' gradient) on the CPU.

The kernels run under ``TRITON_INTERPRET=1`` in one subprocess per suite (see
``triton_interp_worker.py``) and are compared with a float64 autograd oracle computed from the
same dtype-rounded inputs. Outputs are poisoned with NaN before each run.

Tolerances (relative Frobenius error): the kernels round P and dS to the input dtype before the
matrix products, as every flash-style kernel does, so bf16 lands near 2-4e-3 and f16 near 3e-4;
we allow 1.2e-2 (bf16) and 2e-3 (f16). lse is fp32 throughout: absolute error 1e-3.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("numpy")

WORKER = Path(__file__).with_name("triton_interp_worker.py")
TOL = {"bfloat16": 1.2e-2, "float16": 2e-3}
LSE_TOL = 1e-3
SMALL_TILES = {  # BLOCK_M != BLOCK_N, so diagonal ranges cover several tiles of the other side
    "fwd": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    "pre": {"BLOCK_M": 16, "BLOCK_N": 0, "num_warps": 4, "num_stages": 1},
    "dkdv": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    "dq": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    "dkdvq": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    "cvt": {"BLOCK_M": 16, "BLOCK_N": 0, "num_warps": 4, "num_stages": 1},
}


def tiles(base: dict | None = None, **kernels: dict) -> dict:
    """``base`` (``SMALL_TILES`` by default) with some kernels' settings added or changed, e.g.
    ``tiles(dkdv={"SPLIT": 2})``."""
    base = SMALL_TILES if base is None else base
    return {**base, **{name: {**base[name], **extra} for name, extra in kernels.items()}}


def case(
    cid: str,
    *,
    dtype="bfloat16",
    batch=1,
    sq=37,
    sk=45,
    heads=2,
    kv_heads=2,
    d=64,
    dv=None,
    causal=False,
    align="top_left",
    varlen=None,
    **extra,
) -> dict:
    c = {
        "id": cid,
        "dtype": dtype,
        "batch": batch,
        "seqlen_q": sq,
        "seqlen_k": sk,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": d,
        "head_dim_v": dv or d,
        "causal": causal,
        "bottom_right": align == "bottom_right",
        "scale": 0.7 / math.sqrt(d),
        "seed": zlib.crc32(cid.encode()),
    }
    if varlen:
        c["seqlens_q"], c["seqlens_k"] = varlen
    c.update(extra)
    return c


DEFAULT_CASES = [
    case("mha-full-bf16-d64", batch=2, sq=37, sk=45),
    case("gqa4-causal-tl-f16-d128", dtype="float16", sq=50, sk=50, heads=4, kv_heads=1, d=128),
    case(
        "gqa4-causal-br-bf16-sq>sk",
        sq=50,
        sk=33,
        heads=8,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        repeat=True,
    ),
    case("mha-causal-tl-f16-sq<sk", dtype="float16", sq=33, sk=50, causal=True),
    case(
        "gqa2-causal-br-f16-sq<sk-tiles",
        dtype="float16",
        sq=20,
        sk=53,
        heads=4,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        config=SMALL_TILES,
    ),
    case(
        "varlen-empty-gqa4-causal-br-bf16",
        heads=4,
        kv_heads=1,
        causal=True,
        align="bottom_right",
        varlen=([17, 0, 33, 5], [20, 11, 29, 0]),
    ),
    case(
        "varlen-gqa2-full-f16-d128-tiles",
        dtype="float16",
        heads=4,
        kv_heads=2,
        d=128,
        varlen=([9, 40, 1], [30, 7, 18]),
        config=SMALL_TILES,
    ),
    case(
        "gqa4-causal-br-f16-group-split",
        dtype="float16",
        sq=45,
        sk=70,
        heads=8,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        repeat=True,
        config=tiles(dkdv={"SPLIT": 2}),
    ),
    # q, k, v and the gradients as [B, S, H, D] views of [B, H, S, D] memory: the partials of
    # the split group are strided like dK / dV and summed by the sum launch
    case(
        "gqa4-causal-bf16-heads-first-group-split",
        sq=45,
        sk=70,
        heads=8,
        kv_heads=2,
        causal=True,
        heads_first=True,
        config=tiles(dkdv={"SPLIT": 2}),
    ),
    case(
        "gqa4-full-f16-heads-first-group-split-atomic",
        dtype="float16",
        batch=2,
        heads=8,
        kv_heads=2,
        heads_first=True,
        atomic=True,
        config=tiles(dkdvq={"SPLIT": 4}),
    ),
    case(
        "varlen-gqa4-full-bf16-group-split",
        heads=4,
        kv_heads=1,
        varlen=([9, 0, 40], [30, 7, 18]),
        config=tiles(dkdv={"SPLIT": 4}),
    ),
    # Causal launches in the heaviest-first order (reversed grids) where the table asks.
    case(
        "gqa2-causal-tl-bf16-heavy-first",
        sq=45,
        sk=45,
        heads=4,
        kv_heads=2,
        causal=True,
        repeat=True,
        config={k: {**c, "HEAVY_FIRST": 1} for k, c in SMALL_TILES.items()},
    ),
    # dK/dV issuing dP's product before the exponentials (config DP_FIRST; unmasked tiles)
    case(
        "gqa2-causal-br-bf16-dp-first",
        sq=50,
        sk=70,
        heads=4,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        config=tiles(dkdv={"DP_FIRST": 1}),
    ),
    case(
        "atomic-varlen-gqa2-full-f16-dp-first",
        dtype="float16",
        heads=4,
        kv_heads=2,
        varlen=([9, 40, 0], [30, 7, 18]),
        atomic=True,
        config=tiles(dkdvq={"DP_FIRST": 1}),
    ),
    case(
        "mha-causal-tl-bf16-d80-dv48-strided", sq=29, sk=29, d=80, dv=48, causal=True, strided=True
    ),
    # The fused-atomic design (dK/dV kernel adds dQ into an fp32 scratch; the interpreter runs
    # tl.atomic_add): same oracle, same tolerances.
    case("atomic-mha-full-bf16-d64", batch=2, sq=37, sk=45, atomic=True),
    case(
        "atomic-gqa4-causal-tl-f16-d128-tiles",
        dtype="float16",
        sq=50,
        sk=50,
        heads=4,
        kv_heads=1,
        d=128,
        causal=True,
        atomic=True,
        config=SMALL_TILES,
    ),
    case(
        "atomic-gqa4-causal-br-bf16-sq>sk-split",
        sq=50,
        sk=33,
        heads=8,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        atomic=True,
        config=tiles(dkdvq={"SPLIT": 2}),
    ),
    # A configured split that does not divide the GQA group (group 3 with SPLIT 2, group 2
    # with SPLIT 4; a table entry covers every group of its class): every head still counts.
    case(
        "atomic-gqa3-causal-bf16-d96-split-not-dividing",
        sq=41,
        sk=41,
        heads=6,
        kv_heads=2,
        d=96,
        causal=True,
        atomic=True,
        config=tiles(dkdvq={"SPLIT": 2}),
    ),
    case(
        "atomic-gqa2-full-bf16-split-over-group",
        sq=33,
        sk=33,
        heads=4,
        kv_heads=2,
        atomic=True,
        config=tiles(dkdvq={"SPLIT": 4}),
    ),
    case(
        "atomic-mha-causal-br-f16-sq<sk-d80-dv48-strided",
        dtype="float16",
        sq=20,
        sk=53,
        d=80,
        dv=48,
        causal=True,
        align="bottom_right",
        strided=True,
        atomic=True,
        config=SMALL_TILES,
    ),
    case(
        "atomic-varlen-empty-gqa4-causal-br-bf16",
        heads=4,
        kv_heads=1,
        causal=True,
        align="bottom_right",
        varlen=([17, 0, 33, 5], [20, 11, 29, 0]),
        atomic=True,
        config=SMALL_TILES,
    ),
    # dQ added by tensor-descriptor (TMA) reductions into a [B,H,S,BLOCK_D] / [H,T,BLOCK_D]
    # scratch; partial tiles overlap the next sequence's rows with zeros.
    case(
        "atomic-tma-varlen-gqa2-causal-br-f16-d80",
        dtype="float16",
        heads=4,
        kv_heads=2,
        d=80,
        causal=True,
        align="bottom_right",
        varlen=([9, 0, 40, 13], [30, 7, 18, 13]),
        atomic=True,
        config=tiles(dkdvq={"TMA": 1}),
    ),
    case(
        "atomic-tma-gqa4-full-bf16",
        batch=2,
        sq=37,
        sk=45,
        heads=4,
        kv_heads=1,
        atomic=True,
        config=tiles(dkdvq={"TMA": 1}),
    ),
    # Loop tiles through tensor descriptors (TMA loads): rows past a tensor's end come back as
    # zeros, rows past a varlen sequence's end are the next sequence's and must be masked.
    case(
        "tma-loads-varlen-empty-gqa4-causal-br-bf16",
        heads=4,
        kv_heads=1,
        causal=True,
        align="bottom_right",
        varlen=([17, 0, 33, 5], [20, 11, 29, 0]),
        repeat=True,
        config={**SMALL_TILES, **{k: {**SMALL_TILES[k], "LOAD_TMA": 1} for k in ("dkdv", "dq")}},
    ),
    case(
        "tma-loads-mha-causal-tl-f16-d80-dv48-strided-batch2",
        dtype="float16",
        batch=2,
        sq=29,
        sk=29,
        d=80,
        dv=48,
        causal=True,
        strided=True,
        config={**SMALL_TILES, **{k: {**SMALL_TILES[k], "LOAD_TMA": 1} for k in ("dkdv", "dq")}},
    ),
    case(
        "tma-loads-gqa4-full-bf16-split-batch2",
        batch=2,
        sq=37,
        sk=45,
        heads=8,
        kv_heads=2,
        config={
            **SMALL_TILES,
            "dq": {**SMALL_TILES["dq"], "LOAD_TMA": 1},
            "dkdv": {**SMALL_TILES["dkdv"], "LOAD_TMA": 1, "SPLIT": 2},
        },
    ),
]


# Sliding windows and soft-capping (issue 26): the oracle builds the band from the contract
# (``triton_interp_worker.visible``) and caps the full score matrix; tiles smaller than the
# windows so bands cross several blocks on both sides.
WIN_TILES = {
    **SMALL_TILES,
    "fwd": {**SMALL_TILES["fwd"], "BLOCK_M": 16},
    "dq": {**SMALL_TILES["dq"], "BLOCK_M": 16},
}
CAPPED_SCALE = 2.5 / math.sqrt(64)  # scores of std ~2.5: a cap of 2 bends most of them

VARIANT_CASES = [
    # sides near and beyond the int64 limit are unbounded (no wrap-around in band arithmetic)
    case("win-int64-right-tl", sq=24, sk=24, window=[0, 2**63 - 1], config=WIN_TILES),
    case(
        "win-int64-left-br-sq>sk",
        sq=40,
        sk=24,
        align="bottom_right",
        window=[2**63 - 1, 4],
        config=WIN_TILES,
    ),
    case("win-beyond-int64-left-tl", sq=24, sk=24, window=[2**64, 0], config=WIN_TILES),
    case("win-left-only-tl-bf16", sq=70, sk=70, window=[9, None], config=WIN_TILES),
    case(
        "win-one-sided-causal-br-f16",
        dtype="float16",
        sq=50,
        sk=77,
        causal=True,
        align="bottom_right",
        window=[13, None],
        config=WIN_TILES,
        repeat=True,
    ),
    case(
        "win-two-sided-gqa-br-sq<sk",
        sq=20,
        sk=75,
        heads=4,
        kv_heads=2,
        align="bottom_right",
        window=[5, 9],
        config=WIN_TILES,
    ),
    case("win-right-only-tl-sq<sk", sq=33, sk=64, window=[None, 3], config=WIN_TILES),
    # rows 0..37 see no key (d_i = i - 40, right side 2): lse -inf, out 0, dq 0
    case(
        "win-empty-rows-br-sq>sk",
        sq=60,
        sk=20,
        align="bottom_right",
        window=[3, 2],
        config=WIN_TILES,
    ),
    # top-left, Sq > Sk, left side only: the last rows' bands start past the keys
    case("win-empty-rows-tl-sq>sk-left", sq=80, sk=24, window=[30, 5], config=WIN_TILES),
    case("win-causal-caps-right", sq=45, sk=45, causal=True, window=[10, 6], config=WIN_TILES),
    case("win-zero-width", sq=40, sk=40, window=[0, 0], config=WIN_TILES),
    case("win-wider-than-seq", sq=37, sk=45, window=[100, 100], causal=True),
    case("win-default-tiles-mqa", sq=70, sk=90, heads=4, kv_heads=1, window=[20, 4]),
    case("softcap-full-bf16", batch=2, sq=37, sk=45, softcap=2.0, scale=CAPPED_SCALE),
    case(
        "softcap-causal-tl-f16-d128",
        dtype="float16",
        sq=50,
        sk=50,
        heads=4,
        kv_heads=1,
        d=128,
        causal=True,
        softcap=3.0,
        scale=2.5 / math.sqrt(128),
        config=WIN_TILES,
    ),
    case(
        "softcap-win-causal-br-gqa",
        sq=45,
        sk=70,
        heads=8,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        window=[12, None],
        softcap=2.0,
        scale=CAPPED_SCALE,
        config=WIN_TILES,
        repeat=True,
    ),
    case(
        "varlen-win-softcap-br-gqa",
        heads=4,
        kv_heads=2,
        align="bottom_right",
        window=[4, 3],
        softcap=2.0,
        scale=CAPPED_SCALE,
        varlen=([17, 0, 33, 5, 40], [20, 11, 29, 0, 12]),
        config=WIN_TILES,
    ),
    case(
        "varlen-win-causal-tl",
        dtype="float16",
        heads=4,
        kv_heads=1,
        causal=True,
        window=[7, None],
        varlen=([9, 40, 1, 30], [30, 7, 18, 30]),
        config=WIN_TILES,
    ),
    case(
        "win-group-split-heavy-first",
        sq=45,
        sk=70,
        heads=8,
        kv_heads=2,
        causal=True,
        window=[15, None],
        config={
            k: {**c, "HEAVY_FIRST": 1, **({"SPLIT": 2} if k == "dkdv" else {})}
            for k, c in WIN_TILES.items()
        },
    ),
    case(
        "win-softcap-dp-first-tma-loads",
        sq=50,
        sk=70,
        heads=4,
        kv_heads=2,
        window=[11, 6],
        align="bottom_right",
        softcap=2.0,
        scale=CAPPED_SCALE,
        config={
            **WIN_TILES,
            "dkdv": {**WIN_TILES["dkdv"], "DP_FIRST": 1, "LOAD_TMA": 1},
            "dq": {**WIN_TILES["dq"], "LOAD_TMA": 1},
        },
    ),
    case(
        "atomic-win-softcap-two-sided",
        sq=45,
        sk=60,
        heads=4,
        kv_heads=2,
        window=[6, 10],
        softcap=2.0,
        scale=CAPPED_SCALE,
        atomic=True,
        config=WIN_TILES,
    ),
    case(
        "atomic-tma-varlen-win-empty-rows",
        dtype="float16",
        heads=4,
        kv_heads=2,
        align="bottom_right",
        causal=True,
        window=[3, None],
        varlen=([9, 0, 40, 13], [30, 7, 18, 13]),
        atomic=True,
        config=tiles(WIN_TILES, dkdvq={"TMA": 1, "SPLIT": 2}),
    ),
]


def _random_variant_cases(count: int) -> list[dict]:
    """Random windows (either side None or 0..40), alignments, causal, soft cap, GQA, lengths."""
    import random

    rng = random.Random(26)
    out = []
    for n in range(count):
        sq, sk = rng.randint(1, 70), rng.randint(1, 70)
        window = [rng.choice([None, 0, rng.randint(0, 40)]) for _ in range(2)]
        cap = rng.choice([None, 1.5, 4.0])
        heads, kv_heads = rng.choice([(2, 2), (4, 1), (6, 2)])
        extra = {} if cap is None else {"softcap": cap, "scale": CAPPED_SCALE}
        out.append(
            case(
                f"random-variant-{n}",
                sq=sq,
                sk=sk,
                heads=heads,
                kv_heads=kv_heads,
                dtype=rng.choice(["bfloat16", "float16"]),
                causal=rng.random() < 0.3,
                align=rng.choice(["top_left", "bottom_right"]),
                window=window,
                atomic=rng.random() < 0.3,
                config=WIN_TILES,
                **extra,
            )
        )
    return out


VARIANT_CASES += _random_variant_cases(12)
RANGES_CASE = {"id": "loop-bounds", "kind": "ranges", "seed": 2626, "count": 300}


def _slow_cases() -> list[dict]:
    out = []
    for dtype, d, (h, hk), (causal, align), (sq, sk) in itertools.product(
        ("bfloat16", "float16"),
        (32, 64, 96, 128, 256),
        ((2, 2), (4, 1), (6, 2)),
        ((False, "top_left"), (True, "top_left"), (True, "bottom_right")),
        ((1, 1), (19, 64), (64, 19), (70, 70)),
    ):
        for atomic in (False, True):
            out.append(
                case(
                    f"slow-{dtype}-d{d}-h{h}/{hk}-{causal}-{align}-{sq}x{sk}"
                    + ("-atomic" if atomic else ""),
                    dtype=dtype,
                    sq=sq,
                    sk=sk,
                    heads=h,
                    kv_heads=hk,
                    d=d,
                    causal=causal,
                    align=align,
                    atomic=atomic,
                )
            )
    for dtype, causal, align in itertools.product(
        ("bfloat16", "float16"), (False, True), ("top_left", "bottom_right")
    ):
        for atomic in (False, True):
            out.append(
                case(
                    f"slow-varlen-{dtype}-{causal}-{align}" + ("-atomic" if atomic else ""),
                    dtype=dtype,
                    heads=4,
                    kv_heads=2,
                    causal=causal,
                    align=align,
                    varlen=([0, 31, 64, 3, 17], [5, 0, 64, 40, 17]),
                    config=SMALL_TILES,
                    atomic=atomic,
                )
            )
    return out


SLOW_CASES = _slow_cases()

# Attention sinks: the forward's epilogue folds them in, the backward kernels read the lse that
# has them, ``_bwd_sinks`` reduces dsinks; against the library's float64 oracle (its sinks).
SINK_CASES = [
    case("sinks-mha-full-bf16", batch=2, sq=37, sk=45, sinks=True),
    case(
        "sinks-gqa-causal-br-empty-rows-f16",
        dtype="float16",
        sq=50,
        sk=20,
        heads=8,
        kv_heads=2,
        causal=True,
        align="bottom_right",
        sinks=True,
        config=SMALL_TILES,
        repeat=True,
    ),
    # GPT-OSS's shape of call: GQA, D = 64, causal with a left window
    case(
        "sinks-win-causal-gqa-tiles",
        sq=70,
        sk=70,
        heads=8,
        kv_heads=2,
        causal=True,
        window=[12, None],
        sinks=True,
        config=WIN_TILES,
    ),
    case(
        "sinks-softcap-win-two-sided",
        sq=45,
        sk=60,
        heads=4,
        kv_heads=2,
        window=[6, 10],
        softcap=2.0,
        scale=CAPPED_SCALE,
        sinks=True,
        config=WIN_TILES,
    ),
    case(
        "sinks-varlen-empty-causal-br",
        heads=4,
        kv_heads=1,
        causal=True,
        align="bottom_right",
        varlen=([17, 0, 33, 5, 40], [20, 11, 29, 0, 12]),
        sinks=True,
        config=SMALL_TILES,
    ),
    case(
        "sinks-atomic-varlen-win",
        dtype="float16",
        heads=4,
        kv_heads=2,
        causal=True,
        window=[3, None],
        varlen=([9, 0, 40, 13], [30, 7, 18, 13]),
        atomic=True,
        sinks=True,
        config=WIN_TILES,
    ),
]

# sinks, cu_seqlens and lse as strided views of larger tensors (any [H] / [B+1] tensor is valid
# input): the kernels must read their elements, not the buffer's. Their own worker: a kernel
# that reads cu_seqlens' buffer walks out of bounds, which may take the interpreter down.
STRIDED_CASES = [
    case(
        "sinks-varlen-strided-vectors",
        heads=4,
        kv_heads=2,
        causal=True,
        varlen=([17, 0, 33, 5], [20, 11, 29, 4]),
        sinks=True,
        strided_vectors=True,
        config=SMALL_TILES,
    ),
    case(
        "sinks-dense-strided-vectors-f16",
        dtype="float16",
        batch=2,
        sq=30,
        sk=41,
        sinks=True,
        strided_vectors=True,
    ),
]


class Worker:
    """One interpreter subprocess for a list of cases. It can be started as soon as the session
    knows its tests will need it (``conftest.py``: on one core while the rest of the suite runs
    on the other) and is waited for by the first test that reads its results."""

    def __init__(self, cases: list[dict]) -> None:
        self.cases = cases
        self.proc: subprocess.Popen | None = None
        self.results: dict[str, dict] | None = None

    def start(self) -> None:
        if self.proc is not None:
            return
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["OMP_NUM_THREADS"] = "1"  # one core: the test session keeps the other
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        # The cases fit in the pipe's buffer only sometimes: feed them from a thread, so that
        # starting never blocks the session.
        threading.Thread(target=self._feed, daemon=True).start()

    def _feed(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(self.cases))
        self.proc.stdin.close()

    def wait(self) -> dict[str, dict]:
        if self.results is None:
            self.start()
            assert self.proc is not None
            out = self.proc.stdout.read()
            err = self.proc.stderr.read()
            if self.proc.wait(timeout=3600) != 0:
                raise RuntimeError(f"interpreter worker failed:\n{err[-4000:]}")
            self.results = {r["id"]: r for r in json.loads(out)}
        return self.results


# The fixture each suite's tests read, and its worker (conftest.py starts those a run needs).
WORKERS = {
    "default_results": Worker(DEFAULT_CASES),
    "variant_results": Worker([RANGES_CASE, *VARIANT_CASES]),
    "slow_results": Worker(SLOW_CASES),
    "sink_results": Worker(SINK_CASES),
    "strided_results": Worker(STRIDED_CASES),
}


def _results(name: str):
    """The module fixture ``name``: the results of its worker's cases, by id."""

    @pytest.fixture(scope="module", name=name)
    def results() -> dict[str, dict]:
        return WORKERS[name].wait()

    return results


default_results, variant_results, slow_results, sink_results, strided_results = map(
    _results, WORKERS
)


def _each(cases: list[dict]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("c", cases, ids=[c["id"] for c in cases])


def _check(c: dict, r: dict) -> None:
    assert "error" not in r, r.get("error")
    tol = TOL[c["dtype"]]
    for name in ("out", "dq", "dk", "dv"):
        assert r[name] <= tol, f"{name}: rel err {r[name]} > {tol} ({r})"  # NaN fails too
    assert not r["lse_nan"], r
    assert r["lse_inf_match"], f"-inf rows of lse differ from the oracle's ({r})"
    assert r["lse_abs"] <= LSE_TOL, r
    if "dq_empty_rows_zero" in r:
        assert r["dq_empty_rows_zero"], "rows that see no key must get dq == 0"
    if "dkdv_unseen_zero" in r:
        assert r["dkdv_unseen_zero"], "keys that no row sees must get dk == dv == 0"
    if c.get("sinks"):
        assert r["dsinks"] <= tol, f"dsinks: rel err {r['dsinks']} > {tol} ({r})"
    if "out_empty_rows_zero" in r:
        assert r["out_empty_rows_zero"], "rows that see no key must get out == 0 (sink only)"
    if c.get("repeat"):
        assert r["bitwise_repeat"], "backward is not bitwise reproducible"


@_each(DEFAULT_CASES)
def test_triton_kernels_match_oracle(c: dict, default_results: dict) -> None:
    _check(c, default_results[c["id"]])


@pytest.mark.slow
@_each(SLOW_CASES)
def test_triton_kernels_match_oracle_matrix(c: dict, slow_results: dict) -> None:
    _check(c, slow_results[c["id"]])


@_each(VARIANT_CASES)
def test_triton_window_softcap_match_oracle(c: dict, variant_results: dict) -> None:
    _check(c, variant_results[c["id"]])


@_each(SINK_CASES)
def test_triton_attention_sinks_match_oracle(c: dict, sink_results: dict) -> None:
    _check(c, sink_results[c["id"]])


@_each(STRIDED_CASES)
def test_triton_strided_vectors_match_oracle(c: dict, strided_results: dict) -> None:
    _check(c, strided_results[c["id"]])


def test_triton_sink_cases_have_rows_without_keys(sink_results: dict) -> None:
    """The empty-row checks ran: some sink cases have rows whose whole mass is the sink's."""
    assert sum("out_empty_rows_zero" in r for r in sink_results.values()) >= 2


def test_triton_loop_bounds_walk_exactly_the_band(variant_results: dict) -> None:
    """Every program's loop bounds (the kernels' ``_common`` functions, run by the
    interpreter) for random bands, both sides: each walked block meets the band, together they
    cover it once, and the ones walked without a mask are wholly visible and in range."""
    r = variant_results[RANGES_CASE["id"]]
    assert "error" not in r, r.get("error")
    assert r["checked"] > RANGES_CASE["count"], r
    assert r["n_errors"] == 0, r["errors"]
