"""The conformance kit itself: the oracle, tolerances, case generators, and checks that fail."""

import dataclasses
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from dispatch_helpers import BOTTOM_RIGHT as CAUSAL_BR
from dispatch_helpers import EXACT, DeclinesVariants, IgnoresVariants

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing import (
    BFLOAT16,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    Case,
    Unsupported,
    check_backward,
    check_forward,
    declared_capabilities,
    error_metrics,
    make_conformance_tests,
    oracle,
    random_cases,
    sink_cases,
    standard_cases,
    tolerance_for,
    variant_cases,
)
from attn_dispatch.testing.oracle import visible_mask

# Random cases that carry windows and caps (variants=True), as a backend's suite draws them.
RANDOM = random_cases(14, seed=26, max_seqlen=64, variants=True)

# ---------------------------------------------------------------------------------------------
# the oracle


def _sdpa(q, k, v, **kw):
    """PyTorch SDPA (math) on BSHD tensors, returning BSHD."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_oracle_matches_sdpa(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 19, 3, 8, generator=g, dtype=torch.float64) for _ in range(4))
    res = oracle(q, k, v, do, causal=causal, scale=0.4)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = _sdpa(*leaves, is_causal=causal, scale=0.4)
    grads = torch.autograd.grad(out, leaves, do)
    torch.testing.assert_close(res.out, out.detach())
    for got, want in zip((res.dq, res.dk, res.dv), grads, strict=True):
        torch.testing.assert_close(got, want)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * 0.4
    if causal:
        s = s.masked_fill(torch.ones(19, 19, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(res.lse, torch.logsumexp(s, -1))


def test_oracle_bottom_right_gqa_and_dv_match_an_explicit_mask():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 7, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 11, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 11, 2, 5, generator=g, dtype=torch.float64)
    do = torch.randn(1, 7, 4, 5, generator=g, dtype=torch.float64)
    res = oracle(q, k, v, do, causal=True, causal_align="bottom_right")
    mask = torch.arange(11)[None, :] <= torch.arange(7)[:, None] + 4
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    kx, vx = (t.repeat_interleave(2, dim=2) for t in leaves[1:])
    out = _sdpa(leaves[0], kx, vx, attn_mask=mask)
    grads = torch.autograd.grad(out, leaves, do)
    torch.testing.assert_close(res.out, out.detach())
    for got, want in zip((res.dq, res.dk, res.dv), grads, strict=True):
        torch.testing.assert_close(got, want)
    assert res.dk.shape == k.shape and res.dv.shape == v.shape


@pytest.mark.parametrize(
    ("sq", "sk", "align", "huge", "bounded"),
    [
        (6, 6, "top_left", (0, sys.maxsize), (0, None)),
        (7, 4, "bottom_right", (sys.maxsize, 4), (None, 4)),
        (5, 8, "bottom_right", (2**64, 2**63), None),
    ],
)
def test_oracle_window_sides_near_int64_are_unbounded(sq, sk, align, huge, bounded):
    """The oracle does its own band arithmetic, so it catches a backend that wraps around."""
    assert torch.equal(
        visible_mask(sq, sk, False, align, window=huge),
        visible_mask(sq, sk, False, align, window=bounded),
    )
    g = torch.Generator().manual_seed(3)
    q, do = torch.randn(1, sq, 2, 4, generator=g), torch.randn(1, sq, 2, 4, generator=g)
    k, v = torch.randn(1, sk, 2, 4, generator=g), torch.randn(1, sk, 2, 4, generator=g)
    got = oracle(q, k, v, do, causal_align=align, window=huge)
    want = oracle(q, k, v, do, causal_align=align, window=bounded)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_oracle_masked_rows_and_varlen():
    g = torch.Generator().manual_seed(2)
    q, do = torch.randn(9, 2, 4, generator=g), torch.randn(9, 2, 4, generator=g)
    k, v = torch.randn(6, 1, 4, generator=g), torch.randn(6, 1, 4, generator=g)
    cu_q = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 4, 6], dtype=torch.int32)  # first sequence: 3 queries, no keys
    res = oracle(
        q, k, v, do, causal=True, causal_align="bottom_right", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k
    )
    assert res.lse.shape == (2, 9)
    # seq 0: no keys; seq 2: 6 queries, 2 keys, bottom_right -> first 4 rows see nothing
    masked = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    assert torch.equal(torch.isneginf(res.lse), masked.expand(2, 9))
    assert (res.out[masked] == 0).all() and (res.dq[masked] == 0).all()
    assert all(torch.isfinite(t).all() for t in (res.out, res.dq, res.dk, res.dv))
    # seq 2 on its own equals a dense call
    dense = oracle(
        q[None, 3:],
        k[None, 4:],
        v[None, 4:],
        do[None, 3:],
        causal=True,
        causal_align="bottom_right",
    )
    torch.testing.assert_close(res.dk[4:], dense.dk[0])


# ---------------------------------------------------------------------------------------------
# tolerances


def test_tolerances_are_ordered_by_precision():
    dtypes = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
    chain = [tolerance_for(d) for d in dtypes]
    assert chain == [FLOAT64, FLOAT32, FLOAT16, BFLOAT16]
    for tighter, looser in zip(chain, chain[1:]):
        assert tighter.max_err < looser.max_err and tighter.rel_l2 < looser.rel_l2
    with pytest.raises(ValueError, match="dtype"):
        tolerance_for(torch.int32)


def test_error_metrics():
    ref = torch.tensor([1.0, -2.0, 0.0, 4.0], dtype=torch.float64)
    assert error_metrics(ref, ref) == (0.0, 0.0)
    max_err, rel = error_metrics(ref + torch.tensor([0, 0, 0.04, 0]), ref)
    assert max_err == pytest.approx(0.01) and rel == pytest.approx(0.04 / math.sqrt(21))
    assert error_metrics(torch.full((3,), 1e-14), torch.zeros(3)) == (math.inf, math.inf)
    assert error_metrics(torch.full((3,), 1e-14), torch.zeros(3), floor=1.0)[0] < 1e-13
    assert math.isnan(error_metrics(torch.tensor([math.nan]), torch.tensor([1.0]))[0])


# ---------------------------------------------------------------------------------------------
# cases


def test_variants_draw_from_their_own_stream():
    """``variants=True`` adds windows and caps to the same cases, and only adds."""
    plain, varied = random_cases(10, seed=9), random_cases(10, seed=9, variants=True)
    strip = dict(window=None, softcap=None)
    assert [dataclasses.replace(c, **strip) for c in varied] == plain
    assert all(c.needs for c in varied) and not any(c.needs for c in plain)


def test_standard_cases_cover_every_feature():
    cases = standard_cases()
    tags = {t for c in cases for t in c.tags}
    for feature in (
        "varlen",
        "empty",
        "masked_rows",
        "causal_tl",
        "causal_br",
        "noncontig",
        "gqa",
        "mqa",
        "dv",
        "scale",
        "strided",
        "sq>sk",
        "sq<sk",
    ):
        assert feature in tags, feature
    assert any(c.has_masked_rows and c.varlen for c in cases)
    assert {c.layout for c in cases} == {"contiguous", "sliced", "transposed", "strided"}
    assert len({c.id for c in cases}) == len(cases)


@pytest.mark.parametrize(
    "case",
    standard_cases()
    + random_cases(12, seed=3)
    + variant_cases()
    + random_cases(12, seed=4, variants=True),
    ids=lambda c: c.id,
)
def test_case_inputs_are_valid_and_laid_out(case):
    inp = case.make_inputs(torch.float32)
    ad.explain(inp.q, inp.k, inp.v, **inp.flags())  # validation raises on malformed inputs
    assert inp.q.shape[-1] == case.head_dim and inp.v.shape[-1] == case.dv
    assert inp.q.shape[-2] == case.heads and inp.k.shape[-2] == case.kv_heads
    assert torch.isfinite(inp.q).all() and torch.isfinite(inp.grad_out).all()
    if case.layout != "contiguous" and inp.q.numel() > inp.q.shape[-1]:
        # (an empty tensor, or one row, is contiguous to torch whatever its other strides)
        assert not inp.q.is_contiguous()
    elif case.layout != "contiguous" and inp.q.numel():  # one row: strides of wider rows
        packed = torch.empty(inp.q.shape).stride()
        assert inp.q.stride() != packed
    if case.layout == "strided":
        assert inp.q.stride(-1) == 2
    lse = oracle(
        inp.q, inp.k, inp.v, **{k: v for k, v in inp.flags().items() if not k.startswith("max_")}
    ).lse
    assert bool(torch.isneginf(lse).any()) == case.has_masked_rows


def test_cases_are_seeded():
    a, b = random_cases(5, seed=11), random_cases(5, seed=11)
    assert a == b and a != random_cases(5, seed=12)
    x, y = a[0].make_inputs(), a[0].make_inputs()
    assert torch.equal(x.q, y.q) and torch.equal(x.grad_out, y.grad_out)


def test_a_case_lays_the_gradient_out_on_its_own_where_asked():
    base = Case((12, 12), (12, 12), heads=4, kv_heads=2, seed=3)
    plain = base.make_inputs()
    apart = dataclasses.replace(base, grad_layout="transposed").make_inputs()
    assert torch.equal(plain.q, apart.q) and torch.equal(plain.grad_out, apart.grad_out)
    assert plain.grad_out.is_contiguous() and apart.q.is_contiguous()
    assert apart.grad_out.transpose(1, 2).is_contiguous()  # [B, H, S, D] memory
    assert "grad_transposed" in dataclasses.replace(base, grad_layout="transposed").id
    for bad in ("diagonal", "contiguous"):  # unknown, or the layout itself
        with pytest.raises(ValueError, match="grad_layout"):
            dataclasses.replace(base, grad_layout=bad)


@pytest.mark.parametrize("strided_vectors", [False, True])
def test_varlen_cases_pass_one_cu_seqlens_tensor_for_equal_lengths(strided_vectors):
    """Self-attention callers pass one offsets tensor as both (some kernels take varlen only
    so); unequal lengths need two."""
    shared = Case((5, 0, 9), (5, 0, 9), varlen=True, strided_vectors=strided_vectors, seed=4)
    inp = shared.make_inputs()
    assert inp.cu_seqlens_q is inp.cu_seqlens_k
    assert inp.cu_seqlens_q.tolist() == [0, 5, 5, 14]
    assert inp.cu_seqlens_q.stride(0) == (2 if strided_vectors else 1)
    apart = dataclasses.replace(shared, seqlens_k=(7, 3, 0)).make_inputs()
    assert apart.cu_seqlens_q is not apart.cu_seqlens_k
    assert apart.cu_seqlens_k.tolist() == [0, 7, 10, 10]
    assert apart.cu_seqlens_k.stride(0) == (2 if strided_vectors else 1)


# ---------------------------------------------------------------------------------------------
# the checks pass a correct implementation and fail wrong ones


def _oracle_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    *,
    deterministic=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    **flags,
):
    r = oracle(q, k, v, grad_out, **flags)
    return ad.Gradients(r.dq.to(q.dtype), r.dk.to(k.dtype), r.dv.to(v.dtype))


def _oracle_forward(q, k, v, *, max_seqlen_q=None, max_seqlen_k=None, **flags):
    r = oracle(q, k, v, **flags)
    return r.out.to(q.dtype), r.lse.to(adb.lse_dtype(q.dtype))


GQA = Case((20,), (24,), heads=8, kv_heads=2, head_dim=16, seed=1)
BOTTOM_RIGHT = Case((30,), (12,), heads=2, kv_heads=2, head_dim=16, **CAUSAL_BR, seed=2)
SCALED = Case((16,), (16,), heads=2, kv_heads=1, head_dim=16, scale=0.11, seed=3)
VARLEN = Case((5, 0, 9), (7, 3, 0), heads=2, kv_heads=1, head_dim=8, varlen=True, seed=4)
# one cu_seqlens tensor as both (a stride-2 view), bottom-right (the same mask as top-left here)
SELF_VARLEN = dataclasses.replace(
    VARLEN, seqlens_k=(5, 0, 9), **CAUSAL_BR, strided_vectors=True, seed=5
)


@pytest.mark.parametrize(
    "case", [GQA, BOTTOM_RIGHT, SCALED, VARLEN, SELF_VARLEN], ids=lambda c: c.id
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_correct_implementation_passes(case, dtype):
    check_backward(_oracle_backward, case, dtype=dtype)
    check_forward(_oracle_forward, case, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_reference_backend_passes_a_case_with_shared_offsets(dtype):
    check_backward("reference", SELF_VARLEN, dtype=dtype)
    check_forward("reference", SELF_VARLEN, dtype=dtype)


def _wrong_gqa(q, k, v, out, lse, grad_out, **flags):
    # query head h reads kv head h % Hkv instead of h // (H // Hkv)
    g = q.shape[-2] // k.shape[-2]
    perm = torch.arange(q.shape[-2]).reshape(g, -1).t().reshape(-1)
    dq, dk, dv = _oracle_backward(q[..., perm, :], k, v, out, lse, grad_out[..., perm, :], **flags)
    return ad.Gradients(dq[..., torch.argsort(perm), :], dk, dv)


def _ignores_scale(q, k, v, out, lse, grad_out, *, scale=None, **flags):
    return _oracle_backward(q, k, v, out, lse, grad_out, **flags)


def _always_top_left(q, k, v, out, lse, grad_out, *, causal_align=None, **flags):
    return _oracle_backward(q, k, v, out, lse, grad_out, causal_align="top_left", **flags)


def _nan_masked_rows(q, k, v, out, lse, grad_out, **flags):
    dq, dk, dv = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
    dq = dq.clone()
    dq[:, :18] = float("nan")  # rows of BOTTOM_RIGHT that see no key, "left unwritten"
    return ad.Gradients(dq, dk, dv)


def _slightly_off(q, k, v, out, lse, grad_out, **flags):
    dq, dk, dv = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
    return ad.Gradients(dq, dk * (1 + 3e-3), dv)


def _wrong_shape(q, k, v, out, lse, grad_out, **flags):
    dq, dk, dv = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
    return ad.Gradients(dq, dk.repeat_interleave(q.shape[-2] // k.shape[-2], dim=-2), dv)


@pytest.mark.parametrize(
    ("wrong", "case", "dtype", "match"),
    [
        (_wrong_gqa, GQA, torch.float32, "dq .* FAIL"),
        (_ignores_scale, SCALED, torch.float32, "FAIL"),
        (_always_top_left, BOTTOM_RIGHT, torch.float32, "FAIL"),
        (_nan_masked_rows, BOTTOM_RIGHT, torch.float32, "finite=False"),
        (_slightly_off, GQA, torch.float32, "dk .* FAIL"),
        (_slightly_off, GQA, torch.float64, "dk .* FAIL"),
        (_wrong_shape, GQA, torch.float32, "dk: expected"),
    ],
    ids=[
        "gqa-head-map",
        "ignores-scale",
        "ignores-alignment",
        "nan-rows",
        "f32-3e-3-off",
        "f64-3e-3-off",
        "expanded-dk",
    ],
)
def test_wrong_implementation_fails(wrong, case, dtype, match):
    with pytest.raises(AssertionError, match=match):
        check_backward(wrong, case, dtype=dtype)


def test_forward_check_fails_a_wrong_lse_and_nonzero_masked_rows():
    def shifted_lse(q, k, v, **flags):
        out, lse = _oracle_forward(q, k, v, **flags)
        return out, lse + 1e-2

    def masked_rows_nonzero(q, k, v, **flags):
        out, lse = _oracle_forward(q, k, v, **flags)
        return out + 1e-9, lse

    with pytest.raises(AssertionError, match="lse .* FAIL"):
        check_forward(shifted_lse, GQA)
    with pytest.raises(AssertionError, match="rows that see no key"):
        check_forward(masked_rows_nonzero, BOTTOM_RIGHT)


def test_bf16_tolerance_catches_a_percent_error():
    def off_by_2_percent(q, k, v, out, lse, grad_out, **flags):
        dq, dk, dv = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
        return ad.Gradients(dq * 1.02, dk, dv)

    with pytest.raises(AssertionError, match="dq .* FAIL"):
        check_backward(off_by_2_percent, GQA, dtype=torch.bfloat16)


def _doubles_q(q, k, v, out, lse, grad_out, **flags):
    grads = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
    q.mul_(2)  # after the gradients: only the mutation is wrong
    return grads


def _zeroes_grad_out(q, k, v, out, lse, grad_out, **flags):
    grads = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
    grad_out.zero_()
    return grads


def _shifts_varlen_offsets(q, k, v, out, lse, grad_out, *, cu_seqlens_k=None, **flags):
    grads = _oracle_backward(q, k, v, out, lse, grad_out, cu_seqlens_k=cu_seqlens_k, **flags)
    cu_seqlens_k[-1] += 0  # a write of the same value is no change
    cu_seqlens_k[1:] += 1
    return grads


def _writes_padding(q, k, v, out, lse, grad_out, **flags):
    grads = _oracle_backward(q, k, v, out, lse, grad_out, **flags)
    k._base[..., -1] = 0.0  # the head-dim padding of the sliced layout, outside k's view
    return grads


SLICED = Case((12,), (12,), heads=2, kv_heads=1, head_dim=8, layout="sliced", seed=5)


@pytest.mark.parametrize(
    ("mutating", "case", "match"),
    [
        (_doubles_q, GQA, "q: 2560 of 2560 elements changed in place"),
        (_zeroes_grad_out, GQA, "grad_out: 2560 of 2560 elements changed in place"),
        (_shifts_varlen_offsets, VARLEN, "cu_seqlens_k: 3 of 4 elements changed in place"),
        (_writes_padding, SLICED, "k: bytes of its buffer changed"),
    ],
    ids=["doubles-q", "zeroes-grad_out", "varlen-offsets", "sliced-padding"],
)
def test_backward_that_modifies_its_inputs_fails(mutating, case, match):
    with pytest.raises(
        AssertionError, match=f"backward of {mutating.__name__} modified its inputs"
    ):
        check_backward(mutating, case)
    with pytest.raises(AssertionError, match=match):
        check_backward(mutating, case)


def test_forward_that_modifies_its_inputs_fails():
    def scales_v(q, k, v, **flags):
        result = _oracle_forward(q, k, v, **flags)
        v.mul_(0.5)
        return result

    def restrides_k(q, k, v, **flags):
        result = _oracle_forward(q, k, v, **flags)
        k.transpose_(1, 2)
        return result

    with pytest.raises(AssertionError, match="v: 768 of 768 elements changed"):
        check_forward(scales_v, GQA)
    with pytest.raises(
        AssertionError, match=r"k: \(shape, stride, offset, dtype, device\) changed"
    ):
        check_forward(restrides_k, GQA)


# ---------------------------------------------------------------------------------------------
# the pytest suite factory


def test_make_conformance_tests_parametrises():
    cases = [GQA, VARLEN]
    fn = make_conformance_tests(
        "some_backend",
        dtypes=("float32", torch.bfloat16),
        cases=cases,
        filter=lambda c: c.varlen,
        checks=("backward", "forward"),
    )
    (mark,) = [m for m in fn.pytestmark if m.name == "parametrize"]
    ids = [p.id for p in mark.args[1]]
    assert ids == [
        f"{check}-{d}-{VARLEN.id}"
        for check in ("backward", "forward")
        for d in ("float32", "bfloat16")
    ]
    gpu = make_conformance_tests("x", device="cuda", cases=cases)
    assert any(m.name == "gpu" for m in gpu.pytestmark)
    with pytest.raises(ValueError, match="checks"):
        make_conformance_tests("x", checks=("sideways",))


def test_unknown_backend_name_is_an_error_not_a_skip():
    with pytest.raises(ValueError, match="no_such_backend"):
        check_backward("no_such_backend", GQA)


# ---------------------------------------------------------------------------------------------
# through the dispatcher: registered plugins (tests/plugins, active with the `toys` fixture)


def test_registered_wrong_backend_fails_and_rejection_is_unsupported(toys):
    from attn_dispatch.testing import Unsupported

    with pytest.raises(AssertionError, match="toy:fast does not match"):
        check_backward("toy:fast", GQA)  # fills every gradient with 1.0
    with pytest.raises(AssertionError, match="toy:fast does not match"):
        check_forward("toy:fast", GQA)
    with pytest.raises(Unsupported, match="head_dim=128 > 64") as info:
        check_backward("toy:fast", Case((8,), (8,), heads=2, kv_heads=2, head_dim=128))
    assert info.value.reasons


def test_backend_whose_supports_raises_is_a_failure_not_a_skip(toys):
    with pytest.raises(AssertionError, match="failed while evaluating"):
        check_backward("broken_supports", GQA)


def test_visible_mask_follows_the_contract():
    sq, sk = 5, 9
    for align, offset in (("top_left", 0), ("bottom_right", sk - sq)):
        for causal in (False, True):
            for window in ((2, 1), (None, 3), (0, None), (1, 0), (0, 0), None):
                got = visible_mask(sq, sk, causal, align, window=window)
                left, right = window or (None, None)
                if causal:
                    right = 0 if right is None else min(right, 0)
                for i in range(sq):
                    d = i + offset
                    for j in range(sk):
                        want = (left is None or j >= d - left) and (right is None or j <= d + right)
                        assert bool(got[i, j]) == want, (align, causal, window, i, j)


def test_oracle_soft_cap_is_the_tanh_of_the_scores():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 6, 2, 8), torch.randn(1, 7, 2, 8), torch.randn(1, 7, 2, 8)
    res = oracle(q, k, v, softcap=1.3, scale=0.5)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * 0.5
    s = 1.3 * torch.tanh(s / 1.3)
    torch.testing.assert_close(res.lse, torch.logsumexp(s, -1))
    want = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v.double())
    torch.testing.assert_close(res.out, want)


def test_variant_cases_cover_what_the_contract_names():
    cases = variant_cases()
    tags = {t for c in cases for t in c.tags}
    for feature in ("window", "softcap", "varlen", "gqa", "masked_rows", "sq>sk", "sq<sk"):
        assert feature in tags, feature
    windows = [c.window for c in cases if c.window]
    assert any(w[0] is None for w in windows) and any(w[1] is None for w in windows)
    assert any(None not in w for w in windows)  # two-sided
    assert {c.causal_align for c in cases if c.window} == {"top_left", "bottom_right"}
    assert any(c.window and c.softcap for c in cases)
    assert any(c.softcap and not c.window for c in cases)
    assert any(c.needs == ("softcap",) for c in RANDOM) and any("window" in c.needs for c in RANDOM)


def test_windows_and_caps_change_the_result():
    """The variant cases are not accidentally the plain ones: the oracle differs."""
    for case in variant_cases():
        inp = case.make_inputs(torch.float64)
        flags = inp.flags()
        plain = {k: v for k, v in flags.items() if k not in ("window", "softcap")}
        plain.pop("max_seqlen_q", None), plain.pop("max_seqlen_k", None)
        flags.pop("max_seqlen_q", None), flags.pop("max_seqlen_k", None)
        a = oracle(inp.q, inp.k, inp.v, inp.grad_out, **flags)
        b = oracle(inp.q, inp.k, inp.v, inp.grad_out, **plain)
        assert not torch.allclose(a.dq, b.dq), case.id


def test_declared_capabilities_are_listed(env):
    env.set(**EXACT)
    infos = {i.name: i for b in ad.backends() for i in b.implementations}
    assert infos["exact:oracle"].window and infos["exact:oracle"].softcap
    assert declared_capabilities("exact") == {"window", "softcap", "sinks"}
    assert declared_capabilities("no_such_backend") is None


def test_conformance_catches_a_backend_that_ignores_the_window(env):
    env.set(**EXACT)
    impls = ad._settings.current().registry.implementations
    impls["exact:liar"], impls["exact:plain"] = IgnoresVariants(), DeclinesVariants()
    window_case, cap_case = variant_cases()[0], variant_cases()[6]
    sink_case = sink_cases()[2]  # rows that see no key too
    assert window_case.needs == ("window",) and cap_case.needs == ("softcap",)
    assert sink_case.needs == ("sinks",) and sink_case.has_masked_rows
    for case in (window_case, cap_case, sink_case):
        with pytest.raises(AssertionError, match="does not match the float64 oracle"):
            check_backward("exact:liar", case, dtype=torch.float64)
        with pytest.raises(AssertionError, match="does not match the float64 oracle"):
            check_forward("exact:liar", case, dtype=torch.float64)
        with pytest.raises(Unsupported, match="not supported by this implementation"):
            check_backward("exact:plain", case, dtype=torch.float64)
    check_backward("exact:liar", Case((16,), (16,), seed=3), dtype=torch.float64)


def conformance_case_ids(backend: str) -> list[Case]:
    """The cases ``make_conformance_tests`` parametrises its backward test with."""
    fn = make_conformance_tests(backend, checks=("backward",))
    (mark,) = [m for m in fn.pytestmark if m.name == "parametrize"]
    return [p.values[2] for p in mark.args[1]]


def test_conformance_suite_collects_variant_cases_only_where_declared(env):
    env.set(**EXACT)
    declared = conformance_case_ids("exact")
    assert {n for c in declared for n in c.needs} == {"window", "softcap", "sinks"}
    assert len(declared) > len([c for c in declared if c.needs])


def _self_attention_with_sinks(seed: int, seqlens: tuple, heads: int, d: int, **fields) -> Case:
    """A case with sinks whose keys have the queries' lengths and heads."""
    return Case(seqlens, seqlens, heads, heads, d, sinks=True, seed=seed, **fields)


