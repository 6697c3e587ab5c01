"""``attn_dispatch.backend``, the plugin author's API, and the users' top-level namespace: what
each exports, and ``make_inputs`` as dispatch's own validation."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

PLUGIN_ONLY = (
    "Implementation",
    "ForwardInputs",
    "BackwardInputs",
    "hookimpl",
    "lse_dtype",
    "missing_requirement",
)
INTERNAL_HELPERS = ("band_sides", "check_softcap", "check_window", "effective_window")


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_backend_namespace_exports_what_a_plugin_needs():
    for name in adb.__all__:
        assert getattr(adb, name) is not None
    assert adb.Gradients is ad.Gradients and adb.Arch is ad.Arch


def test_top_level_holds_no_plugin_author_names():
    assert not set(ad.__all__) & set(PLUGIN_ONLY + INTERNAL_HELPERS)
    for name in ad.__all__:
        assert getattr(ad, name) is not None
    for name in PLUGIN_ONLY + INTERNAL_HELPERS:
        assert not hasattr(ad, name), name


def test_unknown_top_level_name_is_an_attribute_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
            ad.nosuch  # noqa: B018


def test_make_inputs_builds_backward_and_forward_inputs_on_meta():
    q, k = meta(2, 64, 8, 32), meta(2, 96, 2, 32)
    lse = meta(2, 8, 64, dtype=torch.float32)
    inp = adb.make_inputs(q, k, k, q, lse, q, causal=True, causal_align="bottom_right")
    assert isinstance(inp, adb.BackwardInputs)
    assert (inp.batch, inp.seqlen_q, inp.seqlen_k, inp.heads, inp.kv_heads) == (2, 64, 96, 8, 2)
    assert inp.scale == pytest.approx(32**-0.5) and inp.band == adb.Band(None, 0, True)
    fwd = adb.make_inputs(q, k, k)
    assert type(fwd) is adb.ForwardInputs and not fwd.band.limited


def test_make_inputs_raises_the_dispatchers_errors():
    q, lse = torch.randn(1, 8, 2, 4), torch.randn(1, 2, 8)
    for call in (adb.make_inputs, ad.backward):
        with pytest.raises(TypeError, match="argument 'causal': expected a bool"):
            call(q, q, q, q, lse, q, causal=1)
        with pytest.raises(ValueError, match="argument 'softcap'"):
            call(q, q, q, q, lse, q, softcap=1e39)


def test_make_inputs_deterministic_none_follows_torch_as_dispatch_does():
    q = meta(1, 16, 2, 8)
    assert adb.make_inputs(q, q, q, deterministic=None).deterministic is False
    torch.use_deterministic_algorithms(True)
    try:
        assert adb.make_inputs(q, q, q, deterministic=None).deterministic is True
    finally:
        torch.use_deterministic_algorithms(False)


def test_make_inputs_band_has_sides_that_reach_every_key_unbounded():
    q = meta(1, 16, 2, 8)
    inp = adb.make_inputs(q, q, q, window=(sys.maxsize, 4), causal=True)
    assert inp.band == adb.Band(None, 0, False)
    assert adb.make_inputs(q, q, q, window=(3, 100)).band == adb.Band(3, None, False)


@pytest.mark.parametrize("varlen", [False, True])
def test_lse_shape_and_dtype_are_the_contracts(varlen):
    shape = (40, 8, 16) if varlen else (2, 20, 8, 16)
    assert adb.lse_shape(shape, varlen) == ((8, 40) if varlen else (2, 8, 20))
    assert adb.lse_dtype(torch.float64) == torch.float64
    assert adb.lse_dtype(torch.bfloat16) == torch.float32
