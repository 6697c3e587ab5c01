"""Which head dims FA4's sm_90 kernels compute correctly: the evidence behind the admitted set.

For every head dim D = Dv in ``HEAD_DIMS``, MHA and GQA, FA4's forward and backward are called
directly (past ``supports``) on fresh random bf16 inputs and compared with the float64 oracle:
out, lse, dq, dk and dv, each within the kit's bf16 tolerance. Then the test asserts that the
backend admits the combination exactly when FA4 computed it correctly: an admitted combination
that FA4 gets wrong fails the test, and so does a correct one that the backend still refuses.
Run this file on every FA4 release before widening ``FA4_SPECIFIER``.

The allocator is poisoned with NaN before each kernel call, so an element FA4 leaves unwritten
cannot pass.
"""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_flash_attn_cute import _fa4
from attn_dispatch_flash_attn_cute._support import fa4_problem

import attn_dispatch as ad
from attn_dispatch.backend import make_inputs
from attn_dispatch.testing.oracle import oracle
from attn_dispatch.testing.tolerances import error_metrics, tolerance_for

pytestmark = pytest.mark.gpu

HEAD_DIMS = (8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 104, 128, 160, 192, 256)
# (heads, kv_heads): MHA and a GQA group of 4
GROUPINGS = {"mha": (4, 4), "gqa": (8, 2)}
BATCH, SEQLEN = 2, 512


def _why_not_here() -> str | None:
    if not torch.cuda.is_available() or torch.version.hip:
        return "needs an NVIDIA GPU"
    if ad.detect_arch(torch.device("cuda")).name != "sm_90":
        return "the head-dim evidence is for FA4's sm_90 kernels"
    return fa4_problem()


WHY_NOT = _why_not_here()


def _poison_allocator(nbytes: int) -> None:
    """Fill freed blocks of the caching allocator with NaN so that the next tensors the kernel
    allocates start as NaN wherever it fails to write them."""
    block = torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del block


def _admitted(h: int, hkv: int, d: int) -> bool:
    """Whether ``flash_attn_cute:sm90`` accepts these head dims (forced, so that an opt-in or a
    priority rule does not hide the verdict of its capabilities and ``supports``)."""
    shapes = [(BATCH, SEQLEN, h, d), (BATCH, SEQLEN, hkv, d), (BATCH, SEQLEN, hkv, d)]
    q, k, v = (torch.empty(s, dtype=torch.bfloat16, device="meta") for s in shapes)
    out = torch.empty(BATCH, SEQLEN, h, d, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(BATCH, h, SEQLEN, device="meta")
    report = ad.explain(
        q, k, v, out, lse, out, causal=True, arch="sm_90", backend="flash_attn_cute"
    )
    (cand,) = [c for c in report.candidates if c.name == "flash_attn_cute:sm90"]
    return cand.status != "rejected"


def _fa4_errors(h: int, hkv: int, d: int, seed: int) -> dict[str, float]:
    """rel_l2 of FA4's out, lse, dq, dk and dv against the float64 oracle (causal)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    q, k, v = rnd(BATCH, SEQLEN, h, d), rnd(BATCH, SEQLEN, hkv, d), rnd(BATCH, SEQLEN, hkv, d)
    grad_out = rnd(BATCH, SEQLEN, h, d)
    want = oracle(q, k, v, grad_out, causal=True)
    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    nbytes = 4 * q.numel() * q.element_size() + 16 * q.numel()
    _poison_allocator(nbytes)
    out, lse = _fa4.forward(make_inputs(q, k, v, **flags))
    # The backward runs on FA4's own out and lse, as in training.
    _poison_allocator(nbytes)
    grads = _fa4.backward(make_inputs(q, k, v, out, lse, grad_out, **flags))
    torch.cuda.synchronize()
    got = {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    ref = dict(zip(("out", "lse", "dq", "dk", "dv"), want, strict=True))
    return {name: error_metrics(got[name], ref[name])[1] for name in got}


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
@pytest.mark.parametrize("grouping", sorted(GROUPINGS))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_admitted_exactly_where_fa4_is_correct(d, grouping):
    h, hkv = GROUPINGS[grouping]
    tol = tolerance_for(torch.bfloat16).rel_l2
    errors = _fa4_errors(h, hkv, d, seed=1000 + d)
    correct = all(e <= tol for e in errors.values())
    admitted = _admitted(h, hkv, d)
    table = ", ".join(f"{n}={e:.2e}" for n, e in errors.items())
    print(f"FA4 sm_90 D={d} {grouping}: correct={correct} admitted={admitted} ({table})")
    assert admitted == correct, (
        f"D={d} {grouping}: FA4 {'correct' if correct else 'wrong'} ({table}) but the backend "
        f"{'admits' if admitted else 'refuses'} it"
    )
