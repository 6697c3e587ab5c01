"""``torch_sdpa:efficient``: PyTorch memory-efficient attention (``aten::_efficient_attention_*``).

Layout: the ops take BSHD tensors (ours); varlen runs as batch 1 with cu_seqlens. Its lse is
[B, H, Sq rounded up to 32] (varlen: [num_seqs, H, max_seqlen_q rounded up], per sequence);
the backward reads whole blocks of rows, so our lse is copied into that padded layout (a
B·H·Sq·4-byte copy; varlen: scattered per sequence with index ops, no host sync).
GQA: not native (the op needs equal head counts): K/V are expanded to H heads (a copy) and
dK/dV are summed over each group; extra traffic about 2·(H/Hkv)·(|K| + |V|) plus the same for
the gradients.
Causal: top-left natively (mask type 1, per sequence for varlen); bottom-right (type 2) only for
dense Sq <= Sk: measured on an H200 with torch 2.11, the kernel's bottom-right mask gives wrong
rows when Sq > Sk, so that and varlen bottom-right (unknown per-sequence lengths) are rejected.
Varlen sequences with no keys are left unwritten by the kernel: their lse/out/dq are set here.
``out`` must have contiguous rows (the op ignores its row stride): it is copied when not.
Determinism: ``num_splits_key=1`` makes the backward deterministic (one block per (batch, head)
walks all keys, no atomics), at a loss of parallelism; it is passed when determinism is asked.
ROCm (AOTriton): top-left causal only, no varlen, no deterministic mode.
"""

from __future__ import annotations

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import _common as c
from ._ops import EFFICIENT_BWD, EFFICIENT_FWD, aten, empty_long, ops_problems
from .flash import ROCM_ARCHS

MASK_NONE, MASK_TOP_LEFT, MASK_BOTTOM_RIGHT = 0, 1, 2
LSE_ALIGN = 32


def _mask_type(inp: adb.ForwardInputs) -> int:
    if not inp.causal:
        return MASK_NONE
    return MASK_TOP_LEFT if c.causal_matches(inp, "top_left") else MASK_BOTTOM_RIGHT


