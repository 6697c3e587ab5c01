"""Peak memory and time of the reference backend's backward on the CPU.

Method: run in a fresh process; build q, k, v, grad_out, compute (out, lse) with the reference
forward, then reset the kernel's resident-set high-water mark (``echo 5 > /proc/self/clear_refs``,
Linux) and record the resident set size (RSS); run the backward; read the high-water mark
(``VmHWM`` in ``/proc/self/status``). "Peak above inputs" is ``VmHWM - RSS before``; "above inputs
and outputs" further subtracts the bytes of dq, dk and dv, which are allocated during the call.
RSS counts every byte the process touches (PyTorch's CPU allocations are invisible to
tracemalloc), so this is an upper bound on the backward's working memory. With ``--device cuda``
the same is read from PyTorch's CUDA allocator (``max_memory_allocated`` after a peak reset,
minus the bytes allocated before the call) and timed with a device synchronisation.

    python benchmarks/reference_memory.py                  # B=1 H=8 S=16384 D=128 float32
    python benchmarks/reference_memory.py --seqlen 4096 --heads 4 --head-dim 64 --json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from attn_dispatch_reference import DEFAULT_BUDGET_BYTES, attention_backward, attention_forward

from attn_dispatch import backend as adb

MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(
    batch: int = 1,
    heads: int = 8,
    kv_heads: int | None = None,
    seqlen: int = 16384,
    head_dim: int = 128,
    causal: bool = False,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> dict:
    """Measure one backward (see the module docstring); returns a JSON-able dict."""
    kv_heads = kv_heads or heads
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, seqlen, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, seqlen, kv_heads, head_dim, generator=gen).to(dtype)
    grad_out = torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(dtype)
    q, k, v, grad_out = (t.to(device) for t in (q, k, v, grad_out))
    cuda = torch.device(device).type == "cuda"
    flags = {
        "scale": head_dim**-0.5,
        "band": adb.Band.of(None, causal, "top_left"),
        "budget_bytes": budget_bytes,
    }
    # warm up thread pools and kernels on a small problem, so they are not counted
    small = [t[:, :64].contiguous() for t in (q, k, v, grad_out)]
    o_s, l_s = attention_forward(*small[:3], **flags)
    attention_backward(*small[:3], o_s, l_s, small[3], **flags)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out, lse = attention_forward(q, k, v, **flags)
    sync()
    t_forward = time.perf_counter() - t0

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        rss_before = torch.cuda.memory_allocated()
    else:
        _reset_peak()
        rss_before = _status_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    dq, dk, dv = attention_backward(q, k, v, out, lse, grad_out, **flags)
    sync()
    t_backward = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else _status_kib("VmHWM") * 1024
    outputs = sum(t.numel() * t.element_size() for t in (dq, dk, dv))
    above_inputs = peak - rss_before
    score_matrix = batch * heads * seqlen * seqlen * torch.finfo(torch.float32).bits // 8
    return {
        "shape": {
            "batch": batch,
            "heads": heads,
            "kv_heads": kv_heads,
            "seqlen": seqlen,
            "head_dim": head_dim,
            "dtype": str(dtype).removeprefix("torch."),
            "causal": causal,
        },
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "budget_mib": budget_bytes / MIB,
        "threads": torch.get_num_threads(),
        "forward_s": round(t_forward, 3),
        "backward_s": round(t_backward, 3),
        "peak_above_inputs_mib": round(above_inputs / MIB, 1),
        "outputs_mib": round(outputs / MIB, 1),
        "peak_above_inputs_and_outputs_mib": round((above_inputs - outputs) / MIB, 1),
        "one_full_score_matrix_mib": round(score_matrix / MIB, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--budget-mib", type=float, default=DEFAULT_BUDGET_BYTES / MIB)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    budget = int(args.budget_mib * MIB)
    result = measure(
        args.batch,
        args.heads,
        args.kv_heads,
        args.seqlen,
        args.head_dim,
        args.causal,
        budget,
        getattr(torch, args.dtype),
        args.device,
    )
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:<36} {value}")


if __name__ == "__main__":
    main()
