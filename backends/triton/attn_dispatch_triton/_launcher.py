"""The backward's kernel launches: :class:`BackwardLaunch` holds one problem's arguments,
allocates what a launch plan of :mod:`._launch_policy` names, and launches it.

Split design (``triton:fused``): ``_bwd_preprocess`` (delta, lse2), ``_bwd_dkdv`` (one program
per key block and kv head, walking the GQA group), ``_bwd_dq`` (one program per query block and
head); with config ``GLUON`` on sm_90 the Gluon ``_bwd_dkdv_sm90`` / ``_bwd_dq_sm90`` instead.
Fused-atomic design (``atomic_dq``, ``triton:fused_atomic``): preprocess, the dK/dV kernel with
``ATOMIC_DQ`` also adding dQ into a zero-filled fp32 scratch (config key ``"dkdvq"``), then
``_bwd_dq_convert`` scales and casts it (``"cvt"``). Each kernel can be launched (and timed) on
its own.

Every kernel takes the band (causal mask and sliding window: the call's ``adb.Band``, see
``_band``) as loop bounds, so blocks wholly outside it are never visited, and the soft cap as a
compile-time path.
"""

from __future__ import annotations

import torch

from attn_dispatch import backend as adb

from . import _band, _plan
from . import _launch_policy as policy
from ._bwd_dkdv import _attn_bwd_dkdv
from ._bwd_dq import _attn_bwd_dq
from ._bwd_dq_convert import _attn_bwd_dq_convert
from ._bwd_preprocess import _attn_bwd_preprocess
from ._bwd_split_sum import _attn_bwd_split_sum
from ._common import (
    LOG2E,
    dense,
    dense_vector,
    gradient_buffers,
    kernel_operands,
    lse_strides,
    padded_dim,
    softcap_mode,
    token_strides,
)
from ._kernel_support import gluon_sm90, interpreting, tile_descriptor, tma_available
from ._launch_strategy import DIRECT, LaunchStrategy, RecordingStrategy

GLUON_STAGES = 2  # ring buffers of the Gluon kernels (3 do not fit beside the atomic-dQ tiles)
GLUON_DKDV_TILES = (64, 128)  # (BLOCK_M, BLOCK_N) the Gluon kernels are written for
GLUON_DQ_TILES = (128, 64)

# the plan value indices of the tensors each kernel's tile descriptors address
_Q_DO = (_plan.Q, _plan.DO)
_K_V = (_plan.K, _plan.V)
_Q_K_V_DO = (_plan.Q, _plan.K, _plan.V, _plan.DO)


