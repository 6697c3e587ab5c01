"""Spec -> FlyDSL launcher plus placeholder CPU arguments for a compile-only build."""

from __future__ import annotations

from typing import Any

from ._spec import KernelSpec
from ._tiles import main_tiles


def launcher(spec: KernelSpec):
    """The ``@flyc.jit`` launcher of ``spec`` (imports flydsl)."""
    if spec.kind == "preprocess":
        from ._kernel_rows import build_preprocess

        return build_preprocess(spec.dtype, spec.head_dim, spec.varlen)
    if spec.kind == "convert":
        from ._kernel_rows import build_convert

        return build_convert(spec.dtype, spec.head_dim, spec.varlen)
    from ._kernel_main import build_main

    return build_main(
        main_tiles(spec.variant), spec.dtype, spec.head_dim, spec.causal, spec.varlen, spec.group
    )


def placeholder_args(spec: KernelSpec) -> list[Any]:
    """Small CPU tensors and scalars with the launcher's signature (types matter, not sizes)."""
    import torch

    dt = torch.bfloat16 if spec.dtype == "bf16" else torch.float16
    d = spec.head_dim
    h, hk = spec.group, 1
    x = torch.zeros(1, 64, h, d, dtype=dt)
    kv = torch.zeros(1, 64, hk, d, dtype=dt)
    rows = torch.zeros(1, h, 64)
    acc = torch.zeros(1, 64, h, d)
    cu = torch.zeros(2, dtype=torch.int32)
    if spec.kind == "preprocess":
        return [x, x, rows, acc, cu, 64, h] + [1] * 8 + [1, 1, 1]
    if spec.kind == "convert":
        return [acc, x, cu, 64, h, 0.5, 1, 1, 1]
    return [x, kv, kv, x, rows, rows, acc, kv, kv, cu, cu, 64, 64, h] + [1] * 14 + [0.5, 1, 1, 1]
