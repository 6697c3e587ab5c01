"""The split-partial sum launch (``_bwd_split_sum``) alone: elements per program and warps.

For the dK / dV of GQA 64/8 (8 kv heads, D=128, bf16 outputs) at 4K and 8K keys, with 4 fp32
partials (a split GQA group) and with 1 (``SPLIT_ADD``: the launch only casts), this times the
kernel with each ``BLOCK`` / ``num_warps`` pair (``triton.testing.do_bench`` medians, µs; GB/s
counts the bytes read and written once), after checking its outputs against torch's sum.

    PYTHONUNBUFFERED=1 python backends/triton/bench_split_sum.py
"""

from __future__ import annotations

import sys

import torch
import triton
from attn_dispatch_triton._bwd_split_sum import _attn_bwd_split_sum
from triton.testing import do_bench

BLOCKS = (1024, 2048, 4096, 8192)
WARPS = (4, 8)


def bench(s: int, split: int, block: int, warps: int) -> tuple[float, float]:
    n = 8 * s * 128  # one of dK / dV: [1, s, 8, 128]
    blocks_k = triton.cdiv(n, block)
    n_tot = blocks_k * block + n
    part = torch.randn(split, n_tot, device="cuda")
    dk = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    dv = torch.empty_like(dk)

    def run():
        _attn_bwd_split_sum[(blocks_k + triton.cdiv(n, block),)](
            part, dk, dv, n, n, blocks_k, n_tot, SPLIT=split, BLOCK=block, num_warps=warps,
            num_stages=1)

    run()
    want_k = part[:, :n].sum(0).to(torch.bfloat16)
    want_v = part[:, blocks_k * block:].sum(0).to(torch.bfloat16)
    for got, want in ((dk, want_k), (dv, want_v)):  # (bf16 rounding of two fp32 orders)
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    us = do_bench(run, warmup=10, rep=100) * 1e3
    return us, (split * 2 * n * 4 + 2 * n * 2) / us / 1e3


def main() -> int:
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for s in (4096, 8192):
        for split in (4, 1):
            cells = []
            for block in BLOCKS:
                for warps in WARPS:
                    us, gbs = bench(s, split, block, warps)
                    cells.append(f"{block}/{warps}w {us:6.1f} µs ({gbs:4.0f} GB/s)")
            print(f"{s // 1024}K keys, {split} partial(s): " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
