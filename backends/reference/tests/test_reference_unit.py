"""Reference-backend specifics: registration, chunking, dtypes, masked rows, GQA, devices."""

import pytest
import torch
from attn_dispatch_reference import attention_backward, attention_forward
from attn_dispatch_reference._chunked import chunk_rows
from attn_dispatch_reference.plugin import Chunked

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing import Case, oracle


def test_registered_through_its_entry_point():
    infos = {b.name: b for b in ad.backends()}
    info = infos["reference"]
    assert info.error is None
    assert info.distribution == "attn-dispatch-reference"
    (impl,) = info.implementations
    assert impl.name == "reference:chunked"
    assert impl.priority == {"*": 0}
    assert impl.deterministic and not impl.opt_in and impl.has_forward


@pytest.mark.parametrize("arch", ["cpu", "sm_90", "gfx942", "gfx950"])
def test_supported_on_any_arch(arch):
    q = torch.empty(1, 8, 4, 64, device="meta", dtype=torch.bfloat16)
    report = ad.explain(q, q, q, q, torch.empty(1, 4, 8, device="meta"), q, arch=arch)
    (cand,) = [c for c in report.candidates if c.name == "reference:chunked"]
    assert cand.status in ("selected", "supported") and cand.priority == 0


def _inputs(case, dtype=torch.float64):
    inp = case.make_inputs(dtype)
    given = {n: x for n, x in inp.flags().items() if not n.startswith("max_seqlen")}
    ref = oracle(inp.q, inp.k, inp.v, inp.grad_out, **given)
    scale = inp.scale or case.head_dim**-0.5
    flags = dict(
        scale=scale,
        band=adb.Band.of(None, inp.causal, inp.causal_align),
        cu_seqlens_q=inp.cu_seqlens_q,
        cu_seqlens_k=inp.cu_seqlens_k,
    )
    return inp, ref, flags


@pytest.mark.parametrize("budget", [1, 3000, 40_000, 1 << 30])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_chunk_size_does_not_change_the_result(budget, align):
    mask = dict(causal=True, causal_align=align)
    case = Case((45,), (70,), heads=6, kv_heads=2, head_dim=16, head_dim_v=12, **mask, seed=3)
    inp, ref, flags = _inputs(case)
    out, lse = attention_forward(inp.q, inp.k, inp.v, budget_bytes=budget, **flags)
    grads = attention_backward(
        inp.q, inp.k, inp.v, ref.out, ref.lse, inp.grad_out, budget_bytes=budget, **flags
    )
    torch.testing.assert_close(out, ref.out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref.lse, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, (ref.dq, ref.dk, ref.dv), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_chunk_rows_follows_the_budget():
    # B=1, H=8, Sk=16384, float32: 128 MiB per score buffer -> 256 query rows
    assert chunk_rows(1, 8, 16384, 4, 128 << 20) == 256
    assert chunk_rows(1, 8, 16384, 4, 1) == 1
    assert chunk_rows(1, 8, 0, 4, 1 << 20) > 0


def test_fully_masked_rows_are_zero_and_minus_inf():
    # bottom_right with Sq > Sk: the first Sq - Sk rows see no key
    case = Case(
        (30,), (10,), kv_heads=2, head_dim=8, causal=True, causal_align="bottom_right", seed=5
    )
    inp, ref, flags = _inputs(case, torch.float32)
    out, lse = attention_forward(inp.q, inp.k, inp.v, **flags)
    assert torch.isneginf(lse[:, :, :20]).all() and torch.isfinite(lse[:, :, 20:]).all()
    assert (out[:, :20] == 0).all()
    dq, dk, dv = attention_backward(inp.q, inp.k, inp.v, out, lse, inp.grad_out, **flags)
    assert (dq[:, :20] == 0).all()
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv))


def test_varlen_sequence_without_keys():
    case = Case((5, 7), (0, 4), heads=2, kv_heads=1, head_dim=8, varlen=True, seed=6)
    inp, ref, flags = _inputs(case, torch.float32)
    out, lse = attention_forward(inp.q, inp.k, inp.v, **flags)
    assert torch.isneginf(lse[:, :5]).all() and (out[:5] == 0).all()
    dq, dk, dv = attention_backward(inp.q, inp.k, inp.v, out, lse, inp.grad_out, **flags)
    assert (dq[:5] == 0).all() and torch.isfinite(dq).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_outputs_keep_dtype(dtype):
    case = Case((20,), (20,), heads=4, kv_heads=1, head_dim=16, causal=True, seed=7)
    inp = case.make_inputs(dtype)
    out, lse = ad.forward(inp.q, inp.k, inp.v, causal=True, backend="reference")
    assert out.dtype == dtype and lse.dtype == torch.float32
    grads = ad.backward(
        inp.q, inp.k, inp.v, out, lse, inp.grad_out, causal=True, backend="reference"
    )
    assert [g.dtype for g in grads] == [dtype] * 3
    assert grads.dk.shape == inp.k.shape  # GQA: kv heads, not expanded


def test_selected_automatically_when_alone_on_cpu():
    q = torch.randn(1, 8, 2, 8)
    report = ad.explain(q, q, q)
    cands = {c.name: c for c in report.candidates}
    assert cands["reference:chunked"].status in ("selected", "supported")


def test_implementation_class_directly():
    impl = Chunked()
    assert impl.supports(None, ad.Arch("cpu", "cpu", "cpu")) == []
    assert impl.full_name == "reference:chunked"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_on_gpu_matches_cpu():
    mask = dict(causal=True, causal_align="bottom_right")
    case = Case((3, 40, 0), (17, 40, 5), heads=4, kv_heads=2, **mask, varlen=True, seed=8)
    from attn_dispatch.testing import check_backward, check_forward

    check_backward("reference", case, device="cuda")
    check_forward("reference", case, device="cuda")
