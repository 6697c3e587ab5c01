"""Sliding window and soft cap on one GPU: correctness, then speed, every implementation.

1. correctness at B=1, GQA 16/2, D=128, S=9000 (the tuning table's long class, so the same
   compiled kernels as the timing) against a float32 masked softmax in torch (the band from
   the contract, ``c * tanh(s / c)`` on the scores) over one GQA group: the triton kernels
   called directly (both backward designs, with and without the Gluon sm_90 kernels; outputs
   NaN-poisoned) and the other implementations forced through ``attn_dispatch`` where they
   accept the call (``torch_sdpa:flash``, ``flash_attn_cute:sm90`` when FA4 is installed);
2. bf16, B=1, GQA 64/8, D=128, S=16K, medians of ``triton.testing.do_bench``: forward and
   backward of every implementation for no mask, causal, window (4095, 0), causal + softcap 30
   and window (4095, 0) + softcap 30, the automatic choice for each; then the ratios the
   variants are judged by: window against causal (the ideal by visible pairs is 2.29 at 16K),
   softcap's cost over the same call without it, triton's windowed backward against FA4's.

Usage (about 3-4 minutes on an H200, most of it compiling)::

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_variants.py [--out DIR] [--no-check]

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

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing import visible_mask

VARIANTS = {  # name: (causal, window, softcap)
    "full": (False, None, None),
    "causal": (True, None, None),
    "window(4095,0)": (False, (4095, 0), None),
    "causal+softcap30": (True, None, 30.0),
    "window+softcap30": (False, (4095, 0), 30.0),
}
# backward columns: triton's two designs (the tuning table: Gluon kernels on sm_90), the same
# with GLUON removed (the portable tl kernels), and the other implementations, forced
TRITON = {"fused": False, "fused_atomic": True}
FORCED = ("torch_sdpa:flash", "flash_attn_cute:sm90")
TOL = 2e-2  # relative Frobenius error, bf16 against a float32 reference
LSE_TOL = 2e-2


def log(*args) -> None:
    print(*args, flush=True)


def visible(sq: int, sk: int, causal: bool, window, device) -> torch.Tensor:
    """[Sq, Sk] bool from the contract (top-left diagonal d_i = i here: Sq == Sk)."""
    return visible_mask(sq, sk, causal, "top_left", device=device, window=window)


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


def tl_only_config(q, k, causal: bool) -> dict:
    """The tuning table's backward configs for this shape with ``GLUON`` removed."""
    from attn_dispatch_triton.tuning import get_backward_config

    group = q.shape[2] // k.shape[2]
    table = get_backward_config(q.device, q.shape[-1], causal, group, k.shape[1])
    return {name: {x: y for x, y in c.items() if x != "GLUON"} for name, c in table.items()}


FORCED_COLUMNS = True  # --triton-only turns the forced implementations' columns off


def columns(q, k, lse, flags: dict) -> dict:
    """Backward column name -> (kind, argument): triton designs (``(atomic_dq, config or
    None)``) and the forced implementations that accept the call (their name)."""
    limited = flags["causal"] or flags["window"] is not None
    cols = {}
    for design, atomic in TRITON.items():
        cols[design] = ("triton", (atomic, None))
        cols[f"{design} (tl)"] = ("triton", (atomic, tl_only_config(q, k, limited)))
    if not FORCED_COLUMNS:
        return cols
    report = ad.explain(q, k, k, q, lse, q, **flags)
    verdict = {c.name: c for c in report.candidates}
    for name in FORCED:  # (forcing runs an opt-in implementation too)
        if name in verdict and verdict[name].status in ("supported", "selected", "opt-in"):
            cols[name] = ("forced", name)
    return cols


def triton_flags(flags: dict) -> dict:
    """The triton kernels' keywords for a call's ``flags`` (top-left: Sq == Sk here; every
    window is narrower than the sequences, so ``Band.of`` gives the inputs' band)."""
    band = adb.Band.of(flags["window"], flags["causal"], "top_left")
    return dict(band=band, scale=flags["scale"], softcap=flags["softcap"])


