"""Context parallelism on W GPUs (NCCL): the correctness check, then a scaling benchmark.

    torchrun --nproc_per_node=2 benchmarks/distributed/cp_gpu.py
    torchrun --nproc_per_node=2 benchmarks/distributed/cp_gpu.py --seqlens 32768 --iters 5

1. Correctness (S=4096, bf16, GQA 8/2, D=128): both strategies, both layouts, causal and not;
   every rank's output and q/k/v gradient shards against the single-GPU computation on the full
   sequence (same backend), by ``attn_dispatch.testing``'s bf16 tolerance. Stops on a failure.
2. Timing (GQA 64/8, D=128, bf16, B=1, causal, S = 32K-128K): one training step (forward +
   backward) per strategy on W GPUs against the full sequence on one GPU; for the ring also the
   same block calls without communication ("compute") and the ring transfers alone ("comm"):
   communication is hidden when ``step ≈ compute``. Peak memory per rank is reported too.

Rank 0 prints a table and writes cp_gpu.json to $OUT if set. About 2-4 minutes on 2 H200s.
``--device cpu`` runs the same code on gloo with tiny shapes (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import attn_dispatch as ad
import attn_dispatch.distributed as cp
from attn_dispatch.distributed._ring import Ring, pass_on
from attn_dispatch.testing.tolerances import error_metrics, tolerance_for

CONFIGS = [
    (strategy, lb, causal)
    for strategy in ("ring", "ulysses")
    for lb in ("zigzag", "contiguous")
    for causal in (True, False)
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device: torch.device, iters: int, group=None) -> float:
    """Median seconds of ``fn`` over ``iters`` runs (after one warm-up), ranks in step."""
    fn()
    times = []
    for _ in range(iters):
        if group is not False:
            dist.barrier(group)
        _sync(device)
        start = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            import time

            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _inputs(b, s, h, hkv, d, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=gen, dtype=dtype, device=device)
    k, v = (torch.randn(b, s, hkv, d, generator=gen, dtype=dtype, device=device) for _ in "kv")
    dout = torch.randn(b, s, h, d, generator=gen, dtype=dtype, device=device)
    return q, k, v, dout


def check(device: torch.device, seqlen: int, heads: int, kv_heads: int, d: int, dtype) -> list:
    """Max errors of every configuration; raises if one exceeds the dtype's tolerance."""
    q, k, v, dout = _inputs(1, seqlen, heads, kv_heads, d, dtype, device)
    tol = tolerance_for(dtype)
    rows = []
    for strategy, lb, causal in CONFIGS:
        out, lse = ad.forward(q, k, v, causal=causal)
        full = ad.backward(q, k, v, out, lse, dout, causal=causal)
        ref = [x.double() for x in (out, *full)]
        local = [cp.shard_sequence(t, load_balance=lb).requires_grad_() for t in (q, k, v)]
        got = cp.context_parallel_attention(
            *local, causal=causal, strategy=strategy, load_balance=lb
        )
        got.backward(cp.shard_sequence(dout, load_balance=lb))
        mine = [got.detach(), *(t.grad for t in local)]
        mine = [cp.unshard_sequence(x, load_balance=lb).double() for x in mine]
        out_err = error_metrics(mine[0], ref[0])[0]
        floor = 0.1 * max(float(g.abs().max()) for g in ref[1:])  # the kit's gradient floor
        grad_err = max(error_metrics(x, r, floor)[0] for x, r in zip(mine[1:], ref[1:]))
        ok = out_err <= tol.max_err and grad_err <= tol.max_err
        rows.append((strategy, lb, causal, out_err, grad_err, ok))
    return rows


