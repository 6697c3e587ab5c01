"""Attention sinks on one GPU: what they cost each implementation that runs them.

bf16, B=1, GQA 64/8, D=64 (GPT-OSS's attention), S = 4K, 8K, 16K; causal, and causal with the
sliding window of GPT-OSS's sliding layers (window (127, 0)). For every implementation that
declares sinks (triton:fused, triton:fused_atomic, flash_attn_cute:sm90 where FA4 is
installed), forced through ``attn_dispatch``: the forward, and the backward including dsinks,
with and without sinks (medians of ``triton.testing.do_bench``), and the overhead ratio. Each
sink call's output, lse and gradients (sinks included) are first compared with the reference
backend's at S=4K (relative Frobenius error against float32 math; bf16 tolerance 2e-2).

Usage (a few minutes on an H200)::

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_sinks.py [--out DIR] [--lengths 4096,8192]

Exit status 1 when a check fails. ``--out`` (default ``$OUT`` when set) gets ``sinks.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import attn_dispatch as ad

IMPLEMENTATIONS = ("triton:fused", "triton:fused_atomic", "flash_attn_cute:sm90")
MASKS = {"causal": None, "causal+window(127,0)": (127, 0)}
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64
TOL = 2e-2


def log(*args) -> None:
    print(*args, flush=True)


def inputs(seqlen: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=dtype)

    q = rand(1, seqlen, HEADS, HEAD_DIM)
    k, v = rand(1, seqlen, KV_HEADS, HEAD_DIM), rand(1, seqlen, KV_HEADS, HEAD_DIM)
    do = rand(1, seqlen, HEADS, HEAD_DIM)
    sinks = rand(HEADS, dtype=torch.float32)
    return q, k, v, do, sinks


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(impl: str, window, seqlen: int) -> dict:
    """Errors of ``impl``'s sink call against the reference backend (float32 math on the same
    bf16 inputs: out, lse, dq, dk, dv, dsinks)."""
    q, k, v, do, sinks = inputs(seqlen, seed=1)
    flags = dict(causal=True, window=window, sinks=sinks)
    out, lse = ad.forward(q, k, v, **flags, backend=impl)
    grads = ad.backward(q, k, v, out, lse, do, **flags, backend=impl)
    f32 = [t.float() for t in (q, k, v, do)]
    ref_out, ref_lse = ad.forward(*f32[:3], **flags, backend="reference")
    ref = ad.backward(*f32[:3], ref_out, ref_lse, f32[3], **flags, backend="reference")
    errors = {"out": rel(out, ref_out), "lse": rel(lse, ref_lse)}
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        errors[name] = rel(got, want)
    errors["dsinks"] = rel(grads.dsinks, ref.dsinks)
    return errors


def timings(impl: str, window, seqlen: int) -> dict:
    from triton.testing import do_bench

    q, k, v, do, sinks = inputs(seqlen)
    result = {}
    for label, s in (("plain", None), ("sinks", sinks)):
        flags = dict(causal=True, window=window, sinks=s, backend=impl)
        out, lse = ad.forward(q, k, v, **flags)
        result[f"fwd_{label}"] = do_bench(lambda f=flags: ad.forward(q, k, v, **f))
        result[f"bwd_{label}"] = do_bench(
            lambda f=flags, o=out, m=lse: ad.backward(q, k, v, o, m, do, **f)
        )
    result["fwd_overhead"] = result["fwd_sinks"] / result["fwd_plain"] - 1
    result["bwd_overhead"] = result["bwd_sinks"] / result["bwd_plain"] - 1
    return result


def accepts(impl: str, window) -> bool:
    q, k, v, do, sinks = inputs(256)
    try:
        report = ad.explain(q, k, v, causal=True, window=window, sinks=sinks, backend=impl)
    except ad.UnknownBackendError:  # its backend is not installed here
        return False
    return report.selected == impl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--lengths", default="4096,8192,16384")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    lengths = [int(x) for x in args.lengths.split(",")]
    results, failed = {}, False
    log(
        "| implementation | mask | S | fwd ms | fwd+sinks ms | overhead | bwd ms | bwd+sinks ms |"
        " overhead |"
    )
    log("|---|---|---|---|---|---|---|---|---|")
    for impl in IMPLEMENTATIONS:
        for mask, window in MASKS.items():
            if not accepts(impl, window):
                log(f"{impl} {mask}: not run (the implementation refuses the call here)")
                continue
            errors = check(impl, window, lengths[0])
            bad = {n: e for n, e in errors.items() if not e <= TOL}
            failed |= bool(bad)
            log(f"{impl} {mask}: errors {errors}" + (f" FAILED {bad}" if bad else " ok"))
            for seqlen in lengths:
                t = timings(impl, window, seqlen)
                results[f"{impl} {mask} S={seqlen}"] = {"errors": errors, **t}
                log(
                    f"| {impl} | {mask} | {seqlen} | {t['fwd_plain']:.3f} | {t['fwd_sinks']:.3f}"
                    f" | {t['fwd_overhead']:+.1%} | {t['bwd_plain']:.3f} | {t['bwd_sinks']:.3f}"
                    f" | {t['bwd_overhead']:+.1%} |"
                )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "sinks.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
