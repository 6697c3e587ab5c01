r"""Backward, GQA group split: sum the fp32 dK/dV partials and cast, in one launch.

When ``_bwd_dkdv`` splits a kv head's GQA group over ``SPLIT`` programs, each writes an fp32
partial dK and dV into one scratch buffer laid out ``[SPLIT, n_k_pad + n_v]`` (dK's ``n_k``
elements first, padded to a whole number of blocks, then dV's ``n_v``). This kernel adds the
partials in a fixed order (``0, 1, ..., SPLIT-1``, fp32) and writes both contiguous outputs in
their dtype: one launch instead of two reductions and two casting copies, and still bitwise
reproducible. Programs ``[0, blocks_k)`` write dK, the rest dV. With ``SPLIT = 1`` it only
casts: the launcher's case for the Gluon fused-atomic kernel with ``SPLIT_ADD``, whose slices
add into one buffer by atomics (in arrival order, so not bitwise reproducible).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_k", "n_v", "blocks_k", "stride_split"])
def _attn_bwd_split_sum(
    PART, DK, DV, n_k, n_v, blocks_k, stride_split, SPLIT: tl.constexpr, BLOCK: tl.constexpr
):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    step = stride_split.to(tl.int64)
    if pid < blocks_k:
        start = pid.to(tl.int64) * BLOCK
        mask = start + offs < n_k
        acc = tl.load(PART + start + offs, mask=mask, other=0.0)
        for s in tl.static_range(1, SPLIT):
            acc += tl.load(PART + s * step + start + offs, mask=mask, other=0.0)
        tl.store(DK + start + offs, acc.to(DK.dtype.element_ty), mask=mask)
    else:
        start = (pid - blocks_k).to(tl.int64) * BLOCK
        base = blocks_k.to(tl.int64) * BLOCK + start
        mask = start + offs < n_v
        acc = tl.load(PART + base + offs, mask=mask, other=0.0)
        for s in tl.static_range(1, SPLIT):
            acc += tl.load(PART + s * step + base + offs, mask=mask, other=0.0)
        tl.store(DV + start + offs, acc.to(DV.dtype.element_ty), mask=mask)