def _ring_parts(q, k, v, dout, causal: bool):
    """The ring's block calls alone (local K/V stands in for each step's), its transfers alone."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ring = Ring(None, rank, world, "zigzag", causal, None, None)
    out, lse = ad.forward(q, k, v, causal=causal)

    def compute():
        for step in range(world):
            for blk in ring.plan(step, q.shape[1]):
                r, c = blk.q_rows, blk.k_cols
                ad.forward(q[:, r], k[:, c], v[:, c], causal=blk.causal)
                ad.backward(
                    q[:, r],
                    k[:, c],
                    v[:, c],
                    out[:, r],
                    lse[:, :, r],
                    dout[:, r],
                    causal=blk.causal,
                )

    def comm():
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        for _ in range(world - 1):  # forward K/V, backward K/V
            for _ in range(2):
                pass_on(ring, (k, v))[1].wait()
        for _ in range(world):  # backward dK/dV sums
            pass_on(ring, (dk, dk))[1].wait()

    return compute, comm


def _one_gpu_step(q, k, v, dout):
    out, lse = ad.forward(q, k, v, causal=True)
    ad.backward(q, k, v, out, lse, dout, causal=True)


def _cp_step(local, dout, strategy: str):
    for t in local:
        t.grad = None
    out = cp.context_parallel_attention(*local, causal=True, strategy=strategy)
    out.backward(dout)


def bench(device, seqlens, heads, kv_heads, d, dtype, iters) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for seqlen in seqlens:
        full = _inputs(1, seqlen, heads, kv_heads, d, dtype, device)
        single = None
        if rank == 0:
            single = _time(lambda f=full: _one_gpu_step(*f), device, iters, group=False)
        dist.barrier()
        shards = [cp.shard_sequence(t) for t in full]
        del full
        local = [t.requires_grad_() for t in shards[:3]]
        for strategy in ("ring", "ulysses"):
            if strategy == "ulysses" and (heads % world or kv_heads % world):
                continue
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            step = functools.partial(_cp_step, local, shards[3], strategy)
            t_step = _time(step, device, iters)
            peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
            row = {"S": seqlen, "W": world, "strategy": strategy, "one_gpu_s": single}
            row |= {"step_s": t_step, "peak_bytes": peak}
            if strategy == "ring":
                compute, comm = _ring_parts(*(t.detach() for t in shards), causal=True)
                row |= {"compute_s": _time(compute, device, iters)}
                row |= {"comm_s": _time(comm, device, iters)}
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--seqlens", default="32768,65536,131072")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
        shapes = {"check": (4096, 8, 2, 128), "bench": (64, 8, 128)}
        dtype = torch.bfloat16
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        shapes = {"check": (64, 4, 2, 16), "bench": (4, 2, 16)}
        args.seqlens, dtype = "128,256", torch.float32
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = check(device, *shapes["check"], dtype)
    failed = [r for r in rows if not r[-1]]
    if rank == 0:
        print(f"correctness on {world} ranks ({dtype}): out max_err, grad max_err")
        for r in rows:
            verdict = "ok" if r[5] else "FAIL"
            print(f"  {r[0]:8} {r[1]:10} causal={r[2]!s:5} {r[3]:.2e} {r[4]:.2e} {verdict}")
    if failed:
        dist.destroy_process_group()
        return 1
    seqlens = [int(s) for s in args.seqlens.split(",")]
    results = bench(device, seqlens, *shapes["bench"], dtype, args.iters)
    if rank == 0:
        print(
            f"\ncausal step (fwd+bwd), H={shapes['bench'][0]} Hkv={shapes['bench'][1]}, W={world}"
        )
        print(
            f"{'S':>7} {'strategy':8} {'1 rank ms':>10} {'W ranks ms':>10} {'speedup':>8} "
            f"{'compute ms':>10} {'comm ms':>8} {'peak GiB':>8}"
        )
        for r in results:
            one = r["one_gpu_s"] * 1e3
            comp = f"{r['compute_s'] * 1e3:10.1f}" if "compute_s" in r else f"{'-':>10}"
            comm = f"{r['comm_s'] * 1e3:8.1f}" if "comm_s" in r else f"{'-':>8}"
            print(
                f"{r['S']:>7} {r['strategy']:8} {one:10.1f} {r['step_s'] * 1e3:10.1f} "
                f"{one / (r['step_s'] * 1e3):8.2f} {comp} {comm} {r['peak_bytes'] / 2**30:8.2f}"
            )
        if os.environ.get("OUT"):
            data = {"check": rows, "bench": results, "world": world, "device": str(device)}
            Path(os.environ["OUT"], "cp_gpu.json").write_text(json.dumps(data, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
