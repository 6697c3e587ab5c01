"""``Band``, the keys each query row sees, against a plain definition of visibility: the rows
and keys of ``Band.of(...)`` (``mask`` and ``key_range``) and of the inputs' ``inp.band``,
whose sides that exclude no key at the call's lengths are unbounded (int64-safe)."""

from __future__ import annotations

import random
import sys

import pytest
import torch

from attn_dispatch import backend as adb

ALIGNS = ("top_left", "bottom_right")


def sees(i: int, j: int, sq: int, sk: int, window, causal: bool, align: str) -> bool:
    """Whether query row ``i`` sees key ``j``, in Python ints, from the contract's words."""
    diagonal = i + (sk - sq if align == "bottom_right" else 0)
    left, right = (None, None) if window is None else window
    if left is not None and j < diagonal - left:
        return False
    if right is not None and j > diagonal + right:
        return False
    return not (causal and j > diagonal)


def visibility(sq: int, sk: int, window, causal: bool, align: str) -> list[list[bool]]:
    return [[sees(i, j, sq, sk, window, causal, align) for j in range(sk)] for i in range(sq)]


def random_calls(seed: int, count: int):
    """``(sq, sk, window, causal, align)`` with small lengths and sides (some beyond them)."""
    rng = random.Random(seed)
    for _ in range(count):
        sq, sk = rng.randint(0, 12), rng.randint(0, 12)
        window = None
        if rng.random() < 0.8:
            window = tuple(rng.choice([None, 0, 1, rng.randint(0, 16)]) for _ in range(2))
        yield sq, sk, window, rng.random() < 0.4, rng.choice(ALIGNS)


def band_mask(band: adb.Band, sq: int, sk: int) -> list[list[bool]]:
    mask = band.mask(sq, sk)
    return [[True] * sk for _ in range(sq)] if mask is None else mask.tolist()


def test_mask_is_the_contracts_visibility():
    for sq, sk, window, causal, align in random_calls(seed=1, count=600):
        band = adb.Band.of(window, causal, align)
        want = visibility(sq, sk, window, causal, align)
        assert band_mask(band, sq, sk) == want, (sq, sk, window, causal, align)
        assert band.limited == (band.mask(sq, sk) is not None)


def test_key_range_is_the_smallest_range_holding_every_visible_key():
    for sq, sk, window, causal, align in random_calls(seed=2, count=300):
        band = adb.Band.of(window, causal, align)
        want = visibility(sq, sk, window, causal, align)
        for i0 in range(sq):
            for i1 in range(i0 + 1, sq + 1):
                keys = [j for j in range(sk) if any(want[i][j] for i in range(i0, i1))]
                k0, k1 = band.key_range(i0, i1, sq, sk)
                assert 0 <= k0 <= k1 <= sk
                if keys:  # contiguous: every row's keys are an interval moving with the row
                    assert (k0, k1) == (keys[0], keys[-1] + 1), (sq, sk, window, causal, align)
                else:
                    assert k0 == k1


def test_of_folds_causal_into_the_right_side():
    assert adb.Band.of(None, False, "bottom_right") == adb.Band(None, None, False)
    assert adb.Band.of(None, True, "top_left") == adb.Band(None, 0, False)
    assert adb.Band.of((4, 7), True, "bottom_right") == adb.Band(4, 0, True)
    assert adb.Band.of((None, 3), False, "top_left") == adb.Band(None, 3, False)
    assert adb.Band.of((2, None), True, "top_left") == adb.Band(2, 0, False)


def test_offset_is_the_diagonals_shift():
    assert adb.Band(3, 0, True).offset(5, 9) == 4
    assert adb.Band(3, 0, False).offset(5, 9) == 0


def meta(sq: int, sk: int):
    q = torch.empty(1, sq, 1, 4, device="meta")
    k = torch.empty(1, sk, 1, 4, device="meta")
    return q, k


def test_inputs_band_sees_what_the_call_sees():
    """Through validation: the same visibility, no side wider than the longest sequence (a
    side reaching every key is unbounded), and no alignment without a bounded side."""
    for sq, sk, window, causal, align in random_calls(seed=3, count=400):
        q, k = meta(sq, sk)
        band = adb.make_inputs(q, k, k, window=window, causal=causal, causal_align=align).band
        assert band_mask(band, sq, sk) == visibility(sq, sk, window, causal, align)
        reach = max(sq, sk)
        assert all(side is None or side <= reach for side in (band.left, band.right)), band
        assert band.limited or not band.bottom_right


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("huge", [2**62, 2**63 - 1, 2**63, 2**64, sys.maxsize * 4])
def test_int64_large_sides_are_unbounded_in_the_inputs(huge, align):
    q, k = meta(7, 5)
    for window, want in (
        ((huge, huge), adb.Band(None, None, False)),
        ((huge, 2), adb.Band(None, 2, align == "bottom_right")),
        ((1, huge), adb.Band(1, None, align == "bottom_right")),
    ):
        band = adb.make_inputs(q, k, k, window=window, causal_align=align).band
        assert band == want, (window, band)
        assert band_mask(band, 7, 5) == visibility(7, 5, window, False, align)
    causal = adb.make_inputs(q, k, k, window=(huge, huge), causal=True, causal_align=align).band
    assert causal == adb.Band(None, 0, align == "bottom_right")


def test_varlen_band_uses_the_longest_sequences():
    """Varlen: the sides are judged against max_seqlen, and hold for every shorter pair."""
    q = torch.empty(20, 1, 4, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    lengths = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=10, max_seqlen_k=10)
    for window, causal, align in [((3, 9), False, "top_left"), ((10, 2), True, "bottom_right")]:
        flags = dict(window=window, causal=causal, causal_align=align)
        band = adb.make_inputs(q, q, q, **flags, **lengths).band
        for sq in range(11):
            for sk in range(11):
                assert band_mask(band, sq, sk) == visibility(sq, sk, window, causal, align)
