"""Sliding windows and logit soft-capping through the public API (issue 26, the core side).

Numbers are checked against the float64 oracle of ``attn_dispatch.testing`` (whose mask is
written straight from the contract) through ``ad.backward`` / ``ad.forward`` /
``ad.attention`` with the reference backend; selection, ``explain``, validation and the
decision cache are checked with the installed GPU backends on ``meta`` tensors.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import make_inputs

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch import cli
from attn_dispatch.testing import (
    Case,
    Unsupported,
    check_backward,
    check_forward,
    declared_capabilities,
    make_conformance_tests,
    oracle,
    random_cases,
    tolerance_for,
    variant_cases,
    visible_mask,
)
from attn_dispatch.testing.tolerances import error_metrics


@pytest.fixture(autouse=True)
def one_thread(env):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _meta(sq=256, sk=None, h=8, hkv=8, d=128, dtype=torch.bfloat16, backward=True):
    """Meta tensors (q, k, v[, out, lse, grad_out]) in BSHD."""
    sk = sk or sq
    shapes = [(1, sq, h, d), (1, sk, hkv, d), (1, sk, hkv, d)]
    tensors = [torch.empty(s, dtype=dtype, device="meta") for s in shapes]
    if backward:
        tensors += [
            torch.empty(1, sq, h, d, dtype=dtype, device="meta"),
            torch.empty(1, h, sq, dtype=adb.lse_dtype(dtype), device="meta"),
            torch.empty(1, sq, h, d, dtype=dtype, device="meta"),
        ]
    return tensors


def _reasons(report: ad.Report, name: str) -> tuple[str, ...]:
    return next(c.reasons for c in report.candidates if c.name == name)


# ----------------------------------------------------------------------------------------------
# the oracle itself: its mask is the contract's definition


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


# ----------------------------------------------------------------------------------------------
# numerics through the public API (reference backend) against the oracle

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


# ----------------------------------------------------------------------------------------------
# ad.attention: autograd, gradcheck, torch.compile


def test_attention_window_softcap_matches_the_oracle_varlen_gqa():
    case = Case(
        (9, 0, 14),
        (11, 4, 14),
        heads=4,
        kv_heads=2,
        head_dim=8,
        varlen=True,
        window=(3, 1),
        softcap=1.7,
        causal_align="bottom_right",
        seed=5,
    )
    inp = case.make_inputs(torch.float32)
    q, k, v = (t.requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    out = ad.attention(q, k, v, **inp.flags())
    grads = torch.autograd.grad(out, (q, k, v), inp.grad_out)
    flags = {k: v for k, v in inp.flags().items() if not k.startswith("max_seqlen")}
    ref = oracle(q, k, v, inp.grad_out, **flags)
    tol = tolerance_for(torch.float32)
    for name, got, want in zip(
        ("out", "dq", "dk", "dv"), (out, *grads), (ref.out, ref.dq, ref.dk, ref.dv)
    ):
        max_err, rel_l2 = error_metrics(got, want)
        assert max_err <= tol.max_err and rel_l2 <= tol.rel_l2, (name, max_err, rel_l2)


def test_attention_flags_reach_both_passes(monkeypatch):
    seen = []
    for name, real in (("_dispatch_forward", ad.forward), ("_dispatch_backward", ad.backward)):

        def spy(*args, _real=real, **kwargs):
            seen.append((kwargs["window"], kwargs["softcap"]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(f"attn_dispatch._autograd.{name}", spy)
    q = torch.randn(1, 5, 2, 4, requires_grad=True)
    ad.attention(q, q, q, window=[2, None], softcap=3).sum().backward()
    assert seen == [((2, None), 3.0), ((2, None), 3.0)]
    seen.clear()
    ad.attention(q, q, q, window=(None, None)).sum().backward()
    assert seen == [(None, None), (None, None)]


def _block_step(fn, q, k, v, grad_out):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out))


def test_compile_fullgraph_with_window_and_softcap_matches_eager():
    torch.compiler.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(gm, example_inputs)

    def attn(q, k, v):
        return ad.attention(
            q, k, v, causal=True, causal_align="bottom_right", window=(4, None), softcap=2.5
        )

    compiled = torch.compile(attn, backend=counting, fullgraph=True)
    torch.manual_seed(3)
    q = torch.randn(2, 10, 4, 8, requires_grad=True)
    k, v = (torch.randn(2, 13, 2, 8, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(2, 10, 4, 8)
    want = _block_step(attn, q, k, v, grad_out)
    got = _block_step(compiled, q, k, v, grad_out)
    assert len(graphs) == 1
    nodes = [n for n in graphs[0].graph.nodes if "attn_dispatch.fwd" in str(n.target)]
    assert nodes and (4, None, 2.5) == tuple(nodes[0].args[-3:])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    ref = oracle(
        q, k, v, grad_out, causal=True, causal_align="bottom_right", window=(4, None), softcap=2.5
    )
    for a, b in zip(got, (ref.out, ref.dq, ref.dk, ref.dv)):
        torch.testing.assert_close(a, b.float(), atol=1e-5, rtol=1e-4)
    torch.compiler.reset()


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


def test_same_shapes_with_other_windows_are_other_signatures():
    q, k, v, _, _, do = make_inputs(sq=16, sk=16, h=2, hkv=1, d=8, dtype=torch.float64)
    variants = [
        {},
        {"window": (2, 0)},
        {"window": (2, 1)},
        {"window": (None, 0)},
        {"softcap": 1.0},
        {"softcap": 2.0},
        {"window": (2, 0), "softcap": 1.0},
    ]
    results = {}
    for _ in range(3):  # the later rounds run from the dictionary, then from the guards
        for i, flags in enumerate(variants):
            out, lse = ad.forward(q, k, v, **flags)
            grads = ad.backward(q, k, v, out, lse, do, **flags)
            ref = oracle(q, k, v, do, **flags)
            for got, want in zip((out, lse, *grads), ref):
                torch.testing.assert_close(got, want)
            results.setdefault(i, grads.dq)
    assert len(ad._settings.current().decisions) == 2 * len(variants)  # forward and backward
    for i in results:
        for j in range(i):
            assert not torch.allclose(results[i], results[j]), (variants[i], variants[j])


def test_cached_decision_is_not_reused_for_a_window_the_choice_rejects(env):
    """A decision made for plain inputs (cuDNN on sm_90) must not run a windowed call."""
    env.set(ATTN_DISPATCH_ARCH="sm_90")
    tensors = _meta(d=128)
    assert ad.explain(*tensors).selected == "torch_sdpa:cudnn"
    ad.backward(*tensors)
    ad.backward(*tensors)
    report = ad.explain(*tensors, window=(128, 0))
    assert report.selected != "torch_sdpa:cudnn"
    with pytest.raises(ad.NoBackendError, match=r"window=\(128, 0\): not supported"):
        ad.backward(*tensors, window=(128, 0), backend="torch_sdpa:cudnn")
    ad.backward(*tensors, window=(128, 0))  # selects a backend that declares it


# ----------------------------------------------------------------------------------------------
# capabilities: who is chosen, who is not, and why


def test_cudnn_rejects_with_the_standard_reasons():
    report = ad.explain(*_meta(), window=(64, 0), softcap=30.0, arch="sm_90")
    reasons = _reasons(report, "torch_sdpa:cudnn")
    assert "window=(64, 0): not supported by this implementation" in reasons
    assert "softcap=30.0: not supported by this implementation" in reasons
    flash = _reasons(report, "torch_sdpa:flash")
    assert "softcap=30.0: not supported by this implementation" in flash
    assert not any(r.startswith("window=(64, 0): not supported") for r in flash)


def test_forced_backend_that_cannot_raises_listing_the_reason(env):
    env.set(ATTN_DISPATCH_ARCH="sm_90")
    tensors = _meta()
    for backend in ("torch_sdpa:cudnn", "torch_sdpa:efficient"):
        with pytest.raises(ad.NoBackendError, match=r"softcap=2.0: not supported"):
            ad.backward(*tensors, softcap=2.0, backend=backend)
        with ad.use_backend(backend), pytest.raises(ad.NoBackendError, match="window="):
            ad.forward(*tensors[:3], window=(8, 8))


def test_forced_backend_that_cannot_raises_from_attention(env):
    """Through the op (CPU tensors: a meta call would only run its fake implementation)."""
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    ad._settings.current().registry.implementations["reference:plain"] = _Plain()
    q = torch.randn(1, 6, 2, 8)
    for flags in ({"softcap": 2.0}, {"window": (1, 1)}):
        with pytest.raises(ad.NoBackendError, match="not supported by this implementation"):
            ad.attention(q, q, q, backend="reference:plain", **flags)
    ad.attention(q, q, q, backend="reference:plain")


def test_triton_is_accepted_and_explained_on_sm90():
    for backward in (True, False):
        tensors = _meta(sq=1024, d=128, backward=backward)
        report = ad.explain(
            *tensors, window=(128, None), softcap=30.0, arch="sm_90", backend="triton"
        )
        assert report.selected == "triton:fused", str(report)
        assert "window=(128, None) softcap=30.0" in report.inputs
        assert "torch_sdpa:cudnn" not in {c.name for c in report.candidates if not c.reasons}


def test_triton_runs_on_meta_through_dispatch(env):
    env.set(ATTN_DISPATCH_ARCH="sm_90")
    tensors = _meta(sq=512, d=64)
    grads = ad.backward(*tensors, window=(32, 0), softcap=10.0, backend="triton")
    assert grads.dq.device.type == "meta" and grads.dq.shape == tensors[0].shape
    decision = next(iter(ad._settings.current().decisions.values()))
    assert decision.impl.full_name == "triton:fused"
    assert decision.facts.window == (32, 0) and decision.facts.softcap == 10.0


def test_flydsl_rejects_windows_and_caps():
    tensors = _meta(d=128)
    for arch in ("gfx942", "gfx950"):
        report = ad.explain(*tensors, window=(16, 0), softcap=5.0, arch=arch, backend="flydsl_rocm")
        assert report.selected is None
        own = [
            c
            for c in report.candidates
            if c.name.startswith("flydsl_rocm:") and not c.reasons[0].startswith("arch=")
        ]
        assert own
        for c in own:
            assert "window=(16, 0): not supported by this implementation" in c.reasons, c
            assert "softcap=5.0: not supported by this implementation" in c.reasons, c


def test_the_window_diagonal_needs_a_declared_alignment(env):
    """An implementation whose mask is top-left only cannot run a bottom-right window with
    Sq != Sk (its diagonal differs), even without causal; it can where the two agree."""

    class TopLeft(adb.Implementation):
        backend, name = "reference", "top_left_band"
        priority = {"*": 1}
        causal_aligns = ("top_left",)
        window = True

    env.set(ATTN_DISPATCH_PLUGINS="reference")
    ad._settings.current().registry.implementations["reference:top_left_band"] = TopLeft()
    tensors = make_inputs(sq=6, sk=9, h=2, hkv=1, d=8)
    report = ad.explain(*tensors, window=(2, 2), causal_align="bottom_right")
    (reason,) = _reasons(report, "reference:top_left_band")
    assert "causal_align='bottom_right' with Sq=6 != Sk=9" in reason
    assert "diagonal of window=(2, 2) is top_left only" in reason
    assert not _reasons(ad.explain(*tensors, window=(2, 2)), "reference:top_left_band")
    square = make_inputs(sq=6, sk=6, h=2, hkv=1, d=8)
    assert not _reasons(
        ad.explain(*square, window=(2, 2), causal_align="bottom_right"), "reference:top_left_band"
    )


def test_declared_capabilities_are_listed():
    infos = {i.name: i for b in ad.backends() for i in b.implementations}
    assert infos["reference:chunked"].window and infos["reference:chunked"].softcap
    assert infos["torch_sdpa:flash"].window and not infos["torch_sdpa:flash"].softcap
    assert not infos["torch_sdpa:cudnn"].window and not infos["torch_sdpa:cudnn"].softcap
    assert infos["triton:fused"].to_dict()["window"] is True
    assert declared_capabilities("reference") == {"window", "softcap"}
    assert declared_capabilities("torch_sdpa") == {"window"}
    assert declared_capabilities("torch_sdpa:cudnn") == set()
    assert declared_capabilities("no_such_backend") is None


# ----------------------------------------------------------------------------------------------
# the conformance kit holds a backend that claims support to the oracle


class _IgnoresVariants(adb.Implementation):
    """Declares both capabilities but computes plain attention: a wrong claim."""

    backend, name = "reference", "liar"
    window = softcap = True

    def forward(self, inp):
        from attn_dispatch_reference._chunked import attention_forward

        return attention_forward(
            inp.q, inp.k, inp.v, scale=inp.scale, causal=inp.causal, causal_align=inp.causal_align
        )

    def backward(self, inp):
        from attn_dispatch_reference._chunked import attention_backward

        return ad.Gradients(
            *attention_backward(
                inp.q,
                inp.k,
                inp.v,
                inp.out,
                inp.lse,
                inp.grad_out,
                scale=inp.scale,
                causal=inp.causal,
                causal_align=inp.causal_align,
            )
        )


class _Plain(_IgnoresVariants):
    """The same kernel, declaring neither: rejected, so the kit skips it."""

    name = "plain"
    window = softcap = False


def test_conformance_catches_a_backend_that_ignores_the_window(env):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    impls = ad._settings.current().registry.implementations
    impls["reference:liar"], impls["reference:plain"] = _IgnoresVariants(), _Plain()
    window_case, cap_case = variant_cases()[0], variant_cases()[6]
    assert window_case.needs == ("window",) and cap_case.needs == ("softcap",)
    for case in (window_case, cap_case):
        with pytest.raises(AssertionError, match="does not match the float64 oracle"):
            check_backward("reference:liar", case, dtype=torch.float64)
        with pytest.raises(AssertionError, match="does not match the float64 oracle"):
            check_forward("reference:liar", case, dtype=torch.float64)
        with pytest.raises(Unsupported, match="not supported by this implementation"):
            check_backward("reference:plain", case, dtype=torch.float64)
    check_backward("reference:liar", Case((16,), (16,), seed=3), dtype=torch.float64)


def test_conformance_suite_collects_variant_cases_only_where_declared():
    def ids(backend):
        fn = make_conformance_tests(backend, checks=("backward",))
        (mark,) = [m for m in fn.pytestmark if m.name == "parametrize"]
        return [p.values[2] for p in mark.args[1]]

    reference, cudnn = ids("reference"), ids("torch_sdpa:cudnn")
    assert {n for c in reference for n in c.needs} == {"window", "softcap"}
    assert not any(c.needs for c in cudnn)
    assert any("window" in c.needs for c in ids("torch_sdpa:flash"))
    assert not any("softcap" in c.needs for c in ids("torch_sdpa:flash"))
    assert len(cudnn) < len(reference)


# ----------------------------------------------------------------------------------------------
# CLI


def test_cli_explain_shows_window_and_softcap(capsys):
    argv = ["explain", "--seqlen", "2048", "--heads", "8", "--head-dim", "128", "--arch", "sm_90"]
    assert cli.main([*argv, "--window", "256,0", "--softcap", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("window=(256, 0) softcap=30.0" in line for line in data["inputs"])
    cudnn = next(c for c in data["candidates"] if c["name"] == "torch_sdpa:cudnn")
    assert "window=(256, 0): not supported by this implementation" in cudnn["reasons"]
    assert cli.main([*argv, "--window=-,64"]) == 0
    assert "window=(None, 64)" in capsys.readouterr().out
    assert cli.main([*argv, "--window", "none,0", "--backend", "torch_sdpa:cudnn"]) == 0
    assert "window=(None, 0): not supported" in capsys.readouterr().out


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


def test_cli_list_shows_the_capabilities(capsys):
    assert cli.main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "reference:chunked" in x)
    assert "window" in line and "softcap" in line
    assert cli.main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    impls = {i["name"]: i for b in data["backends"] for i in b["implementations"]}
    assert impls["torch_sdpa:flash"]["window"] and not impls["torch_sdpa:flash"]["softcap"]


def test_inputs_repr_and_describe_carry_the_variants():
    q, k, v, out, lse, do = make_inputs(sq=6, h=2, hkv=1, d=8)
    from attn_dispatch._validation import build_inputs

    inp = build_inputs(
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


def test_band_sides_folds_causal_into_the_window():
    assert ad.band_sides(None, False) == (None, None)
    assert ad.band_sides(None, True) == (None, 0)
    assert ad.band_sides((4, 7), True) == (4, 0)
    assert ad.band_sides((None, 3), False) == (None, 3)
    assert ad.band_sides((2, None), True) == (2, 0)
