"""The kernels' band arguments (``_band.constexprs`` / ``_band.sides`` of the call's
``inp.band``) against the kit's ``visible_mask`` (checked against the contract element by
element in ``tests/core/test_testing.py``), and the plugin's reading of the inputs (no
triton needed)."""

from __future__ import annotations

import itertools
import random

import torch
from attn_dispatch_triton import _band, plugin

from attn_dispatch import backend as adb
from attn_dispatch.testing import visible_mask


def kernel_visible(band: adb.Band, sq: int, sk: int) -> torch.Tensor:
    """What the kernels compute from their band arguments: ``i + lo_off <= j <= i + hi_off``."""
    flags, (left, right) = _band.constexprs(band), _band.sides(band)
    off = sk - sq if flags["BOTTOM_RIGHT"] else 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if flags["LIMIT_LEFT"]:
        ok &= j >= i + off - left
    if flags["LIMIT_RIGHT"]:
        ok &= j <= i + off + right
    return ok


def inputs(sq: int, sk: int, **flags) -> adb.ForwardInputs:
    """Dense forward inputs on meta, as dispatch validates them."""
    q = torch.empty(1, sq, 1, 8, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, sk, 1, 8, dtype=torch.bfloat16, device="meta")
    return adb.make_inputs(q, k, k, **flags)


def test_band_arguments_examples() -> None:
    full = inputs(100, 100).band
    assert _band.constexprs(full) == dict(LIMIT_LEFT=False, LIMIT_RIGHT=False, BOTTOM_RIGHT=False)
    assert _band.sides(full) == (0, 0)
    causal = inputs(16384, 16384, causal=True, window=(4095, 7)).band
    assert _band.constexprs(causal) == dict(LIMIT_LEFT=True, LIMIT_RIGHT=True, BOTTOM_RIGHT=False)
    assert _band.sides(causal) == (4095, 0)
    br = inputs(10, 20, causal=True, causal_align="bottom_right").band
    assert _band.constexprs(br)["BOTTOM_RIGHT"] and _band.sides(br) == (0, 0)


def test_band_arguments_match_contract_brute_force() -> None:
    """Random lengths, windows, causal and alignment: the kernels' visibility from the inputs'
    band is the contract's."""
    rng = random.Random(7)
    for _ in range(1000):
        sq, sk = rng.randint(1, 40), rng.randint(1, 40)
        window = (
            None
            if rng.random() < 0.15
            else tuple(rng.choice([None, 0, rng.randint(0, 50)]) for _ in range(2))
        )
        causal = rng.random() < 0.4
        align = rng.choice(["top_left", "bottom_right"])
        band = inputs(sq, sk, causal=causal, causal_align=align, window=window).band
        want = visible_mask(sq, sk, causal, align, window=window)
        assert torch.equal(kernel_visible(band, sq, sk), want), (sq, sk, causal, align, window)


def test_band_arguments_hold_for_shorter_varlen_sequences() -> None:
    """Varlen: the band is built from the longest lengths; every shorter sequence pair must
    still see exactly the contract's keys."""
    q = torch.empty(32, 1, 8, dtype=torch.bfloat16, device="meta")
    k = torch.empty(28, 1, 8, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(2, dtype=torch.int32, device="meta")
    lengths = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=32, max_seqlen_k=28)
    for align, window, causal in itertools.product(
        ("top_left", "bottom_right"), [(5, 3), (30, None), (None, 12), (40, 40)], (False, True)
    ):
        flags = dict(causal=causal, causal_align=align, window=window)
        band = adb.make_inputs(q, k, k, **flags, **lengths).band
        for sq, sk in itertools.product(range(0, 33, 4), range(0, 29, 4)):
            assert torch.equal(
                kernel_visible(band, sq, sk), visible_mask(sq, sk, causal, align, window=window)
            )


def test_plugin_passes_the_inputs_band_and_softcap() -> None:
    """The kernels get the inputs' band and soft cap."""
    assert plugin.Fused.window and plugin.Fused.softcap
    assert plugin.FusedAtomic.window and plugin.FusedAtomic.softcap
    inp = inputs(64, 64, causal=True, window=(31, 0), softcap=30.0, scale=0.1)
    flags = plugin.Fused._flags(inp)
    assert flags == dict(band=adb.Band(31, 0, False), scale=0.1, softcap=30.0)
