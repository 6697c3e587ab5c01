"""Context parallelism without processes: the causal block schedule, the lse merge, the layouts."""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.distributed import _layout
from attn_dispatch.distributed._ring import block_plan, merge_into


def _covered(load_balance: str, rank: int, src: int, world: int, chunk: int, causal: bool):
    """How many blocks of the plan cover each (local query, local key) pair."""
    n = len(_layout.rank_chunks(load_balance, rank, world)) * chunk
    count = torch.zeros(n, n, dtype=torch.int64)
    for blk in block_plan(load_balance, rank, src, n, causal):
        rows = torch.arange(n)[blk.q_rows]
        cols = torch.arange(n)[blk.k_cols]
        seen = torch.ones(len(rows), len(cols), dtype=torch.int64)
        if blk.causal:
            assert len(rows) == len(cols), (
                "a causal block must be square (top-left == bottom-right)"
            )
            seen = torch.tril(seen)
        count[rows[:, None], cols[None, :]] += seen
    return count


@pytest.mark.parametrize("load_balance", _layout.LOAD_BALANCES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_block_plan_covers_exactly_the_global_mask(load_balance, causal, world):
    chunk = 3
    parts = _layout.chunks_per_rank(load_balance) * world
    seqlen = parts * chunk
    visible = torch.ones(seqlen, seqlen, dtype=torch.int64)
    if causal:
        visible = torch.tril(visible)
    for rank in range(world):
        qpos = _layout.global_positions(load_balance, rank, world, chunk)
        for src in range(world):
            kpos = _layout.global_positions(load_balance, src, world, chunk)
            want = visible[qpos[:, None], kpos[None, :]]
            got = _covered(load_balance, rank, src, world, chunk, causal)
            assert torch.equal(got, want), (rank, src)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_causal_work(world):
    """Every rank computes the same number of (query, key) pairs; contiguous does not."""

    def work(load_balance: str) -> list[int]:
        chunk = 4
        return [
            sum(int(_covered(load_balance, r, s, world, chunk, True).sum()) for s in range(world))
            for r in range(world)
        ]

    assert len(set(work("zigzag"))) == 1
    assert len(set(work("contiguous"))) == world


def test_layout_positions_partition_the_sequence():
    for load_balance in _layout.LOAD_BALANCES:
        for world in (1, 2, 3, 4):
            order = _layout.shard_order(load_balance, world, chunk=5)
            assert sorted(order.tolist()) == list(range(len(order)))
    assert _layout.global_positions("zigzag", 1, 3, 2).tolist() == [2, 3, 8, 9]
    assert _layout.global_positions("contiguous", 1, 3, 2).tolist() == [2, 3]


@pytest.mark.parametrize(
    ("seqlen", "world", "load_balance", "rule"),
    [(10, 3, "zigzag", "2W = 6"), (12, 8, "zigzag", "2W = 16"), (10, 4, "contiguous", "W = 4")],
)
def test_uneven_sequence_names_s_w_and_the_rule(seqlen, world, load_balance, rule):
    with pytest.raises(ValueError, match=rf"S={seqlen}.*W={world}.*{rule}"):
        _layout.check_global_length(seqlen, world, load_balance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merge_matches_attention_over_the_union_and_survives_minus_inf(dtype):
    """Two blocks of keys merged by lse equal one call on all keys; empty rows stay 0 / -inf."""
    torch.manual_seed(0)
    b, s, h, d = 2, 6, 3, 8
    q = torch.randn(b, s, h, d, dtype=dtype)
    k, v = torch.randn(2, b, 10, h, d, dtype=dtype)
    want_out, want_lse = ad.forward(q, k, v)
    acc_dt = torch.float64 if dtype == torch.float64 else torch.float32
    out_acc = torch.zeros(b, s, h, d, dtype=acc_dt)
    lse_acc = torch.full((b, h, s), float("-inf"), dtype=adb.lse_dtype(dtype))
    # a block in which no row sees a key: lse -inf, out 0 (the contract for masked rows)
    merge_into(out_acc, lse_acc, torch.zeros_like(q), torch.full_like(lse_acc, float("-inf")))
    assert torch.isneginf(lse_acc).all() and not out_acc.isnan().any()
    for cols in (slice(0, 4), slice(4, 10)):
        out, lse = ad.forward(q, k[:, cols], v[:, cols])
        merge_into(out_acc, lse_acc, out, lse)
    merge_into(out_acc, lse_acc, torch.zeros_like(q), torch.full_like(lse_acc, float("-inf")))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out_acc.to(dtype), want_out, rtol=0, atol=tol)
    torch.testing.assert_close(lse_acc, want_lse, rtol=0, atol=tol)