# Cases of a randomized run (seeds and shapes as drawn) where rowsum(dO ∘ O) cancels: the bf16
# rounding of the given out moves the exact gradients by 1-6%. dsinks: a sum over rows of mixed
# sign; dq, dk: one key that takes nearly all of its row's weight beside a sink.
CANCELLING = [
    _self_attention_with_sinks(
        1742311143917994, (43,), 3, 10, head_dim_v=72, varlen=True, strided_vectors=True
    ),
    _self_attention_with_sinks(
        1742311143918072, (1, 1, 1), 1, 128, causal=True, layout="transposed"
    ),
    _self_attention_with_sinks(
        1742311143919161, (1, 1, 1), 1, 128, scale=0.1709, softcap=7.7, causal_align="bottom_right"
    ),
    _self_attention_with_sinks(1742311143920140, (1, 0), 2, 72, varlen=True),
]


def _flags_of(inputs) -> dict:
    flags = inputs.flags()
    for name in ("max_seqlen_q", "max_seqlen_k", "deterministic"):
        flags.pop(name, None)
    return flags


def _wrong_dsinks_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    *,
    sinks,
    deterministic=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    **flags,
):
    """The oracle's gradients on the given out, with dsinks of the wrong sign."""
    given = oracle(q, k, v, grad_out, sinks=sinks, given_out_dtype=out.dtype, **flags)
    return ad.Gradients(
        given.dq.to(q.dtype), given.dk.to(k.dtype), given.dv.to(v.dtype), -given.dsinks
    )


