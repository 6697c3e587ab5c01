"""The fused-atomic backward (``triton:fused_atomic``) against the split one, FA2 and cuDNN.

One GPU run, in order (table printed last, everything written under ``--out``):

1. environment and the bf16 matmul ceiling (8192^3, random data);
2. compiles every configuration in parallel worker processes (fills Triton's disk cache);
3. correctness of the fused-atomic backward at every seed shape (our forward, outputs poisoned
   with NaN, float64 oracle on the GPU for the first 8 query heads: a whole GQA group) and at
   small odd shapes (varlen with empty sequences, bottom-right causal with Sq != Sk,
   D=32/64/96/256, f16, MQA);
4. per seed shape: the split backward (tuning table), the fused-atomic backward with each
   candidate configuration (each one's gradients compared with the split result), FA2 and cuDNN
   (PyTorch SDPA), same inputs; at the largest GQA shape also the dK/dV kernel alone with and
   without the atomic dQ (what the atomics cost);
5. the fastest candidate per shape class, in the on-disk tuning cache format (key ``dkdvq``).

Usage::

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_atomic.py --out $OUT
    python benchmarks/triton/bench_atomic.py --smoke   # CPU: interpreter, tiny shapes, no timing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

from attn_dispatch import backend as adb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_kernels import (  # noqa: E402
    EXTRA,
    FWD,
    PRE,
    SEED_SHAPES,
    _extra_job,
    bench,
    bwd_flops,
    cfg,
    check_against_oracle,
    checked_backward_args,
    checked_problem,
    compile_in_workers,
    gpu_environment,
    log,
    make_problem,
    rel,
    run_extra_checks,
    sdpa_backward_ms,
)

TMA = {"TMA": 1}  # dQ tiles added by TMA bulk reductions (cp.reduce.async.bulk) on Hopper
ATOMIC_CANDIDATES = [
    cfg(64, 128, 8, 3),
    {**cfg(64, 128, 8, 2), **TMA},
    {**cfg(64, 128, 8, 3), **TMA},
    {**cfg(32, 128, 8, 3), **TMA},
    {**cfg(64, 64, 4, 3), **TMA},
]
CVT = cfg(64, 0, 4, 1)
CHECK_HEADS = 8


def _warm(job: tuple) -> str:
    """Worker: launch one backward configuration once on a small problem."""
    kind, c, causal = job
    from attn_dispatch_triton.backward import BackwardLaunch
    from attn_dispatch_triton.forward import attention_forward
    from attn_dispatch_triton.tuning import get_backward_config

    t = time.time()
    q, k, v, do = make_problem(16, 2, 256)
    out, lse = attention_forward(
        q, k, v, band=adb.Band.of(None, causal, "top_left"), scale=0.1, config=FWD
    )
    launch = BackwardLaunch(
        q,
        k,
        v,
        out,
        lse,
        do,
        band=adb.Band.of(None, causal, "top_left"),
        scale=0.1,
        atomic_dq=kind == "atomic",
    )
    if kind == "atomic":
        launch.run({"pre": PRE, "dkdvq": c, "cvt": CVT})
    else:  # c = (seqlen_k, group): the split backward's table configuration for that class
        launch.run(get_backward_config(q.device, 128, causal, c[1], c[0]))
    torch.cuda.synchronize()
    return f"{kind} {c} causal={causal}: {time.time() - t:.1f}s"


def _safe_extra_job(job: tuple) -> dict:
    """One odd-shape check; an exception is recorded (as an infinite error), not fatal."""
    try:
        return _extra_job(job)
    except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
        log(f"  check {job[1] and job[1][0]} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
        return {
            "case": f"{job[0]} {job[1] and job[1][0]} atomic FAILED",
            "errors": {"dq": math.inf, "dk": math.inf, "dv": math.inf},
        }


def precompile(workers: int) -> None:
    jobs = [
        ("split", (s, g), causal) for causal in (False, True) for s in (1024, 4096) for g in (1, 8)
    ]
    jobs += [("atomic", c, causal) for c in ATOMIC_CANDIDATES for causal in (False, True)]
    compile_in_workers(_warm, jobs, workers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/attn_triton_atomic"))
    ap.add_argument("--budget", type=float, default=280.0, help="seconds before skipping work")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    args = ap.parse_args()
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    from attn_dispatch_triton.backward import BackwardLaunch, attention_backward
    from attn_dispatch_triton.forward import attention_forward
    from attn_dispatch_triton.tuning import get_backward_config, shape_class

    res: dict = {"checks": [], "timing": [], "candidates": ATOMIC_CANDIDATES}
    shapes, extra, cands = SEED_SHAPES, EXTRA, ATOMIC_CANDIDATES
    d = 128
    if smoke:
        shapes = [("GQA 4/2 64", 4, 2, 64, False), ("MHA 2 48 causal", 2, 2, 48, True)]
        extra, cands, d = EXTRA[:1], [cfg(16, 16, 4, 1), cfg(32, 16, 4, 1)], 64
        res["matmul_tflops"] = float("nan")
    else:
        res["env"], res["matmul_tflops"] = gpu_environment()
        t = time.time()
        precompile(args.workers)
        log(f"precompile {time.time() - t:.0f}s")
    res["candidates"] = cands
    scale = 1 / math.sqrt(d)
    # ---- 3. correctness of the fused-atomic backward (tuning-table configs)
    for name, h, hk, s, causal in shapes:
        q, k, v, do, out, lse, grads = checked_problem(h, hk, s, d, causal, scale, dev)
        attention_backward(
            q,
            k,
            v,
            out,
            lse,
            do,
            **checked_backward_args(grads, causal, scale),
            atomic_dq=True,
            config={"pre": PRE, "dkdvq": cands[0], "cvt": CVT} if smoke else None,
        )
        err = check_against_oracle(
            q, k, v, do, out, lse, grads, causal, False, scale, list(range(min(h, CHECK_HEADS)))
        )
        res["checks"].append({"case": name + " atomic", "errors": err})
        log(f"check {name} atomic: " + " ".join(f"{n}={e:.2e}" for n, e in err.items()))
        del q, k, v, do, out, lse, grads
    jobs = [("extra", e, dev, smoke, True) for e in extra]
    jobs.append(("varlen", None, dev, smoke, True))
    res["checks"].extend(run_extra_checks(jobs, smoke, worker=_safe_extra_job))
    empty_cache(smoke)

    # ---- 4. timing
    for name, h, hk, s, causal in shapes:
        q, k, v, do = make_problem(h, hk, s, d, device=dev)
        out, lse = attention_forward(
            q, k, v, band=adb.Band.of(None, causal, "top_left"), scale=scale
        )
        est = bwd_flops(h, s, s, d, causal) / 300e12 * 1e3
        table = get_backward_config(q.device, d, causal, h // hk, s)
        if smoke:
            table = {"pre": PRE, "dkdv": cands[0], "dq": cands[0]}
        split = BackwardLaunch(
            q, k, v, out, lse, do, band=adb.Band.of(None, causal, "top_left"), scale=scale
        )
        row = {
            "shape": name,
            "class": shape_class(d, causal, h // hk, s),
            "flops": bwd_flops(h, s, s, d, causal),
            "split": bench(lambda L=split, c=table: L.run(c), smoke, est),
        }
        ref = tuple(x.clone() for x in split.run(table))
        atom = BackwardLaunch(
            q,
            k,
            v,
            out,
            lse,
            do,
            band=adb.Band.of(None, causal, "top_left"),
            scale=scale,
            atomic_dq=True,
        )
        row["atomic"], row["atomic_vs_split_err"] = [], []
        for c in cands:
            if time.time() - t0 > args.budget:
                log(f"  budget reached: skipping {c} at {name}")
                row["atomic"].append(None)
                continue
            full = {"pre": PRE, "dkdvq": c, "cvt": CVT}
            got = atom.run(full)
            row["atomic_vs_split_err"].append(max(rel(g, r.double()) for g, r in zip(got, ref)))
            row["atomic"].append(bench(lambda L=atom, f=full: L.run(f), smoke, est))
        row["split_of_best"] = atom.dkdv_plan(cands[0], atomic_dq=True).split
        for label, backend in (("fa2", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
            row[label] = None if smoke else sdpa_backward_ms(q, k, v, do, causal, backend, est)
        if name in ("GQA 64/8 16K", shapes[0][0]):  # what the atomic dQ adds to dK/dV
            c = cands[2 if len(cands) > 2 else 0]
            atom.preprocess(PRE)
            row["dkdv_only_ms"] = bench(lambda L=atom, c=c: L.dkdv(c), smoke, est)
            row["dkdvq_only_ms"] = bench(lambda L=atom, c=c: L.dkdv(c, atomic_dq=True), smoke, est)
            row["cvt_ms"] = bench(lambda L=atom: L.dq_convert(CVT), smoke)
        res["timing"].append(row)
        log("time", json.dumps(row))
        del q, k, v, do, out, lse, split, atom, ref
        empty_cache(smoke)

    # ---- 5. best candidate per shape class
    classes: dict = {}
    for r in res["timing"]:
        classes.setdefault(r["class"], []).append(r)
    best = {}
    for key, rows in classes.items():
        score = [
            sum(r["atomic"][i] / min(x for x in r["atomic"] if x) for r in rows)
            if all(r["atomic"][i] for r in rows)
            else math.inf
            for i in range(len(cands))
        ]
        best[key] = {"dkdvq": cands[min(range(len(score)), key=score.__getitem__)], "cvt": CVT}
    res["best"] = best
    with open(os.path.join(args.out, "atomic_results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print_table(res)
    log(f"total {time.time() - t0:.0f}s")


def empty_cache(smoke: bool) -> None:
    if not smoke:
        torch.cuda.empty_cache()


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.0f}"


def _x(num: float | None, den: float) -> str:
    return "-" if num is None else f"{num / den:.2f}x"


def print_table(res: dict) -> None:
    peak = res["matmul_tflops"]
    cands = res["candidates"]
    log(
        "\n| shape | split us (TF/s) | atomic best us (TF/s) [cfg] | FA2 us | cuDNN us "
        "| atomic/FA2 | atomic/cuDNN | split/cuDNN | candidates us | max rel diff vs split |"
    )
    log("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["timing"]:
        f = r["flops"]
        ts = [x for x in r["atomic"] if x]
        i = r["atomic"].index(min(ts))
        c = cands[i]
        fa2, cud = r["fa2"], r["cudnn"]
        log(
            f"| {r['shape']} | {r['split'] * 1e3:.0f} ({f / r['split'] / 1e9:.0f}) | "
            f"{min(ts) * 1e3:.0f} ({f / min(ts) / 1e9:.0f}) "
            f"[{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}"
            f"{' tma' if c.get('TMA') else ''}] | "
            f"{_us(fa2)} | {_us(cud)} | {_x(fa2, min(ts))} | {_x(cud, min(ts))} | "
            f"{_x(cud, r['split'])} | "
            + "/".join("-" if x is None else f"{x * 1e3:.0f}" for x in r["atomic"])
            + f" | {max(r['atomic_vs_split_err']):.1e} |"
        )
    for r in res["timing"]:
        if "dkdv_only_ms" in r:
            log(
                f"{r['shape']}: dK/dV kernel {r['dkdv_only_ms'] * 1e3:.0f} us, with atomic dQ "
                f"{r['dkdvq_only_ms'] * 1e3:.0f} us, convert {r['cvt_ms'] * 1e3:.0f} us"
            )
    log(f"bf16 matmul ceiling: {peak:.0f} TFLOP/s; best per class: {json.dumps(res['best'])}")


if __name__ == "__main__":
    main()
