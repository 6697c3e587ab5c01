"""Launch plans: the host work of a repeated backward call, done once per input signature.

``kernel[grid](*args, **kwargs)`` runs Python work per launch (argument binding, the
specialization key, the cache lookup) before the C launcher runs, and a backward launches three
or four kernels, so a short-sequence backward is bound by that host work (figures:
docs/benchmarks.md section 2). A :class:`Plan`
records, on the first call of a signature (shapes, strides, dtypes, pointer alignment, flags,
device: everything the kernels specialize on), each launch's compiled kernel, grid and full
argument list; a repeated call allocates its outputs and scratch, fills the data pointers and
the scale into copies of those lists, and calls the compiled kernels' launchers
(``CompiledKernel.run``, or the C launcher behind it when the kernel needs no scratch memory)
directly. Same compiled kernels, same arguments: identical results.

A kernel that takes tensor descriptors has its ``CudaLauncher.launch`` wrapped by triton in a
Python function that walks every argument and expands each descriptor into the C launcher's
arguments (for TMA: a ``CUtensorMap`` encoded from the descriptor, then its shape and strides).
A replay expands them itself: everything but the pointer is fixed per signature, so the plan
keeps the expanded list and, per call and descriptor, only encodes the tensor map around the
new pointer (or, for a descriptor passed as pointer, shape and strides, puts in the pointer).

The launcher call relies on the signatures of triton's ``CompiledKernel.run``,
``CudaLauncher.launch`` and its descriptor wrapper (``wrap_handle_tensordesc``,
``make_tensordesc_arg``), checked on the versions in :data:`VERIFIED_TRITON` on NVIDIA GPUs;
elsewhere, under the interpreter, with launch hooks installed (profilers), or with
``ATTN_DISPATCH_TRITON_PLANS`` off (a boolean: ``0``/``false``/``no``/``off``), every call
takes the normal ``kernel[grid]`` path.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import Any, NamedTuple

import torch

from attn_dispatch import backend as adb

PLANS_VARIABLE = "ATTN_DISPATCH_TRITON_PLANS"
VERIFIED_TRITON = ((3, 6),)
MAX_PLANS = 512

# Indices of the per-call values a plan slot refers to.
Q, K, V, OUT, LSE, DO, CU_Q, CU_K, DQ, DK, DV, TMP, PART, ACC, SCALE, QK_SCALE = range(16)
N_VALUES = 16


@functools.cache
def plans_enabled() -> bool:
    """Whether this triton and environment allow plans (NVIDIA, verified triton, no hooks);
    ``ATTN_DISPATCH_TRITON_PLANS`` is read once, with the core's boolean parser (a bad value
    raises naming it, on every call until fixed: an exception is not cached)."""
    if not adb.env_flag(PLANS_VARIABLE, True):
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or torch.version.hip:
        return False
    return verified_triton()


def verified_triton() -> bool:
    """Whether the installed triton's launcher is one a plan's replay was checked against
    (:data:`VERIFIED_TRITON`); on another, every call takes the ``kernel[grid]`` path."""
    from ._gates import triton_version

    return triton_version() in VERIFIED_TRITON


def hooks_installed() -> bool:
    """Launch hooks (e.g. a profiler) want the normal path's metadata."""
    from triton import knobs

    # triton 3.6 keeps an (empty) HookChain here even when nothing is installed
    return any(
        hook is not None and getattr(hook, "calls", True)
        for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    )


class _Pointer:
    """What a replayed tensor descriptor's ``base`` must offer the launcher: ``data_ptr()``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _Descriptor:
    """A host tensor descriptor as triton's launcher reads it (``base``, ``shape``,
    ``strides``, ``padding``), rebuilt per replayed call around that call's pointer."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, ptr: int, shape: list, strides: list) -> None:
        self.base, self.shape, self.strides, self.padding = _Pointer(ptr), shape, strides, "zero"


