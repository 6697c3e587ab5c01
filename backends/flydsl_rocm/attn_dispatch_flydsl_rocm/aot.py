"""Ahead-of-time build: ``python -m attn_dispatch_flydsl_rocm.aot --arch gfx950 --head-dim 128
--dtype bf16 [--causal] [--gqa R] [--varlen] [--variant V] --out DIR``.

Writes each kernel's code object (``.hsaco``, when an lld is available) and ISA (``.s``) to DIR
and prints one JSON object per kernel: name, arch, VGPRs, AGPRs, LDS bytes, scratch bytes, MFMA
counts by mnemonic, ``ds_read_b64_tr_b16`` count and buffer atomic counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._spec import specs_for

DEFAULT_VARIANT = {"gfx950": "gfx950_fused", "gfx942": "gfx942_mfma"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attn_dispatch_flydsl_rocm.aot")
    p.add_argument("--arch", required=True, choices=["gfx942", "gfx950"])
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--dtype", required=True, choices=["bf16", "f16"])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--gqa", type=int, default=1, help="query heads per kv head")
    p.add_argument("--varlen", action="store_true")
    p.add_argument(
        "--variant",
        choices=["gfx950_fused", "gfx942_mfma"],
        help="main kernel (default: the arch's own)",
    )
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    variant = a.variant or DEFAULT_VARIANT[a.arch]
    if variant == "gfx950_fused" and a.arch != "gfx950":
        p.error("--variant gfx950_fused needs --arch gfx950")
    if not (32 <= a.head_dim <= 256 and a.head_dim % 32 == 0):
        p.error(f"--head-dim {a.head_dim} is not a multiple of 32 in 32..256")
    from ._toolchain import compile_in_subprocess

    status = 0
    for spec in specs_for(variant, a.arch, a.dtype, a.head_dim, a.causal, a.varlen, a.gqa):
        try:
            st = compile_in_subprocess(spec, out_dir=a.out)
        except RuntimeError as exc:
            print(json.dumps({"kernel": spec.key(), "arch": a.arch, "error": str(exc)}))
            status = 1
            continue
        print(
            json.dumps(
                {
                    "kernel": st["key"],
                    "symbol": st["kernel"],
                    "arch": a.arch,
                    "flydsl": st["flydsl"],
                    "vgprs": st["vgprs"],
                    "agprs": st["agprs"],
                    "lds_bytes": st["lds_bytes"],
                    "scratch_bytes": st["scratch_bytes"],
                    "mfma": st["mfma"],
                    "ds_read_b64_tr_b16": st["ds_read_b64_tr_b16"],
                    "buffer_atomics": st["buffer_atomics"],
                    "code_object": str(a.out / f"{st['key']}.hsaco") if st["code_object"] else None,
                    "isa": str(a.out / f"{st['key']}.s"),
                }
            )
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
