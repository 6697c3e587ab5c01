"""Fused attention backward: the entry point, :func:`attention_backward`.

Split design (``triton:fused``, deterministic): preprocess, dK/dV and dQ kernels, no atomics.
Fused-atomic design (``atomic_dq=True``, ``triton:fused_atomic``): preprocess, a dK/dV kernel
that also adds dQ into an fp32 scratch, a convert pass. :class:`~._launcher.BackwardLaunch`
makes the launches (its module describes the kernels), :mod:`._launch_policy` decides their
grids. On NVIDIA GPUs a repeated call of the same signature replays a recorded
:class:`~._plan.Plan` instead (same compiled kernels and arguments, a fraction of the host time).
"""

from __future__ import annotations

import torch
import triton

from attn_dispatch import backend as adb

from . import _plan
from ._common import LOG2E, dense_vector, last_dim_contiguous
from ._launch_strategy import DIRECT, RecordingStrategy
from ._launcher import BackwardLaunch

__all__ = ["BackwardLaunch", "attention_backward"]


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    band: adb.Band,
    scale: float,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softcap: float | None = None,
    config: dict | None = None,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    atomic_dq: bool = False,
    gluon: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of attention, shaped and typed like ``(q, k, v)``.

    ``band`` / ``softcap`` as in :func:`~.forward.attention_forward` (the same values the
    forward that produced ``out`` and ``lse`` ran with).

    ``config`` maps kernel names ("pre", "dkdv", "dq"; "dkdvq", "cvt" with ``atomic_dq``) to
    {BLOCK_M, BLOCK_N, num_warps, num_stages} (default: the tuning table). ``dq``/``dk``/``dv``
    may be given preallocated (tests poison them). ``atomic_dq`` selects the fused design: dQ
    accumulated with fp32 atomics from the key-side kernel (fewer products, not bitwise
    reproducible). ``gluon=False`` keeps the Gluon sm_90 kernels out (configs asking for them
    run the portable ``tl`` kernels, as where Gluon does not apply): calls with attention sinks,
    whose numbers on those kernels no test has checked yet.
    """
    scale = float(scale)  # one specialization (fp32) whatever the caller passes
    # before the plan's signature: a plan replays the pointers of the tensors the kernels read
    cu_seqlens_q, cu_seqlens_k = dense_vector(cu_seqlens_q), dense_vector(cu_seqlens_k)
    planned = config is None and q.is_cuda and _plan.plans_enabled()
    if planned and not _plan.hooks_installed():
        q, k, v, out, grad_out = (last_dim_contiguous(t) for t in (q, k, v, out, grad_out))
        key, values = _signature(
            q,
            k,
            v,
            out,
            lse,
            grad_out,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            dq,
            dk,
            dv,
            scale,
            (band, atomic_dq, softcap, gluon),
        )
        plan = _plan.get(key)
        if plan is not False:
            dq = torch.empty_like(q) if dq is None else dq
            dk = torch.empty_like(k) if dk is None else dk
            dv = torch.empty_like(v) if dv is None else dv
            values[_plan.DQ], values[_plan.DK] = dq.data_ptr(), dk.data_ptr()
            values[_plan.DV] = dv.data_ptr()
            plan.run(values, q.device, _current_stream(key[0]))
            return dq, dk, dv
        strategy = RecordingStrategy(_plan.Recorder())
    else:
        key, strategy = None, DIRECT
    launch = BackwardLaunch(
        q,
        k,
        v,
        out,
        lse,
        grad_out,
        band=band,
        scale=scale,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softcap=softcap,
        dq=dq,
        dk=dk,
        dv=dv,
        atomic_dq=atomic_dq,
        strategy=strategy,
    )
    if launch.batch * launch.heads == 0 or q.numel() == 0 and k.numel() == 0:
        return launch.dq.zero_(), launch.dk.zero_(), launch.dv.zero_()
    if config is None:
        from .tuning import get_backward_config

        config = get_backward_config(
            q.device,
            launch.d,
            launch.band.limited,
            launch.group,
            launch.seqlen_k,
            head_dim_v=launch.d_v,
        )
    if not gluon:
        config = {name: {k: x for k, x in c.items() if k != "GLUON"} for name, c in config.items()}
    grads = launch.run(config)
    plan = strategy.plan(launch.plan_extra)  # (None when direct: nothing recorded)
    if plan is not None:
        _plan.put(key, plan)
    return grads


def _signature(
    q, k, v, out, lse, grad_out, cu_q, cu_k, max_seqlen_q, max_seqlen_k, dq, dk, dv, scale, flags
) -> tuple[tuple, list]:
    """The plan key of a call (everything the kernels specialize on) and its per-call values.

    Shapes, strides and dtypes of every tensor, 16-byte alignment of every pointer, flags,
    varlen lengths and the current device; data pointers and the scale are the values.
    """
    values = [None] * _plan.N_VALUES
    sig = []
    align = 0
    for index, t in (
        (_plan.Q, q),
        (_plan.K, k),
        (_plan.V, v),
        (_plan.OUT, out),
        (_plan.LSE, lse),
        (_plan.DO, grad_out),
        (_plan.CU_Q, cu_q),
        (_plan.CU_K, cu_k),
        (_plan.DQ, dq),
        (_plan.DK, dk),
        (_plan.DV, dv),
    ):
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