class Recorder:
    """Collects the launches of one backward call and the per-call value of each argument."""

    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, int | None]] = {}  # id(arg) -> (value index, offset)
        self.descriptors: dict[int, int] = {}  # id(descriptor) -> value index of its tensor
        self.launches: list[tuple[Any, tuple, list, bool]] = []
        self.constants: set[int] = set()  # id() of floats fixed by the plan's signature
        self.ok = True
        # one tensor in two roles (k is v): a fact of this call, not of its signature
        self.aliased = False

    def name(self, obj: Any, index: int, offset: int | None = 0) -> None:
        """``obj`` is per-call value ``index`` (+ ``offset`` bytes for a pointer)."""
        if id(obj) in self.slots and self.slots[id(obj)][0] != index:
            self.ok = False  # two roles share one object: do not learn from this call
            self.aliased = True
        self.slots.setdefault(id(obj), (index, offset))

    def constant(self, value: float) -> None:
        """``value`` (a float argument) is the same on every call of the signature (the key
        holds what it is derived from): the plan keeps it as recorded."""
        self.constants.add(id(value))

    def name_descriptor(self, desc: Any, index: int) -> None:
        """``desc`` is a tensor descriptor over per-call tensor ``index`` (same shape and
        strides on every call of the signature; only the pointer changes)."""
        self.descriptors[id(desc)] = index

    def launch(
        self, kernel: Any, grid: tuple, args: tuple, kwargs: dict, side: SideStream | None = None
    ) -> Any:
        """Launch through ``kernel[grid]`` (on ``side`` when given, forked from the current
        stream by the caller) and remember the compiled kernel and arguments."""
        if side is None:
            compiled = kernel[grid](*args, **kwargs)
        else:
            with torch.cuda.stream(side.stream):
                compiled = kernel[grid](*args, **kwargs)
        names = kernel.arg_names
        try:
            full = list(args) + [kwargs[n] for n in names[len(args) :]]
        except KeyError:
            self.ok = False
            return compiled
        if not hasattr(compiled, "packed_metadata"):
            self.ok = False
        self.launches.append((compiled, tuple(grid), full, side is not None))
        return compiled

    def plan(self, extra: dict) -> Plan | None:
        """The plan of the recorded launches, or ``None`` when an argument has no known role."""
        if not self.ok:
            return None
        launches = []
        for compiled, grid, full, on_side in self.launches:
            launcher, lead, expand = _launcher(compiled)
            slots, descs, template = [], [], list(lead)
            for i, arg in enumerate(full):
                pos = len(template)
                if i in expand:
                    index = self.descriptors.get(id(arg))
                    if index is None:
                        return None
                    pieces, make = _expanded_descriptor(arg, expand[i])
                    descs.append((pos, index, make))
                    template.extend(pieces)
                elif id(arg) in self.descriptors:
                    shape, strides = list(arg.shape), list(arg.strides)
                    make = functools.partial(_Descriptor, shape=shape, strides=strides)
                    descs.append((pos, self.descriptors[id(arg)], make))
                    template.append(None)
                elif isinstance(arg, float) and id(arg) in self.constants:
                    template.append(arg)
                elif isinstance(arg, (torch.Tensor, float)) or hasattr(arg, "base"):
                    role = self.slots.get(id(arg))
                    if role is None:
                        return None
                    slots.append((pos, *role))
                    template.append(None)
                else:
                    template.append(arg)
            head = (*grid, *(1,) * (3 - len(grid)))
            launches.append(
                Launch(
                    launcher, head, compiled.function, template, tuple(slots), tuple(descs), on_side
                )
            )
        return Plan(launches, **extra)


def _launcher(compiled: Any) -> tuple[Any, tuple, dict]:
    """The callable a replay launches ``compiled`` with, its arguments before the kernel's, and
    the descriptor arguments the replay expands itself (kernel argument position -> triton's
    metadata of that descriptor; empty when the callable expands them or there are none).

    ``compiled.run`` (triton's ``CudaLauncher``) allocates per-launch scratch, then calls its C
    launcher ``launch``. A kernel that needs no scratch (every kernel of this backend so far) is
    launched through ``launch`` itself, one Python frame less per launch; the leading arguments
    are those ``CudaLauncher.__call__`` would pass (cooperative grid, PDL, no scratch), then the
    packed metadata and, with no launch hooks, no launch metadata and no hooks. When ``launch``
    is triton's descriptor wrapper, the C launcher behind it is called instead, with the
    descriptors expanded by the plan (:func:`_expanded_descriptor`).
    """
    run = compiled.run
    tail = (compiled.packed_metadata, None, None, None)
    if not (
        getattr(run, "global_scratch_size", None) == 0
        and getattr(run, "profile_scratch_size", None) == 0
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
    ):
        return run, tail, {}
    lead = (run.launch_cooperative_grid, run.launch_pdl, None, None, *tail)
    launch, expand = _unwrap_descriptors(run.launch)
    return launch, lead, expand


