"""First-call (JIT compilation) cost of FlashAttention-4's kernels per variant, and their reuse
across shapes, through the flash_attn_cute backend.

Usage (a Hopper or Blackwell GPU with flash-attn-4 installed):

    python benchmarks/flash_attn_cute/compile_times.py [--seqlens 1024,4096] [--json PATH]

For each variant of the benchmark's seed shapes (bf16, B = 1, D = 128; MHA 8 and GQA 64/8;
causal or not) it calls ``ad.forward`` and ``ad.backward`` forced to ``flash_attn_cute`` at the
first length: the calls that compile are recorded by the backend (kernels added to FA4's
caches, wall time of the call). Then it calls both again at every other length: no new kernel
may appear (exit status 1 if one does), and the time of such a warm call is shown beside the
first one. FA4's import time is measured apart (before the first call).

FA4's disk cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``, directory
``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``; both read when FA4 is imported) turns a later
process's first calls into loads: run this twice with it set to see both costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
from attn_dispatch_flash_attn_cute import _fa4

import attn_dispatch as ad

VARIANTS = [  # (label, heads, kv_heads, causal)
    ("MHA 8", 8, 8, False),
    ("MHA 8 causal", 8, 8, True),
    ("GQA 64/8", 64, 8, False),
    ("GQA 64/8 causal", 64, 8, True),
]
CACHE_ENV = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")


def timed(fn) -> tuple[object, float]:
    """Result and wall seconds of ``fn()``, the device work included."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def run_variant(heads: int, kv_heads: int, causal: bool, seqlens: list[int]) -> dict:
    """First and warm call times of forward and backward; kernels compiled at each length."""
    flags = dict(causal=causal, backend="flash_attn_cute")
    row: dict = {"kernels_at_later_lengths": 0}
    for i, s in enumerate(seqlens):
        q = torch.randn(1, s, heads, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, s, kv_heads, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        before = _fa4.kernel_count()
        args = (q, k, v)
        (out, lse), fwd_s = timed(lambda args=args: ad.forward(*args, **flags))
        after_fwd = _fa4.kernel_count()
        args += (out, lse, out)  # out doubles as grad_out
        _, bwd_s = timed(lambda args=args: ad.backward(*args, **flags))
        after_bwd = _fa4.kernel_count()
        if i == 0:
            row.update(
                first_seqlen=s,
                fwd_first_s=fwd_s,
                fwd_kernels=after_fwd - before,
                bwd_first_s=bwd_s,
                bwd_kernels=after_bwd - after_fwd,
            )
        else:
            row["kernels_at_later_lengths"] += after_bwd - before
            row[f"fwd_warm_s_at_{s}"], row[f"bwd_warm_s_at_{s}"] = fwd_s, bwd_s
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqlens", default="1024,4096", help="first length compiles (default 1024)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    seqlens = [int(x) for x in args.seqlens.split(",")]
    if not torch.cuda.is_available():
        print("compile_times: needs a CUDA GPU", file=sys.stderr)
        return 2
    arch = ad.detect_arch(torch.device("cuda"))
    cache = {name: os.environ.get(name) for name in CACHE_ENV}
    print(f"arch {arch.name}; FA4 disk cache: {cache}")
    _fa4.interface()  # imported here, so that no first call below includes the import
    print(f"flash_attn.cute import: {_fa4.import_seconds():.1f} s")
    rows = []
    for label, h, hkv, causal in VARIANTS:
        row = run_variant(h, hkv, causal, seqlens)
        row["variant"] = label
        rows.append(row)
    print(f"{'variant':<18} {'pass':<9} {'kernels':>7} {'first call s':>12} {'warm call ms':>12}")
    last = seqlens[-1]
    for row in rows:
        for kind in ("fwd", "bwd"):
            warm = row.get(f"{kind}_warm_s_at_{last}")
            warm_ms = f"{warm * 1e3:12.2f}" if warm is not None else f"{'-':>12}"
            print(
                f"{row['variant']:<18} {kind:<9} {row[f'{kind}_kernels']:>7} "
                f"{row[f'{kind}_first_s']:>12.2f} {warm_ms}"
            )
    print("calls that compiled (backend's record):")
    for rec in _fa4.compile_log():
        print(f"  {rec.variant}: {rec.kernels} kernel(s), {rec.seconds:.2f} s")
    recompiled = sum(r["kernels_at_later_lengths"] for r in rows)
    print(f"kernels compiled at later lengths {seqlens[1:]}: {recompiled} (expected 0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "arch": arch.name,
                    "cache": cache,
                    "import_s": _fa4.import_seconds(),
                    "seqlens": seqlens,
                    "rows": rows,
                    "compile_log": [dataclasses.asdict(r) for r in _fa4.compile_log()],
                },
                f,
                indent=1,
            )
    return 1 if recompiled else 0


if __name__ == "__main__":
    sys.exit(main())