class BackwardLaunch:
    """The arguments of one backward problem, and one method per kernel launch.

    ``strategy`` (chosen once, here) launches each kernel and learns what each argument is:
    :data:`~._launch_strategy.DIRECT` records nothing, a
    :class:`~._launch_strategy.RecordingStrategy` records the call's launch plan
    (``recorder=r`` is short for ``strategy=RecordingStrategy(r)``).
    """

    def __init__(
        self,
        q,
        k,
        v,
        out,
        lse,
        grad_out,
        *,
        band: adb.Band,
        scale: float,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        softcap: float | None = None,
        dq=None,
        dk=None,
        dv=None,
        atomic_dq: bool = False,
        strategy: LaunchStrategy = DIRECT,
        recorder: _plan.Recorder | None = None,
    ) -> None:
        if recorder is not None:
            strategy = RecordingStrategy(recorder)
        self.varlen = varlen = cu_seqlens_q is not None
        q, k, v, out, grad_out = kernel_operands(q, k, v, out, grad_out)
        if varlen:
            self.batch = cu_seqlens_q.numel() - 1
            self.heads, self.kv_heads = q.shape[1], k.shape[1]
            self.seqlen_q, self.seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        else:
            self.batch, self.seqlen_q, self.heads = q.shape[0], q.shape[1], q.shape[2]
            self.seqlen_k, self.kv_heads = k.shape[1], k.shape[2]
        self.d, self.d_v = q.shape[-1], v.shape[-1]
        self.group = self.heads // self.kv_heads
        self.band = band
        self.softcap = softcap
        self.problem = policy.Problem(
            self.batch,
            self.heads,
            self.kv_heads,
            self.seqlen_q,
            self.seqlen_k,
            self.band.limited,
            varlen,
            on_gpu=q.device.type == "cuda",
            has_keys=k.numel() > 0,
        )
        self.q, self.k, self.v, self.out, self.lse, self.grad_out = q, k, v, out, lse, grad_out
        self.dq, self.dk, self.dv = gradient_buffers(q, k, v, (dq, dk, dv))
        tmp = torch.empty((2, *lse.shape), dtype=torch.float32, device=q.device)
        self.lse2, self.delta = tmp[0], tmp[1]
        # the kernels index cu_seqlens as CU + b: a strided view is read through a dense copy
        self.cu_q = dense_vector(cu_seqlens_q) if varlen else q  # an unused pointer when dense
        self.cu_k = dense_vector(cu_seqlens_k) if varlen else q
        # what every main kernel reads per query row and sequence, in its argument order
        self._row_stats = (self.lse2, self.delta, self.cu_q, self.cu_k)
        self.scale = scale
        self.qk_scale = scale * LOG2E
        self.strategy = strategy
        self.launch_kernel = strategy.launch  # bound once: one attribute lookup per launch
        self.dq_wide_store = False  # the dQ scratch's columns in WIDE_STORE's order
        self.plan_extra = dict(tmp_shape=tuple(tmp.shape), part_numel=None, acc=None)
        self.atomic_dq = atomic_dq
        # every kernel's band and cap constexprs (the Gluon ones too: they run on NVIDIA only,
        # where the cap's mode is the hardware tanh they use)
        self.flags = dict(**_band.constexprs(band), SOFTCAP=softcap_mode(self.softcap, q.device))
        self.flags["IS_VARLEN"] = varlen
        # (win_left, win_right, softcap) of every kernel: fixed per plan signature
        self.band_args = (*_band.sides(band), self.softcap or 1.0)
        # the trailing scalars of every main kernel
        self.scalars = (self.qk_scale, self.scale, *self.band_args)
        self.blocks = dict(BLOCK_D=padded_dim(self.d), BLOCK_DV=padded_dim(self.d_v))
        self.s_q, self.s_k, self.s_v = (token_strides(t, varlen) for t in (q, k, v))
        self.s_do = token_strides(grad_out, varlen)
        self.s_t = lse_strides(self.lse2, varlen)
        strategy.name_arguments(self)

    def _launch(self, kernel, grid: tuple, args: tuple, kwargs: dict) -> None:
        self.launch_kernel(kernel, grid, args, kwargs)

    def _sms(self) -> int | None:
        """The GPU's SM count (``None`` off a GPU), for the launch policy."""
        if self.q.device.type != "cuda":
            return None
        from . import tuning

        return tuning.sm_count(self.q.device)

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
            with self.strategy.on_side(side):
                self.dq_(config["dq"])
            self.dkdv(config["dkdv"])
            side.join()
        else:
            self.dkdv(config["dkdv"])
            self.dq_(config["dq"])
        return self.dq, self.dk, self.dv

    def concurrent(self, c: dict) -> bool:
        """Whether dQ runs on a side stream beside dK/dV (config ``CONCURRENT_MAX_SK``)."""
        streams = self.q.device.type == "cuda" and not interpreting()
        return policy.runs_concurrently(self.problem, c, streams)

    def preprocess(self, c: dict) -> None:
        """delta = rowsum(dO * O), lse2 = lse * log2(e) (+inf for rows that see no key)."""
        grid = policy.query_block_grid(self.problem, c)
        self._launch(
            _attn_bwd_preprocess,
            grid,
            (
                self.out,
                self.grad_out,
                self.lse,
                self.delta,
                self.lse2,
                self.cu_q,
                *token_strides(self.out, self.varlen),
                *self.s_do,
                *lse_strides(self.lse, self.varlen),
                *self.s_t,
                self.seqlen_q,
                self.heads,
            ),
            self._row_constants(c, DV=self.d_v, BLOCK_DV=self.blocks["BLOCK_DV"]),
        )

    def dkdv_plan(self, c: dict, atomic_dq: bool = False, gluon: bool = False) -> policy.DkdvPlan:
        """The launch policy's dK/dV plan for this problem (``gluon``: the Gluon kernel runs)."""
        return policy.dkdv_plan(
            self.problem,
            c,
            sms=self._sms(),
            gluon=gluon,
            atomic_dq=atomic_dq,
            dense_out=dense(self.dk) and dense(self.dv),
        )

    def dkdv(self, c: dict, atomic_dq: bool = False) -> None:
        """dK, dV: one program per key block, kv head and slice of the GQA group.

        With ``atomic_dq`` the same programs add the unscaled dQ into ``self.dq_acc`` (fp32,
        zero-filled here); :meth:`dq_convert` finishes it.
        """
        sm90 = self.sm90_descriptors(c, GLUON_DKDV_TILES)
        plan = self.dkdv_plan(c, atomic_dq, gluon=sm90 is not None)
        tma = bool(atomic_dq and c.get("TMA") and sm90 is None) and tma_available(self.q.device)
        acc, s_acc = self._dq_scratch(c, atomic_dq, tma)
        dk, dv, part = self._dkdv_outputs(plan)
        if sm90 is not None:
            self.dq_wide_store = bool(atomic_dq and c.get("WIDE_STORE", 0))
            self._dkdv_sm90(c, plan, sm90, dk, dv, atomic_dq)
        else:
            self._dkdv_portable(c, plan, dk, dv, acc, s_acc, atomic_dq, tma)
        self._sum_partials(plan, dk, dv, part)

    def _dq_scratch(self, c: dict, atomic_dq: bool, tma: bool) -> tuple:
        """The fused-atomic design's zero-filled fp32 dQ scratch (``self.dq_acc``) and the
        strides the dK/dV kernel takes: as ``[B, H, S, BLOCK_D]`` / ``[H, T, BLOCK_D]`` behind a
        TMA descriptor (``tma``; strides in rows), else shaped like Q (in elements). Without
        ``atomic_dq``: an unused pointer."""
        if not atomic_dq:
            return self.q, (0, 0, 0)
        if not tma:
            self.dq_acc = acc = torch.zeros(self.q.shape, dtype=torch.float32, device=self.q.device)
            self.dq_acc_strides = token_strides(acc, self.varlen)
            self.plan_extra["acc"] = dict(shape=tuple(acc.shape))
            self.strategy.name(acc, _plan.ACC)
            return acc, self.dq_acc_strides
        from triton.tools.tensor_descriptor import TensorDescriptor

        bd = self.blocks["BLOCK_D"]
        rows = self.q.shape[0] if self.varlen else self.seqlen_q
        lead = (self.heads, rows) if self.varlen else (self.batch, self.heads, rows)
        self.dq_acc = torch.zeros((*lead, bd), dtype=torch.float32, device=self.q.device)
        flat = self.dq_acc.view(-1, bd)
        desc = TensorDescriptor(flat, list(flat.shape), [bd, 1], [c["BLOCK_M"], bd])
        s_acc = (0, 1, rows) if self.varlen else (self.heads * rows, 1, rows)  # in rows
        self.dq_acc_strides = tuple(x * bd for x in s_acc)  # in elements (the convert pass)
        self.plan_extra["acc"] = dict(shape=tuple(self.dq_acc.shape))
        self.strategy.name_descriptor(desc, _plan.ACC)
        self.strategy.name(self.dq_acc, _plan.ACC)
        return desc, s_acc

    def _dkdv_outputs(self, plan: policy.DkdvPlan) -> tuple:
        """``(dk, dv, part)``: where the dK/dV programs write. With partials, fp32 tensors
        with a leading partial axis (views of one buffer ``part`` for the sum launch, else
        their own, summed by torch); without, the outputs themselves."""
        if plan.partials is policy.Partials.NONE:
            return self.dk, self.dv, None
        count, device = plan.partial_count, self.dk.device
        if plan.partials is policy.Partials.TORCH_SUM:
            self.strategy.unplannable()  # (the torch sum is no kernel launch a plan can replay)
            return (
                torch.empty((count, *self.dk.shape), dtype=torch.float32, device=device),
                torch.empty((count, *self.dv.shape), dtype=torch.float32, device=device),
                None,
            )
        layout = policy.sum_layout(self.dk.numel(), self.dv.numel())
        alloc = torch.zeros if plan.zero_partials else torch.empty
        part = alloc((count, layout.row), dtype=torch.float32, device=device)
        dk = _laid_out_like(part[:, : layout.n_k], self.dk)
        dv = _laid_out_like(part[:, layout.v_offset :], self.dv)
        self.plan_extra["part_numel"] = part.numel()
        self.plan_extra["part_zeroed"] = plan.zero_partials
        self.strategy.name_partials(part, dk, dv)
        return dk, dv, (part, layout)

    def _sum_partials(self, plan: policy.DkdvPlan, dk, dv, part) -> None:
        """dK, dV = the sum of the partials, cast (nothing to do without partials)."""
        if plan.partials is policy.Partials.TORCH_SUM:
            self.dk.copy_(dk.sum(0))
            self.dv.copy_(dv.sum(0))
        elif plan.partials is policy.Partials.SUM_KERNEL:
            buffer, layout = part
            self._launch(
                _attn_bwd_split_sum,
                layout.grid,
                (
                    buffer,
                    self.dk,
                    self.dv,
                    layout.n_k,
                    layout.n_v,
                    layout.blocks_k,
                    layout.row,
                ),
                dict(
                    SPLIT=buffer.shape[0],
                    BLOCK=policy.SUM_BLOCK,
                    num_warps=policy.SUM_WARPS,
                    num_stages=1,
                ),
            )

    def _output_strides(self, plan: policy.DkdvPlan, dk, dv) -> tuple:
        """Token strides of one partial (or of the outputs) of dK and dV."""
        if plan.partials is not policy.Partials.NONE:
            dk, dv = dk[0], dv[0]
        return (*token_strides(dk, self.varlen), *token_strides(dv, self.varlen))

    def _dkdv_sm90(
        self, c: dict, plan: policy.DkdvPlan, descs: tuple, dk, dv, atomic_dq: bool
    ) -> None:
        """The Gluon sm_90 dK/dV kernel, once per launch of ``plan``."""
        from ._bwd_dkdv_sm90 import _attn_bwd_dkdv_sm90

        slices_apart = plan.split > 1 and not plan.zero_partials  # one partial per slice
        head = (
            *descs,
            self.dq_scratch_descriptor() if atomic_dq else None,
            dk,
            dv,
            *self._row_stats,
            *self._output_strides(plan, dk, dv),
            *self.s_t,
            *((dk.stride(0), dv.stride(0)) if slices_apart else (0, 0)),
            *self._lengths_heads(self.kv_heads),
        )
        for launch in plan.launches:
            self._launch(
                _attn_bwd_dkdv_sm90,
                launch.grid,
                (
                    *head,
                    launch.unit_offset,
                    plan.key_blocks,
                    *self.scalars,
                ),
                self.dkdv_sm90_constants(c, launch, atomic_dq),
            )

    def _dkdv_portable(
        self, c: dict, plan: policy.DkdvPlan, dk, dv, acc, s_acc, atomic_dq: bool, tma: bool
    ) -> None:
        """The ``tl`` dK/dV kernel (every arch; also the fused-atomic one)."""
        (launch,) = plan.launches
        descs = self.tile_descriptors(
            c,
            c["BLOCK_M"],
            ((self.q, self.blocks["BLOCK_D"]), (self.grad_out, self.blocks["BLOCK_DV"])),
            _Q_DO,
        )
        split_strides = (dk.stride(0), dv.stride(0)) if plan.split > 1 else (0, 0)
        self._launch(
            _attn_bwd_dkdv,
            launch.grid,
            (
                *self._portable_inputs(descs),
                dk,
                dv,
                acc,
                *self._row_stats,
                *self.s_q,
                *self.s_k,
                *self.s_v,
                *self.s_do,
                *self._output_strides(plan, dk, dv),
                *s_acc,
                *self.s_t,
                *split_strides,
                *self._lengths_heads(self.kv_heads),
                *self.scalars,
            ),
            self._portable_constants(
                c,
                descs,
                heavy_first=launch.layout is policy.GridLayout.HEAVY_FIRST,
                ATOMIC_DQ=atomic_dq,
                DQ_TMA=tma,
                DP_FIRST=bool(c.get("DP_FIRST", 0)),
            ),
        )

    def _portable_inputs(self, descs: tuple | None) -> tuple:
        """Q, K, V, dO and the two tile descriptors of a portable kernel (``descs``; the
        unused pointers Q, Q without them)."""
        return (self.q, self.k, self.v, self.grad_out, *(descs or (self.q, self.q)))

    def _lengths_heads(self, heads: int) -> tuple:
        """The lengths and head counts every main kernel takes after its strides (``heads``:
        the heads its grid walks)."""
        return (self.seqlen_q, self.seqlen_k, heads, self.group)

    def _portable_constants(self, c: dict, descs, *, heavy_first: bool, **extra) -> dict:
        """Compile-time arguments and launch options of a portable dK/dV or dQ kernel
        (``extra``: the kernel's own)."""
        return dict(
            D=self.d,
            DV=self.d_v,
            **self.flags,
            **extra,
            HEAVY_FIRST=heavy_first,
            LOAD_TMA=descs is not None,
            BLOCK_M=c["BLOCK_M"],
            BLOCK_N=c["BLOCK_N"],
            **self.blocks,
            num_warps=c["num_warps"],
            num_stages=c["num_stages"],
        )

    def dq_(self, c: dict) -> None:
        """dQ: one program per query block and head."""
        launch = policy.dq_launch(self.problem, c)
        sm90 = self.sm90_descriptors(c, GLUON_DQ_TILES)
        if sm90 is not None:
            from ._bwd_dq_sm90 import _attn_bwd_dq_sm90

            self._launch(
                _attn_bwd_dq_sm90,
                launch.grid,
                (
                    *sm90,
                    self.dq,
                    *self._row_stats,
                    *token_strides(self.dq, self.varlen),
                    *self.s_t,
                    *self._lengths_heads(self.heads),
                    *self.scalars,
                ),
                dict(self.sm90_constants(c), HEAVY_FIRST=launch.heavy_first),
            )
            return
        descs = self.tile_descriptors(
            c,
            c["BLOCK_N"],
            ((self.k, self.blocks["BLOCK_D"]), (self.v, self.blocks["BLOCK_DV"])),
            _K_V,
        )
        self._launch(
            _attn_bwd_dq,
            launch.grid,
            (
                *self._portable_inputs(descs),
                self.dq,
                *self._row_stats,
                *self.s_q,
                *self.s_k,
                *self.s_v,
                *self.s_do,
                *token_strides(self.dq, self.varlen),
                *self.s_t,
                *self._lengths_heads(self.heads),
                *self.scalars,
            ),
            self._portable_constants(c, descs, heavy_first=launch.heavy_first),
        )

    def dq_convert(self, c: dict) -> None:
        """dQ = scale * (the fp32 scratch of :meth:`dkdv` with ``atomic_dq``), input dtype."""
        self._launch(
            _attn_bwd_dq_convert,
            policy.query_block_grid(self.problem, c),
            (
                self.dq_acc,
                self.dq,
                self.cu_q,
                *self.dq_acc_strides,
                *token_strides(self.dq, self.varlen),
                self.seqlen_q,
                self.heads,
                self.scale,
            ),
            self._row_constants(
                c, D=self.d, BLOCK_D=self.blocks["BLOCK_D"], WIDE_STORE=self.dq_wide_store
            ),
        )

    def _row_constants(self, c: dict, **extra) -> dict:
        """Compile-time arguments and launch options of a per-row kernel (preprocess, dQ
        convert) on the grid ``(query blocks, B*H)`` (``extra``: the kernel's own)."""
        return dict(
            **extra,
            IS_VARLEN=self.varlen,
            BLOCK_M=c["BLOCK_M"],
            num_warps=c["num_warps"],
            num_stages=c["num_stages"],
        )

    def tile_descriptors(
        self, c: dict, rows: int, tensors: tuple, indices: tuple[int, ...]
    ) -> tuple | None:
        """TMA descriptors for the tiles a kernel's loop loads (config ``LOAD_TMA``), one per
        ``(tensor, padded cols)`` (``indices``: each tensor's plan value index), with ``rows``
        rows per block (the loop's step); ``None`` (pointer loads) when the config does not ask
        for them or a tensor does not qualify (see :func:`._kernel_support.tile_descriptor`)."""
        if not c.get("LOAD_TMA") or not tma_available(self.q.device):
            return None
        descs = tuple(tile_descriptor(t, self.varlen, rows, cols) for t, cols in tensors)
        if any(d is None for d in descs):
            return None
        self.strategy.name_descriptors(descs, indices)
        return descs

    def sm90_descriptors(self, c: dict, tiles: tuple[int, int]) -> tuple | None:
        """TMA descriptors of Q, K, V, dO for a Gluon sm_90 kernel when config ``GLUON`` asks
        for it and it applies: NVIDIA sm_90, verified triton, D = DV = 128, the kernel's tiles
        ``(BLOCK_M, BLOCK_N)`` and tensors TMA can read as ``[rows, heads * D]`` (see
        ``_sm90.sm90_descriptors``); else ``None`` (the portable ``tl`` kernel runs)."""
        if not (
            c.get("GLUON")
            and self.d == self.d_v == 128
            and (c["BLOCK_M"], c["BLOCK_N"]) == tiles
            and gluon_sm90(self.q.device)
        ):
            return None
        from ._sm90 import sm90_descriptors

        descs = sm90_descriptors(
            self.q, self.k, self.v, self.grad_out, self.varlen, c["BLOCK_M"], c["BLOCK_N"]
        )
        if descs is not None:
            self.strategy.name_descriptors(descs, _Q_K_V_DO)
        return descs

    def dq_scratch_descriptor(self):
        """The TMA descriptor the Gluon dK/dV kernel reduces dQ into (``self.dq_acc``, fp32,
        shaped like Q, as ``[rows, heads * D]``)."""
        from ._sm90 import dq_scratch_descriptor

        desc = dq_scratch_descriptor(self.dq_acc, self.varlen)
        self.strategy.name_descriptor(desc, _plan.ACC)
        return desc

    def sm90_constants(self, c: dict) -> dict:
        """Compile-time arguments and launch options both Gluon sm_90 kernels take."""
        from . import _sm90

        return dict(
            D=self.d,
            **self.flags,
            BLOCK_M=c["BLOCK_M"],
            BLOCK_N=c["BLOCK_N"],
            STAGES=GLUON_STAGES,
            num_warps=_sm90.WARPS,
            maxnreg=_sm90.MAXNREG,
        )

    def dkdv_sm90_constants(self, c: dict, launch: policy.DkdvLaunch, atomic_dq: bool) -> dict:
        """Those of the Gluon dK/dV kernel for one launch of its plan (with dQ, stored in
        ``self.dq_wide_store``'s column order, when ``atomic_dq``)."""
        return dict(
            self.sm90_constants(c),
            ATOMIC_DQ=atomic_dq,
            GRID_LAYOUT=int(launch.layout),
            WINDOW=launch.window,
            ADD_DKDV=launch.add_dkdv,
            STEP_SLICES=launch.step_slices,
            WIDE_STORE=self.dq_wide_store,
        )


def _laid_out_like(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``rows`` (``[count, >= like.numel()]`` of a partials buffer) as ``count`` tensors each
    strided like ``like`` (dense, see :func:`._common.dense`): the sum launch walks both flat,
    so element i of a partial is then element i of ``like``'s memory, in any order of dims."""
    return rows.as_strided((rows.shape[0], *like.shape), (rows.stride(0), *like.stride()))
