"""Which head dims FA4's sm_90 kernels compute correctly: the evidence behind the release table.

For every head dim D = Dv FA4 takes on sm_90 (multiples of 8 in 8..256), MHA and GQA, FA4's
forward and backward are called directly (past ``supports``) on fresh random bf16 inputs and
compared with the float64 oracle: out, lse, dq, dk and dv, each within the kit's bf16
tolerance. The installed release's row in ``_releases.RELEASES`` must agree: a head dim the
backend admits that FA4 gets wrong fails the test, and so does one the row records as wrong
that FA4 now computes correctly. A correct head dim the row does not mention (not scanned on
that release) passes, and the summary names it: add it to the row.

Run it on every FA4 release before adding or widening its row; a release without a row is
scanned against an empty one (the version gate does not stop the scan). As a script it prints
the row the results make::

    python backends/flash_attn_cute/tests/test_flash_attn_cute_head_dims_gpu.py

The allocator is poisoned with NaN before each kernel call, so an element FA4 leaves unwritten
cannot pass.
"""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_flash_attn_cute import _fa4, _releases, _support

import attn_dispatch as ad
from attn_dispatch.backend import make_inputs
from attn_dispatch.testing.oracle import oracle
from attn_dispatch.testing.tolerances import error_metrics, tolerance_for

pytestmark = pytest.mark.gpu

HEAD_DIMS = tuple(range(8, 257, 8))
# (heads, kv_heads): MHA and a GQA group of 4
GROUPINGS = {"mha": (4, 4), "gqa": (8, 2)}
BATCH, SEQLEN = 2, 512


def _why_not_here() -> str | None:
    if not torch.cuda.is_available() or torch.version.hip:
        return "needs an NVIDIA GPU"
    if ad.detect_arch(torch.device("cuda")).name != "sm_90":
        return "the head-dim evidence is for FA4's sm_90 kernels"
    if _support.installed_version() is None:
        return "flash-attn-4 is not installed"
    return None


def _row() -> _releases.Release:
    """The installed release's row, or an empty one for a release not in the table yet."""
    version = _support.installed_version()
    empty = _releases.Release(version, frozenset(), frozenset(), False, "not tested")
    return _releases.release_for(version) or empty


WHY_NOT = _why_not_here()


def _poison_allocator(nbytes: int) -> None:
    """Fill freed blocks of the caching allocator with NaN so that the next tensors the kernel
    allocates start as NaN wherever it fails to write them."""
    block = torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del block


def _admitted(h: int, hkv: int, d: int) -> bool:
    """Whether the installed release's row admits these head dims on sm_90."""
    return _support.sm90_head_dim_problem(d, d, h != hkv, _row()) is None


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


def _verdict(d: int, grouping: str) -> tuple[bool, str]:
    """Whether FA4 computes D = Dv = ``d`` correctly with ``grouping``, and the errors."""
    h, hkv = GROUPINGS[grouping]
    tol = tolerance_for(torch.bfloat16).rel_l2
    errors = _fa4_errors(h, hkv, d, seed=1000 + d)
    correct = all(e <= tol for e in errors.values())
    return correct, ", ".join(f"{n}={e:.2e}" for n, e in errors.items())


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
@pytest.mark.parametrize("grouping", sorted(GROUPINGS))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_the_release_row_agrees_with_fa4(d, grouping):
    row = _row()
    h, hkv = GROUPINGS[grouping]
    correct, table = _verdict(d, grouping)
    admitted = _admitted(h, hkv, d)
    print(
        f"FA4 {row.version} sm_90 D={d} {grouping}: correct={correct} admitted={admitted} ({table})"
    )
    assert correct or not admitted, f"D={d} {grouping}: FA4 wrong ({table}) but admitted"
    assert not (correct and d in row.sm90_wrong_backward), (
        f"D={d} {grouping}: FA4 {row.version} correct ({table}) but its row records it wrong"
    )


def main() -> None:
    """Scan every head dim, MHA and GQA, and print the row the results make."""
    if WHY_NOT is not None:
        raise SystemExit(WHY_NOT)
    row = _row()
    correct, wrong = set(HEAD_DIMS), set()
    for d in HEAD_DIMS:
        for grouping in sorted(GROUPINGS):
            ok, table = _verdict(d, grouping)
            print(f"D={d:3d} {grouping}: {'correct' if ok else 'WRONG  '} {table}", flush=True)
            if not ok:
                correct.discard(d)
                wrong.add(d)
    print(f"\nflash-attn-4 {row.version} on {torch.cuda.get_device_name()}:")
    print(f"  sm90_head_dims={sorted(correct)}")
    print(f"  sm90_wrong_backward={sorted(wrong)}")
    print(f"  the table's row: admitted {sorted(row.sm90_head_dims)}")


if __name__ == "__main__":
    main()
