"""What the three implementations share: causal-mask and lse conventions, GQA expansion.

Their capabilities (vendors, archs, dtypes, head dims, strides) are class attributes that the
core turns into reasons; ``supports`` keeps only what those cannot say.

Conventions at the boundary:

* Our lse marks a row that sees no key with ``-inf``. PyTorch's FlashAttention-2 and
  memory-efficient kernels write ``+inf`` there (so that ``exp(s - lse) = 0`` in their backward).
  Forwards turn ``+inf`` into ``-inf``; backwards turn ``-inf`` into ``+inf``. Both only where
  such rows can exist (dense: no keys, bottom-right causal with Sq > Sk, or a sliding window;
  varlen: always, since a sequence may have no keys), so the common case pays no extra pass.
* GQA without native kernel support expands K/V to H heads (a copy: (H/Hkv)·|K| + (H/Hkv)·|V|
  written and read again) and sums dK/dV over each group afterwards (H-head gradients written,
  then read once).
"""

from __future__ import annotations

import math
import os

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from ._ops import torch_version

HALF_DTYPES = (torch.float16, torch.bfloat16)
INF = math.inf


#: ``torch_sdpa:flash``'s and ``torch_sdpa:cudnn``'s eager ``ad.attention`` calls through
#: PyTorch's own autograd node of their forward op (``autograd_forward``): on by default with the
#: torch releases it was proven on, on NVIDIA GPUs (``tests/test_sdpa_own_node_gpu.py``); this
#: boolean variable turns it on or off anywhere.
OWN_NODE_VARIABLE = "ATTN_DISPATCH_SDPA_OWN_NODE"
OWN_NODE = "PyTorch's own autograd node (eager attention)"
OWN_NODE_TORCH = ((2, 11),)


def own_node_path() -> adb.FastPath:
    """Whether ``Flash.autograd_forward`` and ``Cudnn.autograd_forward`` offer their op's node
    on this installation."""
    if os.environ.get(OWN_NODE_VARIABLE) is not None:
        on = adb.env_flag(OWN_NODE_VARIABLE, False)
        return adb.FastPath(OWN_NODE, on, f"{OWN_NODE_VARIABLE} turns it {'on' if on else 'off'}")
    version = torch_version()
    here = f"torch {version.major}.{version.minor}"
    proven = ", ".join(f"{major}.{minor}" for major, minor in OWN_NODE_TORCH)
    if torch.version.hip is not None:
        return adb.FastPath(
            OWN_NODE, False, f"not yet run on a ROCm GPU ({OWN_NODE_VARIABLE}=1 turns it on)"
        )
    if (version.major, version.minor) in OWN_NODE_TORCH:
        return adb.FastPath(OWN_NODE, True, f"{here} is a release it was proven on")
    return adb.FastPath(
        OWN_NODE,
        False,
        f"{here} is installed; it was proven on torch {proven} only ({OWN_NODE_VARIABLE}=1 "
        "turns it on); eager attention calls run the library's Python node",
    )


class SdpaImplementation(adb.Implementation):
    """The declarations the three PyTorch ops share."""

    backend = "torch_sdpa"
    cost_requires = ("torch",)  # its kernels' versions, recorded by its cost tables (costs/)
    alignment = 16


def causal_matches(inp: adb.ForwardInputs, native_align: str, masked: bool | None = None) -> bool:
    """Whether a kernel whose mask is aligned ``native_align`` computes ``inp``'s mask.

    ``masked``: whether there is a mask to align (default: ``inp.causal``).
    """
    if masked is None:
        masked = inp.causal
    if not masked or inp.causal_align == native_align:
        return True
    if inp.is_varlen:  # per-sequence lengths equal only when q and k share the offsets
        return inp.cu_seqlens_q is inp.cu_seqlens_k
    return inp.seqlen_q == inp.seqlen_k


def dense_cu_seqlens(inp: adb.ForwardInputs) -> tuple:
    """``(cu_seqlens_q, cu_seqlens_k)`` as the ATen varlen ops read them: packed arrays (they
    ignore a view's strides); ``None`` for dense calls. A no-op on contiguous offsets."""
    if not inp.is_varlen:
        return None, None
    return inp.cu_seqlens_q.contiguous(), inp.cu_seqlens_k.contiguous()


def may_have_empty_rows(inp: adb.ForwardInputs) -> bool:
    """Whether some query row may see no key (its lse is -inf in our convention)."""
    if inp.is_varlen or inp.window is not None:
        return True
    if inp.seqlen_k == 0:
        return True
    return inp.causal and inp.causal_align == "bottom_right" and inp.seqlen_q > inp.seqlen_k


def is_empty(inp: adb.ForwardInputs) -> bool:
    """No work at all (zero queries, keys, batch or heads)."""
    return inp.q.numel() == 0 or inp.k.numel() == 0


def lse_to_kernel(inp: adb.BackwardInputs) -> torch.Tensor:
    """Our lse as the FlashAttention/efficient kernels read it (contiguous, ``+inf`` rows)."""
    lse = inp.lse
    if may_have_empty_rows(inp):
        lse = lse.masked_fill(lse == -INF, INF)
    return lse.contiguous()


def clean_empty_rows(out: torch.Tensor, lse: torch.Tensor, inp: adb.ForwardInputs):
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


def zero_gradients(inp: adb.BackwardInputs) -> ad.Gradients:
    """Gradients of an empty problem: zeros shaped like q, k, v."""
    return ad.Gradients(torch.zeros_like(inp.q), torch.zeros_like(inp.k), torch.zeros_like(inp.v))


def empty_forward(inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of an empty problem: zeros and ``-inf``."""
    out = inp.q.new_zeros((*inp.q.shape[:-1], inp.head_dim_v))
    lse_shape = adb.lse_shape(inp.q.shape, inp.is_varlen)
    return out, torch.full(lse_shape, -INF, dtype=adb.lse_dtype(inp.dtype), device=inp.q.device)