def _unwrap_descriptors(launch: Any) -> tuple[Any, dict]:
    """The C launcher behind triton 3.6's descriptor wrapper ``launch``
    (``wrap_handle_tensordesc``) and its descriptors' metadata by kernel argument position;
    ``(launch, {})`` for a plain C launcher or anything not shaped as that wrapper (then it is
    called as it is)."""
    code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or not cells:
        return launch, {}
    free = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
    if set(free) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
        return launch, {}
    indices, meta = sorted(free["tensordesc_indices"]), free["tensordesc_meta"]
    meta = meta or [None] * len(indices)
    if len(meta) != len(indices):
        return launch, {}
    return free["launcher"], dict(zip(indices, meta))


def _expanded_descriptor(desc: Any, meta: dict | None) -> tuple[list, Any]:
    """The C launcher's arguments for descriptor ``desc``, as triton 3.6's
    ``make_tensordesc_arg`` makes them, with the per-call first one left ``None``, and what
    turns a call's pointer into that one (``None``: the pointer itself)."""
    shape, strides = list(desc.shape), list(desc.strides)
    if meta is None:  # passed as pointer, shape, strides (twice: triton's own decomposition)
        return [None, *shape, *strides, desc.padding == "nan", *shape, *strides], None
    import triton
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    if meta["fp4_padded"]:
        shape[-1] *= 2
    fill = triton.runtime.driver.active.utils.fill_tma_descriptor  # encodes a CUtensorMap
    fixed = (
        meta["swizzle"],
        meta["elem_size"],
        TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
        meta["block_size"],
        shape,
        strides,
        1 if desc.padding == "nan" else 0,
    )

    def encode(ptr: int) -> Any:
        return fill(ptr, *fixed)

    return [None, *shape, *strides], encode


class SideStream:
    """A second stream of one device, forked from and joined back into the current stream with
    events, so independent kernels (dQ beside dK/dV) run concurrently. Both steps are stream
    operations, so CUDA graph capture records them as a fork and a join."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.handle = self.stream.cuda_stream
        self._forked, self._joined = torch.cuda.Event(), torch.cuda.Event()
        self._callers: dict[int, torch.cuda.Stream] = {}  # current-stream objects by handle

    def _caller(self, handle: int | None) -> torch.cuda.Stream:
        """The current stream, found by its raw handle when the caller has it.

        ``torch.cuda.current_stream`` costs host time that is not small beside a short call,
        and a fork and a join ask twice per call (docs/benchmarks.md section 2). A stream object
        only names its handle and device, so one made earlier for the same handle is as good.
        """
        if handle is None:
            return torch.cuda.current_stream(self.device)
        stream = self._callers.get(handle)
        if stream is None:
            stream = torch.cuda.current_stream(self.device)
            if stream.cuda_stream == handle:
                if len(self._callers) >= 64:
                    self._callers.clear()
                self._callers[handle] = stream
        return stream

    def fork(self, current: int | None = None) -> None:
        """Work queued on the side stream from now on starts after the current stream's
        (``current``: its raw handle, when known)."""
        self._forked.record(self._caller(current))
        self.stream.wait_event(self._forked)

    def join(self, current: int | None = None) -> None:
        """Work queued on the current stream from now on starts after the side stream's."""
        self._joined.record(self.stream)
        self._caller(current).wait_event(self._joined)


_SIDE_STREAMS = threading.local()


