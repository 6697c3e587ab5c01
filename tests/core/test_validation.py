"""Validation of the call's arguments: every malformed window, soft cap, scale and max_seqlen is
refused naming it, on every entry point (backward, forward, explain, attention, the CLI), and
whether or not a decision for the same metadata is cached."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from dispatch_helpers import EXACT, make_inputs

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.tools import cli


@pytest.fixture(autouse=True)
def one_thread(env):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------
# validation: every malformed value, on every entry point

BAD_WINDOWS = [
    ((-1, 0), ValueError),
    ((0, -3), ValueError),
    ((1.0, 2), TypeError),
    ((True, 0), TypeError),
    ((0, False), TypeError),
    ((1, 2, 3), TypeError),
    ((1,), TypeError),
    (4, TypeError),
    ("12", TypeError),
    ({"left": 1, "right": 2}, TypeError),
    ((torch.tensor(1), 2), TypeError),
]
BAD_SOFTCAPS = [
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    (-float("inf"), ValueError),
    (0.0, ValueError),
    (0, ValueError),
    (-1.5, ValueError),
    (10**400, ValueError),  # beyond float's range: refused by value, not an OverflowError
    (-(10**400), ValueError),
    (Fraction(10**400, 3), ValueError),
    (True, TypeError),
    ("30", TypeError),
    ((30.0,), TypeError),
    (torch.tensor(30.0), TypeError),
]


def _entry_points():
    q, k, v, out, lse, do = make_inputs(sq=6, h=2, hkv=1, d=8)
    return {
        "backward": lambda **kw: ad.backward(q, k, v, out, lse, do, **kw),
        "forward": lambda **kw: ad.forward(q, k, v, **kw),
        "attention": lambda **kw: ad.attention(q, k, v, **kw),
        "explain": lambda **kw: ad.explain(q, k, v, out, lse, do, **kw),
        "explain_forward": lambda **kw: ad.explain(q, k, v, **kw),
    }


@pytest.mark.parametrize(("window", "error"), BAD_WINDOWS, ids=repr)
def test_malformed_window_is_rejected_naming_it(window, error):
    for call in _entry_points().values():
        with pytest.raises(error, match="argument 'window'"):
            call(window=window)
        call(window=(1, 1))  # a good call between bad ones: the cache never vouches for one
        with pytest.raises(error, match="argument 'window'"):
            call(window=window)


@pytest.mark.parametrize(("softcap", "error"), BAD_SOFTCAPS, ids=repr)
def test_malformed_softcap_is_rejected_naming_it(softcap, error):
    for call in _entry_points().values():
        call(softcap=1.0)
        with pytest.raises(error, match="argument 'softcap'"):
            call(softcap=softcap)


@pytest.mark.parametrize("scale", [10**400, Fraction(-(10**400), 3), 1e31, 0], ids=repr)
def test_a_scale_out_of_range_is_rejected_naming_it(scale):
    for call in _entry_points().values():
        call(scale=1.0)
        with pytest.raises(ValueError, match="argument 'scale': expected a finite float > 0"):
            call(scale=scale)


def test_equal_keys_of_other_types_are_still_checked():
    """(1, 1) == (True, 1) and 1.0 == True hash alike: a cached decision must not let them in."""
    q, k, v, out, lse, do = make_inputs(sq=6, h=2, hkv=1, d=8)
    ad.backward(q, k, v, out, lse, do, window=(1, 1), softcap=1.0)
    ad.backward(q, k, v, out, lse, do, window=(1, 1), softcap=1.0)  # now a guarded signature
    with pytest.raises(TypeError, match="argument 'window'"):
        ad.backward(q, k, v, out, lse, do, window=(True, 1), softcap=1.0)
    with pytest.raises(TypeError, match="argument 'softcap'"):
        ad.backward(q, k, v, out, lse, do, window=(1, 1), softcap=True)


def test_accepted_spellings_are_normalised():
    q, k, v, out, lse, do = make_inputs(sq=6, h=2, hkv=1, d=8, dtype=torch.float64)
    base = ad.forward(q, k, v, window=(2, 1), softcap=3.0)
    for window, softcap in (([2, 1], 3), ((2, 1), 3.0)):
        torch.testing.assert_close(ad.forward(q, k, v, window=window, softcap=softcap), base)
    for inputs_of in (lambda **kw: ad.explain(q, k, v, **kw).inputs,):
        assert "window=(2, 1) softcap=3.0" in inputs_of(window=[2, 1], softcap=3)
        assert "window=None softcap=None" in inputs_of(window=(None, None))
    plain = ad.forward(q, k, v)
    torch.testing.assert_close(ad.forward(q, k, v, window=(None, None)), plain, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# the signature: different windows or caps never share a cached decision or result


# ----------------------------------------------------------------------------------------------
# capabilities: who is chosen, who is not, and why


# ----------------------------------------------------------------------------------------------
# the conformance kit holds a backend that claims support to the oracle


# ----------------------------------------------------------------------------------------------
# CLI


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--window", "1"], "argument --window: expected L,R"),
        (["--window", "1,2,3"], "argument --window: expected L,R"),
        (["--window=-1,2"], "argument --window: expected an integer >= 0"),
        (["--window", "a,2"], "argument --window: expected an integer"),
        (["--softcap", "-1"], "argument 'softcap': expected a finite float > 0"),
        (["--softcap", "nan"], "argument 'softcap': expected a finite float > 0"),
        (["--softcap", "x"], "argument --softcap"),
    ],
)
def test_cli_rejects_malformed_variants(extra, message, capsys):
    argv = ["explain", "--seqlen", "64", "--heads", "2", "--head-dim", "64", *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "bad, error",
    [
        (dict(causal=1), TypeError),
        (dict(deterministic=1), TypeError),
        (dict(deterministic="False"), TypeError),
        (dict(scale=True), TypeError),
        (dict(backend=""), ad.UnknownBackendError),
        (dict(backend=0), TypeError),
    ],
)
def test_validation_does_not_depend_on_the_cache(env, bad, error):
    env.set(**EXACT)
    inputs = make_inputs()
    good = {
        "causal": dict(causal=True),
        "deterministic": dict(deterministic=True),
        "scale": dict(scale=1.0),
        "backend": dict(),  # automatic: ``backend=""`` must not come to mean it
    }[next(iter(bad))]
    for call in (ad.backward, lambda *a, **kw: ad.forward(*a[:3], **kw)):
        with pytest.raises(error):
            call(*inputs, **bad)
        call(*inputs, **good)
        call(*inputs, **good)
        with pytest.raises(error):
            call(*inputs, **bad)


def _every_entry_point() -> dict:
    """Each public call that parses the flags, on one set of inputs, by name."""
    q, k, v, out, lse, grad_out = make_inputs()
    return {
        "backward": lambda **kw: ad.backward(q, k, v, out, lse, grad_out, **kw),
        "forward": lambda **kw: ad.forward(q, k, v, **kw),
        "attention": lambda **kw: ad.attention(q, k, v, **kw),
        "explain": lambda **kw: ad.explain(q, k, v, out, lse, grad_out, **kw),
        "decide": lambda **kw: ad.decide(q, k, v, out, lse, grad_out, **kw),
        "make_inputs": lambda **kw: adb.make_inputs(q, k, v, **kw),
    }


@pytest.mark.parametrize("align", [["top_left"], {"top_left": 1}, None, 1])
def test_a_causal_align_of_another_type_is_named_by_every_entry_point(env, align):
    """An unhashable value too: the flags are a cache key, looked up before validation."""
    env.set(**EXACT)
    for name, call in _every_entry_point().items():
        call(causal=True)  # a cached signature first: the check must not depend on the cache
        with pytest.raises(ValueError, match="argument 'causal_align': expected one of") as info:
            call(causal=True, causal_align=align)
        assert repr(align) in str(info.value), name


@pytest.mark.parametrize("backend", [["exact"], {"exact": 1}, 0], ids=["list", "dict", "int"])
def test_a_backend_of_another_type_is_named_by_every_entry_point(env, backend):
    """An unhashable name too: the forced name is part of the cache key, looked up before
    validation (a cached dense signature first, so the guarded path is the one asked)."""
    env.set(**EXACT)
    calls = _every_entry_point()
    del calls["make_inputs"]  # it takes no backend
    for name, call in calls.items():
        call(causal=True)
        call(causal=True)
        with pytest.raises(TypeError, match="argument 'backend': expected a") as info:
            call(causal=True, backend=backend)
        assert type(backend).__name__ in str(info.value), name


def test_max_seqlen_type_is_checked_after_caching(env):
    env.set(**EXACT)
    q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    for _ in range(2):
        ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5.0, max_seqlen_k=5)


def test_attention_scale_is_checked_by_the_library(env):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="argument 'scale': expected a float, got str"):
        ad.attention(q, q, q, scale="abc")
