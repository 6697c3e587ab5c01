"""Why an implementation cannot take given inputs: reasons that name the value (no flydsl)."""

from __future__ import annotations

import torch

import attn_dispatch as ad

from ._layout import head_dim_problems
from ._tiles import LDS_BUDGET, main_tiles

FLYDSL_REQUIREMENT = "flydsl>=0.4.2,<0.5"
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
_INT32_MAX = 2**31 - 1
# Head dims whose kernel spills registers (found by compiling; the fix is a split dK/dV + dQ
# kernel, which is not implemented).
SPILLING_HEAD_DIMS = {"gfx942_mfma": {256}, "gfx950_fused": set()}


def dtype_tag(dtype: torch.dtype) -> str | None:
    return _DTYPES.get(dtype)


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
    return (f"{name} strides {tuple(s)} are not supported (needs the last dim contiguous, every "
            f"head inside one row pitch and 32-bit offsets)")


def reasons(variant: str, inp: ad.ForwardInputs, arch: ad.Arch) -> list[str]:
    """Every reason ``variant`` rejects ``inp`` on ``arch``; [] when it can run it."""
    out: list[str] = []
    missing = ad.missing_requirement(FLYDSL_REQUIREMENT)
    if missing:
        out.append(missing)
    if not isinstance(inp, ad.BackwardInputs):
        out.append("forward is not implemented (flydsl_rocm provides the backward only)")
    if variant == "gfx950_fused" and arch.name != "gfx950":
        out.append(f"arch {arch.name} is not gfx950 (needs MFMA 16x16x32 and ds_read_b64_tr_b16)")
    if variant == "gfx942_mfma" and arch.name not in ("gfx942", "gfx950"):
        out.append(f"arch {arch.name} is not gfx942 or gfx950")
    vendor = inp.device_vendor(arch)
    if vendor != "rocm":
        out.append(f"device {inp.device} is not a ROCm GPU ({vendor})")
    if dtype_tag(inp.dtype) is None:
        out.append(f"dtype {inp.dtype} is not torch.bfloat16 or torch.float16")
    d, dv = inp.head_dim, inp.head_dim_v
    if not (32 <= d <= 256 and d % 32 == 0):
        out.append(f"head_dim={d} is not a multiple of 32 in 32..256")
    elif d in SPILLING_HEAD_DIMS[variant]:
        out.append(f"head_dim={d} spills registers in the {variant} kernel (not supported)")
    elif head_dim_problems(main_tiles(variant), d):
        out.append(f"head_dim={d} is not supported by the {variant} index math: "
                   + "; ".join(head_dim_problems(main_tiles(variant), d)))
    if dv != d:
        out.append(f"head_dim_v={dv} differs from head_dim={d}")
    if inp.causal and inp.causal_align == "bottom_right":
        if inp.is_varlen or inp.seqlen_q != inp.seqlen_k:
            out.append(
                "causal_align='bottom_right' is only supported where it equals top_left "
                f"(dense, seqlen_q == seqlen_k; got seqlen_q={inp.seqlen_q}, "
                f"seqlen_k={inp.seqlen_k}, varlen={inp.is_varlen})"
            )
    if inp.kv_heads <= 0 or inp.heads % inp.kv_heads:
        out.append(f"heads={inp.heads} is not a multiple of kv_heads={inp.kv_heads}")
    if inp.deterministic:
        out.append("deterministic=True requested; dQ accumulates with f32 atomics")
    tensors = [("q", inp.q), ("k", inp.k), ("v", inp.v)]
    if isinstance(inp, ad.BackwardInputs):
        tensors += [("out", inp.out), ("grad_out", inp.grad_out)]
    for name, t in tensors:
        why = _stride_reason(name, t, inp.is_varlen)
        if why:
            out.append(why)
    budget_arch = arch.name if arch.name in LDS_BUDGET else "gfx942"
    tiles = main_tiles(variant)
    lds = tiles.lds_bytes(d)
    if lds > LDS_BUDGET[budget_arch]:
        out.append(f"LDS {lds} bytes for {tiles.block_m}x{tiles.block_n} tiles at head_dim={d} "
                   f"exceeds the {budget_arch} budget of {LDS_BUDGET[budget_arch]}")
    return out
