"""Sliding window and soft cap in the triton kernels on one GPU: correctness, then speed.

1. correctness of every timed variant (forward ``out``/``lse``, both backward designs) at
   B=1, GQA 16/2, D=128, S=9000 (the tuning table's long class, so the same compiled kernels
   as the timing) against a float32 masked softmax in torch (the band from the contract,
   ``c * tanh(s / c)`` on the scores) over one GQA group; outputs poisoned with NaN;
2. bf16, B=1, GQA 64/8, D=128, S=16K: forward, backward (``triton:fused``'s split design) and
   backward (``triton:fused_atomic``'s design) for no mask, causal, causal with the Gluon sm_90
   kernels off (``causal-tl``: the tl kernels windowed and capped calls run), window
   (4095, 0), causal + softcap 30 and window (4095, 0) + softcap 30; then the ratios the issue
   asks for (window against causal; softcap's cost over causal, and over ``causal-tl``) and
   the ideal ratio of visible pairs (causal / window: 2.29 at 16K).

Usage (estimated 1-2 minutes on an H200, most of it compiling; not yet run)::

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_variants.py [--out DIR]

Exit status 1 when a correctness check fails. ``--out`` (default ``$OUT`` when set) gets
``variants.json`` with every number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

VARIANTS = {  # name: (causal, window, softcap)
    "full": (False, None, None),
    "causal": (True, None, None),
    # the same, with the Gluon sm_90 backward kernels turned off: the tl kernels that run
    # windowed and soft-capped calls (their fair baseline)
    "causal-tl": (True, None, None),
    "window(4095,0)": (False, (4095, 0), None),
    "causal+softcap30": (True, None, 30.0),
    "window+softcap30": (False, (4095, 0), 30.0),
}
TOL = 2e-2  # relative Frobenius error, bf16 against a float32 reference
LSE_TOL = 2e-2


def log(*args) -> None:
    print(*args, flush=True)


def visible(sq: int, sk: int, causal: bool, window, device) -> torch.Tensor:
    """[Sq, Sk] bool from the contract (top-left diagonal d_i = i here: Sq == Sk)."""
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left is not None:
        ok &= j >= i - left
    if right is not None:
        ok &= j <= i + right
    return ok


def reference(q, k, v, do, scale, causal, window, softcap):
    """float32 masked softmax attention of q [S,G,D] against one kv head k, v [S,D]; returns
    out, lse [G,S], dq, dk, dv."""
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    s = torch.einsum("igd,jd->gij", q, k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(q.shape[0], k.shape[0], causal, window, q.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("gij,jd->igd", torch.exp(s - lse[..., None]), v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do.float())
    return out.detach(), lse.detach(), dq, dk, dv


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if torch.isnan(a).any():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run(q, k, v, scale, causal, window, softcap, atomic: bool, do, config=None):
    from attn_dispatch_triton.backward import attention_backward
    from attn_dispatch_triton.forward import attention_forward

    flags = dict(causal=causal, bottom_right=False, scale=scale, window=window, softcap=softcap)
    out = torch.full((*q.shape[:-1], v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    attention_forward(q, k, v, **flags, out=out, lse=lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    attention_backward(
        q,
        k,
        v,
        out,
        lse,
        do,
        **flags,
        dq=grads[0],
        dk=grads[1],
        dv=grads[2],
        atomic_dq=atomic,
        config=config,
    )
    return out, lse, grads


def check(device) -> list[dict]:
    """Every variant, both backward designs, one GQA group against the float32 reference."""
    torch.manual_seed(0)
    s, h, hk, d = 9000, 16, 2, 128
    scale = 1 / math.sqrt(d)
    q = torch.randn(1, s, h, d, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, s, hk, d, device=device, dtype=torch.bfloat16)
    v = torch.randn(1, s, hk, d, device=device, dtype=torch.bfloat16)
    do = torch.randn(1, s, h, d, device=device, dtype=torch.bfloat16)
    g = h // hk
    rows = []
    for name, (causal, window, cap) in VARIANTS.items():
        ref = reference(
            q[0, :, :g], k[0, :, 0], v[0, :, 0], do[0, :, :g], scale, causal, window, cap
        )
        for atomic in (False, True):
            config = tl_only_config(q, k, causal) if name == "causal-tl" else None
            out, lse, (dq, dk, dv) = run(q, k, v, scale, causal, window, cap, atomic, do, config)
            errs = dict(
                out=rel(out[0, :, :g], ref[0]),
                lse=(lse[0, :g] - ref[1]).abs().max().item(),
                dq=rel(dq[0, :, :g], ref[2]),
                dk=rel(dk[0, :, 0], ref[3]),
                dv=rel(dv[0, :, 0], ref[4]),
            )
            ok = all(errs[n] <= TOL for n in ("out", "dq", "dk", "dv")) and errs["lse"] <= LSE_TOL
            rows.append(dict(variant=name, atomic=atomic, ok=ok, **errs))
            log(
                f"check {name:18s} {'atomic' if atomic else 'split ':6s} "
                + " ".join(f"{n}={e:.2e}" for n, e in errs.items())
                + ("  ok" if ok else "  FAIL")
            )
        del ref
        torch.cuda.empty_cache()
    return rows


def timed(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=300)


def visible_pairs(s: int, causal: bool, window) -> int:
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    total = 0
    for i in range(s):
        lo = 0 if left is None else max(0, i - left)
        hi = s - 1 if right is None else min(s - 1, i + right)
        total += max(0, hi - lo + 1)
    return total


def tl_only_config(q, k, causal: bool) -> dict:
    """The tuning table's backward configs for this shape with ``GLUON`` removed."""
    from attn_dispatch_triton.tuning import get_backward_config

    group = q.shape[2] // k.shape[2]
    table = get_backward_config(q.device, q.shape[-1], causal, group, k.shape[1])
    return {name: {x: y for x, y in c.items() if x != "GLUON"} for name, c in table.items()}


