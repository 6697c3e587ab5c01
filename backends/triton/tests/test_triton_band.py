"""The band helper (``_band.effective_band``) against the contract, brute force, and the
plugin's reading of ``inp.window`` / ``inp.softcap`` (no triton needed)."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch
from attn_dispatch_triton import plugin
from attn_dispatch_triton._band import Band, effective_band

import attn_dispatch as ad


def visible(sq: int, sk: int, causal: bool, align: str, window) -> torch.Tensor:
    """[Sq, Sk] visibility straight from the contract."""
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    d = i + (sk - sq if align == "bottom_right" else 0)
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left is not None:
        ok &= j >= d - left
    if right is not None:
        ok &= j <= d + right
    return ok


def band_visible(band: Band, sq: int, sk: int) -> torch.Tensor:
    """What the kernels compute from a band: ``i + lo_off <= j <= i + hi_off``."""
    off = sk - sq if band.bottom_right else 0
    flags, (left, right) = band.constexprs(), band.sides()
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if flags["LIMIT_LEFT"]:
        ok &= j >= i + off - left
    if flags["LIMIT_RIGHT"]:
        ok &= j <= i + off + right
    return ok


def test_band_examples() -> None:
    assert effective_band(False, "top_left", None, 100, 100) == Band(None, None, False)
    assert effective_band(True, "bottom_right", None, 10, 20) == Band(None, 0, True)
    # causal caps the right side at 0; the window's left side stays
    assert effective_band(True, "top_left", (4095, 7), 16384, 16384) == Band(4095, 0, False)
    assert effective_band(False, "top_left", (None, 3), 50, 50) == Band(None, 3, False)
    # sides wider than the sequences exclude nothing: unbounded, one compiled variant
    assert effective_band(False, "bottom_right", (100, 100), 37, 45) == Band(None, None, False)
    assert effective_band(False, "top_left", (37, 45), 37, 45) == Band(None, None, False)
    assert effective_band(False, "top_left", (36, 44), 37, 45) == Band(36, 44, False)
    assert effective_band(True, "top_left", (None, 9), 8, 8) == Band(None, 0, False)


def test_band_matches_contract_brute_force() -> None:
    """Random lengths, windows, causal and alignment: the band's visibility is the contract's."""
    rng = random.Random(7)
    for _ in range(2000):
        sq, sk = rng.randint(0, 40), rng.randint(0, 40)
        window = (
            None
            if rng.random() < 0.15
            else tuple(rng.choice([None, 0, rng.randint(0, 50)]) for _ in range(2))
        )
        causal = rng.random() < 0.4
        align = rng.choice(["top_left", "bottom_right"])
        band = effective_band(causal, align, window, sq, sk)
        want = visible(sq, sk, causal, align, window)
        assert torch.equal(band_visible(band, sq, sk), want), (sq, sk, causal, align, window)


def test_band_normalisation_is_safe_for_shorter_varlen_sequences() -> None:
    """Varlen: the band is built from the longest lengths; every shorter sequence pair must
    still see exactly the contract's keys."""
    for align, window, causal in itertools.product(
        ("top_left", "bottom_right"), [(5, 3), (30, None), (None, 12), (40, 40)], (False, True)
    ):
        band = effective_band(causal, align, window, 32, 28)
        for sq, sk in itertools.product(range(0, 33, 4), range(0, 29, 4)):
            assert torch.equal(band_visible(band, sq, sk), visible(sq, sk, causal, align, window))


@pytest.mark.parametrize(
    ("window", "error"),
    [((1, -1), ValueError), ((1.5, 2), ValueError), ((True, 2), ValueError), ([1, 2], TypeError)],
)
def test_band_rejects_bad_windows(window, error) -> None:
    with pytest.raises(error, match="window"):
        effective_band(False, "top_left", window, 8, 8)


@pytest.mark.parametrize(
    ("value", "error"),
    [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), ("3", TypeError)],
)
def test_softcap_rejects_bad_values(value, error) -> None:
    with pytest.raises(error, match="softcap"):
        ad.check_softcap(value)
    assert ad.check_softcap(30) == 30.0 and ad.check_softcap(None) is None


def _inputs(**kw) -> SimpleNamespace:
    base = dict(causal=True, causal_align="top_left", max_seqlen_q=4096, max_seqlen_k=4096)
    return SimpleNamespace(**{**base, **kw})


def test_plugin_reads_window_and_softcap() -> None:
    """Inputs without the new attributes read as None; the capability attributes are declared;
    the measured small-MHA priority rule (against cuDNN, which has neither) covers plain causal
    calls only."""
    assert plugin.Fused.window and plugin.Fused.softcap
    assert plugin.FusedAtomic.window and plugin.FusedAtomic.softcap
    old = _inputs()
    assert plugin.window_of(old) is None and plugin.softcap_of(old) is None
    mha = dict(is_varlen=False, heads=8, kv_heads=8, batch=1)
    assert plugin.small_dense_causal_mha(_inputs(**mha))
    assert not plugin.small_dense_causal_mha(_inputs(**mha, window=(4095, 0)))
    assert not plugin.small_dense_causal_mha(_inputs(**mha, softcap=30.0))
    flags = plugin.Fused._flags(_inputs(window=(4095, 0), softcap=30.0, scale=0.1, is_varlen=False))
    assert flags["window"] == (4095, 0) and flags["softcap"] == 30.0
