"""Where FlashAttention-4 stands in an ``attn-dispatch bench`` run, per shape.

Usage: python benchmarks/flash_attn_cute/fa4_table.py bench.json [bench_graphs.json ...]

For each file and shape: the fastest forced implementation, FA4's time and its ratio to the
fastest, the automatic choice and its ratio, and whether the automatic choice is within
``--within`` (default 2%) of the fastest. Exit status 1 if any shape misses it.
"""

from __future__ import annotations

import argparse
import json
import sys

FA4_PREFIX = "flash_attn_cute:"


def rows_by_shape(rows: list[dict]) -> dict[str, list[dict]]:
    shapes: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("us") is not None:
            shapes.setdefault(r["shape"], []).append(r)
    return shapes


def summarize(path: str, within: float) -> tuple[list[str], int]:
    with open(path) as f:
        data = json.load(f)
    timing = data.get("environment", {}).get("timing", "?")
    lines = [
        f"{path} ({timing})",
        f"  {'shape':<34} {'fastest':<24} {'us':>9} {'FA4 us':>9} {'FA4/best':>8} "
        f"{'auto':<24} {'auto/best':>9}",
    ]
    misses = 0
    for shape, rs in rows_by_shape(data["rows"]).items():
        forced = [r for r in rs if r["kind"] == "forced"]
        auto = next((r for r in rs if r["kind"] == "auto"), None)
        if not forced:
            continue
        best = min(forced, key=lambda r: r["us"])
        fa4 = next((r for r in forced if r["impl"].startswith(FA4_PREFIX)), None)
        fa4_us = f"{fa4['us']:9.1f}" if fa4 else f"{'-':>9}"
        fa4_ratio = f"{fa4['us'] / best['us']:8.3f}" if fa4 else f"{'-':>8}"
        if auto is None:
            auto_text, verdict = f"{'-':<24} {'-':>9}", "no automatic choice"
            misses += 1
        else:
            ratio = auto["us"] / best["us"]
            ok = ratio <= 1 + within
            misses += not ok
            auto_text = f"{auto['impl']:<24} {ratio:9.3f}"
            verdict = "ok" if ok else f"MISS (> {within:.0%})"
        lines.append(
            f"  {shape:<34} {best['impl']:<24} {best['us']:9.1f} {fa4_us} {fa4_ratio} "
            f"{auto_text}  {verdict}"
        )
    return lines, misses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--within", type=float, default=0.02, help="tolerance (default 0.02)")
    args = p.parse_args(argv)
    total = 0
    for path in args.files:
        lines, misses = summarize(path, args.within)
        total += misses
        print("\n".join(lines))
    print(f"shapes where the automatic choice is more than {args.within:.0%} behind: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
