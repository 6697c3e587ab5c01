"""Launch order of the causal backward kernels: heaviest programs first, or the natural order.

With a causal mask the dQ programs of the last query blocks and the dK/dV programs of the first
key blocks do the most work. ``HEAVY_FIRST`` (a config key; the tuning table sets it per shape
class) launches those first across all heads, so light programs fill the tail. This script
checks that both orders give bitwise identical gradients (each program's arithmetic is
unchanged) that match the reference, then times the backward kernels both ways
(``triton.testing.do_bench``, median, L2 flushed).

    PYTHONUNBUFFERED=1 python backends/triton/bench_order.py
"""

from __future__ import annotations

import functools

import torch
import triton.testing
from attn_dispatch_triton.backward import attention_backward
from attn_dispatch_triton.tuning import get_backward_config

import attn_dispatch as ad

SHAPES = [  # (name, H, Hkv, S)
    ("GQA 64/8 1K causal", 64, 8, 1024),
    ("GQA 64/8 2K causal", 64, 8, 2048),
    ("GQA 64/8 4K causal", 64, 8, 4096),
    ("GQA 64/8 16K causal", 64, 8, 16384),
    ("MHA 8 2K causal", 8, 8, 2048),
    ("MHA 8 4K causal", 8, 8, 4096),
    ("MHA 8 8K causal", 8, 8, 8192),
    ("MHA 8 16K causal", 8, 8, 16384),
]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}")
    rows = []
    for name, h, hk, s in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(s + h)
        q, k, v = (torch.randn(1, s, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for n in (h, hk, hk))
        out, lse = ad.forward(q, k, v, causal=True, backend="triton:fused")
        do = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        base = get_backward_config(q.device, 128, True, h // hk, s)
        grads = {}
        ms = {}
        for heavy in (1, 0):
            config = {kname: {**c, "HEAVY_FIRST": heavy} for kname, c in base.items()}
            poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            dq, dk, dv = poisoned

            run = functools.partial(attention_backward, q, k, v, out, lse, do, causal=True,
                                    bottom_right=False, scale=128**-0.5, config=config,
                                    dq=dq, dk=dk, dv=dv)

            grads[heavy] = [t.clone() for t in run()]
            ms[heavy] = triton.testing.do_bench(run, warmup=50, rep=300)
        same = all(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))
        if s <= 4096:  # the reference backend on the GPU is quick enough here
            ref = ad.backward(q, k, v, out, lse, do, causal=True, backend="reference")
            err = max(rel_l2(a, r) for a, r in zip(grads[1], ref))
        else:
            err = float("nan")
        ok = same and not any(t.isnan().any().item() for t in grads[1]) and not err > 1e-2
        rows.append((name, ms[0] * 1e3, ms[1] * 1e3, same, err, ok))
        print(f"{name}: natural {ms[0] * 1e3:.0f} us, heavy-first {ms[1] * 1e3:.0f} us, "
              f"bitwise equal {same}, rel_l2 vs reference {err:.2e}", flush=True)
    print(f"\n{'shape':<22}{'natural µs':>12}{'heavy-first µs':>16}{'speed-up':>10}  check")
    for name, nat, heavy, _same, err, ok in rows:
        print(f"{name:<22}{nat:>12.0f}{heavy:>16.0f}{nat / heavy:>9.3f}×  "
              f"{'OK' if ok else 'FAIL'} (rel_l2 {err:.1e})")


if __name__ == "__main__":
    main()