def side_stream(device: torch.device) -> SideStream:
    """This thread's side stream of ``device`` (created once per thread and device).

    Per thread, because a fork records an event and then waits on it: two threads sharing the
    events could each wait on the other's record, and a stream taking part in one thread's
    CUDA graph capture must not receive another thread's eager work.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    streams = getattr(_SIDE_STREAMS, "by_device", None)
    if streams is None:
        streams = _SIDE_STREAMS.by_device = {}
    side = streams.get(index)
    if side is None:
        side = streams[index] = SideStream(torch.device("cuda", index))
    return side


class Launch(NamedTuple):
    """One recorded kernel launch: what :meth:`Plan.run` passes to the compiled launcher."""

    launcher: Any
    grid: tuple
    function: Any
    template: list  # the arguments after the function, per-call values left as None
    slots: tuple  # (position, value index, byte offset or None)
    descs: tuple  # (position, value index, maker or None): descriptors made per call
    on_side: bool  # queued on the device's side stream


class Plan:
    """Precomputed launches of one signature; :meth:`run` only fills per-call values."""

    def __init__(
        self,
        launches: list,
        *,
        tmp_shape: tuple,
        part_numel: int | None,
        acc: dict | None,
        part_zeroed: bool = False,
    ):
        self.launches = launches
        self.tmp_shape = tmp_shape
        self.part_numel = part_numel
        self.part_zeroed = part_zeroed  # the partials are added into it, not stored
        self.acc = acc  # {"shape"} of the fused-atomic dQ scratch (zero-filled per call)

    def run(self, values: list, device: torch.device, stream: int) -> None:
        """Allocate the scratch, complete ``values`` with its pointers, launch everything."""
        tmp = torch.empty(self.tmp_shape, dtype=torch.float32, device=device)
        values[TMP] = tmp.data_ptr()
        if self.part_numel is not None:
            alloc = torch.zeros if self.part_zeroed else torch.empty
            part = alloc(self.part_numel, dtype=torch.float32, device=device)
            values[PART] = part.data_ptr()
        if self.acc is not None:
            acc = torch.zeros(self.acc["shape"], dtype=torch.float32, device=device)
            values[ACC] = acc.data_ptr()
        side = None
        for launcher, (gx, gy, gz), function, template, slots, descs, on_side in self.launches:
            args = template.copy()
            for pos, index, offset in slots:
                args[pos] = values[index] if offset is None else values[index] + offset
            for pos, index, make in descs:
                args[pos] = values[index] if make is None else make(values[index])
            if on_side and side is None:
                side = side_stream(device)
                side.fork(stream)
            launcher(gx, gy, gz, side.handle if on_side else stream, function, *args)
        if side is not None:
            side.join(stream)


_PLANS: dict[tuple, Plan | None] = {}  # plans of calls without a Prepared (outside dispatch)
_generation = 0  # bumped by clear(): a Prepared holding plans of an older one drops them
_PREPARED: weakref.WeakSet = weakref.WeakSet()  # live Prepared objects, for recorded()
MAX_PREPARED_PLANS = 16  # per signature: one per (current device, alignment bits) seen


class Prepared:
    """One signature's plans: what the implementation's ``prepare`` returns, so that a call of
    a dispatcher decision finds its plans as ``inp.plan`` without building a plan key.

    ``key`` holds what the signature fixes (shapes, strides, dtypes, flags, varlen lengths,
    the tensors' device); a call still tells the two facts a decision does not fix: the current
    device and the 16-byte alignment bits of its pointers (a decision serves every pointer).
    The plans are dropped when :func:`clear` runs (the tuned configurations changed).
    """

    __slots__ = ("key", "plans", "generation", "__weakref__")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.plans: dict[tuple[int, int], Plan | None] = {}
        self.generation = _generation
        _PREPARED.add(self)

    def get(self, device: int, align: int) -> Plan | None | bool:
        """The plan of a call on ``device`` with pointer alignment bits ``align``; ``None``
        when such a call was not plannable, ``False`` when none was recorded (since the last
        :func:`clear`)."""
        if self.generation != _generation:
            self.plans.clear()
            self.generation = _generation
        return self.plans.get((device, align), False)

    def put(self, device: int, align: int, plan: Plan | None) -> None:
        """Remember the plan of a call on ``device`` with alignment bits ``align`` (``None``:
        not plannable, do not record again)."""
        if self.generation != _generation:
            self.plans.clear()
            self.generation = _generation
        if len(self.plans) >= MAX_PREPARED_PLANS:
            self.plans.clear()
        self.plans[device, align] = plan


def get(key: tuple) -> Plan | None | bool:
    """The plan for ``key``; ``False`` when none was recorded yet."""
    return _PLANS.get(key, False)


def put(key: tuple, plan: Plan | None) -> None:
    """Remember a plan (``None``: this signature is not plannable, do not record again)."""
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan


def clear() -> None:
    """Forget every plan (e.g. after the tuned configurations changed), those held by
    :class:`Prepared` signatures included (each drops its own at its next call)."""
    global _generation
    _generation += 1
    _PLANS.clear()


def recorded() -> list[Plan]:
    """Every plan recorded since the last :func:`clear`, with or without a :class:`Prepared`
    (for tests and benchmarks that inspect what was recorded)."""
    plans = [plan for plan in _PLANS.values() if plan is not None]
    for prepared in list(_PREPARED):
        if prepared.generation == _generation:
            plans.extend(plan for plan in prepared.plans.values() if plan is not None)
    return plans
