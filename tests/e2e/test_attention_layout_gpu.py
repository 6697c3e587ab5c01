"""``ad.attention(..., layout="bhsd")`` on the GPU with every implementation that takes the call.

The caller's gradient, contiguous in [B, H, S, D], reaches the kernels as a transposed view
while the saved ``out`` is [B, S, H, D]-contiguous: two layouts in one backward call, which the
randomized sweep (one layout per case) does not draw. Each implementation runs forced, forward
and backward, against the float64 oracle."""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch.testing import error_metrics, oracle, tolerance_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]

# (batch, query heads, kv heads, length, head dim, causal)
SHAPES = [(2, 8, 2, 200, 64, True), (1, 4, 4, 130, 128, False)]


def leaves(shape, dtype=torch.bfloat16):
    b, h, hk, s, d, _ = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    sizes = ((b, h, s, d), (b, hk, s, d), (b, hk, s, d))
    return [
        torch.randn(size, generator=gen, device="cuda", dtype=dtype).requires_grad_(True)
        for size in sizes
    ]


def takers(shape) -> list[str]:
    """The implementations that accept this call's backward with the gradient as it arrives."""
    q, k, v = (t.detach().transpose(1, 2) for t in leaves(shape))
    out = q.new_empty(q.shape)  # the forward's: [B, S, H, D]-contiguous
    lse = q.new_empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    grad = q.new_empty(q.transpose(1, 2).shape).transpose(1, 2)  # the caller's, as a view
    report = ad.explain(q, k, v, out, lse, grad, causal=shape[-1])
    return [c.name for c in report.candidates if c.status in ("supported", "selected")]


def cases():
    if not torch.cuda.is_available():
        return []
    return [pytest.param(s, n, id=f"{n}-{s[4]}") for s in SHAPES for n in takers(s)]


@pytest.mark.parametrize("shape, name", cases())
def test_bhsd_gradients_match_the_oracle_for_every_implementation(shape, name):
    q, k, v = leaves(shape)
    gen = torch.Generator(device="cuda").manual_seed(1)
    grad = torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype)
    out = ad.attention(q, k, v, causal=shape[-1], layout="bhsd", backend=name)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = oracle(
        *(t.detach().transpose(1, 2) for t in (q, k, v)),
        grad.transpose(1, 2),
        causal=shape[-1],
        given_out_dtype=q.dtype,
    )
    tol = tolerance_for(q.dtype)
    floor = 0.1 * max(ref.dq.abs().max(), ref.dk.abs().max(), ref.dv.abs().max()).item()
    for label, got, want, scale in (
        ("out", out, ref.out, 0.0),
        ("dq", dq, ref.dq, floor),
        ("dk", dk, ref.dk, floor),
        ("dv", dv, ref.dv, floor),
    ):
        max_err, rel_l2 = error_metrics(got.transpose(1, 2), want, scale)
        assert max_err <= tol.max_err and rel_l2 <= tol.rel_l2, (label, name, max_err, rel_l2)
