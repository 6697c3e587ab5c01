"""torch_sdpa numerics on a CUDA GPU against the float64 oracle (skipped without one).

Each implementation runs the core's conformance kit: backward on the oracle's own out/lse,
forward (out and lse, -inf rows included), and bitwise-repeatable backward when
``deterministic=True`` is accepted. Cases an implementation rejects are skipped with its
reasons. Tolerances are the kit's per-dtype defaults (bf16: max_err 2e-2, rel_l2 1e-2;
f16: 4e-3, 2e-3); float32 through the memory-efficient kernel is held to TF32 bounds
(max_err 1e-2, rel_l2 4e-3), since its float32 path may use TF32 tensor cores.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import attn_dispatch as ad
from attn_dispatch.testing import TF32, make_conformance_tests

pytestmark = pytest.mark.gpu

test_cudnn = make_conformance_tests(
    "torch_sdpa:cudnn", dtypes=("bfloat16", "float16"), device="cuda"
)
test_flash = make_conformance_tests(
    "torch_sdpa:flash", dtypes=("bfloat16", "float16"), device="cuda"
)
test_efficient = make_conformance_tests(
    "torch_sdpa:efficient",
    dtypes=("bfloat16", "float32"),
    device="cuda",
    tol={torch.float32: TF32},
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", ["cudnn", "flash", "efficient"])
def test_seed_shape_gqa_against_reference(impl):
    """A seed-sized GQA problem (H=64, Hkv=8, D=128, 1K, causal) against float32 math."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_q, shape_k = (1, 1024, 64, 128), (1, 1024, 8, 128)
    q, do = (
        torch.randn(shape_q, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2)
    )
    k, v = (
        torch.randn(shape_k, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2)
    )
    out, lse = ad.forward(q, k, v, causal=True, backend=f"torch_sdpa:{impl}")
    ref_out, ref_lse = ad.forward(q.float(), k.float(), v.float(), causal=True, backend="reference")
    assert (out.float() - ref_out).norm() / ref_out.norm() < 1e-2
    assert (lse - ref_lse).abs().max() < 2e-2
    grads = ad.backward(q, k, v, out, lse, do, causal=True, backend=f"torch_sdpa:{impl}")
    ref = ad.backward(
        q.float(),
        k.float(),
        v.float(),
        out.float(),
        lse,
        do.float(),
        causal=True,
        backend="reference",
    )
    for name, got, want in zip("qkv", grads, ref, strict=True):
        assert got.shape == want.shape, name
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err < 1e-2, f"d{name}: rel_l2 {err:.2e}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", ["flash"])
def test_strided_cu_seqlens_match_the_oracle(impl):
    """cu_seqlens given as stride-2 views: the ATen varlen ops read a packed array (efficient
    takes no distinct offsets, which the kit's varlen cases have)."""
    from attn_dispatch.testing import Case, check_backward, check_forward

    case = Case((7, 5, 33), (7, 5, 33), 4, 2, 64, varlen=True, strided_vectors=True)
    inputs = case.make_inputs(torch.bfloat16, "cuda")
    assert inputs.cu_seqlens_q.stride(0) != 1
    check_backward(f"torch_sdpa:{impl}", case, dtype=torch.bfloat16, device="cuda")
    check_forward(f"torch_sdpa:{impl}", case, dtype=torch.bfloat16, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_efficient_runs_a_single_token_with_unaligned_unit_strides():
    """A sliced single token (strides 150, 75 on its size-1 dims, bf16): PyTorch's backward
    tests those strides for alignment, which the core rightly ignores."""
    from attn_dispatch.testing import Case, check_backward, check_forward

    case = Case((1,), (1,), 1, 1, 72, causal=True, varlen=True, layout="sliced", seed=1)
    assert case.make_inputs(torch.bfloat16, "cpu").q.stride()[:2] == (150, 75)
    check_backward("torch_sdpa:efficient", case, dtype=torch.bfloat16, device="cuda")
    check_forward("torch_sdpa:efficient", case, dtype=torch.bfloat16, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_efficient_refuses_the_varlen_case_it_faulted_on():
    """Sweep seed 2060813614, case 58: empty query sequences beside keys and queries beside no
    keys; PyTorch's memory-efficient backward read out of bounds (illegal memory access)."""
    from attn_dispatch.testing import Case, Unsupported, check_backward

    case = Case((0, 4, 0, 1201), (673, 0, 1, 3), 48, 4, 120, varlen=True)
    with pytest.raises(Unsupported, match="distinct cu_seqlens_q"):
        check_backward("torch_sdpa:efficient", case, dtype=torch.bfloat16, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("q_memory", ["bshd", "bhsd"])
def test_cudnn_backward_is_right_for_each_layout_of_out_and_its_gradient(q_memory):
    # by its source, PyTorch caches cuDNN's backward graph under q, k and v's layouts: every
    # layout of out and grad_out in turn on one q, k, v, at a shape no other test runs
    # (benchmarks.md section 9)
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, seqlen, heads, kv_heads, d = 1, 136, 12, 4, 96

    def tensor(h: int, memory: str) -> torch.Tensor:
        shape = (batch, seqlen, h, d) if memory == "bshd" else (batch, h, seqlen, d)
        t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
        return t if memory == "bshd" else t.transpose(1, 2)

    def laid_out(t: torch.Tensor, memory: str) -> torch.Tensor:
        return (
            t.contiguous() if memory == "bshd" else t.transpose(1, 2).contiguous().transpose(1, 2)
        )

    q = tensor(heads, q_memory)
    k, v = tensor(kv_heads, q_memory), tensor(kv_heads, q_memory)
    out, lse = ad.forward(q, k, v, causal=True, backend="torch_sdpa:cudnn")
    for out_memory, grad_memory in itertools.product(("bshd", "bhsd"), repeat=2):
        grad = tensor(heads, grad_memory)
        got = ad.backward(
            q, k, v, laid_out(out, out_memory), lse, grad, causal=True, backend="torch_sdpa:cudnn"
        )
        leaves = [t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v)]
        math = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
        math.backward(grad.float().transpose(1, 2))
        for name, g, leaf in zip(("dq", "dk", "dv"), got, leaves, strict=True):
            want = leaf.grad.transpose(1, 2)
            error = ((g.float() - want).norm() / want.norm()).item()
            assert error < 1e-2, (name, out_memory, grad_memory, error)