def triton_call(q, k, v, do, flags, atomic, config, out=None, lse=None):
    """Forward (unless ``out`` / ``lse`` are given) and backward through the triton kernels,
    into NaN-poisoned buffers; returns out, lse, (dq, dk, dv)."""
    from attn_dispatch_triton.backward import attention_backward
    from attn_dispatch_triton.forward import attention_forward

    flags = triton_flags(flags)
    if out is None:
        out = torch.full_like(q, float("nan"))
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
        attention_forward(q, k, v, **flags, out=out, lse=lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    dq, dk, dv = grads
    attention_backward(
        q, k, v, out, lse, do, **flags, dq=dq, dk=dk, dv=dv, atomic_dq=atomic, config=config
    )
    return out, lse, grads


def forced_call(q, k, v, do, flags, name):
    out, lse = ad.forward(q, k, v, **flags, backend=name)
    grads = ad.backward(q, k, v, out, lse, do, **flags, backend=name)
    return out, lse, list(grads)


def check(device) -> list[dict]:
    """Every variant and column, one GQA group against the float32 reference."""
    torch.manual_seed(0)
    s, h, hk, d = 9000, 16, 2, 128
    scale = 1 / math.sqrt(d)
    q, k, v, do = (
        torch.randn(1, s, n, d, device=device, dtype=torch.bfloat16) for n in (h, hk, hk, h)
    )
    g = h // hk
    rows = []
    for name, (causal, window, cap) in VARIANTS.items():
        ref = reference(
            q[0, :, :g], k[0, :, 0], v[0, :, 0], do[0, :, :g], scale, causal, window, cap
        )
        flags = dict(causal=causal, window=window, softcap=cap, scale=scale)
        lse_like = torch.zeros(1, h, s, device=device)
        for col, (kind, arg) in columns(q, k, lse_like, flags).items():
            if kind == "triton":
                out, lse, (dq, dk, dv) = triton_call(q, k, v, do, flags, *arg)
            else:
                out, lse, (dq, dk, dv) = forced_call(q, k, v, do, flags, arg)
            errs = dict(
                out=rel(out[0, :, :g], ref[0]),
                lse=(lse[0, :g].float() - ref[1]).abs().max().item(),
                dq=rel(dq[0, :, :g], ref[2]),
                dk=rel(dk[0, :, 0], ref[3]),
                dv=rel(dv[0, :, 0], ref[4]),
            )
            ok = all(errs[n] <= TOL for n in ("out", "dq", "dk", "dv")) and errs["lse"] <= LSE_TOL
            rows.append(dict(variant=name, column=col, ok=ok, **errs))
            log(
                f"check {name:17s} {col:22s} "
                + " ".join(f"{n}={e:.2e}" for n, e in errs.items())
                + ("  ok" if ok else "  FAIL")
            )
        del ref
        torch.cuda.empty_cache()
    return rows


def timed(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def visible_pairs(s: int, causal: bool, window) -> int:
    band = adb.Band.of(window, causal, "top_left")
    left, right = band.left, band.right
    total = 0
    for i in range(s):
        lo = 0 if left is None else max(0, i - left)
        hi = s - 1 if right is None else min(s - 1, i + right)
        total += max(0, hi - lo + 1)
    return total


def time_triton_backward(q, k, v, out, lse, do, tflags: dict, atomic: bool, config) -> float:
    from attn_dispatch_triton.backward import attention_backward

    return timed(
        lambda: attention_backward(q, k, v, out, lse, do, **tflags, atomic_dq=atomic, config=config)
    )


def time_forced(q, k, v, do, flags: dict, name: str) -> tuple[float, float]:
    """Forward and backward medians (ms) of implementation ``name``, forced."""
    fwd = timed(lambda: ad.forward(q, k, v, **flags, backend=name))
    out, lse = ad.forward(q, k, v, **flags, backend=name)
    return fwd, timed(lambda: ad.backward(q, k, v, out, lse, do, **flags, backend=name))


def time_variant(q, k, v, do, flags: dict) -> dict:
    """Forward and backward medians (ms) of every column; the automatic choice."""
    from attn_dispatch_triton.forward import attention_forward

    tflags = triton_flags(flags)
    out, lse = attention_forward(q, k, v, **tflags)
    fwd = {"triton": timed(lambda: attention_forward(q, k, v, **tflags))}
    bwd = {}
    for col, (kind, arg) in columns(q, k, lse, flags).items():
        if kind == "triton":
            bwd[col] = time_triton_backward(q, k, v, out, lse, do, tflags, *arg)
        else:
            fwd[arg], bwd[arg] = time_forced(q, k, v, do, flags, arg)
    auto = ad.explain(q, k, v, out, lse, do, **flags).selected
    return dict(fwd_ms=fwd, bwd_ms=bwd, auto=auto)


def speed(device) -> list[dict]:
    torch.manual_seed(1)
    s, h, hk, d = 16384, 64, 8, 128
    q, k, v, do = (
        torch.randn(1, s, n, d, device=device, dtype=torch.bfloat16) for n in (h, hk, hk, h)
    )
    rows = []
    for name, (causal, window, cap) in VARIANTS.items():
        flags = dict(causal=causal, window=window, softcap=cap, scale=1 / math.sqrt(d))
        row = dict(variant=name, pairs=visible_pairs(s, causal, window))
        row.update(time_variant(q, k, v, do, flags))
        rows.append(row)
        log(
            f"time  {name:17s} auto={row['auto']}  fwd "
            + " ".join(f"{c}={t:.3f}" for c, t in row["fwd_ms"].items())
            + "  bwd "
            + " ".join(f"{c}={t:.3f}" for c, t in row["bwd_ms"].items())
        )
    return rows


def best_triton(row: dict) -> tuple[str, float]:
    """The faster triton design's backward (the table's kernels) and its time."""
    return min(((c, row["bwd_ms"][c]) for c in TRITON), key=lambda x: x[1])


def summary(rows: list[dict]) -> None:
    by = {r["variant"]: r for r in rows}
    cols = sorted({c for r in rows for c in r["bwd_ms"]}, key=list(by["full"]["bwd_ms"]).index)
    log("\nbf16 B=1 GQA 64/8 D=128 S=16K, backward ms (forward ms: triton's)")
    log(f"{'variant':17s} {'fwd':>7s} " + " ".join(f"{c[:14]:>14s}" for c in cols) + "  auto")
    for r in rows:
        cells = " ".join(f"{r['bwd_ms'].get(c, float('nan')):14.3f}" for c in cols)
        log(f"{r['variant']:17s} {r['fwd_ms']['triton']:7.3f} {cells}  {r['auto']}")

    def total(r):
        return r["fwd_ms"]["triton"] + best_triton(r)[1]

    c, w = by["causal"], by["window(4095,0)"]
    log(
        f"window (4095,0) vs causal, triton fwd + best bwd: {total(c) / total(w):.2f}x "
        f"(ideal by visible pairs {c['pairs'] / w['pairs']:.2f}x; vs full "
        f"{total(by['full']) / total(w):.2f}x)"
    )
    for capped, plain in (("causal+softcap30", "causal"), ("window+softcap30", "window(4095,0)")):
        a, b = by[capped], by[plain]
        log(
            f"softcap cost, {plain}: fwd {a['fwd_ms']['triton'] / b['fwd_ms']['triton'] - 1:+.1%}"
            f"  best bwd {best_triton(a)[1] / best_triton(b)[1] - 1:+.1%}"
            f"  fwd + bwd {total(a) / total(b) - 1:+.1%}"
        )
    for name in ("window(4095,0)", "causal", "causal+softcap30", "window+softcap30"):
        fa4 = by[name]["bwd_ms"].get("flash_attn_cute:sm90")
        if fa4:
            design, t = best_triton(by[name])
            log(f"{name}: triton:{design} bwd / FA4 bwd = {t / fa4:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--no-check", action="store_true", help="time only (skip the checks)")
    parser.add_argument("--triton-only", action="store_true", help="no forced implementations")
    args = parser.parse_args()
    global FORCED_COLUMNS
    FORCED_COLUMNS = not args.triton_only
    device = torch.device("cuda")
    log(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    t0 = time.time()
    checks = [] if args.no_check else check(device)
    log(f"checks done in {time.time() - t0:.0f} s")
    rows = speed(device)
    summary(rows)
    log(f"total {time.time() - t0:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "variants_triton.json" if args.triton_only else "variants.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(dict(checks=checks, timings=rows), f, indent=1)
    return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