def time_variant(q, k, v, out, lse, do, flags: dict) -> dict:
    from attn_dispatch_triton.backward import attention_backward
    from attn_dispatch_triton.forward import attention_forward

    return dict(
        fwd_ms=timed(lambda: attention_forward(q, k, v, **flags)),
        bwd_ms=timed(lambda: attention_backward(q, k, v, out, lse, do, **flags)),
        bwd_atomic_ms=timed(
            lambda: attention_backward(q, k, v, out, lse, do, **flags, atomic_dq=True)
        ),
    )


def speed(device) -> list[dict]:
    from attn_dispatch_triton.forward import attention_forward

    torch.manual_seed(1)
    s, h, hk, d = 16384, 64, 8, 128
    scale = 1 / math.sqrt(d)
    q = torch.randn(1, s, h, d, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, s, hk, d, device=device, dtype=torch.bfloat16)
    v = torch.randn(1, s, hk, d, device=device, dtype=torch.bfloat16)
    do = torch.randn_like(q)
    rows = []
    for name, (causal, window, cap) in VARIANTS.items():
        flags = dict(causal=causal, bottom_right=False, scale=scale, window=window, softcap=cap)
        out, lse = attention_forward(q, k, v, **flags)
        if name == "causal-tl":
            flags["config"] = tl_only_config(q, k, causal)
        row = dict(variant=name, pairs=visible_pairs(s, causal, window))
        row.update(time_variant(q, k, v, out, lse, do, flags))
        rows.append(row)
        log(
            f"time  {name:18s} fwd {row['fwd_ms']:8.3f} ms  bwd {row['bwd_ms']:8.3f} ms  "
            f"bwd-atomic {row['bwd_atomic_ms']:8.3f} ms"
        )
    return rows


def table(rows: list[dict]) -> None:
    by = {r["variant"]: r for r in rows}
    log("\nbf16 B=1 GQA 64/8 D=128 S=16K (ms; ratio = causal / variant, >1 faster)")
    log(
        f"{'variant':18s} {'fwd':>8s} {'bwd':>8s} {'bwd-at':>8s} {'f+b':>8s} "
        f"{'ratio':>6s} {'ideal':>6s}"
    )
    c = by["causal"]
    for r in rows:
        total = r["fwd_ms"] + r["bwd_ms"]
        ratio = (c["fwd_ms"] + c["bwd_ms"]) / total
        ideal = c["pairs"] / r["pairs"]
        log(
            f"{r['variant']:18s} {r['fwd_ms']:8.3f} {r['bwd_ms']:8.3f} {r['bwd_atomic_ms']:8.3f} "
            f"{total:8.3f} {ratio:6.2f} {ideal:6.2f}"
        )
    w, sc, ctl = by["window(4095,0)"], by["causal+softcap30"], by["causal-tl"]
    for part in ("fwd_ms", "bwd_ms", "bwd_atomic_ms"):
        log(
            f"{part[:-3]:11s} window speed-up over causal {c[part] / w[part]:5.2f}x "
            f"(tl causal {ctl[part] / w[part]:5.2f}x, full {by['full'][part] / w[part]:5.2f}x); "
            f"softcap cost over causal {(sc[part] / c[part] - 1) * 100:+5.1f}% "
            f"(tl causal {(sc[part] / ctl[part] - 1) * 100:+5.1f}%)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "backends", "triton"))
    device = torch.device("cuda")
    log(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    t0 = time.time()
    checks = check(device)
    log(f"checks done in {time.time() - t0:.0f} s")
    rows = speed(device)
    table(rows)
    log(f"total {time.time() - t0:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "variants.json"), "w") as f:
            json.dump(dict(checks=checks, timings=rows), f, indent=1)
    return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
