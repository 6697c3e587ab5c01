"""attn_dispatch entry point of the FlyDSL ROCm backend (cheap to import: no flydsl here)."""

from __future__ import annotations

import attn_dispatch as ad
from attn_dispatch import backend as adb

from ._support import DTYPES, HEAD_DIMS, reasons


class _FlyDSL(adb.Implementation):
    """Backward only; capabilities as declared here, the rest in ``_support.reasons``."""

    backend = "flydsl_rocm"
    opt_in = True
    deterministic = False  # dQ accumulates with f32 atomics
    vendors = ("rocm",)
    dtypes = tuple(DTYPES)
    head_dims = HEAD_DIMS
    same_head_dims = True
    causal_aligns = ("top_left",)

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        return reasons(self.name, inp, arch)

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        from ._runtime import backward

        arch = ad.detect_arch(inp.device)
        if arch.vendor != "rocm":  # never launch without a ROCm device
            raise ValueError(f"flydsl_rocm needs a ROCm GPU; device {inp.device} is {arch.full}")
        return backward(self.name, inp, arch)


class Gfx950Fused(_FlyDSL):
    """Fused dQ+dK+dV for CDNA4: MFMA 16x16x32, ds_read_b64_tr_b16, swizzled LDS, K/V in
    registers, prefetched Q/dO tiles."""

    name = "gfx950_fused"
    priority = {"gfx950": 95}
    archs = ("gfx950",)  # needs MFMA 16x16x32 and ds_read_b64_tr_b16


class Gfx942Mfma(_FlyDSL):
    """Fused dQ+dK+dV with MFMA 32x32x8 for CDNA3 (also runs on gfx950)."""

    name = "gfx942_mfma"
    priority = {"gfx942": 90, "gfx950": 85}
    archs = ("gfx942", "gfx950")


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    return [Gfx950Fused(), Gfx942Mfma()]
