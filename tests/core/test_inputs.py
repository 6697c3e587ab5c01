"""The bad-input battery: every malformed argument raises ValueError/TypeError naming it."""

from __future__ import annotations

import itertools
import math
import sys

import pytest
import torch
from dispatch_helpers import EXACT, TOYS, make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing import visible_mask


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
    # beyond float32's range (inf there) or flushed to zero: inf/NaN scores in every kernel
    (dict(scale=1e39), ValueError, "scale"),
    (dict(scale=1e-39), ValueError, "scale"),
    (dict(softcap=1e39), ValueError, "softcap"),
    (dict(softcap=1e-39), ValueError, "softcap"),
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


BAD_CALLS = [("dense", *c) for c in DENSE_CASES] + [("varlen", *c) for c in VARLEN_CASES]


@pytest.mark.parametrize(
    ("layout", "changes", "error", "argument"),
    BAD_CALLS,
    ids=[f"dense-{c[2]}-{i}" for i, c in enumerate(DENSE_CASES)]
    + [f"varlen-{c[2]}-{i}" for i, c in enumerate(VARLEN_CASES)],
)
def test_bad_input_names_the_argument(env, layout, changes, error, argument):
    call = _dense_call if layout == "dense" else _varlen_call
    args, flags = call(**changes)
    with pytest.raises(error) as info:
        ad.backward(*args.values(), **flags)
    assert f"'{argument}'" in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))


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
    env.set(**EXACT)
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
    env.set(**EXACT)
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


@pytest.mark.parametrize(
    ("sq", "sk", "align", "window", "expected"),
    [
        # top-left: left reaches every key from Sq - 1 on, right from Sk - 1 on
        (6, 5, "top_left", (5, 4), None),
        (6, 5, "top_left", (4, 3), (4, 3)),
        (6, 5, "top_left", (0, sys.maxsize), (0, None)),
        # bottom-right: left from Sk - 1 on, right from Sq - 1 on
        (6, 5, "bottom_right", (4, 5), None),
        (6, 5, "bottom_right", (3, 4), (3, 4)),
        (6, 3, "bottom_right", (sys.maxsize, 4), (None, 4)),
        (6, 5, "top_left", (2**64, 0), (None, 0)),
    ],
)
def test_window_side_that_reaches_every_key_is_unbounded(env, sq, sk, align, window, expected):
    """Backends see such a side as None, so none does band arithmetic near the int64 limit."""
    q, k, v, *_ = make_inputs(sq=sq, sk=sk)
    inp = adb.make_inputs(
        q, k, v, causal=False, causal_align=align, scale=None, deterministic=False, window=window
    )
    assert inp.window == expected


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_a_window_side_is_kept_exactly_when_it_hides_a_key(env, causal, align):
    """Every side at every small length: dropped (None) exactly when the mask without it is the
    same, so a kept side always hides a key the call's causal mask does not."""
    for sq, sk in itertools.product(range(1, 6), repeat=2):
        q, k, v, *_ = make_inputs(sq=sq, sk=sk)
        for left, right in itertools.product([None, *range(7)], repeat=2):
            window = (left, right)
            inp = adb.make_inputs(q, k, v, causal=causal, causal_align=align, window=window)
            mask = visible_mask(sq, sk, causal, align, window=window)
            for side, name in ((0, "left"), (1, "right")):
                if window[side] is None:
                    continue
                without = (None, right) if side == 0 else (left, None)
                hides = not torch.equal(mask, visible_mask(sq, sk, causal, align, window=without))
                kept = inp.window is not None and inp.window[side] is not None
                assert kept == hides, (sq, sk, window, name, inp.window)


def test_a_window_that_hides_nothing_beyond_causal_runs_without_window_support(env):
    """transformers' ``sliding_window=S`` at length S is ``window=(S - 1, 0)``: plain causal
    attention, which an implementation without windows takes."""
    env.set(**TOYS)
    inputs = make_inputs(sq=8)
    assert adb.make_inputs(*inputs, causal=True, window=(7, 0)).window is None
    report = ad.explain(*inputs, causal=True, window=(7, 0))
    assert report.selected == "toy:nondet", str(report)
    assert tag_of(ad.backward(*inputs, causal=True, window=(7, 0))) == 3.0
    report = ad.explain(*inputs, causal=True, window=(6, 0))
    assert report.selected is None  # no toy declares windows


def test_varlen_window_reach_is_taken_from_the_longest_sequences(env):
    args, flags = _varlen_call()  # max_seqlen_q=4, max_seqlen_k=5
    inp = adb.make_inputs(
        args["q"],
        args["k"],
        args["v"],
        causal=False,
        causal_align="top_left",
        scale=None,
        deterministic=False,
        window=(3, 3),
        **flags,
    )
    assert inp.window == (None, 3)


