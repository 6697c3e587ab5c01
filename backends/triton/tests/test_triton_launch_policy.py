"""The backward's launch policy (``_launch_policy``), on the CPU: every rule of splits, tail
slices, partial buffers, orders and windows, with the expected plans worked out from the rules
in the comments (no GPU, no triton)."""

from __future__ import annotations

import pytest
from attn_dispatch_triton import _launch_policy as policy
from attn_dispatch_triton._launch_policy import DkdvLaunch, GridLayout, Partials, Problem

TILES = {"BLOCK_M": 64, "BLOCK_N": 128}


def gqa(
    seqlen: int, *, heads: int = 64, kv_heads: int = 8, batch: int = 1, causal: bool = False, **kw
) -> Problem:
    return Problem(batch, heads, kv_heads, seqlen, seqlen, causal, **kw)


def plan(
    p: Problem,
    sms: int | None = 132,
    gluon: bool = True,
    atomic_dq: bool = True,
    dense_out: bool = True,
    **config,
) -> policy.DkdvPlan:
    return policy.dkdv_plan(
        p,
        {**TILES, **config},
        sms=sms,
        gluon=gluon,
        atomic_dq=atomic_dq,
        dense_out=dense_out,
    )


# -- group split ------------------------------------------------------------------------------


def test_split_from_the_config_wins() -> None:
    assert policy.group_split(gqa(1024), {"SPLIT": 4}, 128, None) == 4


@pytest.mark.parametrize(
    ("heads", "kv_heads", "configured", "split"),
    [(28, 4, 4, 1), (24, 8, 2, 1), (40, 8, 4, 1), (8, 4, 4, 2), (12, 2, 4, 3), (16, 1, 4, 4)],
)
def test_configured_split_divides_the_group(heads, kv_heads, configured, split) -> None:
    # Each slice walks group // split heads: a split that does not divide the group dropped
    # query heads (wrong dQ, and dK/dV missing their contributions).
    p = Problem(1, heads, kv_heads, 1024, 1024, True)
    got = policy.group_split(p, {"SPLIT": configured}, 128, 132)
    assert got == split and p.group % got == 0


def test_configured_split_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="SPLIT"):
        policy.group_split(gqa(1024), {"SPLIT": 0}, 128, 132)


@pytest.mark.parametrize(
    "problem",
    [
        Problem(1, 8, 8, 1024, 1024, False),  # MHA: group of 1
        gqa(1024, on_gpu=False),  # off a GPU
        gqa(1024, has_keys=False),  # no keys: nothing to split
    ],
    ids=["mha", "cpu", "no-keys"],
)
def test_no_split_without_a_group_a_gpu_or_keys(problem) -> None:
    assert policy.group_split(problem, {}, 128, 132) == 1


def test_split_doubles_while_the_programs_fit_the_target() -> None:
    # 1K, 8 kv heads: 8 key blocks x 8 = 64 programs; without a mask the target is 132 (one per
    # SM): 128 fits, 256 does not -> 2
    assert policy.group_split(gqa(1024), {}, 128, 132) == 2
    # causal: target 8 x 132 = 1056: 128, 256, 512 programs fit; the group of 8 stops it -> 8
    assert policy.group_split(gqa(1024, causal=True), {}, 128, 132) == 8
    # 4K causal: 32 x 8 = 256 programs; 512 and 1024 fit 1056, 2048 does not -> 4
    assert policy.group_split(gqa(4096, causal=True), {}, 128, 132) == 4
    # the group bounds it: GQA 16/8 (group 2) at 1K causal -> 2
    assert policy.group_split(gqa(1024, heads=16, causal=True), {}, 128, 132) == 2
    # long sequences fill the SMs alone: 16K = 128 x 8 = 1024 programs > 132 -> 1
    assert policy.group_split(gqa(16384), {}, 128, 132) == 1


# -- tail slices ------------------------------------------------------------------------------


def tail(
    seqlen: int,
    *,
    kv_heads: int = 2,
    heads: int = 16,
    causal: bool = False,
    split: int = 1,
    most: int = 32,
    varlen: bool = False,
    sms: int = 132,
):
    p = gqa(seqlen, heads=heads, kv_heads=kv_heads, causal=causal, varlen=varlen)
    return policy.tail_slices(p, {**TILES, "TAIL_SLICES": most}, split, sms)


