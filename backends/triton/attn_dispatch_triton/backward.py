"""Fused attention backward: the entry point, :func:`attention_backward`.

Split design (``triton:fused``, deterministic): preprocess, dK/dV and dQ kernels, no atomics.
Fused-atomic design (``atomic_dq=True``, ``triton:fused_atomic``): preprocess, a dK/dV kernel
that also adds dQ into an fp32 scratch, a convert pass. :class:`~._launcher.BackwardLaunch`
makes the launches (its module describes the kernels), :mod:`._launch_policy` decides their
grids. On NVIDIA GPUs a repeated call of the same signature replays a recorded
:class:`~._plan.Plan` instead (same compiled kernels and arguments, a fraction of the host time),
kept by the signature's :class:`~._plan.Prepared` (:func:`signature`, once per dispatcher decision)
or, for a call without one, found by a key built from every tensor of the call.
"""

from __future__ import annotations

import functools

import torch
import triton

from attn_dispatch import backend as adb

from . import _plan
from ._common import LOG2E, dense_vector, gradient_buffers, kernel_operands
from ._launch_strategy import DIRECT, RecordingStrategy
from ._launcher import BackwardLaunch

__all__ = ["BackwardLaunch", "attention_backward", "plannable", "signature"]


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
    plan: _plan.Prepared | None = None,
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
    whose numbers on those kernels no test has checked yet. ``plan``: the call's signature
    from :func:`signature` (the dispatcher's ``inp.plan``), which keeps its launch plans; without
    one a repeated call finds its plan by a key built from every tensor of the call.
    """
    scale = float(scale)  # one specialization (fp32) whatever the caller passes
    # before the plan's signature: a plan replays the pointers of the tensors the kernels read
    cu_seqlens_q, cu_seqlens_k = dense_vector(cu_seqlens_q), dense_vector(cu_seqlens_k)
    grads = (dq, dk, dv)
    # a Prepared covers calls that allocate their gradients (its key holds no dq/dk/dv)
    prepared = plan if dq is None and dk is None and dv is None else None
    keep, strategy = None, DIRECT
    if config is None and (prepared is not None or plannable(q)) and not _plan.hooks_installed():
        q, k, v, out, grad_out = kernel_operands(q, k, v, out, grad_out)
        inputs = (q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_k)
        flags = (band, atomic_dq, softcap, gluon)
        found, keep, values, device = _find_plan(
            inputs, grads, scale, prepared, flags, (max_seqlen_q, max_seqlen_k)
        )
        if isinstance(found, _plan.Plan):
            return _replay(found, values, device, inputs[:3], grads)
        if found is None:  # recorded before and not plannable: launch directly
            keep = None
        else:
            strategy = RecordingStrategy(_plan.Recorder())
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
    result = launch.run(_kernel_configs(launch, config, gluon))
    if keep is not None:  # a recording call: its plan, or None (not plannable: do not record again)
        made = strategy.plan(launch.plan_extra)
        if made is not None or not strategy.recorder.aliased:  # (aliasing is this call's alone)
            keep(made)
    return result


def _find_plan(
    inputs: tuple, grads: tuple, scale: float, prepared, flags: tuple, max_seqlens: tuple
) -> tuple:
    """``(found, keep, values, device)`` of a plannable call: its plan (``False``: none recorded
    yet; ``None``: recorded and not plannable), the function that keeps what its recording
    makes, its per-call values and the current device. Kept by ``prepared`` (the call's
    :class:`~._plan.Prepared`) where given, else by a key built from every tensor of the call."""
    values, align = _values(inputs, grads, scale)
    device = _current_device()
    if prepared is not None:
        keep = functools.partial(prepared.put, device, align)
        return prepared.get(device, align), keep, values, device
    key = (_static_key((*inputs, *grads), *max_seqlens, flags), device, align)
    return _plan.get(key), functools.partial(_plan.put, key), values, device


def _replay(plan: _plan.Plan, values: list, device: int, qkv: tuple, grads: tuple) -> tuple:
    """``(dq, dk, dv)`` by ``plan``, into ``grads`` where given, else into fresh tensors."""
    dq, dk, dv = gradient_buffers(*qkv, grads)
    values[_plan.DQ], values[_plan.DK], values[_plan.DV] = (
        dq.data_ptr(),
        dk.data_ptr(),
        dv.data_ptr(),
    )
    plan.run(values, dq.device, _current_stream(device))
    return dq, dk, dv


def _kernel_configs(launch: BackwardLaunch, config: dict | None, gluon: bool) -> dict:
    """``config`` or, without one, the tuning table's for ``launch``'s problem; with
    ``gluon=False`` every entry's ``GLUON`` key dropped."""
    if config is None:
        from .tuning import get_backward_config

        config = get_backward_config(
            launch.q.device,
            launch.d,
            launch.band.limited,
            launch.group,
            launch.seqlen_k,
            head_dim_v=launch.d_v,
        )
    if not gluon:
        config = {name: {k: x for k, x in c.items() if k != "GLUON"} for name, c in config.items()}
    return config


def signature(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    band: adb.Band,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softcap: float | None = None,
    atomic_dq: bool = False,
    gluon: bool = True,
) -> _plan.Prepared:
    """The :class:`~._plan.Prepared` signature of a call of :func:`attention_backward` with
    these arguments (its ``plan``), without gradients given: the tensors as it sees them (after
    its contiguity copies). Useful only where :func:`plannable`."""
    q, k, v, out, grad_out = kernel_operands(q, k, v, out, grad_out)
    cu_q, cu_k = dense_vector(cu_seqlens_q), dense_vector(cu_seqlens_k)
    flags = (band, atomic_dq, softcap, gluon)
    tensors = (q, k, v, out, lse, grad_out, cu_q, cu_k, None, None, None)
    return _plan.Prepared(_static_key(tensors, max_seqlen_q, max_seqlen_k, flags))


def plannable(q: torch.Tensor) -> bool:
    """Whether launch plans run for ``q``'s device (CUDA, plans on)."""
    return q.is_cuda and _plan.plans_enabled()


# The per-call value index of each tensor of a call: inputs, then the gradients if given.
_INPUTS = (_plan.Q, _plan.K, _plan.V, _plan.OUT, _plan.LSE, _plan.DO, _plan.CU_Q, _plan.CU_K)
_GRADS = (_plan.DQ, _plan.DK, _plan.DV)


def _static_key(tensors: tuple, max_seqlen_q, max_seqlen_k, flags: tuple) -> tuple:
    """What a plan depends on that the signature fixes: shapes, strides and dtypes of the eleven
    tensors (``None`` for an absent one), their device, flags and varlen lengths."""
    sig = [None if t is None else (t.shape, t.stride(), t.dtype) for t in tensors]
    return (tensors[0].device.index, flags, max_seqlen_q, max_seqlen_k, *sig)


def _values(inputs: tuple, grads: tuple, scale: float) -> tuple[list, int]:
    """A call's per-call values (data pointers, the scale) and the 16-byte alignment bits of its
    pointers: what a plan depends on beyond the signature, with the current device."""
    values = [None] * _plan.N_VALUES
    align = 0
    for index, t in zip(_INPUTS + _GRADS, inputs + grads):
        if t is not None:
            ptr = values[index] = t.data_ptr()
            align |= (ptr % 16 != 0) << index
    values[_plan.SCALE] = scale
    values[_plan.QK_SCALE] = scale * LOG2E
    return values, align


def _current_device() -> int:
    return triton.runtime.driver.active.get_current_device()


def _current_stream(device: int) -> int:
    return triton.runtime.driver.active.get_current_stream(device)
