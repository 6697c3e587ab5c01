# ruff: noqa  (an experiment's script, kept for one commit: its result is in docs/benchmarks.md)
"""Leave one batch x heads layout out of the sm_90 H200 grid: each held-out point's choice
(forward and backward, eager and graphs) from the other layouts' rows, judged by its measured
time over the fastest at that point; batch and heads at a quarter weight in the distance
against full weight (at full weight no other layout's rows cover a call: priorities decide)."""

import collections
import json
import sys

sys.path.insert(0, ".")
from attn_dispatch import _costs

ROWS = [json.loads(l) for l in open("docs/results/2026-12-04-h200-cost-grid/grid.jsonl")][1:]
PRIORITY = {
    "flash_attn_cute:sm90": 60,
    "torch_sdpa:cudnn": 50,
    "triton:fused": 45,
    "triton:fused_atomic": 43,
    "torch_sdpa:flash": 40,
    "torch_sdpa:efficient": 30,
}
LAYOUTS = [(1, 8, 8), (1, 64, 8), (4, 32, 8)]


def shape(r):
    return _costs.Shape(
        r["batch"],
        r["heads"],
        r["kv_heads"],
        r["seqlen"],
        r["seqlen"],
        r["head_dim"],
        r["mask"],
        r["window"],
        r["sinks"],
        r["softcap"],
    )


points = collections.defaultdict(dict)
for r in ROWS:
    points[
        (r["batch"], r["heads"], r["kv_heads"], r["seqlen"], r["head_dim"], r["mask"], r["kind"])
    ][r["impl"]] = r


def choices(weight):
    orig = _costs.distance

    def distance(a, b):
        if a.exact != b.exact or (a.window is None) != (b.window is None):
            return float("inf")
        fa, fb = a.features, b.features
        return sum((weight if n in ("batch", "heads") else 1.0) * abs(fa[n] - fb[n]) for n in fa)

    _costs.distance = distance
    out = {}
    for layout in LAYOUTS:
        rows = tuple(
            _costs.Row(
                r["impl"], r["kind"], shape(r), {"eager": r["eager_us"], "graph": r["graph_us"]}
            )
            for r in ROWS
            if (r["batch"], r["heads"], r["kv_heads"]) != layout
        )
        table = _costs.CostTable("sm_90", "cv", {}, rows)
        for key, impls in points.items():
            if key[:3] != layout:
                continue
            s = shape(next(iter(impls.values())))
            for mode in ("eager", "graph"):
                pred = {i: table.predict(i, key[-1], mode, s) for i in impls}
                slot = max((PRIORITY[i] for i in impls if pred[i]), default=0)
                rank = lambda i: (-slot, 0, pred[i].us) if pred[i] else (-PRIORITY[i], 1, 0)
                chosen = min(impls, key=rank)
                best = min(r[mode + "_us"] for r in impls.values())
                out[(key, mode)] = (impls[chosen][mode + "_us"] / best, any(pred.values()))
    _costs.distance = orig
    return out


quarter, full = choices(0.25), choices(1.0)
covered = [k for k, (_, c) in quarter.items() if c]
print(
    f"{len(quarter)} choices; at a quarter weight {len(covered)} are covered by another layout's rows; at full weight {sum(c for _, c in full.values())}"
)
for name, res in (
    ("quarter weight (other layouts' rows)", quarter),
    ("full weight (priorities)", full),
):
    r = [res[k][0] for k in covered]
    print(
        f"  those {len(r)} choices, {name}: mean {sum(r) / len(r):.3f}x, worst {max(r):.2f}x, over 1.05x: {sum(x > 1.05 for x in r)}"
    )
