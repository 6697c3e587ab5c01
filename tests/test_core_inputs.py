"""The bad-input battery: every malformed argument raises ValueError/TypeError naming it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_inputs

import attn_dispatch as ad


def _dense_call(**changes):
    q, k, v, out, lse, do = make_inputs(b=2, sq=6, sk=5, h=4, hkv=2, d=8)
    args = dict(q=q, k=k, v=v, out=out, lse=lse, grad_out=do)
    flags = {}
    for name, value in changes.items():
        (args if name in args else flags)[name] = value
    return args, flags


def _varlen_call(**changes):
    q, k, v, out, do = (
        torch.randn(s) for s in ((7, 4, 8), (9, 2, 8), (9, 2, 8), (7, 4, 8), (7, 4, 8))
    )
    lse = torch.randn(4, 7)
    args = dict(q=q, k=k, v=v, out=out, lse=lse, grad_out=do)
    flags = dict(
        cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
        cu_seqlens_k=torch.tensor([0, 4, 9], dtype=torch.int32),
        max_seqlen_q=4,
        max_seqlen_k=5,
    )
    for name, value in changes.items():
        (args if name in args else flags)[name] = value
    return args, flags


B, SQ, SK, H, HKV, D = 2, 6, 5, 4, 2, 8
DENSE_CASES = [
    # (changes, error type, argument named in the message)
    (dict(q=[1.0]), TypeError, "q"),
    (dict(grad_out=None), TypeError, "grad_out"),
    (dict(q=torch.randn(B, SQ, H)), ValueError, "q"),
    (dict(k=torch.randn(B, SK, HKV, D, 1)), ValueError, "k"),
    (dict(k=torch.randn(B + 1, SK, HKV, D)), ValueError, "k"),
    (dict(k=torch.randn(B, SK, HKV, D + 1)), ValueError, "k"),
    (dict(v=torch.randn(B, SK + 1, HKV, D)), ValueError, "v"),
    (dict(v=torch.randn(B, SK, HKV + 1, D)), ValueError, "v"),
    (dict(out=torch.randn(B, SQ, H, D + 2)), ValueError, "out"),
    (dict(grad_out=torch.randn(B, SQ + 1, H, D)), ValueError, "grad_out"),
    (dict(lse=torch.randn(B, SQ, H)), ValueError, "lse"),
    (dict(lse=torch.randn(B, H, SQ, dtype=torch.float64)), TypeError, "lse"),
    (dict(k=torch.randn(B, SK, 3, D), v=torch.randn(B, SK, 3, D)), ValueError, "k"),
    (dict(k=torch.randn(B, SK, HKV, D, dtype=torch.float64)), TypeError, "k"),
    (dict(grad_out=torch.randn(B, SQ, H, D).half()), TypeError, "grad_out"),
    (dict(q=torch.randint(0, 3, (B, SQ, H, D))), TypeError, "q"),
    (dict(lse=torch.randn(B, H, SQ, device="meta")), ValueError, "lse"),
    (dict(causal=1), TypeError, "causal"),
    (dict(causal_align="bottom"), ValueError, "causal_align"),
    (dict(scale=0.0), ValueError, "scale"),
    (dict(scale=-1.0), ValueError, "scale"),
    (dict(scale=math.inf), ValueError, "scale"),
    (dict(scale=math.nan), ValueError, "scale"),
    (dict(scale="0.1"), TypeError, "scale"),
    (dict(deterministic="yes"), TypeError, "deterministic"),
    (dict(max_seqlen_q=SQ + 1), ValueError, "max_seqlen_q"),
    (dict(cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    (dict(backend="no_such_backend"), ValueError, "backend"),
    (dict(backend=3), TypeError, "backend"),
]

VARLEN_CASES = [
    (dict(cu_seqlens_q=torch.tensor([0, 3, 7])), TypeError, "cu_seqlens_q"),  # int64
    (dict(cu_seqlens_k=torch.tensor([[0, 4, 9]], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    (dict(cu_seqlens_k=torch.tensor([0, 9], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    (
        dict(cu_seqlens_q=torch.tensor([0, 5, 4], dtype=torch.int32), max_seqlen_q=7),
        ValueError,
        "cu_seqlens_q",
    ),
    (dict(cu_seqlens_k=torch.tensor([0, 4, 8], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    (dict(max_seqlen_q=None), ValueError, "max_seqlen_q"),
    (dict(max_seqlen_k=2.5), TypeError, "max_seqlen_k"),
    (dict(max_seqlen_k=3), ValueError, "max_seqlen_k"),  # shorter than the longest sequence
    (dict(q=torch.randn(1, 7, 4, 8)), ValueError, "q"),
    (dict(lse=torch.randn(7, 4)), ValueError, "lse"),
    (
        dict(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32, device="meta")),
        ValueError,
        "cu_seqlens_q",
    ),
]


@pytest.mark.parametrize(
    ("changes", "error", "argument"),
    DENSE_CASES,
    ids=[f"dense-{c[2]}-{i}" for i, c in enumerate(DENSE_CASES)],
)
def test_dense_bad_input_names_the_argument(env, changes, error, argument):
    args, flags = _dense_call(**changes)
    with pytest.raises(error) as info:
        ad.backward(*args.values(), **flags)
    assert f"'{argument}'" in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))


@pytest.mark.parametrize(
    ("changes", "error", "argument"),
    VARLEN_CASES,
    ids=[f"varlen-{c[2]}-{i}" for i, c in enumerate(VARLEN_CASES)],
)
def test_varlen_bad_input_names_the_argument(env, changes, error, argument):
    args, flags = _varlen_call(**changes)
    with pytest.raises(error) as info:
        ad.backward(*args.values(), **flags)
    assert f"'{argument}'" in str(info.value)


def test_message_says_expected_and_given(env):
    args, flags = _dense_call(out=torch.randn(B, SQ, H, D + 2))
    with pytest.raises(ValueError) as info:
        ad.backward(*args.values(), **flags)
    message = str(info.value)
    assert f"({B}, {SQ}, {H}, {D})" in message and f"({B}, {SQ}, {H}, {D + 2})" in message


def test_forward_and_explain_validate_too(env):
    q, k, v, *_ = make_inputs(h=3, hkv=2)
    with pytest.raises(ValueError, match="'k'"):
        ad.forward(q, k, v)
    with pytest.raises(ValueError, match="'k'"):
        ad.explain(q, k, v)


def test_bad_input_is_rejected_after_a_good_call_with_the_same_metadata(env):
    """The decision cache must not skip the CPU cu_seqlens value check."""
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    args, flags = _varlen_call()
    ad.backward(*args.values(), **flags)
    flags["cu_seqlens_q"] = torch.tensor([0, 5, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="'cu_seqlens_q'"):
        ad.backward(*args.values(), **flags)


def test_gpu_cu_seqlens_values_checked_only_in_debug_mode(env, monkeypatch):
    """Meta tensors stand in for device tensors: values are never read without debug mode."""
    args, flags = _varlen_call()
    meta = {k: v.to("meta") for k, v in args.items()}
    meta_flags = dict(
        flags,
        cu_seqlens_q=flags["cu_seqlens_q"].to("meta"),
        cu_seqlens_k=flags["cu_seqlens_k"].to("meta"),
    )
    report = ad.explain(**meta, **meta_flags, arch="sm_90")
    assert report.arch.name == "sm_90"


def test_scale_default_and_resolution(env):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    q, k, v, out, lse, do = make_inputs(d=16)
    report = ad.explain(q, k, v, out, lse, do)
    assert "scale=0.25" in report.inputs
    report = ad.explain(q, k, v, out, lse, do, scale=0.5)
    assert "scale=0.5" in report.inputs


def test_deterministic_none_follows_torch(env, toys):
    q, k, v, out, lse, do = make_inputs()
    assert ad.backward(q, k, v, out, lse, do).dq.flatten()[0] == 3.0  # toy:nondet
    torch.use_deterministic_algorithms(True)
    try:
        assert ad.backward(q, k, v, out, lse, do).dq.flatten()[0] == 1.0  # toy:fast
    finally:
        torch.use_deterministic_algorithms(False)
