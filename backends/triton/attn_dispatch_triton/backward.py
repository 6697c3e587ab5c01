"""Fused attention backward: the launcher that runs preprocess, dK/dV and dQ.

Split design (``triton:fused``, deterministic): three launches, no atomics, no fp32 scratch for
the gradients (see the kernel modules for the math): ``_bwd_preprocess`` (delta, lse2),
``_bwd_dkdv`` (one program per key block and kv head, walking the GQA group), ``_bwd_dq`` (one
program per query block and head).

Fused-atomic design (``atomic_dq=True``, ``triton:fused_atomic``): preprocess, then
``_bwd_dkdv`` with ``ATOMIC_DQ`` also adds dQ into a zero-filled fp32 scratch with atomics or
TMA reductions (config key ``"dkdvq"``; on sm_90 with ``GLUON`` the Gluon ``_bwd_dkdv_sm90``
with ``ATOMIC_DQ``, TMA reductions), then ``_bwd_dq_convert`` scales and casts it (config key
``"cvt"``).

:class:`BackwardLaunch` holds one problem's arguments so each kernel can also be launched (and
timed) on its own; :func:`attention_backward` runs all three. On NVIDIA GPUs a repeated call of
the same signature replays a recorded :class:`~._plan.Plan` instead (same compiled kernels and
arguments, a fraction of the host time; see ``_plan``).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import triton

from . import _plan
from ._bwd_dkdv import _attn_bwd_dkdv
from ._bwd_dq import _attn_bwd_dq
from ._bwd_dq_convert import _attn_bwd_dq_convert
from ._bwd_preprocess import _attn_bwd_preprocess
from ._bwd_split_sum import _attn_bwd_split_sum
from ._common import LOG2E, last_dim_contiguous, lse_strides, padded_dim, token_strides

SUM_BLOCK = 1024  # elements per program of the split-partial sum
# TAIL_SLICES: no slice shorter (each loads K / V and adds dK / dV; MHA 8 16K's 256-step units
# in 13 slices of ~20 steps took 4.8% longer, GQA 64/8 16K's 2048 in 13 took 1.6-1.8% less)
MIN_SLICE_STEPS = 64
SLICE_COST_STEPS = 2  # a program's own start and end (K / V load, dK / dV), in steps: a guess
# ... and the fp32 buffer's fill and cast per unit (128 keys of dK and dV: ~330 KB of traffic),
# in steps of one program (~2.3 us at D = 128 on an H200): an estimate
BUFFER_COST_STEPS_PER_UNIT = 0.04
MAX_GRID_YZ = 65535  # CUDA's limit on grid axes 1 and 2 (axis 0 allows 2**31 - 1)


class BackwardLaunch:
    """The arguments of one backward problem, and one method per kernel launch."""

    def __init__(self, q, k, v, out, lse, grad_out, *, causal: bool, bottom_right: bool,
                 scale: float, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                 max_seqlen_k=None, dq=None, dk=None, dv=None, atomic_dq: bool = False,
                 recorder: _plan.Recorder | None = None) -> None:
        self.varlen = varlen = cu_seqlens_q is not None
        q, k, v, out, grad_out = (last_dim_contiguous(t) for t in (q, k, v, out, grad_out))
        if varlen:
            self.batch = cu_seqlens_q.numel() - 1
            self.heads, self.kv_heads = q.shape[1], k.shape[1]
            self.seqlen_q, self.seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        else:
            self.batch, self.seqlen_q, self.heads = q.shape[0], q.shape[1], q.shape[2]
            self.seqlen_k, self.kv_heads = k.shape[1], k.shape[2]
        self.d, self.d_v = q.shape[-1], v.shape[-1]
        self.group = self.heads // self.kv_heads
        self.q, self.k, self.v, self.out, self.lse, self.grad_out = q, k, v, out, lse, grad_out
        self.dq = torch.empty_like(q) if dq is None else dq
        self.dk = torch.empty_like(k) if dk is None else dk
        self.dv = torch.empty_like(v) if dv is None else dv
        tmp = torch.empty((2, *lse.shape), dtype=torch.float32, device=q.device)
        self.lse2, self.delta = tmp[0], tmp[1]
        self.cu_q = cu_seqlens_q if varlen else q  # an unused pointer when dense
        self.cu_k = cu_seqlens_k if varlen else q
        self.scale = scale
        self.qk_scale = scale * LOG2E
        self.rec = recorder
        self.side: _plan.SideStream | None = None  # where launches go instead of the current
        self.dq_wide_store = False  # the dQ scratch's columns in WIDE_STORE's order
        self.plan_extra = dict(tmp_shape=tuple(tmp.shape), part_numel=None, acc=None)
        if recorder is not None:
            for t, index in ((q, _plan.Q), (k, _plan.K), (v, _plan.V), (out, _plan.OUT),
                             (lse, _plan.LSE), (grad_out, _plan.DO), (self.dq, _plan.DQ),
                             (self.dk, _plan.DK), (self.dv, _plan.DV),
                             (self.scale, _plan.SCALE), (self.qk_scale, _plan.QK_SCALE)):
                recorder.name(t, index, None if isinstance(t, float) else 0)
            recorder.name(self.lse2, _plan.TMP, 0)
            recorder.name(self.delta, _plan.TMP, self.delta.data_ptr() - tmp.data_ptr())
            if varlen:
                recorder.name(self.cu_q, _plan.CU_Q)
                recorder.name(self.cu_k, _plan.CU_K)
        self.atomic_dq = atomic_dq
        self.flags = dict(CAUSAL=causal, BOTTOM_RIGHT=bottom_right, IS_VARLEN=varlen)
        self.blocks = dict(BLOCK_D=padded_dim(self.d), BLOCK_DV=padded_dim(self.d_v))
        self.s_q, self.s_k, self.s_v = (token_strides(t, varlen) for t in (q, k, v))
        self.s_do = token_strides(grad_out, varlen)
        self.s_t = lse_strides(self.lse2, varlen)

    def _launch(self, kernel, grid: tuple, args: tuple, kwargs: dict) -> None:
        side = self.side
        if self.rec is not None:
            self.rec.launch(kernel, grid, args, kwargs, side)
        elif side is None:
            kernel[grid](*args, **kwargs)
        else:
            with torch.cuda.stream(side.stream):
                kernel[grid](*args, **kwargs)

    def preprocess(self, c: dict) -> None:
        """delta = rowsum(dO * O), lse2 = lse * log2(e) (+inf for rows that see no key)."""
        grid = (triton.cdiv(max(self.seqlen_q, 1), c["BLOCK_M"]), self.batch * self.heads)
        self._launch(_attn_bwd_preprocess, grid, (
            self.out, self.grad_out, self.lse, self.delta, self.lse2, self.cu_q,
            *token_strides(self.out, self.varlen), *self.s_do,
            *lse_strides(self.lse, self.varlen), *self.s_t, self.seqlen_q, self.heads,
        ), dict(DV=self.d_v, IS_VARLEN=self.varlen, BLOCK_M=c["BLOCK_M"],
                BLOCK_DV=self.blocks["BLOCK_DV"], num_warps=c["num_warps"],
                num_stages=c["num_stages"]))

    def group_split(self, c: dict) -> int:
        """How many programs share one kv head's GQA group (``c["SPLIT"]`` or a heuristic).

        Splitting pays when the key blocks alone leave SMs idle. Measured on an H200 (GQA 64/8,
        D=128): without a mask, about one program per SM is best (1K: split 2, 179 us vs 288 us
        unsplit); with a causal mask, whose programs differ in work, about eight per SM (4K:
        split 4, 1.38 ms vs 1.75 ms); long sequences need none.
        """
        if "SPLIT" in c:
            return c["SPLIT"]
        if self.group == 1 or self.q.device.type != "cuda" or self.k.numel() == 0:
            return 1  # (no keys: nothing to split, and no empty partial buffer to plan around)
        from .tuning import sm_count

        programs = triton.cdiv(max(self.seqlen_k, 1), c["BLOCK_N"]) * self.batch * self.kv_heads
        target = sm_count(self.q.device) * (8 if self.flags["CAUSAL"] else 1)
        split = 1
        while self.group % (split * 2) == 0 and programs * split * 2 <= target:
            split *= 2
        return split

    def dkdv(self, c: dict, atomic_dq: bool = False) -> None:
        """dK, dV: one program per key block, kv head and slice of the GQA group.

        With ``atomic_dq`` the same programs add the unscaled dQ into ``self.dq_acc`` (fp32,
        zero-filled here); :meth:`dq_convert` finishes it.
        """
        split = self.group_split(c)
        sm90 = self.sm90_descriptors(c, (64, 128))
        tma = bool(atomic_dq and c.get("TMA") and sm90 is None) and _tma_available(self.q.device)
        rec = self.rec
        if tma:  # rows of one (sequence, head) contiguous: [B,H,S,BLOCK_D] / [H,T,BLOCK_D]
            from triton.tools.tensor_descriptor import TensorDescriptor

            bd = self.blocks["BLOCK_D"]
            rows = self.q.shape[0] if self.varlen else self.seqlen_q
            lead = (self.heads, rows) if self.varlen else (self.batch, self.heads, rows)
            self.dq_acc = torch.zeros((*lead, bd), dtype=torch.float32, device=self.q.device)
            flat = self.dq_acc.view(-1, bd)
            acc = TensorDescriptor(flat, list(flat.shape), [bd, 1], [c["BLOCK_M"], bd])
            s_acc = (0, 1, rows) if self.varlen else (self.heads * rows, 1, rows)  # in rows
            self.dq_acc_strides = tuple(x * bd for x in s_acc)
            self.plan_extra["acc"] = dict(shape=tuple(self.dq_acc.shape))
            if rec is not None:
                rec.name_descriptor(acc, _plan.ACC)
                rec.name(self.dq_acc, _plan.ACC)
        elif atomic_dq:
            self.dq_acc = acc = torch.zeros(self.q.shape, dtype=torch.float32,
                                            device=self.q.device)
            s_acc = self.dq_acc_strides = token_strides(acc, self.varlen)
            self.plan_extra["acc"] = dict(shape=tuple(acc.shape))
            if rec is not None:
                rec.name(acc, _plan.ACC)
        else:
            acc, s_acc = self.q, (0, 0, 0)  # an unused pointer
        key_blocks = triton.cdiv(max(self.seqlen_k, 1), c["BLOCK_N"])
        contiguous = self.dk.is_contiguous() and self.dv.is_contiguous()
        tail = self.tail_slices(c, split, key_blocks) if sm90 is not None and atomic_dq \
            and contiguous else None
        fused_sum = (split > 1 or tail is not None) and contiguous
        # config SPLIT_ADD: the Gluon fused-atomic kernel's slices add their dK / dV into one
        # zero-filled fp32 buffer by atomics, which the sum launch below then only casts (so do
        # the slices of the last wave's units with TAIL_SLICES)
        add_slices = fused_sum and atomic_dq and sm90 is not None and (
            bool(c.get("SPLIT_ADD", 0)) or tail is not None)
        if fused_sum:  # fp32 partials in one buffer, summed and cast by one launch below
            n_k, n_v = self.dk.numel(), self.dv.numel()
            blocks_k = triton.cdiv(n_k, SUM_BLOCK)
            n_tot = blocks_k * SUM_BLOCK + n_v
            parts = 1 if add_slices else split
            part = (torch.zeros if add_slices else torch.empty)(
                (parts, n_tot), dtype=torch.float32, device=self.dk.device)
            dk = part[:, :n_k].view(parts, *self.dk.shape)
            dv = part[:, blocks_k * SUM_BLOCK:].view(parts, *self.dv.shape)
            dk_part, dv_part = dk[0], dv[0]
            self.plan_extra["part_numel"] = part.numel()
            self.plan_extra["part_zeroed"] = add_slices
            if rec is not None:
                rec.name(dk, _plan.PART, 0)
                rec.name(dv, _plan.PART, dv.data_ptr() - part.data_ptr())
                rec.name(part, _plan.PART, 0)
        elif split > 1:  # outputs with other strides: partials summed by torch
            dk = torch.empty((split, *self.dk.shape), dtype=torch.float32, device=self.dk.device)
            dv = torch.empty((split, *self.dv.shape), dtype=torch.float32, device=self.dv.device)
            dk_part, dv_part = dk[0], dv[0]
            if rec is not None:
                rec.ok = False
        else:
            dk, dv = dk_part, dv_part = self.dk, self.dv
        grid = (key_blocks, self.batch * self.kv_heads, split)
        window = self.window(c, grid) if sm90 is not None else 0
        heavy_first = not window and self.heavy_first(c, grid[0])  # (a window replaces it)
        if window:
            grid = (split * window, grid[0], grid[1] // window)
        elif heavy_first:
            grid = grid[::-1]
        if sm90 is not None:
            from ._bwd_dkdv_sm90 import _attn_bwd_dkdv_sm90

            # config WIDE_STORE: the kernel stores dQ's columns in another order, which the
            # convert launch reads back
            self.dq_wide_store = bool(atomic_dq and c.get("WIDE_STORE", 0))

            slices_apart = split > 1 and not add_slices  # one partial per slice
            head = (*sm90, self.dq_scratch_descriptor() if atomic_dq else None, dk, dv,
                    self.lse2, self.delta, self.cu_q, self.cu_k,
                    *token_strides(dk_part, self.varlen), *token_strides(dv_part, self.varlen),
                    *self.s_t, *((dk.stride(0), dv.stride(0)) if slices_apart else (0, 0)),
                    self.seqlen_q, self.seqlen_k, self.kv_heads, self.group)
            if tail is None:
                self._launch(_attn_bwd_dkdv_sm90, grid, (
                    *head, 0, key_blocks, self.qk_scale, self.scale,
                ), self.sm90_constants(c, heavy_first, atomic_dq, window, add_slices))
            else:  # whole units in full waves (stored), then the rest in slices (added)
                full, slices = tail
                units = key_blocks * self.batch * self.kv_heads
                self._launch(_attn_bwd_dkdv_sm90, (full, 1, 1), (
                    *head, 0, key_blocks, self.qk_scale, self.scale,
                ), self.sm90_constants(c, False, atomic_dq, units=True))
                self._launch(_attn_bwd_dkdv_sm90, (units - full, 1, slices), (
                    *head, full, key_blocks, self.qk_scale, self.scale,
                ), self.sm90_constants(c, False, atomic_dq, add_slices=True, units=True,
                                       step_slices=True))
        else:
            self._dkdv_portable(c, grid, dk, dv, dk_part, dv_part, acc, s_acc, split,
                                heavy_first, atomic_dq, tma)
        if fused_sum:  # (8 warps: one 16-byte load per thread and partial; bench_split_sum.py)
            self._launch(_attn_bwd_split_sum, (blocks_k + triton.cdiv(n_v, SUM_BLOCK),),
                         (part, self.dk, self.dv, n_k, n_v, blocks_k, n_tot),
                         dict(SPLIT=part.shape[0], BLOCK=SUM_BLOCK, num_warps=8, num_stages=1))
        elif split > 1:
            self.dk.copy_(dk.sum(0))
            self.dv.copy_(dv.sum(0))

    def _dkdv_portable(self, c: dict, grid: tuple, dk, dv, dk_part, dv_part, acc, s_acc,
                       split: int, heavy_first: bool, atomic_dq: bool, tma: bool) -> None:
        """The ``tl`` dK/dV kernel (every arch; also the fused-atomic one)."""
        descs = self.tile_descriptors(c, c["BLOCK_M"], (
            (self.q, _plan.Q, self.blocks["BLOCK_D"]),
            (self.grad_out, _plan.DO, self.blocks["BLOCK_DV"])))
        self._launch(_attn_bwd_dkdv, grid, (
            self.q, self.k, self.v, self.grad_out, *(descs or (self.q, self.q)), dk, dv, acc,
            self.lse2, self.delta,
            self.cu_q, self.cu_k, *self.s_q, *self.s_k, *self.s_v, *self.s_do,
            *token_strides(dk_part, self.varlen), *token_strides(dv_part, self.varlen),
            *s_acc, *self.s_t, dk.stride(0) if split > 1 else 0, dv.stride(0) if split > 1 else 0,
            self.seqlen_q, self.seqlen_k, self.kv_heads, self.group,
            self.qk_scale, self.scale,
        ), dict(D=self.d, DV=self.d_v, **self.flags, ATOMIC_DQ=atomic_dq, DQ_TMA=tma,
                HEAVY_FIRST=heavy_first, LOAD_TMA=descs is not None,
                DP_FIRST=bool(c.get("DP_FIRST", 0)),
                BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], **self.blocks,
                num_warps=c["num_warps"], num_stages=c["num_stages"]))

    def dq_(self, c: dict) -> None:
        """dQ: one program per query block and head."""
        grid = (triton.cdiv(max(self.seqlen_q, 1), c["BLOCK_M"]), self.batch * self.heads)
        heavy_first = self.heavy_first(c, grid[0])
        if heavy_first:
            grid = grid[::-1]
        sm90 = self.sm90_descriptors(c, (128, 64))
        if sm90 is not None:
            from ._bwd_dq_sm90 import _attn_bwd_dq_sm90

            self._launch(_attn_bwd_dq_sm90, grid, (
                *sm90, self.dq, self.lse2, self.delta, self.cu_q, self.cu_k,
                *token_strides(self.dq, self.varlen), *self.s_t,
                self.seqlen_q, self.seqlen_k, self.heads, self.group, self.qk_scale, self.scale,
            ), self.sm90_constants(c, heavy_first))
            return
        descs = self.tile_descriptors(c, c["BLOCK_N"], (
            (self.k, _plan.K, self.blocks["BLOCK_D"]), (self.v, _plan.V, self.blocks["BLOCK_DV"])))
        self._launch(_attn_bwd_dq, grid, (
            self.q, self.k, self.v, self.grad_out, *(descs or (self.q, self.q)), self.dq,
            self.lse2, self.delta,
            self.cu_q, self.cu_k, *self.s_q, *self.s_k, *self.s_v, *self.s_do,
            *token_strides(self.dq, self.varlen), *self.s_t,
            self.seqlen_q, self.seqlen_k, self.heads, self.group, self.qk_scale, self.scale,
        ), dict(D=self.d, DV=self.d_v, **self.flags, HEAVY_FIRST=heavy_first,
                LOAD_TMA=descs is not None, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
                **self.blocks,
                num_warps=c["num_warps"], num_stages=c["num_stages"]))

    def tile_descriptors(self, c: dict, rows: int, tensors: tuple) -> tuple | None:
        """TMA descriptors for the tiles a kernel's loop loads (config ``LOAD_TMA``), one per
        ``(tensor, plan value index, padded cols)``, with ``rows`` rows per block (the loop's
        step); ``None`` (pointer loads) when the config does not ask for them or a tensor does
        not qualify (see :func:`tile_descriptor`)."""
        if not c.get("LOAD_TMA") or not _tma_available(self.q.device):
            return None
        descs = tuple(tile_descriptor(t, self.varlen, rows, cols) for t, _, cols in tensors)
        if any(d is None for d in descs):
            return None
        if self.rec is not None:
            for d, (_, index, _) in zip(descs, tensors):
                self.rec.name_descriptor(d, index)
        return descs

    def sm90_descriptors(self, c: dict, tiles: tuple[int, int]) -> tuple | None:
        """TMA descriptors of Q, K, V, dO for a Gluon sm_90 kernel when config ``GLUON`` asks
        for it and it applies: NVIDIA sm_90, verified triton, D = DV = 128, the kernel's tiles
        ``(BLOCK_M, BLOCK_N)`` and tensors TMA can read as ``[rows, heads * D]`` (see
        ``_sm90.sm90_descriptors``); else ``None`` (the portable ``tl`` kernel runs)."""
        if not (c.get("GLUON") and self.d == self.d_v == 128
                and (c["BLOCK_M"], c["BLOCK_N"]) == tiles and _gluon_sm90(self.q.device)):
            return None
        from ._sm90 import sm90_descriptors

        descs = sm90_descriptors(self.q, self.k, self.v, self.grad_out, self.varlen,
                                 c["BLOCK_M"], c["BLOCK_N"])
        if descs is not None and self.rec is not None:
            for d, index in zip(descs, (_plan.Q, _plan.K, _plan.V, _plan.DO)):
                self.rec.name_descriptor(d, index)
        return descs

    def dq_scratch_descriptor(self):
        """The TMA descriptor the Gluon dK/dV kernel reduces dQ into (``self.dq_acc``, fp32,
        shaped like Q, as ``[rows, heads * D]``)."""
        from ._sm90 import dq_scratch_descriptor

        desc = dq_scratch_descriptor(self.dq_acc, self.varlen)
        if self.rec is not None:
            self.rec.name_descriptor(desc, _plan.ACC)
        return desc

    def sm90_constants(self, c: dict, heavy_first: bool, atomic_dq: bool | None = None,
                       window: int = 0, add_slices: bool = False, units: bool = False,
                       step_slices: bool = False) -> dict:
        """Compile-time arguments and launch options of a Gluon sm_90 kernel (``atomic_dq``:
        the dK/dV kernel's, with or without dQ (stored in ``self.dq_wide_store``'s order),
        launched in ``window``s, :meth:`window`;
        ``add_slices``: the GQA slices add dK / dV into one fp32 buffer by atomics; ``units``:
        a 1-D grid of (key block, kv head) units from an offset; ``step_slices``: slices are
        equal shares of a group's steps, :meth:`tail_slices`)."""
        from . import _sm90

        consts = dict(D=self.d, **self.flags, HEAVY_FIRST=heavy_first, BLOCK_M=c["BLOCK_M"],
                      BLOCK_N=c["BLOCK_N"], STAGES=c.get("GLUON_STAGES", 2),
                      num_warps=_sm90.WARPS, maxnreg=_sm90.MAXNREG)
        if atomic_dq is not None:
            consts["ATOMIC_DQ"] = atomic_dq
            consts["HEADS_INNER"] = bool(c.get("HEADS_INNER", 0))
            consts["WINDOW"] = window
            consts["ADD_DKDV"] = add_slices
            consts["UNITS"] = units
            consts["STEP_SLICES"] = step_slices
            consts["WIDE_STORE"] = self.dq_wide_store  # (False unless the dK/dV kernel adds dQ)
        if atomic_dq:  # a ring of 3 does not fit beside the dS^T and dQ tiles (240 KB)
            consts["STAGES"] = 2
        return consts

    def tail_slices(self, c: dict, split: int, key_blocks: int) -> tuple[int, int] | None:
        """Config ``TAIL_SLICES`` (the Gluon fused-atomic kernel; 0: off): ``(full, slices)``.

        Without a mask every (key block, kv head) unit is equally long and takes one SM, so
        when the units do not fill whole waves the last wave leaves SMs idle. The first
        ``full`` units (at least one whole wave) then run one program each, and each of the
        others is cut into ``slices`` equal shares of its GQA group's (head, query block)
        steps: the count, at most ``TAIL_SLICES``, that finishes the rest soonest when each
        program costs ``SLICE_COST_STEPS`` steps more than its own, with no slice under
        ``MIN_SLICE_STEPS`` steps. All of dK / dV then goes through a zero-filled fp32 buffer
        (the whole units store into it, the slices add into it, the sum launch casts it), so
        the time saved must exceed 5% of a unit's and that buffer's estimated cost
        (``BUFFER_COST_STEPS_PER_UNIT``). ``None`` where it does not apply (a causal mask,
        varlen, a split group) or does not pay.
        """
        most = int(c.get("TAIL_SLICES", 0))
        if most < 0:
            raise ValueError(f"config TAIL_SLICES must be >= 0, got {most}")
        if most < 2 or split != 1 or self.flags["CAUSAL"] or self.varlen:
            return None
        from .tuning import sm_count

        sms = sm_count(self.q.device)
        units = key_blocks * self.batch * self.kv_heads
        full = units // sms * sms
        rest = units - full
        steps = self.group * triton.cdiv(self.seqlen_q, c["BLOCK_M"])
        best, slices = steps + SLICE_COST_STEPS, 1  # the rest's time, in steps
        for k in range(2, most + 1):
            if steps // k < MIN_SLICE_STEPS:
                break
            rest_time = triton.cdiv(rest * k, sms) * (steps / k + SLICE_COST_STEPS)
            if rest_time < best:
                best, slices = rest_time, k
        saved = steps + SLICE_COST_STEPS - best
        pays = saved > max(0.05 * (steps + SLICE_COST_STEPS), units * BUFFER_COST_STEPS_PER_UNIT)
        return (full, slices) if full and rest and pays else None

    def window(self, c: dict, grid: tuple) -> int:
        """Kv heads per launch window of the Gluon dK/dV kernel (config ``WINDOW``; 0: off):
        the programs of ``WINDOW`` kv heads (all their group slices) launch together, key block
        by key block, so that with a causal mask the heavy programs of the last heads do not
        start last; it replaces ``HEAVY_FIRST``'s grid. Halved until it divides ``B * Hkv``;
        off when the key blocks do not fit the grid's second axis (65535)."""
        w = int(c.get("WINDOW", 0))
        if not w or grid[0] > MAX_GRID_YZ:
            return 0
        while grid[1] % w:
            w //= 2
        return w

    def heavy_first(self, c: dict, blocks: int) -> bool:
        """Whether to launch the programs with the most work first (config ``HEAVY_FIRST``;
        causal masks only, where programs differ in work). Measured on an H200
        (``bench_order.py``): it pays at MHA 4K causal and costs at GQA 1K causal, so the
        tuning table turns it on per shape class. The reversed grid puts the ``blocks`` of the
        sequence on a grid axis limited to 65535; beyond that the natural order is kept."""
        return bool(c.get("HEAVY_FIRST", 0)) and self.flags["CAUSAL"] and blocks <= MAX_GRID_YZ

    def dq_convert(self, c: dict) -> None:
        """dQ = scale * (the fp32 scratch of :meth:`dkdv` with ``atomic_dq``), input dtype."""
        grid = (triton.cdiv(max(self.seqlen_q, 1), c["BLOCK_M"]), self.batch * self.heads)
        self._launch(_attn_bwd_dq_convert, grid, (
            self.dq_acc, self.dq, self.cu_q, *self.dq_acc_strides,
            *token_strides(self.dq, self.varlen), self.seqlen_q, self.heads, self.scale,
        ), dict(D=self.d, IS_VARLEN=self.varlen, BLOCK_M=c["BLOCK_M"],
                BLOCK_D=self.blocks["BLOCK_D"], WIDE_STORE=self.dq_wide_store,
                num_warps=c["num_warps"], num_stages=c["num_stages"]))

    def run(self, config: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All kernels; ``config`` maps "pre"/"dkdv"/"dq" (split) or "pre"/"dkdvq"/"cvt"
        (``atomic_dq``) to launch configs."""
        self.preprocess(config["pre"])
        if self.atomic_dq:
            self.dkdv(config["dkdvq"], atomic_dq=True)
            self.dq_convert(config["cvt"])
        elif self.concurrent(config["dq"]):
            # dQ and dK/dV only share read-only inputs: dQ goes to the side stream and both
            # kernels fill the GPU together (their single waves at short lengths overlap).
            side = _plan.side_stream(self.q.device)
            side.fork()  # (a recorded plan forks and joins again on every replay)
            self.side = side
            try:
                self.dq_(config["dq"])
            finally:
                self.side = None
            self.dkdv(config["dkdv"])
            side.join()
        else:
            self.dkdv(config["dkdv"])
            self.dq_(config["dq"])
        return self.dq, self.dk, self.dv

    def concurrent(self, c: dict) -> bool:
        """Whether dQ runs on a side stream beside dK/dV: config ``CONCURRENT_MAX_SK`` on the
        dQ entry, the longest key length that does (CUDA devices only). Measured on an H200
        (docs/triton_notes.md): the backward is 4-13% faster at GQA causal 1K-8K, GQA 1K and
        MHA 2K causal; at 16K and at long non-causal lengths it moves -3% ... +3%."""
        return (self.seqlen_k <= c.get("CONCURRENT_MAX_SK", -1) and self.q.device.type == "cuda"
                and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


@functools.cache
def _has_host_descriptors() -> bool:
    """Whether this triton passes host tensor descriptors to kernels (triton >= 3.4)."""
    return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None


def _tma_available(device: torch.device) -> bool:
    """TMA copies exist on NVIDIA sm_90 and newer; triton's interpreter emulates them (tests).
    Configs asking for them (``LOAD_TMA``, ``TMA``) fall back to pointer loads / atomics
    elsewhere, and on a triton without host tensor descriptors."""
    if not _has_host_descriptors():
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    if device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def _gluon_sm90(device: torch.device) -> bool:
    """Whether the Gluon sm_90 kernels can run: an NVIDIA sm_90 device (not under the
    interpreter: Gluon has none) and a triton whose Gluon API they were written and checked
    against (:data:`._tma_rows.GLUON_TRITON`)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or torch.version.hip:
        return False
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return False
    from ._tma_rows import GLUON_TRITON

    version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    return (version in GLUON_TRITON
            and importlib.util.find_spec("triton.experimental.gluon") is not None)


def tile_descriptor(t: torch.Tensor, varlen: bool, rows: int, cols: int):
    """A TMA descriptor over ``t`` as ``[B, S, H, D]`` (varlen ``[T, H, D]`` as ``[1, T, H, D]``)
    with ``[1, rows, 1, cols]`` blocks, or ``None`` when TMA cannot address it (empty, pointer
    or a stride not a multiple of 16 bytes)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = list(t.shape), list(t.stride())
    if varlen:
        shape, strides = [1, *shape], [strides[0], *strides]
    size = t.element_size()
    if (t.numel() == 0 or t.data_ptr() % 16 or strides[-1] != 1
            or any(s * size % 16 for s in strides[:-1])):
        return None
    return TensorDescriptor(t, shape, strides, [1, rows, 1, cols])


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, grad_out: torch.Tensor, *, causal: bool,
                       bottom_right: bool, scale: float,
                       cu_seqlens_q: torch.Tensor | None = None,
                       cu_seqlens_k: torch.Tensor | None = None,
                       max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                       config: dict | None = None, dq: torch.Tensor | None = None,
                       dk: torch.Tensor | None = None, dv: torch.Tensor | None = None,
                       atomic_dq: bool = False,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of attention, shaped and typed like ``(q, k, v)``.

    ``config`` maps kernel names ("pre", "dkdv", "dq"; "dkdvq", "cvt" with ``atomic_dq``) to
    {BLOCK_M, BLOCK_N, num_warps, num_stages} (default: the tuning table). ``dq``/``dk``/``dv``
    may be given preallocated (tests poison them). ``atomic_dq`` selects the fused design: dQ
    accumulated with fp32 atomics from the key-side kernel (fewer products, not bitwise
    reproducible).
    """
    scale = float(scale)  # one specialization (fp32) whatever the caller passes
    planned = config is None and q.is_cuda and _plan.plans_enabled()
    if planned and not _plan.hooks_installed():
        q, k, v, out, grad_out = (last_dim_contiguous(t) for t in (q, k, v, out, grad_out))
        key, values = _signature(q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, max_seqlen_k, dq, dk, dv, scale,
                                 (causal, bottom_right, atomic_dq))
        plan = _plan.get(key)
        if plan is not False:
            dq = torch.empty_like(q) if dq is None else dq
            dk = torch.empty_like(k) if dk is None else dk
            dv = torch.empty_like(v) if dv is None else dv
            values[_plan.DQ], values[_plan.DK] = dq.data_ptr(), dk.data_ptr()
            values[_plan.DV] = dv.data_ptr()
            plan.run(values, q.device, _current_stream(key[0]))
            return dq, dk, dv
        recorder = _plan.Recorder()
    else:
        recorder = None
    launch = BackwardLaunch(q, k, v, out, lse, grad_out, causal=causal,
                            bottom_right=bottom_right, scale=scale, cu_seqlens_q=cu_seqlens_q,
                            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                            max_seqlen_k=max_seqlen_k, dq=dq, dk=dk, dv=dv,
                            atomic_dq=atomic_dq, recorder=recorder)
    if launch.batch * launch.heads == 0 or q.numel() == 0 and k.numel() == 0:
        return launch.dq.zero_(), launch.dk.zero_(), launch.dv.zero_()
    if config is None:
        from .tuning import get_backward_config

        config = get_backward_config(q.device, launch.d, causal, launch.group,
                                     launch.seqlen_k)
    grads = launch.run(config)
    if recorder is not None:
        plan = recorder.plan(launch.plan_extra)
        if plan is not None:
            _plan.put(key, plan)
    return grads


def _signature(q, k, v, out, lse, grad_out, cu_q, cu_k, max_seqlen_q, max_seqlen_k, dq, dk, dv,
               scale, flags) -> tuple[tuple, list]:
    """The plan key of a call (everything the kernels specialize on) and its per-call values.

    Shapes, strides and dtypes of every tensor, 16-byte alignment of every pointer, flags,
    varlen lengths and the current device; data pointers and the scale are the values.
    """
    values = [None] * _plan.N_VALUES
    sig = []
    align = 0
    for index, t in ((_plan.Q, q), (_plan.K, k), (_plan.V, v), (_plan.OUT, out),
                     (_plan.LSE, lse), (_plan.DO, grad_out), (_plan.CU_Q, cu_q),
                     (_plan.CU_K, cu_k), (_plan.DQ, dq), (_plan.DK, dk), (_plan.DV, dv)):
        if t is None:
            sig.append(None)
            continue
        ptr = t.data_ptr()
        values[index] = ptr
        align |= (ptr % 16 != 0) << index
        sig.append((t.shape, t.stride(), t.dtype))
    values[_plan.SCALE] = scale = float(scale)
    values[_plan.QK_SCALE] = scale * LOG2E
    device = _current_device()
    key = (device, q.device.index, flags, max_seqlen_q, max_seqlen_k, align, *sig)
    return key, values


def _current_device() -> int:
    return triton.runtime.driver.active.get_current_device()


def _current_stream(device: int) -> int:
    return triton.runtime.driver.active.get_current_stream(device)
