"""dQ beside dK/dV on a side stream (config ``CONCURRENT_MAX_SK``) against sequential launches.

Per shape: the table's configs with the side stream forced on and off; the gradients of both are
checked against each other (rel. error < 1e-2; they are bitwise equal in practice), then the whole
backward (preprocess + dK/dV + dQ, no launch plans) is timed with ``do_bench`` (median).

    PYTHONUNBUFFERED=1 python backends/triton/bench_concurrent.py
"""

from __future__ import annotations

import math

import torch
from attn_dispatch_triton.backward import BackwardLaunch
from attn_dispatch_triton.forward import attention_forward
from attn_dispatch_triton.tuning import get_backward_config
from triton.testing import do_bench

SHAPES = [  # (name, H, Hkv, S, causal)
    (f"{kind} {s // 1024}K" + (" causal" if causal else ""), h, hk, s, causal)
    for kind, h, hk in (("GQA 64/8", 64, 8), ("MHA 8", 8, 8))
    for causal in (True, False) for s in (1024, 2048, 4096, 8192, 16384)
]
ON, OFF = 1 << 30, -1  # CONCURRENT_MAX_SK values: every length / none


def problem(h: int, hk: int, s: int, causal: bool):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, s, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for n in (h, hk, hk))
    do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    out, lse = attention_forward(q, k, v, causal=causal, bottom_right=False,
                                 scale=1 / math.sqrt(128))
    return q, k, v, out, lse, do


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    print(f"{'shape':<22}{'sequential us':>15}{'concurrent us':>15}{'change':>9}")
    for name, h, hk, s, causal in SHAPES:
        args = problem(h, hk, s, causal)
        table = get_backward_config(args[0].device, 128, causal, h // hk, s)
        launch = BackwardLaunch(*args, causal=causal, bottom_right=False,
                                scale=1 / math.sqrt(128))
        times, grads = {}, {}
        for mode, limit in (("seq", OFF), ("par", ON)):
            cfg = {**table, "dq": {**table["dq"], "CONCURRENT_MAX_SK": limit}}
            for t in (launch.dq, launch.dk, launch.dv):
                t.fill_(float("nan"))
            grads[mode] = [t.clone() for t in launch.run(cfg)]
            times[mode] = do_bench(lambda c=cfg, L=launch: L.run(c), warmup=25, rep=300,
                                   return_mode="median") * 1e3
        err = max(rel(a, b) for a, b in zip(grads["par"], grads["seq"]))
        assert err < 1e-2, f"{name}: concurrent gradients differ from sequential ({err:.1e})"
        print(f"{name:<22}{times['seq']:>15.0f}{times['par']:>15.0f}"
              f"{times['par'] / times['seq'] - 1:>+9.1%}", flush=True)


if __name__ == "__main__":
    main()