@pytest.mark.parametrize("case", CANCELLING, ids=lambda c: c.id)
def test_the_reference_backend_passes_where_the_given_out_moves_the_gradients(case):
    check_backward("reference", case, dtype=torch.bfloat16)


@pytest.mark.parametrize("case", CANCELLING, ids=lambda c: c.id)
def test_the_given_out_moves_these_gradients_beyond_the_tolerance(case):
    """Each of these cases exercises the given-out oracle: against the exact gradients, the
    gradients on the bf16-rounded out miss bf16's tolerance."""
    inputs = case.make_inputs(torch.bfloat16, "cpu")
    flags = _flags_of(inputs)
    exact = oracle(inputs.q, inputs.k, inputs.v, inputs.grad_out, **flags)
    given = oracle(
        inputs.q, inputs.k, inputs.v, inputs.grad_out, given_out_dtype=torch.bfloat16, **flags
    )
    tol = tolerance_for(torch.bfloat16)
    floor = 0.1 * max(r.abs().max().item() for r in (exact.dq, exact.dk, exact.dv))
    misses = [
        name
        for name, got, ref, low in (
            ("dq", given.dq, exact.dq, floor),
            ("dk", given.dk, exact.dk, floor),
            ("dsinks", given.dsinks, exact.dsinks, 0.0),
        )
        if error_metrics(got, ref, low)[0] > tol.max_err
        or error_metrics(got, ref, low)[1] > tol.rel_l2
    ]
    assert misses, "the rounding of out no longer moves any gradient of this case"