def _token_positions(inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query token: its sequence index and its position inside that sequence."""
    cu = inp.cu_seqlens_q
    tokens = torch.arange(inp.q.shape[0], dtype=cu.dtype, device=cu.device)
    seq = torch.searchsorted(cu[1:].contiguous(), tokens, right=True)
    return seq, (tokens - cu[seq]).long()


def _keyless_tokens(inp: adb.ForwardInputs, seq: torch.Tensor) -> torch.Tensor:
    """Bool [Tq]: query tokens whose sequence has no keys (the kernel leaves them unwritten)."""
    cu_k = inp.cu_seqlens_k
    return (cu_k[1:] - cu_k[:-1])[seq] == 0


def _padded_lse(inp: adb.BackwardInputs, lse: torch.Tensor) -> torch.Tensor:
    """Our lse in the kernel's padded layout: the backward reads whole blocks of rows.

    Dense [B, H, Sq] -> [B, H, Sq rounded up to 32]; varlen [H, Tq] -> [num_seqs, H,
    max_seqlen_q rounded up]. Padding rows hold +inf (they contribute nothing).
    """
    width = -(-inp.max_seqlen_q // LSE_ALIGN) * LSE_ALIGN
    if not inp.is_varlen:
        padded = lse.new_full((inp.batch, inp.heads, width), c.INF)
        padded[:, :, : inp.seqlen_q] = lse
        return padded
    nseq = inp.cu_seqlens_q.shape[0] - 1
    padded = lse.new_full((nseq, inp.heads, width), c.INF)
    seq, pos = _token_positions(inp)
    padded[seq, :, pos] = lse.t()
    return padded


def _rocm_reasons(inp: adb.ForwardInputs) -> list[str]:
    """AOTriton: half dtypes, top-left causal mask, no varlen, no deterministic mode."""
    reasons = []
    if inp.deterministic:
        reasons.append(
            "deterministic=True on ROCm: AOTriton's backward exposes no deterministic mode"
        )
    if inp.is_varlen:
        reasons.append("varlen on ROCm: not supported by this backend")
    if not c.causal_matches(inp, "top_left"):
        reasons.append(
            f"causal_align={inp.causal_align!r} with Sq={inp.seqlen_q} != "
            f"Sk={inp.seqlen_k} on ROCm: AOTriton's mask is top-left only"
        )
    if inp.dtype not in c.HALF_DTYPES:
        reasons.append(
            f"dtype={str(inp.dtype).replace('torch.', '')} on ROCm: needs float16 or bfloat16"
        )
    return reasons


def _cuda_reasons(inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
    """bf16 needs sm_80; varlen only with shared offsets; the bottom-right mask is wrong where
    rows see no key (Sq > Sk)."""
    reasons = []
    if inp.dtype == torch.bfloat16 and (arch.sm or 0) < 80:
        reasons.append(f"dtype=bfloat16 on {arch.name}: needs sm_80 or newer")
    if inp.is_varlen and inp.cu_seqlens_q is not inp.cu_seqlens_k:
        # The offsets' values live on the device (never read on the host), so sequences with
        # queries but no keys, or keys but no queries, cannot be told apart from others.
        reasons.append(
            "varlen with distinct cu_seqlens_q and cu_seqlens_k on CUDA: PyTorch's kernel "
            "faulted (illegal memory access) on sequences whose queries or keys are empty, and "
            "the offsets are not read on the host to rule those out"
        )
    if (
        inp.causal
        and not c.causal_matches(inp, "top_left")
        and (inp.is_varlen or inp.seqlen_q > inp.seqlen_k)
    ):
        reasons.append(
            f"causal_align='bottom_right' with Sq={inp.seqlen_q} > "
            f"Sk={inp.seqlen_k} (or varlen with distinct cu_seqlens): the "
            "kernel's bottom-right mask is wrong where rows see no key"
        )
    return reasons


class Efficient(c.SdpaImplementation):
    """Memory-efficient attention forward/backward (NVIDIA sm50+, AMD through AOTriton)."""

    name = "efficient"
    priority = {"sm_*": 30, "gfx9*": 15, "gfx1*": 15}
    deterministic = True  # num_splits_key=1 when asked (CUDA; ROCm is refused in supports)
    vendors = ("cuda", "rocm")
    archs = ("sm_*", *ROCM_ARCHS)  # ROCm: where AOTriton builds these kernels
    min_sm = 50
    dtypes = (*c.HALF_DTYPES, torch.float32)  # float32 on CUDA only (see supports)
    head_dims = range(8, 257, 8)  # 16-byte rows, at most 256

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Beyond the declarations: what differs between CUDA and AOTriton on ROCm, and the
        private ops' schemas."""
        if arch.vendor == "rocm":
            reasons = _rocm_reasons(inp)
        else:
            reasons = _cuda_reasons(inp, arch)
        return reasons + ops_problems(EFFICIENT_FWD, EFFICIENT_BWD)

    def _kernel_views(self, inp: adb.ForwardInputs):
        """q, k, v as the op takes them: batch 1 for varlen, K/V expanded to H heads."""
        group = inp.group_size
        q, k, v = inp.q, c.expand_kv(inp.k, group), c.expand_kv(inp.v, group)
        if inp.is_varlen:
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        return adb.packed_unit_strides(q), adb.packed_unit_strides(k), adb.packed_unit_strides(v)

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` in our layout."""
        if c.is_empty(inp):
            return c.empty_forward(inp)
        q, k, v = self._kernel_views(inp)
        varlen = inp.is_varlen
        res = aten(EFFICIENT_FWD)(
            q,
            k,
            v,
            None,
            *c.dense_cu_seqlens(inp),
            inp.max_seqlen_q if varlen else None,
            inp.max_seqlen_k if varlen else None,
            0.0,
            _mask_type(inp),
            True,
            scale=inp.scale,
        )
        out, lse = res[0], res[1]
        if varlen:
            seq, pos = _token_positions(inp)
            keyless = _keyless_tokens(inp, seq)
            lse = lse[seq, :, pos].masked_fill(keyless[:, None], c.INF).t().contiguous()
            out = out.squeeze(0)
        else:
            lse = lse[:, :, : inp.seqlen_q].contiguous()
        return c.clean_empty_rows(out, lse, inp)

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the caller's out and lse (no recomputation)."""
        if c.is_empty(inp):
            return c.zero_gradients(inp)
        q, k, v = self._kernel_views(inp)
        lse = _padded_lse(inp, c.lse_to_kernel(inp))
        out, grad_out = inp.out.contiguous(), inp.grad_out  # the op assumes out's row pitch
        if inp.is_varlen:
            out, grad_out = out.unsqueeze(0), grad_out.unsqueeze(0)
        out, grad_out = adb.packed_unit_strides(out), adb.packed_unit_strides(grad_out)
        seed = empty_long(inp.q.device)
        splits = 1 if inp.deterministic else None
        dq, dk, dv, _ = aten(EFFICIENT_BWD)(
            grad_out,
            q,
            k,
            v,
            None,
            out,
            *c.dense_cu_seqlens(inp),
            inp.max_seqlen_q,
            inp.max_seqlen_k,
            lse,
            0.0,
            seed,
            seed,
            _mask_type(inp),
            False,
            scale=inp.scale,
            num_splits_key=splits,
        )
        if inp.is_varlen:
            dq, dk, dv = dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)
            keyless = _keyless_tokens(inp, _token_positions(inp)[0])
            dq = dq.masked_fill(keyless[:, None, None], 0)
        group = inp.group_size
        return ad.Gradients(dq, c.reduce_group(dk, group), c.reduce_group(dv, group))
