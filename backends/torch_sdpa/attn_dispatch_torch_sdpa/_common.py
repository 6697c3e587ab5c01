"""What the three implementations share: capability checks, lse conventions, GQA expansion.

Conventions at the boundary:

* Our lse marks a row that sees no key with ``-inf``. PyTorch's FlashAttention-2 and
  memory-efficient kernels write ``+inf`` there (so that ``exp(s - lse) = 0`` in their backward).
  Forwards turn ``+inf`` into ``-inf``; backwards turn ``-inf`` into ``+inf``. Both only where
  such rows can exist (dense: no keys, or bottom-right causal with Sq > Sk; varlen: always, since
  a sequence may have no keys), so the common case pays no extra pass.
* GQA without native kernel support expands K/V to H heads (a copy: (H/Hkv)·|K| + (H/Hkv)·|V|
  written and read again) and sums dK/dV over each group afterwards (H-head gradients written,
  then read once).
"""

from __future__ import annotations

import math

import torch

import attn_dispatch as ad

HALF_DTYPES = (torch.float16, torch.bfloat16)
INF = math.inf


def cuda_capability(arch: ad.Arch) -> int | None:
    """``sm_90`` -> 90; ``None`` for a name that is not ``sm_<digits>``."""
    digits = arch.name[3:] if arch.name.startswith("sm_") else ""
    return int(digits) if digits.isdigit() else None


def vendor_reasons(inp: ad.ForwardInputs, arch: ad.Arch, vendors: tuple[str, ...]) -> list[str]:
    """Reject tensors that are not on a GPU of one of ``vendors``."""
    vendor = inp.device_vendor(arch)
    if vendor not in vendors:
        wanted = " or ".join({"cuda": "an NVIDIA (CUDA)", "rocm": "an AMD (ROCm)"}[v]
                             for v in vendors)
        return [f"device vendor {vendor!r} (tensors on {inp.device.type}): needs {wanted} GPU"]
    if vendor != arch.vendor:
        return [f"tensors are on a {vendor} device but arch={arch.name} is a {arch.vendor} arch"]
    return []


def dtype_reasons(inp: ad.ForwardInputs, dtypes: tuple[torch.dtype, ...]) -> list[str]:
    """Reject dtypes outside ``dtypes``."""
    if inp.dtype in dtypes:
        return []
    names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
    return [f"dtype={str(inp.dtype).replace('torch.', '')}: needs one of {names}"]


def head_dim_reasons(inp: ad.ForwardInputs, max_dim: int, same_dv: bool) -> list[str]:
    """Head dims must be multiples of 8 (16-byte rows) and at most ``max_dim``."""
    reasons = []
    for name, d in (("head_dim", inp.head_dim), ("head_dim_v", inp.head_dim_v)):
        if d % 8 or d > max_dim:
            reasons.append(f"{name}={d}: needs a multiple of 8 that is at most {max_dim}")
    if same_dv and inp.head_dim != inp.head_dim_v:
        reasons.append(f"head_dim_v={inp.head_dim_v} != head_dim={inp.head_dim}: needs equal dims")
    return reasons


def tensors_of(inp: ad.ForwardInputs) -> list[tuple[str, torch.Tensor]]:
    """The q/k/v (and out/grad_out for backward) tensors with their names."""
    named = [("q", inp.q), ("k", inp.k), ("v", inp.v)]
    if isinstance(inp, ad.BackwardInputs):
        named += [("out", inp.out), ("grad_out", inp.grad_out)]
    return named