def test_tail_slices_cut_the_last_partial_wave() -> None:
    # 9216 keys, 2 kv heads: 144 units of 8 heads x 144 query blocks = 1152 steps; 132 whole
    # units, 12 left. k slices take ceil(12 k / 132) waves of 1152 / k + 2 steps: k = 11 is the
    # most that still fits one wave (132 programs of 104.7 + 2 steps), against 1154 unsliced
    assert tail(9216) == (132, 11)
    assert tail(9216, most=4) == (132, 4)  # capped by the config
    # 280 units (17920 keys): 264 whole, 16 left; 8 slices make 128 programs (one wave), 9 would
    # need two, and 16 slices would too: 8 is the best within 16
    assert tail(128 * 140, most=16) == (264, 8)
    # the seed's GQA 64/8 lengths, at most 16 slices: 16K (1024 units of 2048 steps: 924 whole,
    # 100 left, 13 slices) and 8K (512 units of 1024 steps: 396 whole, 116 left, 9 slices)
    assert tail(16384, kv_heads=8, heads=64, most=16) == (924, 13)
    assert tail(8192, kv_heads=8, heads=64, most=16) == (396, 9)


def test_tail_slices_off_where_they_do_not_apply_or_pay() -> None:
    assert tail(8192) is None  # 128 units: no whole wave to keep
    assert tail(128 * 66) is None  # 132 units: whole waves, no rest
    assert tail(9216, causal=True) is None  # causal units differ in length
    assert tail(9216, varlen=True) is None  # varlen units too
    assert tail(9216, split=2) is None  # a split group is sliced already
    assert tail(9216, most=1) is None  # 0 / 1: off
    assert tail(768) is None  # 96 steps per unit: no two slices of >= 64 steps
    # GQA 64/8 4K: 256 units, 132 whole, 124 left: 124 x k programs need k waves, no gain
    assert tail(4096, kv_heads=8, heads=64, most=16) is None


def test_tail_slices_must_pay_for_the_buffer(monkeypatch) -> None:
    # 9216 keys saves 1154 - 2 x 106.7 steps at most, far above 5% of a unit; with a buffer cost
    # of 10 steps per unit (1440 for 144 units) it no longer pays
    monkeypatch.setattr(policy, "BUFFER_COST_STEPS_PER_UNIT", 10)
    assert tail(9216) is None


def test_negative_tail_slices_are_refused() -> None:
    with pytest.raises(ValueError, match="TAIL_SLICES"):
        tail(8192, most=-1)


# -- windows and heaviest-first --------------------------------------------------------------


def test_window_halves_until_it_divides_the_kv_rows() -> None:
    assert policy.window({}, (32, 8, 4)) == 0  # off
    assert policy.window({"WINDOW": 1}, (32, 8, 4)) == 1
    assert policy.window({"WINDOW": 4}, (32, 8, 4)) == 4
    assert policy.window({"WINDOW": 4}, (32, 6, 4)) == 2  # 4 does not divide 6
    assert policy.window({"WINDOW": 4}, (32, 5, 4)) == 1
    assert policy.window({"WINDOW": 1}, (policy.MAX_GRID_YZ + 1, 8, 4)) == 0  # axis 1 too small


def test_heavy_first_needs_the_config_a_causal_mask_and_room_on_the_axis() -> None:
    causal, full = gqa(4096, causal=True), gqa(4096)
    assert policy.heavy_first(causal, {"HEAVY_FIRST": 1}, 32)
    assert not policy.heavy_first(causal, {}, 32)
    assert not policy.heavy_first(full, {"HEAVY_FIRST": 1}, 32)
    assert not policy.heavy_first(causal, {"HEAVY_FIRST": 1}, policy.MAX_GRID_YZ + 1)


# -- dK/dV plans ------------------------------------------------------------------------------


def test_natural_plan_without_partials() -> None:
    # GQA 64/8 16K causal, split 1 given: 128 key blocks x 8 kv heads, one launch, no buffer
    got = plan(gqa(16384, causal=True), SPLIT=1)
    assert got == policy.DkdvPlan(1, 128, Partials.NONE, 0, False, (DkdvLaunch((128, 8, 1)),))


def test_heavy_first_plan_reverses_the_grid() -> None:
    got = plan(gqa(2048, causal=True), SPLIT=4, HEAVY_FIRST=1)
    # split 4 -> partials summed by the sum launch, one per slice
    assert got == policy.DkdvPlan(
        4, 16, Partials.SUM_KERNEL, 4, False, (DkdvLaunch((4, 8, 16), GridLayout.HEAVY_FIRST),)
    )


def test_windowed_plan_replaces_heavy_first() -> None:
    # 4K causal, split 4, windows of 1 kv head: (4 x 1, 32 key blocks, 8 / 1)
    got = plan(gqa(4096, causal=True), SPLIT=4, WINDOW=1, HEAVY_FIRST=1)
    assert got.launches == (DkdvLaunch((4, 32, 8), GridLayout.WINDOWED, window=1),)
    # windows of 2 with B = 2 (16 kv rows): (4 x 2, 32, 8)
    got = plan(gqa(4096, batch=2, causal=True), SPLIT=4, WINDOW=2)
    assert got.launches == (DkdvLaunch((8, 32, 8), GridLayout.WINDOWED, window=2),)


