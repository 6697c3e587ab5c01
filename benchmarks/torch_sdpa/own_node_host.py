"""One-off: where an eager call through cuDNN's own node spends its host time (B=1, 32/8 heads,
S=128, D=128, causal, bf16, [B, H, S, D] leaves): sdpa, the op alone, the op with the gradient
pre-hook registered, two C++ alternatives to the hook (a full slice, two views), the flash op,
and ``ad.attention`` forced to either; forward alone and forward + backward. ``--profile``: a
cProfile of 2,000 forwards of ``ad.attention`` forced to cuDNN.

Run on a CUDA GPU from the repository root: ``python benchmarks/torch_sdpa/own_node_host.py``
"""

from __future__ import annotations

import cProfile
import functools
import io
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from attn_dispatch_torch_sdpa import cudnn

import attn_dispatch as ad

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import interleaved_medians  # noqa: E402

DEVICE = torch.device("cuda")
CUDNN = torch.ops.aten._scaled_dot_product_cudnn_attention.default
FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
SLICE = torch.ops.aten.slice.Tensor


def main() -> None:
    gen = torch.Generator().manual_seed(0)

    def rand(heads: int) -> torch.Tensor:
        return torch.randn(1, heads, 128, 128, generator=gen, dtype=torch.bfloat16).to(DEVICE)

    q, k, v = (rand(h).requires_grad_() for h in (32, 8, 8))
    grad, scale = rand(32), 128**-0.5

    def op() -> torch.Tensor:
        return CUDNN(q, k, v, None, True, 0.0, True, False, scale=scale)[0]

    def hooked() -> torch.Tensor:
        out = op()
        out.grad_fn.register_prehook(functools.partial(cudnn._gradient_in, q.stride()))
        return out

    def attention(backend: str) -> torch.Tensor:
        return ad.attention(q, k, v, causal=True, layout="bhsd", backend=backend)

    forwards = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        "op": op,
        "op+register": hooked,
        "op+slice": lambda: SLICE(op(), -1, 0, 128),
        "op+views": lambda: op().view(-1).view(q.shape),
        "flash op": lambda: FLASH(q, k, v, 0.0, True, False, scale=scale)[0],
        "ad cudnn": lambda: attention("torch_sdpa:cudnn"),
        "ad flash": lambda: attention("torch_sdpa:flash"),
    }

    def with_backward(forward):
        def step():
            q.grad = k.grad = v.grad = None
            forward().backward(grad)

        return step

    rows = {f"{name} fwd": f for name, f in forwards.items()}
    rows |= {f"{name} fwd+bwd": with_backward(f) for name, f in forwards.items()}
    for step in rows.values():
        for _ in range(3):
            step()
    for name in ("ad cudnn", "ad flash"):
        print(name, "node:", type(forwards[name]().grad_fn).__name__)
    for name, seconds in interleaved_medians(rows, DEVICE, 20, 11, 200).items():
        print(f"{name:22s} {seconds * 1e6:8.1f} us")
    if "--profile" in sys.argv:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            forwards["ad cudnn"]()
        torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).strip_dirs().sort_stats("tottime").print_stats(15)
        print(text.getvalue())


if __name__ == "__main__":
    main()