def test_gradients_on_the_given_out_agree_with_the_reference_formulas():
    """The oracle's given-out dsinks and dv are what a formula-based backward computes."""
    inputs = CANCELLING[0].make_inputs(torch.float32, "cpu")
    flags = _flags_of(inputs)
    exact = oracle(inputs.q, inputs.k, inputs.v, inputs.grad_out, **flags)
    given = oracle(
        inputs.q, inputs.k, inputs.v, inputs.grad_out, given_out_dtype=torch.bfloat16, **flags
    )
    out = exact.out.to(torch.bfloat16).double()
    delta = (inputs.grad_out.double() * out).sum(-1).t()  # [H, T]
    p_sink = torch.exp(inputs.sinks.double()[:, None] - exact.lse)
    torch.testing.assert_close(given.dsinks, -(p_sink * delta).sum(1))
    torch.testing.assert_close(given.dv, exact.dv)  # dv = P^T dO: no rowsum in it


def test_a_backward_with_wrong_dsinks_fails_the_check():
    with pytest.raises(AssertionError, match="dsinks"):
        check_backward(_wrong_dsinks_backward, CANCELLING[0], dtype=torch.bfloat16)


def _formula_backward(q, k, v, dout, out_given, scale, softcap, causal, sinks=None):
    """dq, dk and dsinks of one dense MHA sequence by the backward's formulas, in float64, with
    ``rowsum(dO * O)`` taken from ``out_given`` (q, k, v, dout: [S, H, D]; sinks: [H])."""
    raw = torch.einsum("ihd,jhd->hij", q, k) * scale
    s = softcap * torch.tanh(raw / softcap)
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, S]
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks[:, None])
    p = torch.exp(s - lse[..., None])
    dp = torch.einsum("ihd,jhd->hij", dout, v)
    delta = (dout * out_given).sum(-1).t()  # [H, S]
    ds = p * (dp - delta[..., None]) * (1 - torch.tanh(raw / softcap) ** 2) * scale
    dq, dk = torch.einsum("hij,jhd->ihd", ds, k), torch.einsum("hij,ihd->jhd", ds, q)
    dsinks = None if sinks is None else -(torch.exp(sinks[:, None] - lse) * delta).sum(-1)
    return dq, dk, dsinks


