"""The Markdown tables of docs/benchmarks.md section 1 from an ``attn-dispatch bench --json``
file: per shape, µs (TFLOP/s) of the implementations, the automatic choice against the fastest
and the direct call, and the faster triton implementation against FA2 and cuDNN.

    python benchmarks/bench_table.py docs/results/2026-12-01-h200/bench.json
"""

from __future__ import annotations

import argparse
import json

COLUMNS = [
    ("torch_sdpa:cudnn", "cuDNN"),
    ("triton:fused", "triton:fused"),
    ("triton:fused_atomic", "triton:fused_atomic"),
    ("torch_sdpa:flash", "FA2"),
    ("torch_sdpa:efficient", "efficient"),
]


def shape_name(r: dict) -> str:
    kind = "MHA" if r["heads"] == r["kv_heads"] else "GQA"
    heads = r["heads"] if kind == "MHA" else f"{r['heads']}/{r['kv_heads']}"
    return f"{kind} {heads} {r['seqlen'] // 1024}K" + (" causal" if r["causal"] else "")


def table(rows: list[dict]) -> str:
    shapes: dict[str, dict] = {}
    for r in rows:
        shapes.setdefault(shape_name(r), {})[(r["impl"], r["kind"])] = r
    head = [
        "shape",
        *(label for _, label in COLUMNS),
        "auto vs fastest",
        "auto vs direct",
        "forced vs direct (same kernel)",
        "triton vs FA2",
        "triton vs cuDNN",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, by in shapes.items():
        forced = {impl: r for (impl, kind), r in by.items() if kind == "forced"}
        best = min(forced.values(), key=lambda r: r["us"])
        auto = next(r for (_, kind), r in by.items() if kind == "auto")
        direct = next(r for (_, kind), r in by.items() if kind == "direct")
        cells = [name]
        for impl, _ in COLUMNS:
            r = forced.get(impl)
            cell = "—" if r is None else f"{r['us']:.0f} ({r['tflops']:.0f})"
            cells.append(f"**{cell}**" if r is best else cell)
        same = forced[direct["impl"]]
        cells += [
            f"{auto['us'] / best['us'] - 1:+.1%}",
            f"{auto['us'] / direct['us'] - 1:+.1%}",
            f"{same['us'] / direct['us'] - 1:+.1%}",
        ]
        triton = [r for impl, r in forced.items() if impl.startswith("triton:")]
        ours = min(triton, key=lambda r: r["us"]) if triton else None
        for other in ("torch_sdpa:flash", "torch_sdpa:cudnn"):
            ok = ours is not None and other in forced
            which = ours["impl"].split(":")[1] if ok else ""
            cells.append(f"{forced[other]['us'] / ours['us']:.2f}× ({which})" if ok else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="the --json file of attn-dispatch bench")
    rows = json.load(open(ap.parse_args().json))["rows"]
    print(table(rows))


if __name__ == "__main__":
    main()
