"""The backend's calls into the installed FA4, compiled on the CPU.

Under ``FakeTensorMode`` FA4 builds and compiles its kernels for a named arch without a GPU
and without launching them (what FA4 offers to fill its disk cache ahead of time). Running
the backend's own ``forward`` / ``backward`` that way checks, on every CI run, that the
installed FA4 takes the private entry points' arguments as this backend passes them (the
top-left causal mask as a window with a negative right side, a sliding window with a soft cap,
attention sinks as ``learnable_sink``), returns what it
unpacks, and that the first calls are recorded. sm_90 only: FA4's Blackwell kernels query
the GPU while compiling. Runs in a subprocess, since FA4 reads the arch once per process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import os
    os.environ.update(
        FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132"
    )
    os.environ.pop("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", None)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from attn_dispatch.backend import make_inputs
    from attn_dispatch_flash_attn_cute import _fa4

    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    with FakeTensorMode():
        q = torch.empty(2, 300, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 1000, 2, 64, dtype=torch.bfloat16, device="cuda")
        out, lse = _fa4.forward(make_inputs(q, k, k, **flags))
        assert out.shape == (2, 300, 8, 64) and out.dtype == torch.bfloat16, out
        assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32, lse
        dq, dk, dv = _fa4.backward(make_inputs(q, k, k, out, lse, out, **flags))
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
        # a sliding window on the top-left diagonal (both sides shifted) with a soft cap
        capped = dict(flags, window=(200, 5), softcap=30.0)
        out, lse = _fa4.forward(make_inputs(q, k, k, **capped))
        dq, dk, dv = _fa4.backward(make_inputs(q, k, k, out, lse, out, **capped))
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
        # a second call of a signature: no snapshot, no progress line, same results
        dq, dk, dv = _fa4.backward(make_inputs(q, k, k, out, lse, out, **capped))
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
        # attention sinks (GPT-OSS: GQA, D = 64, a causal window), float32 logits
        sinks = torch.empty(8, dtype=torch.float32, device="cuda")
        windowed = dict(flags, window=(127, 0), sinks=sinks)
        kv = torch.empty(2, 300, 2, 64, dtype=torch.bfloat16, device="cuda")
        out, lse = _fa4.forward(make_inputs(q, kv, kv, **windowed))
        assert out.shape == q.shape and lse.shape == (2, 8, 300), (out, lse)
        grads = _fa4.backward(make_inputs(q, kv, kv, out, lse, out, **windowed))
        assert grads.dq.shape == q.shape and grads.dsinks.shape == (8,), grads
        assert grads.dsinks.dtype == torch.float32, grads.dsinks
    log = _fa4.compile_log()
    assert [(r.kind, r.variant) for r in log] == [
        ("forward", "forward bfloat16 D=64 Dv=64 group=4 window dense"),
        ("backward", "backward bfloat16 D=64 Dv=64 group=4 window dense"),
        ("forward", "forward bfloat16 D=64 Dv=64 group=4 window dense softcap=30"),
        ("backward", "backward bfloat16 D=64 Dv=64 group=4 window dense softcap=30"),
        ("forward", "forward bfloat16 D=64 Dv=64 group=4 window dense sinks=float32"),
        ("backward", "backward bfloat16 D=64 Dv=64 group=4 window dense sinks=float32"),
    ], log
    assert all(r.kernels > 0 and r.seconds > 0 for r in log), log
    print("compiled:", [(r.variant, r.kernels, round(r.seconds, 1)) for r in log])
    """
)


def test_forward_and_backward_compile_through_installed_fa4():
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "compiled:" in result.stdout
    # one line before and one after each variant's first compilation, none per call
    starts = [line for line in result.stderr.splitlines() if "compiling FlashAttention-4" in line]
    assert starts == [
        "attn_dispatch: compiling FlashAttention-4 forward bfloat16 D=64 Dv=64 group=4 window "
        "dense kernels (once per variant) ...",
        "attn_dispatch: compiling FlashAttention-4 backward bfloat16 D=64 Dv=64 group=4 window "
        "dense kernels (once per variant) ...",
        "attn_dispatch: compiling FlashAttention-4 forward bfloat16 D=64 Dv=64 group=4 window "
        "dense softcap=30 kernels (once per variant) ...",
        "attn_dispatch: compiling FlashAttention-4 backward bfloat16 D=64 Dv=64 group=4 window "
        "dense softcap=30 kernels (once per variant) ...",
        "attn_dispatch: compiling FlashAttention-4 forward bfloat16 D=64 Dv=64 group=4 window "
        "dense sinks=float32 kernels (once per variant) ...",
        "attn_dispatch: compiling FlashAttention-4 backward bfloat16 D=64 Dv=64 group=4 window "
        "dense sinks=float32 kernels (once per variant) ...",
    ], result.stderr[-3000:]
    assert result.stderr.count(" ready in ") == 6