def test_given_out_dq_and_dk_follow_the_backward_formulas_with_a_soft_cap():
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 13, 3, 16, generator=gen, dtype=torch.float64) for _ in "qkvd")
    flags = dict(causal=True, softcap=2.5, scale=0.4)
    given = oracle(q, k, v, dout, given_out_dtype=torch.bfloat16, **flags)
    out_given = given.out.to(torch.bfloat16).double()
    dq, dk, _ = _formula_backward(q[0], k[0], v[0], dout[0], out_given[0], 0.4, 2.5, True)
    torch.testing.assert_close(given.dq[0], dq)
    torch.testing.assert_close(given.dk[0], dk)
    exact = oracle(q, k, v, dout, **flags)
    assert not torch.allclose(exact.dq, given.dq, rtol=0, atol=1e-12)  # the rounding shows


def test_given_out_gradients_follow_the_backward_formulas_with_sinks_per_sequence():
    """Varlen with sinks: each sequence's dq, dk and its share of dsinks by the formulas."""
    gen = torch.Generator().manual_seed(1)
    lengths = (5, 1, 9)
    q, k, v, dout = (torch.randn(15, 2, 8, generator=gen, dtype=torch.float64) for _ in "qkvd")
    sinks = torch.randn(2, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    flags = dict(causal=True, softcap=4.0, scale=0.3, cu_seqlens_q=cu, cu_seqlens_k=cu)
    given = oracle(q, k, v, dout, sinks=sinks, given_out_dtype=torch.bfloat16, **flags)
    out_given = given.out.to(torch.bfloat16).double()
    dsinks = torch.zeros_like(sinks)
    for start, n in zip((0, 5, 6), lengths, strict=True):
        rows = slice(start, start + n)
        dq, dk, part = _formula_backward(
            q[rows], k[rows], v[rows], dout[rows], out_given[rows], 0.3, 4.0, True, sinks
        )
        torch.testing.assert_close(given.dq[rows], dq)
        torch.testing.assert_close(given.dk[rows], dk)
        dsinks += part
    torch.testing.assert_close(given.dsinks, dsinks)
