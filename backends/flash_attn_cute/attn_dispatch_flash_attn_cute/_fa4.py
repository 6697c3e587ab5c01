"""The calls into FlashAttention-4, imported on the first kernel call.

FA4's private entry points are used, as FA4's own autograd function uses them:
``_flash_attn_fwd(q, k, v, ...) -> (out, lse, p, row_max, o_lo)`` and
``_flash_attn_bwd(q, k, v, out, dout, lse, ...) -> (dq, dk, dv)``, every argument but the
tensors by keyword. Both run on the current CUDA device and stream, so a call on another device
than the current one switches to ``q``'s for its duration.

Layouts need no conversion: FA4's tensors are ours (BSHD / THD, dK/dV with Hkv heads) and so
is its lse (float32, natural log, [B, H, Sq] dense and [H, Tq] varlen, contiguous; FA4 copies
an lse or a tensor whose strides it cannot read itself). Rows that see no key get lse = -inf
and a zero output row from FA4's forward (``Softmax.finalize``: a zero row sum gives -inf and
a unit rescale of a zero accumulator), and its backward reads lse = -inf as 0 for the softmax
recomputation while the mask zeroes every probability of such a row, so dQ is zero there: our
contract, with no conversion. Calls with no work (zero queries or keys) are answered here
without FA4.

JIT compilation: FA4 compiles a kernel the first time it sees a compile key (dtype, head dims,
GQA ratio, mask kind, varlen, deterministic, tile configuration, ...; sequence lengths, batch,
heads and the scale are runtime values) and keeps it for the process. Only the first call of a
signature can compile (everything in FA4's compile key is part of our signature), so only that
call takes snapshots of FA4's caches: each first call that added kernels is recorded with its
wall time (:func:`compile_log`) and logged once at INFO on the ``attn_dispatch.flash_attn_cute``
logger, and the first call of a variant new to the process prints one line on stderr before
and one after (compiling takes seconds). Host-side only: CUDA-graph capture and torch.compile
(which calls the dispatcher's custom op, never this code, while tracing) are unaffected.

Per call, the rest is cached per signature (:class:`Plan`): the keyword arguments (scale, mask,
soft cap, determinism), the variant; the device is switched only when it is not current. The
implementation's ``prepare`` makes a signature's :class:`Ready` (its plan, and its replay once
learned) once per dispatcher decision, which hands it to every call as ``inp.plan``. A dense
call whose signature already ran on the current device reads it there; its second and third
calls are recorded (:mod:`._replay`; a call's attention sinks are one more input); when the
two did the same work, every later call with 16-byte-aligned inputs replays it (FA4's
allocations and kernel launches, none of its Python):
less host time per call than FA4's own entry points. Inputs without a plan (built outside the
dispatcher) find theirs in a cache keyed on their facts and flags, and are never replayed.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import _replay
from ._releases import RELEASES, tested_versions
from ._support import installed_release, mask_args

log = logging.getLogger("attn_dispatch.flash_attn_cute")

_interface: ModuleType | None = None
_import_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """One call that compiled (or loaded from FA4's disk cache) new kernels."""

    kind: str  # "forward" or "backward"
    variant: str  # what selects the kernels: dtype, head dims, GQA ratio, mask, varlen, ...
    seconds: float  # wall time of the whole call (compilation dominates it)
    kernels: int  # kernels added to FA4's in-process caches by this call


_records: list[CompileRecord] = []


def interface() -> ModuleType:
    """``flash_attn.cute.interface``, imported once (a few seconds: CUTLASS's DSL, TVM-FFI)."""
    global _interface, _import_seconds
    if _interface is None:
        start = time.perf_counter()
        import flash_attn.cute.interface as iface

        _import_seconds = time.perf_counter() - start
        _interface = iface
        log.info("flash_attn.cute imported in %.1f s", _import_seconds)
    return _interface


def import_seconds() -> float | None:
    """How long importing FA4 took in this process (``None``: not imported yet)."""
    return _import_seconds


def compile_log() -> list[CompileRecord]:
    """The calls of this process that compiled FA4 kernels, in order."""
    return list(_records)


def compile_cache_owners() -> list:
    """FA4's functions that keep a compile cache (``fn.compile_cache``; its ``.cache`` maps a
    compile key to a kernel): every one of its interface module, since our calls reach several
    through FA4's helpers and a recording must see each ([] before FA4 is imported)."""
    if _interface is None:
        return []
    return [obj for obj in vars(_interface).values() if hasattr(obj, "compile_cache")]


def kernel_count() -> int:
    """Kernels in FA4's in-process compile caches (0 before FA4 is imported)."""
    total = 0
    for owner in compile_cache_owners():
        entries = getattr(owner.compile_cache, "cache", None)
        if isinstance(entries, dict):
            total += len(entries)
    return total


def variant_of(inp: adb.ForwardInputs, kind: str) -> str:
    """A readable description of what selects FA4's kernels for ``inp``."""
    m = mask_args(inp)
    window = m.window_left is not None or m.window_right is not None
    mask = "causal" if m.causal else ("window" if window else "full")
    parts = [
        kind,
        str(inp.dtype).removeprefix("torch."),
        f"D={inp.head_dim}",
        f"Dv={inp.head_dim_v}",
        f"group={inp.group_size}",
        mask,
        "varlen" if inp.is_varlen else "dense",
    ]
    if inp.softcap is not None:
        parts.append(f"softcap={inp.softcap:g}")  # FA4 compiles one kernel per cap value
    if inp.sinks is not None:  # FA4's learnable_sink, a kernel argument of its dtype
        parts.append(f"sinks={str(inp.sinks.dtype).removeprefix('torch.')}")
    if kind == "backward" and inp.deterministic:
        parts.append("deterministic")
    return " ".join(parts)


@dataclasses.dataclass
class Plan:
    """What every call of one signature passes to FA4, worked out on its first call: the
    keyword arguments fixed by the signature (scale, mask, soft cap, determinism), whether its
    calls may be replayed (``ATTN_DISPATCH_FA4_REPLAY``, read then) and whether the first call,
    the only one that can compile kernels, has run."""

    kind: str
    variant: str
    kwargs: dict
    replay: bool = True
    first_done: bool = False
    # the signature's backward tensors need :func:`packed_strides` (its own plan's; one made
    # without the tensors' strides in its key leaves it False and checks every call)
    restride: bool = False


# Plans of inputs without one of the dispatcher's (``inp.plan`` is None: built outside dispatch)
# per (kind, facts, flags the facts do not hold), so such a signature pays for its plan once.
_plans: dict[tuple, Plan] = {}
MAX_PLANS = 4096
# Variants whose kernels this process already has: their first calls compile nothing.
_variants_ready: set[str] = set()
# The current CUDA device, from C (which initialises CUDA itself when it must), with no Python
# frame; torch.cuda.current_device where this torch has no CUDA.
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def prepare(kind: str, inp: adb.ForwardInputs) -> Ready:
    """A new :class:`Ready` of ``inp``'s signature for the dispatcher's decision (the
    implementation's ``prepare``): its plan, with the replay setting in force now."""
    plan = Plan(kind, variant_of(inp, kind), _fixed_kwargs(kind, inp), replay_enabled())
    if isinstance(inp, adb.BackwardInputs):
        plan.restride = any(_odd_unit_strides(t) for t in backward_tensors(inp))
    return Ready(plan)


def backward_tensors(inp: adb.BackwardInputs) -> tuple[torch.Tensor, ...]:
    """The tensors FA4's backward takes, in its order."""
    return (inp.q, inp.k, inp.v, inp.out, inp.grad_out, inp.lse)


def _odd_unit_strides(t: torch.Tensor) -> bool:
    """Whether ``t`` is contiguous to torch (which ignores the strides of size-1 dims) with a
    size-1 dim's stride other than a packed tensor's."""
    return t.is_contiguous() and adb.packed_unit_strides(t) is not t


def packed_strides(tensors: tuple) -> tuple:
    """``tensors`` with those of :func:`_odd_unit_strides` as views with packed strides (the
    same elements). FA4's backward faulted on such a tensor (an illegal address: one varlen
    sequence of one token and one head, q, k, v, out and grad_out slices of wider rows;
    docs/benchmarks.md section 9): ``contiguous()``, which it uses to fix strides it cannot
    take, leaves these as they are."""
    return tuple([adb.packed_unit_strides(t) if t.is_contiguous() else t for t in tensors])


def plan_of(kind: str, inp: adb.ForwardInputs) -> Plan:
    """The :class:`Plan` of ``inp``: the one the dispatcher handed over, else :func:`plan_for`."""
    r = inp.plan
    return plan_for(kind, inp) if r is None else r.plan


def plan_for(kind: str, inp: adb.ForwardInputs) -> Plan:
    """The cached :class:`Plan` of ``inp``'s signature for inputs without a plan of the
    dispatcher's (made on the first call of the signature).

    The replay setting is part of the key: a plan is found again only under the setting in
    force now."""
    replay = replay_enabled()
    key = (
        kind,
        inp.facts,
        inp.causal,
        inp.causal_align,
        inp.deterministic,
        inp.cu_seqlens_q is inp.cu_seqlens_k,
        replay,
        None if inp.sinks is None else inp.sinks.dtype,
    )
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        kwargs = _fixed_kwargs(kind, inp)
        plan = _plans[key] = Plan(kind, variant_of(inp, kind), kwargs, replay)
    return plan


def _fixed_kwargs(kind: str, inp: adb.ForwardInputs) -> dict:
    m = mask_args(inp)
    kwargs = dict(
        softmax_scale=inp.scale,
        causal=m.causal,
        window_size_left=m.window_left,
        window_size_right=m.window_right,
    )
    if kind == "forward":
        return kwargs | dict(softcap=inp.softcap, return_lse=True)
    return kwargs | dict(softcap=inp.softcap or 0.0, deterministic=inp.deterministic)


def progress(message: str) -> None:
    """One line on stderr: compiling a variant takes seconds, and a silent pause looks hung."""
    sys.stderr.write(f"attn_dispatch: {message}\n")
    sys.stderr.flush()


def first_call(plan: Plan, call: Callable[[], Any]) -> Any:
    """Run the first call of a signature; when it adds kernels to FA4's caches, record its time
    (and, for a variant new to this process, announce the compilation before and after)."""
    announce = plan.variant not in _variants_ready
    if announce:
        progress(f"compiling FlashAttention-4 {plan.variant} kernels (once per variant) ...")
    before = kernel_count()
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    added = kernel_count() - before
    plan.first_done = True
    _variants_ready.add(plan.variant)
    if added > 0:
        record = CompileRecord(plan.kind, plan.variant, seconds, added)
        _records.append(record)
        log.info("FA4 compiled %d kernel(s) for %s in %.1f s", added, plan.variant, seconds)
    if announce:
        progress(f"FlashAttention-4 {plan.variant} ready in {seconds:.1f} s")
    return result


def _varlen_args(inp: adb.ForwardInputs) -> dict:
    return dict(
        cu_seqlens_q=inp.cu_seqlens_q.contiguous(),
        cu_seqlens_k=inp.cu_seqlens_k.contiguous(),
        max_seqlen_q=inp.max_seqlen_q,
        max_seqlen_k=inp.max_seqlen_k,
    )


def _run(plan: Plan, t: torch.Tensor, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on ``t``'s CUDA device (FA4 launches on the current device and
    stream), through :func:`first_call` on the plan's first call.

    The device is switched only when it is not already current (the usual case costs one
    query). Fake tensors (``FakeTensorMode``: FA4 then compiles without launching, e.g. to fill
    its disk cache on a machine without a GPU) need no device and may run where CUDA is absent.
    """

    current = is_fake(t) or t.get_device() == _current_device()
    if plan.first_done and current:
        return fn(*args, **kwargs)  # the hot path: no closure, no context manager

    def call():
        if current:
            return fn(*args, **kwargs)
        with torch.cuda.device(t.device):
            return fn(*args, **kwargs)

    if plan.first_done:
        return call()
    return first_call(plan, call)


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` is a FakeTensor (shape and dtype only)."""
    return isinstance(t, FakeTensor)


def has_no_work(inp: adb.ForwardInputs) -> bool:
    """Zero queries or zero keys (or heads, or batch): nothing for a kernel to do."""
    return inp.q.numel() == 0 or inp.k.numel() == 0


def empty_forward(inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` when there is no work: zero rows, ``-inf`` lse."""
    out = inp.q.new_zeros((*inp.q.shape[:-1], inp.head_dim_v))
    shape = (inp.heads, inp.q.shape[0]) if inp.is_varlen else (inp.batch, inp.heads, inp.seqlen_q)
    lse = torch.full(shape, float("-inf"), dtype=adb.lse_dtype(inp.dtype), device=inp.q.device)
    return out, lse


# The hot path's front: ``inp.plan``, the :class:`Ready` the dispatcher keeps with its decision,
# ``hot`` once a dense call of the signature ran FA4 (its kernels exist). It holds the plan and,
# once two recorded calls did the same work, the replay of FA4's host code (_replay); the two
# functions below read them inline, since every Python frame counts at this point.
_new_gradients = tuple.__new__
# One recording at a time: a recording swaps FA4's compile caches for the process.
_recording = threading.Lock()


class Ready:
    """One signature's plan and how far its replay has come (the dispatcher's ``inp.plan``);
    ``hot`` once a dense call of it ran FA4 with real tensors (its kernels exist)."""

    __slots__ = ("plan", "hot", "replay", "recorded", "learning")

    def __init__(self, plan: Plan):
        self.plan = plan
        self.hot = False
        self.replay: Callable[[tuple], tuple] | None = None
        self.recorded: _replay.Trace | None = None  # the first recording, until the second
        self.learning = plan.replay


REPLAY_VARIABLE = "ATTN_DISPATCH_FA4_REPLAY"


def replay_enabled() -> bool:
    """``ATTN_DISPATCH_FA4_REPLAY``, a boolean (``adb.env_flag``): on (the default) replays
    FA4's host code per signature, off runs it on every call; a bad value raises naming it.
    The replay is also off, with the reason logged once, on an FA4 release it was not proven
    on (``_releases``: ``replay_tested``)."""
    if not adb.env_flag(REPLAY_VARIABLE, True):
        return False
    problem = replay_problem()
    if problem is not None:
        if problem not in _replay_refusals:
            _replay_refusals.add(problem)
            log.warning("FA4 host-code replay off: %s", problem)
        return False
    return True


# The reasons replay_enabled has logged (once each per process).
_replay_refusals: set[str] = set()


def replay_problem() -> str | None:
    """Why the installed FA4 release may not be replayed (``None``: it may)."""
    release = installed_release()
    if release is None:
        return None  # the version gate refuses the backend itself, with its reason
    if release.replay_tested:
        return None
    tested = ", ".join(v for v in tested_versions() if RELEASES[v].replay_tested)
    return (
        f"the replay was not proven on FA4 {release.version} (proven on: {tested}); FA4's host "
        "code runs on every call"
    )


def _remember(inp: adb.ForwardInputs, plan: Plan) -> None:
    """Let later calls of ``inp``'s signature take the hot path (dense calls with a plan of the
    dispatcher's, once FA4 has run them with real tensors)."""
    r = inp.plan
    if r is not None and inp.cu_seqlens_q is None and not is_fake(inp.q) and plan.first_done:
        r.hot = True


def _learn(r: Ready, fn: Callable, tensors: tuple, keep: tuple[int, ...]) -> tuple:
    """Call FA4 while recording it; two recordings that agree make the signature's replay.

    A call that passes one tensor in two places is not recorded: its trace would name one
    input where the signature's other calls pass two (the dispatcher gives both the same
    decision)."""
    if not _replay.distinct(tensors) or not _recording.acquire(blocking=False):
        result = fn(*tensors, **r.plan.kwargs)
        return tuple([result[i] for i in keep])
    try:
        with _replay.recording(tensors, compile_cache_owners()) as recorder:
            result = fn(*tensors, **r.plan.kwargs)
    finally:
        _recording.release()
    try:
        trace = recorder.trace(result, keep)
    except _replay.Unreplayable as exc:
        _stop_learning(r, str(exc))
    else:
        if r.recorded is None:
            r.recorded = trace
        elif r.recorded == trace:
            r.replay = _replay.replayer(trace)
            r.learning = False
            r.recorded = None
        else:
            _stop_learning(r, "two calls did different work")
    return tuple([result[i] for i in keep])


def _stop_learning(r: Ready, reason: str) -> None:
    r.learning = False
    r.recorded = None
    log.info("FA4 %s: host code runs on every call (%s)", r.plan.variant, reason)


def _contiguous_sinks(inp: adb.ForwardInputs) -> torch.Tensor:
    """The sinks as FA4 takes them: its kernels' argument conversion refuses a [H] view whose
    stride is not 1 (``Expected strides[leading_dim] == 1``), even at H = 1, where
    ``contiguous()`` keeps the stride; the copy is H elements."""
    sinks = inp.sinks
    return sinks if sinks.stride(0) == 1 else sinks.clone(memory_format=torch.contiguous_format)


def _forward_with_sinks(q, k, v, sinks, **kwargs):
    """FA4's forward with the sinks as a positional input, so that a recording sees them among
    the call's inputs (the replay hands each call's sinks to the kernels)."""
    return _interface._flash_attn_fwd(q, k, v, learnable_sink=sinks, **kwargs)


def _backward_with_sinks(q, k, v, out, grad_out, lse, sinks, **kwargs):
    """FA4's backward with the sinks as a positional input (see :func:`_forward_with_sinks`)."""
    return _interface._flash_attn_bwd(q, k, v, out, grad_out, lse, learnable_sink=sinks, **kwargs)


def _aligned(tensors: tuple) -> bool:
    """Real tensors whose pointers are all 16-byte aligned: FA4 copies an input whose pointer
    is not (a step its recording would not hold), and launches nothing for fake tensors."""
    if isinstance(tensors[0], FakeTensor):
        return False
    pointers = 0
    for t in tensors:
        pointers |= t.data_ptr()
    return not pointers & 15


def _sinks_forward(inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of a call with attention sinks: FA4's ``learnable_sink`` (its lse includes
    them); dense calls of a signature FA4 ran are replayed as calls without sinks are, the
    sinks one more input."""
    r = inp.plan
    if r is not None and r.hot and inp.q.get_device() == _current_device():
        tensors = (inp.q, inp.k, inp.v, _contiguous_sinks(inp))
        if _aligned(tensors):
            if r.replay is not None:
                return r.replay(tensors)
            if r.learning:
                return _learn(r, _forward_with_sinks, tensors, (0, 1))
        out, lse, *_ = _forward_with_sinks(*tensors, **r.plan.kwargs)
        return out, lse
    if has_no_work(inp):
        out, lse = empty_forward(inp)
        if lse.numel():  # no keys: each row's mass is its sink's
            heads = (slice(None), None) if inp.is_varlen else (None, slice(None), None)
            lse.copy_(inp.sinks[heads].expand(lse.shape))
        return out, lse
    fa = _interface or interface()
    plan = plan_of("forward", inp)
    kwargs = plan.kwargs | _varlen_args(inp) if inp.is_varlen else plan.kwargs
    sinks = _contiguous_sinks(inp)
    out, lse, *_ = _run(
        plan, inp.q, fa._flash_attn_fwd, inp.q, inp.k, inp.v, **kwargs, learnable_sink=sinks
    )
    _remember(inp, plan)
    return out, lse


def _sinks_backward(inp: adb.BackwardInputs) -> ad.Gradients:
    """``(dq, dk, dv)`` and ``dsinks`` from FA4's backward with ``learnable_sink``, replayed
    as the forward is."""
    r = inp.plan
    if r is not None and r.hot and inp.q.get_device() == _current_device():
        tensors = backward_tensors(inp)
        if r.plan.restride:
            tensors = packed_strides(tensors)
        tensors = (*tensors, _contiguous_sinks(inp))
        aligned = _aligned(tensors)
        if aligned and r.replay is not None:
            dq, dk, dv, dsinks = r.replay(tensors)
        elif aligned and r.learning:
            dq, dk, dv, dsinks = _learn(r, _backward_with_sinks, tensors, (0, 1, 2, 3))
        else:
            dq, dk, dv, dsinks = _backward_with_sinks(*tensors, **r.plan.kwargs)
        return ad.Gradients(dq, dk, dv, dsinks.to(inp.sinks.dtype))
    if has_no_work(inp):  # out is 0 where there is no work: the sinks' gradient is 0
        zeros = (torch.zeros_like(t) for t in (inp.q, inp.k, inp.v, inp.sinks))
        return ad.Gradients(*zeros)
    fa = _interface or interface()
    plan = plan_of("backward", inp)
    kwargs = plan.kwargs | _varlen_args(inp) if inp.is_varlen else plan.kwargs
    tensors = packed_strides(backward_tensors(inp))
    sinks = _contiguous_sinks(inp)
    dq, dk, dv, dsinks = _run(
        plan, inp.q, fa._flash_attn_bwd, *tensors, **kwargs, learnable_sink=sinks
    )
    _remember(inp, plan)
    return ad.Gradients(dq, dk, dv, dsinks.to(inp.sinks.dtype))


def forward(inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in our layout from FA4's forward."""
    if inp.sinks is not None:
        return _sinks_forward(inp)
    r = inp.plan
    if r is not None and r.hot and inp.q.get_device() == _current_device():
        tensors = (inp.q, inp.k, inp.v)
        # FA4 copies an input whose pointer is not 16-byte aligned: such calls are not replayed;
        # nor are fake tensors (same facts as real ones), for which FA4 launches nothing
        if not (
            isinstance(tensors[0], FakeTensor)
            or (tensors[0].data_ptr() | tensors[1].data_ptr() | tensors[2].data_ptr()) & 15
        ):
            if r.replay is not None:
                return r.replay(tensors)
            if r.learning:
                return _learn(r, _interface._flash_attn_fwd, tensors, (0, 1))
        out, lse, *_ = _interface._flash_attn_fwd(*tensors, **r.plan.kwargs)
        return out, lse
    if has_no_work(inp):
        return empty_forward(inp)
    fa = _interface or interface()
    plan = plan_of("forward", inp)
    kwargs = plan.kwargs | _varlen_args(inp) if inp.is_varlen else plan.kwargs
    out, lse, *_ = _run(plan, inp.q, fa._flash_attn_fwd, inp.q, inp.k, inp.v, **kwargs)
    _remember(inp, plan)
    return out, lse


def backward(inp: adb.BackwardInputs) -> ad.Gradients:
    """``(dq, dk, dv)`` from FA4's backward on the caller's out and lse."""
    if inp.sinks is not None:
        return _sinks_backward(inp)
    r = inp.plan
    if r is not None and r.hot and inp.q.get_device() == _current_device():
        tensors = (inp.q, inp.k, inp.v, inp.out, inp.grad_out, inp.lse)
        if r.plan.restride:
            tensors = packed_strides(tensors)
        # as in forward: real tensors, 16-byte-aligned pointers
        if not (
            isinstance(tensors[0], FakeTensor)
            or (
                tensors[0].data_ptr()
                | tensors[1].data_ptr()
                | tensors[2].data_ptr()
                | tensors[3].data_ptr()
                | tensors[4].data_ptr()
                | tensors[5].data_ptr()
            )
            & 15
        ):
            if r.replay is not None:
                return _new_gradients(ad.Gradients, r.replay(tensors))
            if r.learning:
                return _new_gradients(
                    ad.Gradients, _learn(r, _interface._flash_attn_bwd, tensors, (0, 1, 2))
                )
        return _new_gradients(ad.Gradients, _interface._flash_attn_bwd(*tensors, **r.plan.kwargs))
    if has_no_work(inp):
        return ad.Gradients(
            torch.zeros_like(inp.q), torch.zeros_like(inp.k), torch.zeros_like(inp.v)
        )
    fa = _interface or interface()
    plan = plan_of("backward", inp)
    kwargs = plan.kwargs | _varlen_args(inp) if inp.is_varlen else plan.kwargs
    tensors = backward_tensors(inp)
    if inp.plan is None or plan.restride:
        tensors = packed_strides(tensors)
    dq, dk, dv = _run(plan, inp.q, fa._flash_attn_bwd, *tensors, **kwargs)
    _remember(inp, plan)
    return ad.Gradients(dq, dk, dv)
