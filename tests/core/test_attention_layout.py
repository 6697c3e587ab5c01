"""``ad.attention(..., layout="bhsd")``: head-first tensors through views, declared, checked."""

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch.testing.oracle import oracle


def _bhsd(b: int, h: int, s: int, d: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(b, h, s, d, dtype=dtype, requires_grad=True)


def test_bhsd_matches_the_oracle_in_its_own_layout_with_gradients():
    torch.manual_seed(0)
    q, k, v = _bhsd(2, 4, 7, 8), _bhsd(2, 2, 9, 8), _bhsd(2, 2, 9, 8)
    grad = torch.randn(2, 4, 7, 8, dtype=torch.float64)
    flags = dict(causal=True, causal_align="bottom_right", window=(3, None))
    out = ad.attention(q, k, v, layout="bhsd", **flags)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = oracle(*(t.detach().transpose(1, 2) for t in (q, k, v)), grad.transpose(1, 2), **flags)
    assert out.shape == (2, 4, 7, 8)
    assert out.transpose(1, 2).is_contiguous()  # a view of the operator's BSHD output
    for got, want in ((out, ref.out), (dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
        torch.testing.assert_close(got.detach(), want.transpose(1, 2), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "layout, error, words",
    [
        ("BHSD", ValueError, "expected one of"),
        ("bsdh", ValueError, "expected one of"),
        (None, TypeError, "expected a str"),
        (1, TypeError, "expected a str"),
    ],
)
def test_a_bad_layout_names_the_argument(layout, error, words):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(error, match=f"argument 'layout'.*{words}"):
        ad.attention(q, q, q, layout=layout)


def test_bhsd_refuses_varlen_and_other_ranks():
    q = torch.randn(6, 2, 8)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="argument 'layout'.*varlen"):
        ad.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6, max_seqlen_k=6,
                     layout="bhsd")  # fmt: skip
    with pytest.raises(ValueError, match="argument 'q': layout='bhsd' expects a 4-D"):
        ad.attention(q, q, q, layout="bhsd")
