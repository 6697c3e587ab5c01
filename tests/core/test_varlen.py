"""Padded batch <-> varlen helpers: metadata, round trips, gradients, bad input."""

import numpy as np
import pytest
import torch

import attn_dispatch as ad


def test_mask_with_left_right_and_inner_padding():
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
    meta = ad.varlen_from_mask(mask)
    assert meta.cu_seqlens.tolist() == [0, 3, 5, 7]
    assert meta.cu_seqlens.dtype == torch.int32
    assert meta.max_seqlen == 3 and type(meta.max_seqlen) is int
    assert meta.indices.tolist() == [1, 2, 3, 4, 5, 8, 10]
    assert meta.num_sequences == 3 and meta.total == 7


def test_unpad_pad_round_trip_and_gradient():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # integer masks are accepted
    meta = ad.varlen_from_mask(mask)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    packed = meta.unpad(x)
    assert torch.equal(packed, x.detach()[mask.bool()])
    back = meta.pad(packed)
    assert torch.equal(back, x.detach() * mask[..., None, None])
    back.sum().backward()
    assert torch.equal(x.grad, mask[..., None, None].expand_as(x).double())


def test_unpad_gathers_strided_views():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    meta = ad.varlen_from_mask(mask)
    bhsd = torch.randn(2, 4, 3, 8)
    view = bhsd.transpose(1, 2)  # BSHD view that cannot be flattened without a copy
    assert torch.equal(meta.unpad(view), view.contiguous()[mask])


def test_key_mask_queries_are_the_tail():
    key_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    vq, vk = ad.varlen_from_key_mask(key_mask, 2)
    assert vq.cu_seqlens.tolist() == [0, 2, 4] and vq.max_seqlen == 2
    assert vk.cu_seqlens.tolist() == [0, 3, 8] and vk.max_seqlen == 5
    assert vq.indices.tolist() == [0, 1, 2, 3]
    assert (vq.batch, vq.seqlen) == (2, 2)
    vq, _ = ad.varlen_from_key_mask(torch.tensor([[0, 0, 1, 1]], dtype=torch.bool), 3)
    assert vq.cu_seqlens.tolist() == [0, 2] and vq.indices.tolist() == [1, 2]


def test_position_ids_restarts_split_documents():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [5, 6, 7, 8, 9, 10]])
    meta = ad.varlen_from_position_ids(pos)
    assert meta.cu_seqlens.tolist() == [0, 3, 5, 6, 12]
    assert meta.max_seqlen == 6 and meta.num_sequences == 4
    x = torch.randn(2, 6, 3)
    assert torch.equal(meta.unpad(x), x.reshape(12, 3))


def test_varlen_attention_of_unpadded_batch_matches_each_row_alone():
    torch.manual_seed(0)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
    q = torch.randn(3, 6, 4, 8, dtype=torch.float64)
    k, v = torch.randn(2, 3, 6, 2, 8, dtype=torch.float64)
    meta = ad.varlen_from_mask(mask)
    out = meta.pad(
        ad.attention(
            meta.unpad(q),
            meta.unpad(k),
            meta.unpad(v),
            causal=True,
            cu_seqlens_q=meta.cu_seqlens,
            cu_seqlens_k=meta.cu_seqlens,
            max_seqlen_q=meta.max_seqlen,
            max_seqlen_k=meta.max_seqlen,
        )
    )
    for b in range(3):
        real = mask[b].bool()
        alone = ad.attention(
            q[b : b + 1, real], k[b : b + 1, real], v[b : b + 1, real], causal=True
        )
        torch.testing.assert_close(out[b, real], alone[0], rtol=1e-12, atol=1e-12)
        assert torch.all(out[b, ~real] == 0)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: ad.varlen_from_mask(torch.ones(4)), ValueError, "argument 'mask'"),
        (lambda: ad.varlen_from_mask(torch.zeros(2, 3)), TypeError, "additive float mask"),
        (lambda: ad.varlen_from_mask([[1]]), TypeError, "argument 'mask'"),
        (
            lambda: ad.varlen_from_key_mask(torch.ones(1, 3, dtype=torch.bool), 4),
            ValueError,
            "argument 'seqlen_q'",
        ),
        (
            lambda: ad.varlen_from_position_ids(torch.zeros(2, 3)),
            TypeError,
            "argument 'position_ids'",
        ),
        (
            lambda: ad.varlen_from_mask(torch.ones(1, 3, dtype=torch.bool)).unpad(torch.ones(2, 3)),
            ValueError,
            "argument 'x'",
        ),
        (
            lambda: ad.varlen_from_mask(torch.ones(1, 3, dtype=torch.bool)).unpad(np.zeros((1, 3))),
            TypeError,
            "argument 'x': expected a torch.Tensor, got ndarray",
        ),
        (
            lambda: ad.varlen_from_mask(torch.ones(1, 3, dtype=torch.bool)).pad([[0.0]] * 3),
            TypeError,
            "argument 'x': expected a torch.Tensor, got list",
        ),
        (
            lambda: ad.varlen_from_mask(torch.ones(2, 3, dtype=torch.bool, device="meta")),
            ValueError,
            "argument 'mask': a meta tensor has no values",
        ),
        (
            lambda: ad.varlen_from_key_mask(torch.ones(2, 3, dtype=torch.bool, device="meta"), 1),
            ValueError,
            "argument 'key_mask': a meta tensor has no values",
        ),
        (
            lambda: ad.varlen_from_position_ids(torch.zeros(2, 3, dtype=torch.long, device="meta")),
            ValueError,
            "argument 'position_ids': a meta tensor has no values",
        ),
        (
            lambda: ad.varlen_from_position_ids(torch.tensor([[0, 1, 2, 0, 1]]) + 0.5j),
            TypeError,
            "argument 'position_ids': expected integers, got torch.complex",
        ),
    ],
)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
