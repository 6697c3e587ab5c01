"""Per-rank memory of ring context parallelism against the sequence length, on CPU ranks (gloo).

For each S and W it reports, for rank 0, the bytes autograd saves for the backward (through
``saved_tensors_hooks``, each storage once); the W=1 row is the single-process baseline. O(S/W)
shows as a constant ``saved·W/S`` column. The transient peak of the backward (K/V and dK/dV
buffers in flight) is measured on GPUs by ``cp_gpu.py`` (``torch.cuda.max_memory_allocated``).

    python benchmarks/distributed/cp_memory.py [--seqlens 1024,2048,4096] [--worlds 1,2,4]

Takes about a minute on two CPU cores with the defaults. Writes cp_memory.json to $OUT if set.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attn_dispatch.distributed as cp

B, H, HKV, D = 1, 4, 2, 32


def measure(seqlen: int, strategy: str) -> dict[str, int]:
    """Bytes autograd holds for this rank's backward (each storage counted once)."""
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(B, seqlen, h, D, generator=gen) for h in (H, HKV, HKV)]
    q, k, v = (cp.shard_sequence(t).requires_grad_() for t in full)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = cp.context_parallel_attention(q, k, v, causal=True, strategy=strategy)
    out.backward(torch.randn_like(out))  # runs: the saved tensors are all the backward reads
    return {"saved_bytes": sum(saved.values())}


def _worker(rank: int, world: int, port: int, seqlens: list[int], strategy: str, path: str):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    rows = [{"S": s, "W": world, **measure(s, strategy)} for s in seqlens]
    if rank == 0:
        Path(path).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="1024,2048,4096")
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--strategy", default="ring", choices=("ring", "ulysses"))
    args = parser.parse_args(argv)
    seqlens = [int(s) for s in args.seqlens.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (int(w) for w in args.worlds.split(",")):
            path = os.path.join(tmp, f"w{world}.json")
            mp.spawn(
                _worker,
                args=(world, _free_port(), seqlens, args.strategy, path),
                nprocs=world,
            )
            rows += json.loads(Path(path).read_text())
    print(f"{args.strategy}, causal, B={B} H={H} Hkv={HKV} D={D} float32, rank 0 (KiB)")
    print(f"{'S':>6} {'W':>3} {'saved':>10} {'saved·W/S':>10}")
    for r in rows:
        kib = r["saved_bytes"] / 1024
        print(f"{r['S']:>6} {r['W']:>3} {kib:>10.0f} {kib * r['W'] / r['S']:>10.2f}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cp_memory.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
