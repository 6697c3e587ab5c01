"""Host time of ``ad.backward`` per call: triton (plans on / off) against cuDNN, on one GPU.

Checks first (a replayed plan against the recorded call, bitwise, and against the reference
backend), then times 20 calls per row after warm-up: host µs (``perf_counter`` around the call,
the GPU idle before it) and device µs (CUDA events around the call), medians.

    PYTHONUNBUFFERED=1 python backends/triton/bench_host.py
"""

from __future__ import annotations

import os
import statistics
import time

import torch

import attn_dispatch as ad


def inputs(s: int, h: int, hk: int, causal: bool, d: int = 128):
    g = torch.Generator(device="cuda").manual_seed(s + h)
    q, k, v = (torch.randn(1, s, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for n in (h, hk, hk))
    out, lse = ad.forward(q, k, v, causal=causal, backend="triton:fused")
    do = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    return (q, k, v, out, lse, do), dict(causal=causal)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(name, s, h, hk, causal, backend):
    args, kw = inputs(s, h, hk, causal)
    ref = ad.backward(*args, **kw, backend="reference")
    first = ad.backward(*args, **kw, backend=backend)  # records the plan
    again = ad.backward(*args, **kw, backend=backend)  # replays it
    again = ad.backward(*args, **kw, backend=backend)
    errs = [rel_l2(a, r) for a, r in zip(again, ref)]
    same = all(torch.equal(a, b) for a, b in zip(first, again))
    ok = max(errs) <= 1e-2 and (same or backend.endswith("atomic"))
    print(f"check {name:<18} {backend:<20} rel_l2 dq/dk/dv "
          f"{' '.join(f'{e:.2e}' for e in errs)} replay==record {same} {'OK' if ok else 'FAIL'}")
    return ok


def time_calls(args, kw, backend, n=20):
    for _ in range(3):
        ad.backward(*args, **kw, backend=backend)
    torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        t0 = time.perf_counter()
        ad.backward(*args, **kw, backend=backend)
        t1 = time.perf_counter()
        e1.record()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e6)
        dev.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(host), statistics.median(dev)


def set_plans(on: bool) -> None:
    from attn_dispatch_triton import _plan

    os.environ["ATTN_DISPATCH_TRITON_PLANS"] = "1" if on else "0"
    _plan.plans_enabled.cache_clear()
    _plan.clear()


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    import triton

    print("triton", triton.__version__)
    ok = all([check("GQA 64/8 1K", 1024, 64, 8, False, "triton:fused"),
              check("MHA 8 1K causal", 1024, 8, 8, True, "triton:fused"),
              check("GQA 64/8 1K", 1024, 64, 8, False, "triton:fused_atomic")])
    print("checks", "OK" if ok else "FAILED")
    rows = []
    for name, s, h, hk in (("GQA 64/8 1K", 1024, 64, 8), ("MHA 8 1K", 1024, 8, 8),
                           ("MHA 8 16K", 16384, 8, 8)):
        args, kw = inputs(s, h, hk, False)
        for label, backend, plans in (("triton:fused plans", "triton:fused", True),
                                      ("triton:fused no plans", "triton:fused", False),
                                      ("triton:fused_atomic plans", "triton:fused_atomic", True),
                                      ("cudnn", "torch_sdpa:cudnn", True)):
            set_plans(plans)
            try:
                h_us, d_us = time_calls(args, kw, backend)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{name} {label}: {type(exc).__name__}: {exc}")
                continue
            rows.append((name, label, h_us, d_us))
            print(f"{name:<12} {label:<26} host {h_us:8.1f} us  device {d_us:9.1f} us")
        set_plans(True)


if __name__ == "__main__":
    main()
