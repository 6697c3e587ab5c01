"""The least an autograd node around ``ad.forward`` / ``ad.backward`` can do (no argument checks,
no scope, no copies but a non-contiguous gradient's), for benchmarks that set
``ad.attention``'s own node beside it: what ``ad.attention`` costs beyond it is its node's."""

from __future__ import annotations

import torch

import attn_dispatch as ad


def minimal_node(backend: str | None = None) -> type[torch.autograd.Function]:
    """A node class whose ``apply(q, k, v)`` ([B, S, H, D]) is causal attention through the
    public calls, ``backend`` forced (``None``: the automatic choice)."""

    class Minimal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = ad.forward(q, k, v, causal=True, backend=backend)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            grad_out = grad_out.contiguous()
            grads = ad.backward(q, k, v, out, lse, grad_out, causal=True, backend=backend)
            return grads[0], grads[1], grads[2]

    return Minimal


class EmptyNode(torch.autograd.Function):
    """A node over q, k and v ([B, S, H, D]) that computes nothing: its forward and backward
    only allocate their results. What any Python autograd node costs a training step, with
    the engine's walk of the graph around it, before it does any work."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
