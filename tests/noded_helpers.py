"""What the tests of eager ``ad.attention`` through the ``noded`` test plugins share."""

from __future__ import annotations

import torch

import attn_dispatch as ad
from attn_dispatch import _autograd

NODED = {"ATTN_DISPATCH_TEST_PLUGINS": "noded", "ATTN_DISPATCH_PLUGINS": "noded"}


def leaves(heads_first: bool = False, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = ((2, 4, 7, 8), (2, 2, 7, 8), (2, 2, 7, 8))
    if not heads_first:
        shapes = tuple((b, s, h, d) for b, h, s, d in shapes)
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]


def expected(q, k, v, grad, heads_first: bool) -> tuple[torch.Tensor, ...]:
    """Output and gradients by PyTorch's math attention (GQA, causal) in float64."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    views = (q, k, v) if heads_first else tuple(t.transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(*views, is_causal=True, enable_gqa=True)
    out = out if heads_first else out.transpose(1, 2)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def step(q, k, v, grad, heads_first: bool):
    """One call and its backward: the output, its node's class name and the gradients."""
    for t in (q, k, v):
        t.grad = None
    out = ad.attention(q, k, v, causal=True, layout="bhsd" if heads_first else "bshd")
    node = type(out.grad_fn).__name__
    if node == "TransposeBackward0":
        below = type(out.grad_fn.next_functions[0][0]).__name__
        # the library's node takes a heads-first call through transposed views; any other node
        # under a view is reported as that view
        node = below if below == LIBRARY_NODE else node
    out.backward(grad)
    return out.detach(), node, q.grad, k.grad, v.grad


LIBRARY_NODE = _autograd._EAGER_NODE.__name__
