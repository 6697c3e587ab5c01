"""The dQ scratch's column order of ``WIDE_STORE`` (Gluon fused-atomic kernel, sm_90).

With the config key the Gluon dK/dV kernel relabels its dQ tile's registers before storing it
(``_bwd_dkdv_sm90._wide_store_order``), so that each thread stores 16 bytes and the stores are
free of shared-memory bank conflicts; the scratch then holds each row's columns in another order,
and the convert pass (``_bwd_dq_convert.logical_columns``) puts them back. Here, on the CPU:
the convert pass under ``TRITON_INTERPRET=1`` undoes that order exactly (the order written out in
torch, from the kernel's docstring), and it still compiles for sm_90. The Gluon side runs only on
Hopper: the GPU oracle tests (``test_triton_gluon.py``) run the whole backward with the key on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CONVERT_IN_INTERPRETER = textwrap.dedent("""
    import os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from attn_dispatch_triton._bwd_dq_convert import _attn_bwd_dq_convert

    torch.manual_seed(0)
    b, s, h, d, scale = 2, 37, 3, 128, 0.0883
    logical = torch.randn(b, s, h, d)
    # within each half of D: column 8j + 2q + t (j = 4b + 2k + e) stored at 32b + 8q + 4k + 2e + t
    stored = (logical.view(b, s, h, 2, 2, 2, 2, 4, 2)  # (half, b, k, e, q, t)
              .permute(0, 1, 2, 3, 4, 7, 5, 6, 8).reshape(b, s, h, d))  # (half, b, q, k, e, t)
    assert not torch.equal(stored, logical)
    out = {}
    for wide, acc in ((True, stored), (False, logical)):
        dq = torch.full((b, s, h, d), float("nan"), dtype=torch.bfloat16)
        grid = ((s + 15) // 16, b * h)
        _attn_bwd_dq_convert[grid](acc, dq, acc, *acc.stride()[:3], *dq.stride()[:3], s, h,
                                   scale, D=d, IS_VARLEN=False, BLOCK_M=16, BLOCK_D=d,
                                   WIDE_STORE=wide, num_warps=4)
        out[wide] = dq
    assert torch.equal(out[True], out[False])  # the same values, each in its place
    # (the interpreter's fp32 -> bf16 cast truncates: within one bf16 ulp of torch's rounding)
    want = logical * scale
    assert ((out[False].float() - want).abs() <= want.abs() * 2 ** -7).all()
    print("ok")
""")


def test_convert_puts_the_wide_store_columns_back() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", CONVERT_IN_INTERPRETER],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_convert_with_wide_store_compiles_for_sm90() -> None:
    import triton
    from attn_dispatch_triton._bwd_dq_convert import _attn_bwd_dq_convert
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if not isinstance(_attn_bwd_dq_convert, JITFunction):
        pytest.skip("kernels were defined in interpreter mode: nothing to compile")
    consts = dict(D=128, IS_VARLEN=False, BLOCK_M=64, BLOCK_D=128, WIDE_STORE=True)
    signature = {}
    for name in _attn_bwd_dq_convert.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in ("ACC", "DQ", "CU_Q"):
            signature[name] = {"ACC": "*fp32", "DQ": "*bf16", "CU_Q": "*i32"}[name]
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    src = ASTSource(_attn_bwd_dq_convert, signature, constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert len(compiled.asm["cubin"]) > 0
