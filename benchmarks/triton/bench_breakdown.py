"""Where triton:fused_atomic's and cuDNN's backward time goes (GQA 64/8, B=1, D=128, bf16).

Two views per shape:

* kernel by kernel: GPU time of each kernel of one backward call (``torch.profiler``, mean of 5
  calls after warm-up, back to back, so the inputs stay warm in L2);
* sustained: each backward run back to back for 3 s while ``nvidia-smi`` samples the SM clock,
  the board power and the active throttle reasons (medians of the last two thirds). At these
  sizes an H200 runs at its power limit, so the clock a kernel sustains is part of its speed.

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_breakdown.py [--seqlens 4096 16384]
        [--causal] [--variant SPLIT_ADD=0 ...]

``--variant KEY=VALUE[,KEY=VALUE]`` adds ``triton:fused_atomic`` with those keys over the table's
``dkdvq`` entry (``tuning.trial``), timed the same two ways.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch
from attn_dispatch_triton import tuning
from bench_kernels import timed_backward, timing_inputs
from torch.profiler import ProfilerActivity, profile

import attn_dispatch as ad

CALLS = 5


def kernel_times(fn: Callable[[], object]) -> dict[str, float]:
    """Kernel name -> µs of GPU time per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:60]
            total[name] = total.get(name, 0.0) + event.device_time / CALLS
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def _sample(stop: threading.Event, rows: list[list[str]]) -> None:
    query = "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active"
    while not stop.is_set():
        out = (
            subprocess.run(
                ["nvidia-smi", query, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .split(", ")
        )
        if len(out) == 3:
            rows.append(out)
        time.sleep(0.05)


def sustained(fn: Callable[[], object], seconds: float = 3.0) -> tuple[float, float, float, str]:
    """(µs per call, SM MHz, W, throttle reasons) while ``fn`` runs back to back."""
    fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    stop, rows = threading.Event(), []
    sampler = threading.Thread(target=_sample, args=(stop, rows))
    sampler.start()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, calls = time.perf_counter(), 0
    start.record()
    while time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
        if calls % 4 == 0:
            torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    stop.set()
    sampler.join()
    late = rows[len(rows) // 3 :]
    mhz = statistics.median(float(r[0]) for r in late)
    watts = statistics.median(float(r[1]) for r in late)
    reasons = ",".join(sorted({r[2] for r in late}))
    return start.elapsed_time(end) * 1e3 / calls, mhz, watts, reasons


def backward_calls(s: int, causal: bool) -> dict[str, Callable[[], object]]:
    """Both backward calls on fresh random GQA 64/8 inputs of ``s`` tokens."""
    inputs = timing_inputs(64, 8, s)
    q, k, v, out, lse, do = inputs
    return {
        "triton:fused_atomic": lambda: timed_backward(inputs, causal),
        "torch_sdpa:cudnn": lambda: ad.backward(
            q, k, v, out, lse, do, causal=causal, backend="torch_sdpa:cudnn"
        ),
    }


def parse_variant(text: str) -> dict[str, int]:
    """``"SPLIT_ADD=0,WINDOW=1"`` -> ``{"SPLIT_ADD": 0, "WINDOW": 1}``."""
    try:
        return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=INT[,KEY=INT], got {text!r}") from None


def in_force(name: str, s: int, causal: bool):
    """The config of implementation ``name`` (``triton:fused_atomic[K=V,...]``: the table's
    dkdvq entry with those keys) in force while its calls run."""
    if "[" not in name:
        return contextlib.nullcontext()
    keys = parse_variant(name[name.index("[") + 1 : -1])
    return tuning.trial_with("sm_90", "dkdvq", 128, causal, 8, s, **keys)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=[],
        help="KEY=INT[,KEY=INT]: also time triton:fused_atomic with these keys",
    )
    args = ap.parse_args()
    if args.variant and tuning.arch_of(torch.device("cuda")) != "sm_90":
        print("--variant needs an sm_90 GPU (it changes the sm_90 table's entries)")
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    summary = []
    for s in args.seqlens:
        impls = backward_calls(s, args.causal)
        for keys in args.variant:
            name = "triton:fused_atomic[" + ",".join(f"{k}={v}" for k, v in keys.items()) + "]"
            impls[name] = impls["triton:fused_atomic"]
        label = f"GQA 64/8 {s // 1024}K{' causal' if args.causal else ''}"
        for name, fn in impls.items():
            with in_force(name, s, args.causal):
                times = kernel_times(fn)
            print(f"{label} {name}: {sum(times.values()):.1f} µs of kernels per call", flush=True)
            for kernel, us in times.items():
                print(f"    {us:10.1f}  {kernel}")
        for rnd in range(2):  # alternating, so that neither always runs on the hotter card
            for name, fn in list(impls.items())[:: (-1 if rnd else 1)]:
                with in_force(name, s, args.causal):
                    us, mhz, watts, reasons = sustained(fn)
                summary.append(
                    f"{label:22s} {name:34s} {us:10.1f} µs  {mhz:5.0f} MHz  "
                    f"{watts:4.0f} W  throttle {reasons}"
                )
                print(summary[-1], flush=True)
    print("\nsustained, back to back:\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
