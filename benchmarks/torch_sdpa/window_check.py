"""torch_sdpa:flash with sliding windows against the reference, on a CUDA GPU.

Prints the schemas of the ops the backend calls, then for each case: what ``Flash.supports``
says, and for the accepted ones the errors of out/lse (forward) and dq/dk/dv (backward on the
reference's out/lse) against the reference run in float64 on the same bf16 inputs, with the
bf16 tolerances of the conformance kit. Outputs are poisoned by nothing here (the ops allocate
them); the check is the comparison of every element. Until the core passes ``window=`` the
inputs are the core's validated inputs with the window attached by a subclass.

    python benchmarks/torch_sdpa/window_check.py      # about 20 s on one GPU; exit 1 on a failure

Writes ``window_check.json`` under ``$OUT`` when it is set.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from attn_dispatch_reference import attention_backward, attention_forward
from attn_dispatch_torch_sdpa.flash import Flash

import attn_dispatch as ad
from attn_dispatch._inputs import BackwardInputs, build_inputs
from attn_dispatch.testing import BFLOAT16, error_metrics

OPS = (
    "_flash_attention_forward",
    "_flash_attention_backward",
    "_efficient_attention_forward",
    "_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
)


class WithWindow(BackwardInputs):
    __slots__ = ("window", "softcap")


# (name, seqlens_q, seqlens_k (one each: dense), heads, kv_heads, causal, align, window)
CASES = [
    ("square-local", (1024,), (1024,), 8, 2, False, "bottom_right", (64, 64)),
    ("square-local-tl", (1024,), (1024,), 8, 8, False, "top_left", (100, 3)),
    ("sq<sk-local", (300,), (1000,), 8, 2, False, "bottom_right", (50, 20)),
    ("causal-left", (1024,), (1024,), 8, 2, True, "bottom_right", (128, None)),
    ("causal-left-right", (512,), (900,), 4, 1, True, "bottom_right", (33, 7)),
    ("right-only", (700,), (700,), 4, 4, False, "bottom_right", (None, 16)),
    ("diagonal", (256,), (256,), 4, 2, False, "bottom_right", (0, 0)),
    ("empty-rows", (400,), (300,), 4, 2, False, "bottom_right", (10, 5)),
    ("right-beyond-keys", (400,), (300,), 4, 2, False, "bottom_right", (None, 900)),
    ("sq>sk+1-left-only", (400,), (300,), 4, 2, False, "bottom_right", (10, None)),
    ("varlen-same", (100, 257, 3, 64), None, 8, 2, True, "bottom_right", (40, None)),
    ("varlen-distinct", (100, 257, 3, 64), (120, 200, 50, 64), 8, 2, False, "bottom_right", (9, 4)),
    ("varlen-top-left", (100, 257), (120, 200), 8, 2, False, "top_left", (9, 4)),
]


def _inputs(case, gen):
    name, sq, sk, h, hkv, causal, align, window = case
    d = 128

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    varlen = len(sq) > 1
    if varlen:
        same = sk is None
        sk = sq if same else sk
        cu_q = torch.tensor([0, *torch.tensor(sq).cumsum(0).tolist()], dtype=torch.int32).cuda()
        cu_k = (
            cu_q if same else torch.tensor([0, *torch.tensor(sk).cumsum(0).tolist()]).int().cuda()
        )
        q, do = rand(sum(sq), h, d), rand(sum(sq), h, d)
        k, v = rand(sum(sk), hkv, d), rand(sum(sk), hkv, d)
        extra = dict(
            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(sq), max_seqlen_k=max(sk)
        )
    else:
        q, do = rand(2, sq[0], h, d), rand(2, sq[0], h, d)
        k, v = rand(2, sk[0], hkv, d), rand(2, sk[0], hkv, d)
        extra = {}
    flags = dict(causal=causal, causal_align=align, scale=d**-0.5)
    ref_flags = dict(
        flags,
        window=window,
        cu_seqlens_q=extra.get("cu_seqlens_q"),
        cu_seqlens_k=extra.get("cu_seqlens_k"),
    )
    q64, k64, v64 = (t.double() for t in (q, k, v))
    out64, lse64 = attention_forward(q64, k64, v64, **ref_flags)
    out, lse = out64.to(torch.bfloat16), lse64.float()
    ref_grads = attention_backward(
        q64, k64, v64, out.double(), lse.double(), do.double(), **ref_flags
    )
    base = build_inputs(q, k, v, out, lse, do, deterministic=False, **flags, **extra)
    inp = WithWindow(
        q,
        k,
        v,
        out,
        lse,
        do,
        base.cu_seqlens_q,
        base.cu_seqlens_k,
        causal,
        align,
        False,
        base.facts,
    )
    inp.window, inp.softcap = window, None
    return inp, (out64, lse64), ref_grads


def main() -> int:
    out_dir = os.environ.get("OUT")
    print("torch", torch.__version__, torch.cuda.get_device_name())
    for op in OPS:
        print(getattr(torch.ops.aten, op).default._schema)
    arch = ad.detect_arch()
    flash = Flash()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, failed = [], 0
    print(f"\n{'case':<20} {'status':<9} {'out':>8} {'lse':>8} {'dq':>8} {'dk':>8} {'dv':>8}")
    for case in CASES:
        inp, (out64, lse64), grads64 = _inputs(case, gen)
        reasons = flash.supports(inp, arch)
        row = {"case": case[0], "window": case[-1], "reasons": reasons}
        if reasons:
            print(f"{case[0]:<20} rejected  {' | '.join(reasons)[:110]}")
            rows.append(row)
            continue
        out, lse = flash.forward(inp)
        errs = {"out": error_metrics(out, out64)[0]}
        fin = torch.isfinite(lse64)
        lse_ok = torch.equal(torch.isneginf(lse), torch.isneginf(lse64)) and bool(
            (
                (lse[fin].double() - lse64[fin]).abs()
                <= BFLOAT16.lse_atol + BFLOAT16.lse_rtol * lse64[fin].abs()
            ).all()
        )
        errs["lse"] = (lse[fin].double() - lse64[fin]).abs().max().item() if fin.any() else 0.0
        grads = flash.backward(inp)
        floor = 0.1 * max(g.abs().max().item() for g in grads64)
        for name, got, want in zip(("dq", "dk", "dv"), grads, grads64, strict=True):
            errs[name] = error_metrics(got, want, floor)[0]
        ok = lse_ok and all(errs[n] <= BFLOAT16.max_err for n in ("out", "dq", "dk", "dv"))
        failed += not ok
        row.update(errs, ok=ok)
        rows.append(row)
        print(
            f"{case[0]:<20} {'ok' if ok else 'FAILED':<9} "
            + " ".join(f"{errs[n]:8.1e}" for n in ("out", "lse", "dq", "dk", "dv"))
        )
    if out_dir:
        Path(out_dir, "window_check.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"\n{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
