"""Windows and soft caps through the public API (``ad.forward``/``ad.backward``, by dispatch or
forced) against the float64 oracle of ``attn_dispatch.testing``, in float64 and lower precision.
"""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch.testing import (
    Case,
    check_backward,
    check_forward,
    oracle,
    random_cases,
    variant_cases,
)


@pytest.fixture(autouse=True)
def one_thread(isolated_plugins):
    """One intra-op thread: the shapes are tiny, and two threads spinning on a busy two-core
    machine make each small matmul much slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_inputs(sq, sk, h, hkv, d, dtype):
    """Random dense backward arguments (q, k, v, out, lse, grad_out) in BSHD."""
    q, out, do = (torch.randn(1, sq, h, d, dtype=dtype) for _ in range(3))
    k, v = (torch.randn(1, sk, hkv, d, dtype=dtype) for _ in range(2))
    return q, k, v, out, torch.randn(1, h, sq, dtype=dtype), do


RANDOM = random_cases(14, seed=26, max_seqlen=64, variants=True)


@pytest.mark.parametrize("case", variant_cases() + RANDOM, ids=lambda c: c.id)
def test_reference_matches_the_oracle_float64(case: Case):
    """Forward and backward by dispatch (not forced: the reference is the only CPU backend)."""
    check_forward(ad.forward, case, dtype=torch.float64)
    check_backward(ad.backward, case, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", variant_cases()[::2] + RANDOM[::3], ids=lambda c: c.id)
def test_reference_matches_the_oracle_low_precision(case: Case, dtype: torch.dtype):
    check_backward("reference", case, dtype=dtype)
    check_forward("reference", case, dtype=dtype)


def test_causal_with_a_window_caps_the_right_side():
    torch.manual_seed(1)
    q, k, v, out, lse, do = make_inputs(sq=12, sk=17, h=2, hkv=1, d=8, dtype=torch.float64)
    for align in ("top_left", "bottom_right"):
        flags = dict(causal_align=align, backend="reference")
        a = ad.forward(q, k, v, causal=True, window=(3, 5), **flags)
        b = ad.forward(q, k, v, window=(3, 0), **flags)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        ref = oracle(q, k, v, causal_align=align, window=(3, 0))
        torch.testing.assert_close(a[0], ref.out)


def test_rows_that_see_no_key_get_zeros_and_minus_inf():
    """Top-left, Sq > Sk, window (1, 0): rows past Sk + 1 see nothing."""
    torch.manual_seed(2)
    q, k, v, _, _, do = make_inputs(sq=20, sk=6, h=2, hkv=2, d=8, dtype=torch.float64)
    out, lse = ad.forward(q, k, v, window=(1, 0), softcap=2.0)
    empty = torch.arange(20) > 6
    assert torch.isneginf(lse[:, :, empty]).all() and torch.isfinite(lse[:, :, ~empty]).all()
    assert (out[:, empty] == 0).all()
    dq, dk, dv = ad.backward(q, k, v, out, lse, do, window=(1, 0), softcap=2.0)
    assert (dq[:, empty] == 0).all()
    ref = oracle(q, k, v, do, window=(1, 0), softcap=2.0)
    for got, want in zip((out, dq, dk, dv), (ref.out, ref.dq, ref.dk, ref.dv)):
        torch.testing.assert_close(got, want)
