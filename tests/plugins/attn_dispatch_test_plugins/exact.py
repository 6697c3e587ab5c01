"""``exact:oracle``: attention in float64, for the core's tests that need real numbers
(autograd, torch.compile, variants, attention sinks) without depending on a real backend.

The forward is the testing oracle's. The gradients are written out by the textbook formulas
rather than taken with the oracle's autograd: the dispatcher runs inside a custom operator,
below autograd, where nothing records a graph. As every backward does, they take
``rowsum(dO ∘ O)`` from the ``out`` they are given.
"""

from __future__ import annotations

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing.oracle import oracle_of, visible_mask

from . import active


class Oracle(adb.Implementation):
    backend, name = "exact", "oracle"
    priority = {"*": 1}
    window = softcap = sinks = True

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The float64 oracle's (its forward needs no autograd)."""
        result = oracle_of(inp)
        return result.out.to(inp.dtype), result.lse.to(adb.lse_dtype(inp.dtype))

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        grads = [[], [], [], []]
        for q, k, v, do, out in _sequences(inp):
            for acc, g in zip(grads, _gradients(inp, q, k, v, do, out)):
                acc.append(g)
        dsinks = None
        if inp.sinks is not None:
            dsinks = sum(g.sum((0, 2)) for g in grads[3]).to(inp.sinks.dtype)
        grads = [[g.to(inp.dtype) for g in acc] for acc in grads[:3]]
        if inp.is_varlen:
            return ad.Gradients(*(torch.cat(g, 1).squeeze(0) for g in grads), dsinks)
        return ad.Gradients(*(g[0] for g in grads), dsinks)


def _sequences(inp: adb.BackwardInputs):
    """(q, k, v, grad_out, out) as dense [B, S, H, D] batches: the whole call, or one per
    sequence."""
    tensors = (inp.q, inp.k, inp.v, inp.grad_out, inp.out)
    if not inp.is_varlen:
        yield tensors
        return
    cu_q, cu_k = inp.cu_seqlens_q.tolist(), inp.cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        q, k, v, do, out = tensors
        yield q[rows][None], k[keys][None], v[keys][None], do[rows][None], out[rows][None]


def _heads_first(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.double().repeat_interleave(group, dim=2).permute(0, 2, 1, 3)


def _attend(inp, q, k, v):
    """The output [B, H, S, Dv] and what the gradients need: q, k, v heads first (k and v
    repeated per query head), the probabilities and, with a soft cap, tanh of the scores."""
    group = inp.heads // inp.kv_heads
    qh, kh, vh = _heads_first(q, 1), _heads_first(k, group), _heads_first(v, group)
    scores = qh @ kh.transpose(-1, -2) * inp.scale
    tanh = None
    if inp.softcap is not None:
        tanh = torch.tanh(scores / inp.softcap)
        scores = inp.softcap * tanh
    mask = visible_mask(q.shape[1], k.shape[1], inp.causal, inp.causal_align, q.device, inp.window)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    if inp.sinks is not None:
        lse = torch.logaddexp(lse, inp.sinks.double()[None, :, None])
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return probs @ vh, (qh, kh, vh, probs, tanh, lse)


def _gradients(inp, q, k, v, grad_out, out):
    _, (qh, kh, vh, probs, tanh, lse) = _attend(inp, q, k, v)
    do, out = _heads_first(grad_out, 1), _heads_first(out, 1)
    dv = probs.transpose(-1, -2) @ do
    dp = do @ vh.transpose(-1, -2)
    delta = (do * out).sum(-1, keepdim=True)
    ds = probs * (dp - delta)
    if tanh is not None:
        ds = ds * (1 - tanh * tanh)
    dq = (ds @ kh * inp.scale).permute(0, 2, 1, 3)
    dk = (ds.transpose(-1, -2) @ qh * inp.scale).permute(0, 2, 1, 3)
    dv = dv.permute(0, 2, 1, 3)
    # per [B, H, Sq] row: -P_sink · rowsum(dO ∘ O), summed by the caller
    dsink = None
    if inp.sinks is not None:
        dsink = -torch.exp(inp.sinks.double()[None, :, None] - lse) * delta[..., 0]
    return dq, _per_kv_head(dk, inp.kv_heads), _per_kv_head(dv, inp.kv_heads), dsink


def _per_kv_head(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, S, H, D] summed over each key/value head's group of query heads: [B, S, Hkv, D]."""
    b, s, h, d = grad.shape
    return grad.reshape(b, s, kv_heads, h // kv_heads, d).sum(3)


@adb.hookimpl
def attn_dispatch_implementations():
    return [Oracle()] if active() else []
