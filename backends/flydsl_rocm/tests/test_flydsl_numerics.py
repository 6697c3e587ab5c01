"""Numerics against the float64 oracle: only on a ROCm GPU (gfx942 / gfx950)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.testing import make_conformance_tests


def _rocm_arch() -> str | None:
    if not (torch.cuda.is_available() and torch.version.hip):
        return None
    name = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    return name if name in ("gfx942", "gfx950") else None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        _rocm_arch() is None,
        reason="needs a ROCm GPU (gfx942 or gfx950); the FlyDSL kernels cannot run on this machine",
    ),
]

test_flydsl_conformance = make_conformance_tests(
    "flydsl_rocm", dtypes=("bfloat16", "float16"), device="cuda", checks=("backward",)
)
