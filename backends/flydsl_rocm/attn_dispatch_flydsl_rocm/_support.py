"""Why an implementation cannot take given inputs: reasons that name the value (no flydsl)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from ._layout import head_dim_problems
from ._tiles import LDS_BUDGET, main_tiles

# The FlyDSL releases the kernels were built and ISA-checked with (see the README's version
# table); the cap stays below the next minor release, which may change the unstable APIs used.
FLYDSL_REQUIREMENT = "flydsl>=0.4.2,<0.6"
# Set to 1 where FlyDSL is installed on purpose (CI): a missing or out-of-range FlyDSL then fails
# the compile tests instead of skipping them, so a green run always means they ran.
REQUIRE_FLYDSL_ENV = "ATTN_DISPATCH_REQUIRE_FLYDSL"
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
# Head dims the kernels' tiles are written for (D == Dv).
HEAD_DIMS = range(32, 257, 32)
_INT32_MAX = 2**31 - 1
# Head dims whose kernel spills registers (found by compiling; the fix is a split dK/dV + dQ
# kernel, which is not implemented).
SPILLING_HEAD_DIMS = {"gfx942_mfma": {256}, "gfx950_fused": set()}


def oldest_flydsl() -> str:
    """The lowest FlyDSL release :data:`FLYDSL_REQUIREMENT` accepts (its ``>=`` bound)."""
    from packaging.requirements import Requirement

    lows = [s.version for s in Requirement(FLYDSL_REQUIREMENT).specifier if s.operator == ">="]
    if len(lows) != 1:
        raise ValueError(f"FLYDSL_REQUIREMENT={FLYDSL_REQUIREMENT!r} needs exactly one >= bound")
    return lows[0]


def flydsl_required(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``ATTN_DISPATCH_REQUIRE_FLYDSL`` (a boolean, ``adb.env_flag``) asks for FlyDSL
    to be present and in range."""
    return adb.env_flag(REQUIRE_FLYDSL_ENV, False, environ)


def flydsl_test_gate(
    problem: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """What a test that needs FlyDSL does: ``("run", "")``, ``("skip", why)`` on a user's machine
    or ``("fail", why)`` when ``ATTN_DISPATCH_REQUIRE_FLYDSL`` is set. ``problem`` is
    ``adb.missing_requirement(FLYDSL_REQUIREMENT)``."""
    if problem is None:
        return "run", ""
    if flydsl_required(environ):
        return "fail", (
            f"{problem}, and {REQUIRE_FLYDSL_ENV}=1 forbids skipping "
            f"(install it: pip install '{FLYDSL_REQUIREMENT}')"
        )
    return "skip", f"{problem} (pip install '{FLYDSL_REQUIREMENT}')"


def dtype_tag(dtype: torch.dtype) -> str | None:
    """The kernels' name for ``dtype`` (``None`` for a dtype they do not run)."""
    return DTYPES.get(dtype)


def _stride_reason(name: str, t: torch.Tensor, varlen: bool) -> str | None:
    """Kernels address rows as ``row * stride_row + head * stride_head + d``, heads inside one
    row pitch, last dim contiguous, 32-bit element offsets within one batch entry."""
    s = t.stride()
    heads = t.shape[-2]
    d = t.shape[-1]
    row = s[0] if varlen else s[1]
    rows = t.shape[0] if varlen else t.shape[1]
    ok = (
        s[-1] == 1
        and s[-2] >= 0
        and s[-2] * (heads - 1) + d <= row
        and rows * row < _INT32_MAX
        and (varlen or s[0] < _INT32_MAX)
    )
    if ok:
        return None
    return (
        f"{name} strides {tuple(s)} are not supported (needs the last dim contiguous, every "
        f"head inside one row pitch and 32-bit offsets)"
    )


def _head_dim_reasons(variant: str, d: int) -> list[str]:
    """Head dims inside :data:`HEAD_DIMS` that a kernel still cannot take."""
    if d not in HEAD_DIMS:  # the core gives the declared range's reason
        return []
    if d in SPILLING_HEAD_DIMS[variant]:
        return [f"head_dim={d} spills registers in the {variant} kernel (not supported)"]
    problems = head_dim_problems(main_tiles(variant), d)
    if problems:
        return [
            f"head_dim={d} is not supported by the {variant} index math: " + "; ".join(problems)
        ]
    return []


def _lds_reasons(variant: str, d: int, arch: ad.Arch) -> list[str]:
    budget_arch = arch.name if arch.name in LDS_BUDGET else "gfx942"
    tiles = main_tiles(variant)
    lds = tiles.lds_bytes(d)
    if lds <= LDS_BUDGET[budget_arch]:
        return []
    return [
        f"LDS {lds} bytes for {tiles.block_m}x{tiles.block_n} tiles at head_dim={d} "
        f"exceeds the {budget_arch} budget of {LDS_BUDGET[budget_arch]}"
    ]


def reasons(variant: str, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
    """What the declared capabilities (see ``plugin``) cannot say: the flydsl requirement,
    head dims the kernels cannot take, strides and the LDS budget; [] when it can run."""
    out: list[str] = []
    missing = adb.missing_requirement(FLYDSL_REQUIREMENT)
    if missing:
        out.append(missing)
    out += _head_dim_reasons(variant, inp.head_dim)
    tensors = [("q", inp.q), ("k", inp.k), ("v", inp.v)]
    if isinstance(inp, adb.BackwardInputs):
        tensors += [("out", inp.out), ("grad_out", inp.grad_out)]
    for name, t in tensors:
        why = _stride_reason(name, t, inp.is_varlen)
        if why:
            out.append(why)
    return out + _lds_reasons(variant, inp.head_dim, arch)
