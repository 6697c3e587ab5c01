"""triton:fused's host cost by memory layout: ad.forward + ad.backward forced, B=1 S=128 32/8
D=128 causal bf16, on [B, S, H, D] tensors and on [B, H, S, D] memory; then a profile of the
backward in the second layout. Run: python benchmarks/triton_layout_host_cost.py (on the GPU)."""

import cProfile
import pstats
import time

import torch

import attn_dispatch as ad


def run(layout, backend, n=200):
    B, S, H, Hk, D = 1, 128, 32, 8, 128

    def mk(h):
        return torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16)

    q, k, v = mk(H), mk(Hk), mk(Hk)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out, lse = ad.forward(q, k, v, causal=True, backend=backend)
    do = torch.randn_like(out)
    for _ in range(20):
        ad.backward(q, k, v, out, lse, do, causal=True, backend=backend)
    ts = []
    for _r in range(7):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            o, lse_ = ad.forward(q, k, v, causal=True, backend=backend)
            ad.backward(q, k, v, o, lse_, do, causal=True, backend=backend)
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) / n * 1e6)
    ts.sort()
    print(f"{layout} {backend}: {ts[3]:.1f} us fwd+bwd")


for lay in ("bshd", "bhsd"):
    run(lay, "triton:fused")
B, S, H, Hk, D = 1, 128, 32, 8, 128


def mk(h):
    return torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16)


q, k, v = (mk(h).transpose(1, 2).contiguous().transpose(1, 2) for h in (H, Hk, Hk))
out, lse = ad.forward(q, k, v, causal=True, backend="triton:fused")
do = torch.randn_like(out)
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    ad.backward(q, k, v, out, lse, do, causal=True, backend="triton:fused")
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("cumtime").print_stats(18)