def test_windows_are_for_the_gluon_kernel_only() -> None:
    got = plan(gqa(4096, causal=True), gluon=False, SPLIT=4, WINDOW=1, HEAVY_FIRST=1)
    assert got.launches == (DkdvLaunch((4, 8, 32), GridLayout.HEAVY_FIRST),)


def test_split_add_sums_into_one_zeroed_buffer() -> None:
    # SPLIT_ADD with the Gluon fused-atomic kernel: 1 zero-filled partial the slices add into
    got = plan(gqa(8192, causal=True), SPLIT=4, WINDOW=1, SPLIT_ADD=1)
    assert got == policy.DkdvPlan(
        4,
        64,
        Partials.SUM_KERNEL,
        1,
        True,
        (DkdvLaunch((4, 64, 8), GridLayout.WINDOWED, window=1, add_dkdv=True),),
    )


@pytest.mark.parametrize(
    ("gluon", "atomic_dq"), [(False, True), (True, False)], ids=["tl-kernel", "split-design"]
)
def test_split_add_needs_the_gluon_fused_atomic_kernel(gluon, atomic_dq) -> None:
    got = plan(gqa(8192, causal=True), gluon=gluon, atomic_dq=atomic_dq, SPLIT=4, SPLIT_ADD=1)
    assert (got.partials, got.partial_count, got.zero_partials) == (Partials.SUM_KERNEL, 4, False)
    assert not got.launches[0].add_dkdv


def test_split_outputs_with_other_strides_are_summed_by_torch() -> None:
    got = plan(gqa(8192, causal=True), dense_out=False, SPLIT=4, SPLIT_ADD=1)
    assert (got.partials, got.partial_count, got.zero_partials) == (Partials.TORCH_SUM, 4, False)
    assert got.launches == (DkdvLaunch((64, 8, 4)),)


def test_tail_plan_launches_whole_units_then_slices() -> None:
    # GQA 64/8 16K, no mask: 1024 units; 924 in whole waves, the other 100 in 13 slices each,
    # added into one zero-filled buffer the sum launch casts
    got = plan(gqa(16384), TAIL_SLICES=16)
    assert got == policy.DkdvPlan(
        1,
        128,
        Partials.SUM_KERNEL,
        1,
        True,
        (
            DkdvLaunch((924, 1, 1), GridLayout.UNITS),
            DkdvLaunch(
                (100, 1, 13), GridLayout.UNITS, unit_offset=924, add_dkdv=True, step_slices=True
            ),
        ),
    )


@pytest.mark.parametrize(
    "change",
    [dict(gluon=False), dict(atomic_dq=False), dict(dense_out=False)],
    ids=["tl-kernel", "split-design", "strided-outputs"],
)
def test_tail_slices_only_for_the_gluon_fused_atomic_kernel(change) -> None:
    got = plan(gqa(16384), **change, TAIL_SLICES=16)
    assert got.partials is Partials.NONE and got.launches == (DkdvLaunch((128, 8, 1)),)


def test_plan_off_a_gpu_uses_the_heuristic_free_defaults() -> None:
    got = plan(gqa(1024, on_gpu=False), sms=None, gluon=False, TAIL_SLICES=16)
    assert got == policy.DkdvPlan(1, 8, Partials.NONE, 0, False, (DkdvLaunch((8, 8, 1)),))


def test_empty_key_sequence_still_gets_one_key_block() -> None:
    got = plan(Problem(1, 8, 2, 0, 0, False, has_keys=False), gluon=False)
    assert got.key_blocks == 1 and got.launches == (DkdvLaunch((1, 2, 1)),)


# -- dQ, the convert pass, the sum launch and the side stream --------------------------------


def test_dq_launch_per_query_block_and_head() -> None:
    cfg = {"BLOCK_M": 128, "BLOCK_N": 64}
    assert policy.dq_launch(gqa(1000), cfg) == policy.DqLaunch((8, 64), False)
    assert policy.dq_launch(gqa(1000, causal=True), {**cfg, "HEAVY_FIRST": 1}) == policy.DqLaunch(
        (64, 8), True
    )
    assert policy.query_block_grid(gqa(0), cfg) == (1, 64)  # at least one block


def test_sum_layout_pads_dk_to_whole_blocks() -> None:
    layout = policy.sum_layout(1500, 700)
    assert (layout.blocks_k, layout.v_offset, layout.row) == (2, 2048, 2748)
    assert layout.grid == (2 + 1,)


def test_concurrent_dq_up_to_the_configured_length() -> None:
    cfg = {"CONCURRENT_MAX_SK": 2048}
    assert policy.runs_concurrently(gqa(2048), cfg, streams=True)
    assert not policy.runs_concurrently(gqa(4096), cfg, streams=True)
    assert not policy.runs_concurrently(gqa(2048), cfg, streams=False)
    assert not policy.runs_concurrently(gqa(1024), {}, streams=True)
