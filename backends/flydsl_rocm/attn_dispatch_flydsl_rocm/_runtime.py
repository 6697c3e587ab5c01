"""Running the three kernels on a ROCm GPU: preprocess -> main -> convert.

Only reached from ``backward`` after ``supports`` accepted a ROCm device. Each configuration is
first compiled in a child process (a compile error can abort a process), then in-process for
launching; both are cached by ``KernelSpec.key()`` (the scale is a run-time argument).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from ._spec import KernelSpec, specs_for
from ._support import dtype_tag
from ._tiles import main_tiles, rows_per_block
from ._toolchain import cache_dir, compile_in_subprocess, rocm_path

_launchers: dict[str, object] = {}


@contextlib.contextmanager
def _target_arch(arch: str) -> Iterator[None]:
    """``ARCH=arch`` while FlyDSL compiles (it reads its target from that variable), then the
    caller's value back: the rest of the process never sees it."""
    saved = os.environ.get("ARCH")
    os.environ["ARCH"] = arch
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ARCH", None)
        else:
            os.environ["ARCH"] = saved


def _compiled(spec: KernelSpec, args: list):
    fn = _launchers.get(spec.key())
    if fn is None:
        compile_in_subprocess(spec)  # surfaces a crashing compile as an exception, not an abort
        os.environ.setdefault("FLYDSL_RUNTIME_CACHE_DIR", str(cache_dir() / "flydsl"))
        rp = rocm_path()
        if rp:
            os.environ.setdefault("ROCM_PATH", rp)
        with _target_arch(spec.arch):
            import flydsl.compiler as flyc

            from ._builders import launcher

            fn = flyc.compile(launcher(spec), *args)
        _launchers[spec.key()] = fn
        return fn, True  # flyc.compile already ran it once with these arguments
    return fn, False


def _run(spec: KernelSpec, args: list) -> None:
    fn, ran = _compiled(spec, args)
    if not ran:
        fn(*args)


def _rows(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(row, head, batch) strides in elements."""
    s = t.stride()
    return (s[0], s[1], 0) if varlen else (s[1], s[2], s[0])


def backward(variant: str, inp: adb.BackwardInputs, arch: ad.Arch) -> ad.Gradients:
    """dq, dk, dv through the FlyDSL kernels (ROCm GPU only)."""
    q, k, v, o, do = inp.q, inp.k, inp.v, inp.out, inp.grad_out
    varlen = inp.is_varlen
    d, h, hk = inp.head_dim, inp.heads, inp.kv_heads
    group = h // hk
    tag = dtype_tag(inp.dtype)
    pre, main, conv = specs_for(variant, arch.name, tag, d, inp.causal, varlen, group)
    if varlen:
        batch = inp.cu_seqlens_q.numel() - 1
        # the kernels index cu_seqlens as a packed array: a strided view would be misread
        cu_q, cu_k = inp.cu_seqlens_q.contiguous(), inp.cu_seqlens_k.contiguous()
        sq, sk = inp.max_seqlen_q, inp.max_seqlen_k
    else:
        batch = q.shape[0]
        sq, sk = q.shape[1], k.shape[1]
        cu_q = cu_k = torch.zeros(2, dtype=torch.int32, device=q.device)
    lse = inp.lse.contiguous()
    dvec = torch.empty_like(lse)
    dq_acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    l_sh, l_sb = (lse.stride(0), 0) if varlen else (lse.stride(1), lse.stride(0))
    rpb = rows_per_block(d)
    row_grid = (sq + rpb - 1) // rpb

    _run(
        pre,
        [
            o,
            do,
            dvec,
            dq_acc,
            cu_q,
            sq,
            h,
            *_rows(o, varlen),
            *_rows(do, varlen),
            l_sh,
            l_sb,
            row_grid,
            h,
            batch,
        ],
    )
    bn = main_tiles(variant).block_n
    _run(
        main,
        [
            q,
            k,
            v,
            do,
            lse,
            dvec,
            dq_acc,
            dk,
            dv,
            cu_q,
            cu_k,
            sq,
            sk,
            h,
            *_rows(q, varlen),
            *_rows(k, varlen),
            *_rows(v, varlen),
            *_rows(do, varlen),
            l_sh,
            l_sb,
            float(inp.scale),
            (sk + bn - 1) // bn,
            hk,
            batch,
        ],
    )
    _run(conv, [dq_acc, dq, cu_q, sq, h, float(inp.scale), row_grid, h, batch])
    return ad.Gradients(dq, dk, dv)
