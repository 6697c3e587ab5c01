"""The Gluon sm_90 kernels against the portable tl kernels, per seed shape, on a Hopper GPU.

For every seed shape (B=1, D=128, bf16) this runs the dK/dV kernel and the dQ kernel as the
tuning table's configuration with ``GLUON`` removed (the tl kernel; where the table uses Gluon,
that is the tl kernel at the Gluon tiles, not necessarily the tl tiles it used before) and as
the Gluon kernel (64x128 dK/dV tiles, 128x64 dQ tiles, the table's ``SPLIT`` / ``HEAVY_FIRST``
kept, a ring of 2 and of 3 buffers). It first checks that both produce the same gradients
(outputs NaN-poisoned, relative Frobenius difference < 1e-2; each is checked against the
float64 oracle by the tests), then times each kernel alone with ``triton.testing.do_bench``
(median) and prints a table.

    PYTHONUNBUFFERED=1 python backends/triton/bench_gluon.py [--shapes all|short|long]
"""

from __future__ import annotations

import argparse
import sys

import torch
from attn_dispatch_triton.backward import BackwardLaunch
from attn_dispatch_triton.tuning import get_backward_config
from bench_kernels import timing_inputs
from triton.testing import do_bench

SHAPES = [  # (name, H, Hkv, S, causal): the seed shapes
    (f"{kind} {s // 1024}K" + (" causal" if causal else ""), h, hk, s, causal)
    for kind, h, hk in (("GQA 64/8", 64, 8), ("MHA 8", 8, 8)) for causal in (False, True)
    for s in (1024, 2048, 4096, 8192, 16384)
]
KEPT = ("SPLIT", "HEAVY_FIRST")  # launch-order / grid keys the Gluon kernels honour too


def variants(causal: bool, group: int, seqlen: int) -> dict[str, dict]:
    """Per kernel: the tl config and the Gluon configs (ring of 2 and 3 buffers)."""
    table = get_backward_config(torch.device("cuda"), 128, causal, group, seqlen)
    out = {}
    for kernel, tiles in (("dkdv", (64, 128)), ("dq", (128, 64))):
        tl_cfg = {k: v for k, v in table[kernel].items() if not k.startswith("GLUON")}
        kept = {k: v for k, v in table[kernel].items() if k in KEPT}
        gluon = {**kept, "BLOCK_M": tiles[0], "BLOCK_N": tiles[1], "num_warps": 8,
                 "num_stages": 3, "GLUON": 1}
        out[kernel] = {"tl": tl_cfg, "gluon2": {**gluon, "GLUON_STAGES": 2},
                       "gluon3": {**gluon, "GLUON_STAGES": 3}}
    return out


def run_kernel(launch: BackwardLaunch, kernel: str, cfg: dict) -> None:
    launch.dkdv(cfg) if kernel == "dkdv" else launch.dq_(cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", choices=("all", "short", "long"), default="all")
    args = ap.parse_args()
    shapes = [s for s in SHAPES if args.shapes == "all"
              or (args.shapes == "short") == (s[3] <= 2048)]
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows, failed = [], False
    for name, h, hk, s, causal in shapes:
        q, k, v, out, lse, do = timing_inputs(h, hk, s)
        launch = BackwardLaunch(q, k, v, out, lse, do, causal=causal, bottom_right=False,
                                scale=128 ** -0.5)
        cfgs = variants(causal, h // hk, s)
        launch.preprocess(get_backward_config(q.device, 128, causal, h // hk, s)["pre"])
        row = {"shape": name}
        for kernel, by_name in cfgs.items():
            grads = {}
            for variant, cfg in by_name.items():
                assert variant == "tl" or launch.sm90_descriptors(
                    cfg, (cfg["BLOCK_M"], cfg["BLOCK_N"])) is not None, "Gluon does not apply"
                for t in (launch.dq, launch.dk, launch.dv):
                    t.fill_(float("nan"))
                run_kernel(launch, kernel, cfg)
                grads[variant] = [t.clone() for t in ((launch.dk, launch.dv) if kernel == "dkdv"
                                                      else (launch.dq,))]
                row[f"{kernel} {variant}"] = do_bench(
                    lambda launch=launch, kernel=kernel, cfg=cfg: run_kernel(launch, kernel, cfg),
                    warmup=10, rep=150) * 1e3
            for variant in ("gluon2", "gluon3"):
                for got, want in zip(grads[variant], grads["tl"]):
                    diff = ((got.double() - want.double()).norm() / want.double().norm()).item()
                    if not diff < 1e-2:  # (NaN fails too)
                        print(f"FAIL {name} {kernel} {variant}: differs from tl by {diff:.2e}")
                        failed = True
        rows.append(row)
        print(name, {k: round(v) for k, v in row.items() if k != "shape"}, flush=True)
    cols = ["dkdv tl", "dkdv gluon2", "dkdv gluon3", "dq tl", "dq gluon2", "dq gluon3"]
    print("\n| shape | " + " | ".join(f"{c} (us)" for c in cols)
          + " | dK/dV best Gluon / tl | dQ best Gluon / tl |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        kv = min(r["dkdv gluon2"], r["dkdv gluon3"]) / r["dkdv tl"]
        dq = min(r["dq gluon2"], r["dq gluon3"]) / r["dq tl"]
        print(f"| {r['shape']} | " + " | ".join(f"{r[c]:.0f}" for c in cols)
              + f" | {kv:.3f} | {dq:.3f} |")
    print("FAILED: Gluon and tl gradients differ" if failed else "all Gluon gradients match tl")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
