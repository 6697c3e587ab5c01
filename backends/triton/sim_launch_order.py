"""Load balance of the fused-atomic dK/dV programs' launch orders, simulated (CPU only).

A GQA causal backward launches one program per (key block, kv head, slice of the group); key
block ``n`` walks the query blocks from its diagonal on, so programs differ in work. This models
the block scheduler as "each program, in launch order, goes to the first SM that is free" (one
program per SM at a time, as the Gluon kernel's shared memory allows), with a program's cost its
query-block steps plus a fixed ``--overhead`` of steps, and prints each order's makespan over the
ideal (total work / SMs) and how many (kv head, slice) groups run at once on average (a proxy for
the L2 footprint). Orders: ``natural`` (key blocks innermost, group by group), ``heavy-first``
(all programs by work) and ``window-w`` (``w`` groups at a time, key block by key block). It
models neither L2 nor power, so it ranks orders by balance only; the GPU decides
(``bench_walk_order.py``).

    python backends/triton/sim_launch_order.py [--sms 132] [--overhead 3]
"""

from __future__ import annotations

import argparse
import heapq

Program = tuple[int, int, int]  # (group, key block, steps)


def programs(seqlen: int, split: int, kv_heads: int = 8, group: int = 8, block_n: int = 128,
             block_m: int = 64) -> list[Program]:
    """GQA causal (top-left), B=1, Sq=Sk: the programs in the natural launch order."""
    key_blocks, query_blocks = seqlen // block_n, seqlen // block_m
    return [(s * kv_heads + h, n, (query_blocks - n * block_n // block_m) * (group // split))
            for s in range(split) for h in range(kv_heads) for n in range(key_blocks)]


def simulate(order: list[Program], sms: int, overhead: float) -> tuple[float, float]:
    """Makespan (in steps) and the time-averaged number of groups running."""
    free = [(0.0, i) for i in range(sms)]
    runs = []
    for grp, _, steps in order:
        start, sm = heapq.heappop(free)
        end = start + steps + overhead
        runs.append((start, end, grp))
        heapq.heappush(free, (end, sm))
    makespan = max(end for _, end, _ in runs)
    samples = [makespan * (k + 0.5) / 200 for k in range(200)]
    active = sum(len({g for a, b, g in runs if a <= t < b}) for t in samples) / len(samples)
    return makespan, active


def orders(progs: list[Program]) -> dict[str, list[Program]]:
    groups = max(g for g, _, _ in progs) + 1
    out = {"natural": progs, "heavy-first": sorted(progs, key=lambda p: (-p[2], p[0]))}
    for w in (2, 4, 8):
        if groups % w == 0:
            out[f"window-{w}"] = sorted(progs, key=lambda p: (p[0] // w, p[1], p[0]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=3.0, help="fixed steps per program")
    args = ap.parse_args()
    for seqlen in (4096, 8192, 16384):
        for split in (1, 2, 4, 8):
            progs = programs(seqlen, split)
            ideal = sum(steps + args.overhead for _, _, steps in progs) / args.sms
            cells = []
            for name, order in orders(progs).items():
                makespan, active = simulate(order, args.sms, args.overhead)
                cells.append(f"{name} {makespan / ideal:.3f} ({active:.1f} groups)")
            print(f"GQA 64/8 {seqlen // 1024}K causal, split {split}: " + "  ".join(cells))


if __name__ == "__main__":
    main()