@pytest.mark.parametrize(
    ("sq", "sk", "align", "huge", "bounded"),
    [
        (6, 6, "top_left", (0, sys.maxsize), (0, None)),
        (7, 4, "bottom_right", (sys.maxsize, 4), (None, 4)),
        (6, 6, "top_left", (2**64, 0), (None, 0)),
        (6, 6, "top_left", (2**63, 2**63 - 1), None),
    ],
)
def test_window_sides_near_and_beyond_int64_are_unbounded_in_every_call(
    env, sq, sk, align, huge, bounded
):
    """Any side at least the sequence length, up to beyond int64, computes exactly what an
    unbounded side does: forward, backward, attention (its operator schema is int64) and
    explain."""
    env.set(**EXACT)
    torch.manual_seed(0)
    q, k, v, _, _, do = make_inputs(sq=sq, sk=sk, d=8)
    flags = dict(causal_align=align, backend="exact")
    out, lse = ad.forward(q, k, v, window=huge, **flags)
    want_out, want_lse = ad.forward(q, k, v, window=bounded, **flags)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    grads = ad.backward(q, k, v, out, lse, do, window=huge, **flags)
    want = ad.backward(q, k, v, out, lse, do, window=bounded, **flags)
    assert all(torch.equal(a, b) for a, b in zip(grads, want))
    assert torch.equal(ad.attention(q, k, v, window=huge, **flags), want_out)
    assert f"window={bounded}" in ad.explain(q, k, v, window=huge, **flags).inputs


@pytest.mark.parametrize("name", ["scale", "softcap"])
@pytest.mark.parametrize("value", [1e39, 1e-39, math.inf, math.nan])
def test_scale_and_softcap_outside_float32_range_are_refused_in_every_call(env, name, value):
    q, k, v, *_ = make_inputs(d=8)
    for call in (ad.forward, ad.attention, ad.explain):
        with pytest.raises(ValueError, match=f"'{name}'"):
            call(q, k, v, **{name: value})


@pytest.mark.parametrize("max_seqlen", [10, 2**31, 2**63, 2**64])
def test_varlen_max_seqlen_beyond_the_tokens_means_the_token_count(env, max_seqlen):
    """No sequence is longer than its packed tensor; backends never see a larger max_seqlen
    (grid sizes, int32 kernel arguments), and the operator schema never one beyond int64."""
    env.set(**EXACT)
    args, flags = _varlen_call()  # Tq=7, Tk=9
    q, k, v = args["q"], args["k"], args["v"]
    want = ad.forward(q, k, v, **flags)
    flags.update(max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen)
    out, lse = ad.forward(q, k, v, **flags)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    assert torch.equal(ad.attention(q, k, v, **flags), want[0])
    assert "max_seqlen_q=7 max_seqlen_k=9" in ad.explain(q, k, v, **flags).inputs


@pytest.mark.parametrize(("scale", "softcap"), [(1e30, 1e-30), (1e-30, 1e30), (1e20, 1e-20)])
def test_scale_over_softcap_outside_float32_range_is_refused(env, scale, softcap):
    """Each value is in range, but kernels scale raw scores by scale / softcap in float32:
    an infinite ratio times a zero score is NaN."""
    q, k, v, *_ = make_inputs(d=8)
    for call in (ad.forward, ad.attention, ad.explain):
        with pytest.raises(ValueError, match="argument 'softcap': expected scale / softcap"):
            call(q, k, v, scale=scale, softcap=softcap)
    ad.forward(q, k, v, scale=1e20, softcap=1e-9)  # a ratio of 1e29 is in range


def test_numpy_bool_flag_is_refused_with_its_qualified_type(env):
    """A numpy bool is not a bool: the message must not read "expected a bool, got bool"."""
    np = pytest.importorskip("numpy")
    q, k, v, *_ = make_inputs(d=8)
    for name in ("causal", "deterministic"):
        with pytest.raises(TypeError, match=f"argument '{name}': expected a bool.*got numpy.bool"):
            ad.forward(q, k, v, **{name: np.bool_(True)})


def test_inputs_repr_and_describe_carry_the_variants():
    q, k, v, out, lse, do = make_inputs(sq=6, h=2, hkv=1, d=8)

    inp = adb.make_inputs(
        q,
        k,
        v,
        out,
        lse,
        do,
        causal=False,
        causal_align="top_left",
        scale=None,
        deterministic=False,
        window=[3, None],
        softcap=7,
    )
    assert inp.window == (3, None) and inp.softcap == 7.0 and isinstance(inp.softcap, float)
    assert "window=(3, None), softcap=7.0" in repr(inp)
    assert "window=(3, None) softcap=7.0" in inp.describe()
    assert math.isclose(inp.scale, 8**-0.5)


def test_size_one_dims_get_packed_strides_and_keep_their_values():
    base = torch.randn(1, 150, dtype=torch.bfloat16)
    t = base[0, :144].as_strided((1, 1, 72), (150, 75, 1))  # a sliced single token
    packed = adb.packed_unit_strides(t)
    assert packed.stride() == (72, 72, 1)
    assert packed.data_ptr() == t.data_ptr() and torch.equal(packed, t)
    wide = torch.randn(2, 3, 80)[:, :, :72]  # no size-1 dim: returned as given
    assert adb.packed_unit_strides(wide) is wide
    assert adb.packed_unit_strides(wide[:1]).stride() == (240, 80, 1)