def stride_reasons(inp: ad.ForwardInputs) -> list[str]:
    """Last dim contiguous, every other stride a multiple of 16 bytes, 16-byte aligned data."""
    reasons = []
    for name, t in tensors_of(inp):
        elems = 16 // t.element_size()
        strides = t.stride()
        if t.shape[-1] > 1 and strides[-1] != 1:
            reasons.append(f"{name}.stride()={strides}: needs a contiguous last dim")
        elif any(s % elems for s, n in zip(strides[:-1], t.shape[:-1]) if n > 1):
            reasons.append(f"{name}.stride()={strides}: needs strides that are multiples of "
                           f"{elems} elements (16 bytes)")
        elif t.device.type != "meta" and t.numel() and t.data_ptr() % 16:
            reasons.append(f"{name}.data_ptr() % 16 = {t.data_ptr() % 16}: needs 16-byte "
                           "alignment")
    return reasons


def causal_matches(inp: ad.ForwardInputs, native_align: str) -> bool:
    """Whether a kernel whose causal mask is aligned ``native_align`` computes ``inp``'s mask."""
    if not inp.causal or inp.causal_align == native_align:
        return True
    if inp.is_varlen:  # per-sequence lengths equal only when q and k share the offsets
        return inp.cu_seqlens_q is inp.cu_seqlens_k
    return inp.seqlen_q == inp.seqlen_k


def may_have_empty_rows(inp: ad.ForwardInputs) -> bool:
    """Whether some query row may see no key (its lse is -inf in our convention)."""
    if inp.is_varlen:
        return True
    if inp.seqlen_k == 0:
        return True
    return inp.causal and inp.causal_align == "bottom_right" and inp.seqlen_q > inp.seqlen_k


def is_empty(inp: ad.ForwardInputs) -> bool:
    """No work at all (zero queries, keys, batch or heads)."""
    return inp.q.numel() == 0 or inp.k.numel() == 0


def lse_to_kernel(inp: ad.BackwardInputs) -> torch.Tensor:
    """Our lse as the FlashAttention/efficient kernels read it (contiguous, ``+inf`` rows)."""
    lse = inp.lse
    if may_have_empty_rows(inp):
        lse = lse.masked_fill(lse == -INF, INF)
    return lse.contiguous()


def clean_empty_rows(out: torch.Tensor, lse: torch.Tensor, inp: ad.ForwardInputs):
    """``(out, lse)`` with rows that see no key set to exactly 0 and ``-inf``.

    Kernels disagree on these rows (``+inf`` or ``-inf`` lse, 0 or NaN output); any
    non-finite lse marks such a row. Only run where such rows can exist.
    """
    if not may_have_empty_rows(inp):
        return out, lse
    empty = ~torch.isfinite(lse)
    lse = lse.masked_fill(empty, -INF)
    rows = empty.transpose(0, 1) if inp.is_varlen else empty.transpose(1, 2)  # like out's rows
    return out.masked_fill(rows.unsqueeze(-1), 0), lse


def expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    """``[..., Hkv, D]`` -> ``[..., Hkv*group, D]`` (query head h reads kv head h // group)."""
    if group == 1:
        return t
    *lead, hkv, d = t.shape
    return t.unsqueeze(-2).expand(*lead, hkv, group, d).reshape(*lead, hkv * group, d)


def reduce_group(t: torch.Tensor, group: int) -> torch.Tensor:
    """``[..., H, D]`` gradients of expanded K/V -> ``[..., H/group, D]`` (sum over the group)."""
    if group == 1:
        return t
    *lead, h, d = t.shape
    return t.view(*lead, h // group, group, d).sum(dim=-2)


def zero_gradients(inp: ad.BackwardInputs) -> ad.Gradients:
    """Gradients of an empty problem: zeros shaped like q, k, v."""
    return ad.Gradients(torch.zeros_like(inp.q), torch.zeros_like(inp.k), torch.zeros_like(inp.v))


def empty_forward(inp: ad.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of an empty problem: zeros and ``-inf``."""
    out = inp.q.new_zeros((*inp.q.shape[:-1], inp.head_dim_v))
    if inp.is_varlen:
        lse_shape = (inp.heads, inp.q.shape[0])
    else:
        lse_shape = (inp.batch, inp.heads, inp.seqlen_q)
    return out, torch.full(lse_shape, -INF, dtype=torch.float32, device=inp.q.device)
