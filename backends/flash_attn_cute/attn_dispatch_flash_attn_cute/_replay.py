"""FA4's host code, recorded once per signature and replayed.

Once its kernels are compiled, what a call of ``_flash_attn_fwd`` / ``_flash_attn_bwd`` does on
the device is fixed by the call's signature: it allocates its outputs and scratch buffers, fills
some, and launches compiled kernels with those buffers, the input tensors and constants. Working
that out takes FA4 tens of microseconds of Python per call (validation, configuration, compile
keys). A recording (:func:`recording`) watches one call: every PyTorch operation its Python runs
(through a dispatch mode) and every compiled kernel it launches (through its compile caches).
When the call did nothing but allocate, fill, take views and launch kernels on buffers it can
name, the result is a :class:`Trace`, and :func:`replayer` turns a trace into a function that
does the same work on new inputs of the same signature, in a few microseconds.

What a trace cannot see, the caller must hold fixed: the signature (shapes, strides, dtypes,
device, flags) and the 16-byte alignment of the inputs' data pointers (FA4 copies an input whose
pointer is not aligned). A recording refuses, with the reason: an operation of another kind, a
tensor argument it cannot trace back to an input or an allocation, a tensor inside a container
argument other than a named tuple of tensors and plain values, an argument that is not a plain
value, an allocation on another device than the inputs'. It cannot see launches through a
compile cache it was not given (the caller passes every one FA4 has) nor reads of tensor values
that bypass PyTorch's dispatch, which is one more reason the backend trusts it only with the FA4
release its tests ran on.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_ALLOCATIONS = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
}
_ZEROED_ALLOCATIONS = {aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default}

# A reference to a tensor at replay: (slot, None) is the slot's tensor itself, (slot, (size,
# stride, offset)) a view of it, ``offset`` counted from the slot tensor's own storage offset.
# Slots: the inputs first, then each allocation in order.
Ref = tuple[int, tuple | None]


class Unreplayable(Exception):
    """The recorded call did something a replay would not reproduce."""


@dataclasses.dataclass(frozen=True)
class Trace:
    """What one call did, as plain data (two traces of the same work compare equal).

    ``steps``: ``("empty", size, stride, dtype, device)`` (a new slot), ``("fill", ref, value)``
    or ``("call", kernel, args, fills, kwargs, records)``: ``args`` the kernel's positional
    arguments with each tensor replaced by ``None`` and listed in ``fills`` as ``(position,
    ref)``, and each named tuple holding tensors replaced by ``None`` and listed in ``records``
    as ``(position, type, items, item_fills)``, its tensors ``None`` in ``items`` and listed in
    ``item_fills`` as ``(index, ref)``.
    ``outputs``: a ref (or ``None``) per returned item kept."""

    n_inputs: int
    steps: tuple
    outputs: tuple


def distinct(inputs: Sequence[torch.Tensor]) -> bool:
    """Whether no tensor object is passed in two places (only such calls can be recorded)."""
    return len({id(t) for t in inputs}) == len(inputs)


class Recorder(TorchDispatchMode):
    """Watches one call of FA4's host code; :meth:`trace` says what it did."""

    def __init__(self, inputs: Sequence[torch.Tensor]):
        super().__init__()
        if not distinct(inputs):
            # its trace would name one input where other calls pass two
            raise ValueError("inputs: one tensor passed in two places cannot be recorded")
        self.n_inputs = len(inputs)
        self.device = inputs[0].device
        self.thread = threading.get_ident()
        self.slots: list[torch.Tensor] = list(inputs)
        self.refs: dict[int, Ref] = {}
        self.alive: list[torch.Tensor] = list(inputs)  # keeps every id in ``refs`` unique
        self.steps: list[tuple] = []
        self.problem: str | None = None
        self.in_kernel = False
        for slot, t in enumerate(inputs):
            self.refs[id(t)] = (slot, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.in_kernel and self.problem is None:
            try:
                self._note(func, args, out)
            except Unreplayable as exc:
                self.problem = str(exc)
            except Exception as exc:  # noting must never fail a call FA4 completes
                self.problem = f"recording {func} failed: {exc!r}"
        return out

    def _note(self, func, args: tuple, out: Any) -> None:
        if func in _ALLOCATIONS or func in _ZEROED_ALLOCATIONS:
            ref = self._new_slot(out)
            if func in _ZEROED_ALLOCATIONS:
                self.steps.append(("fill", ref, 0))
        elif func is aten.full.default:
            self.steps.append(("fill", self._new_slot(out), args[1]))
        elif func is aten.zero_.default:
            self.steps.append(("fill", self.ref(args[0]), 0))
        elif func is aten.fill_.Scalar:
            self.steps.append(("fill", self.ref(args[0]), args[1]))
        elif func.is_view and isinstance(out, torch.Tensor):
            self._note_view(func, args[0], out)
        else:
            raise Unreplayable(f"FA4 ran {func}")

    def _new_slot(self, t: torch.Tensor) -> Ref:
        if t.device != self.device:
            # e.g. a host tensor whose values FA4 would read outside the dispatcher's sight
            raise Unreplayable(f"FA4 allocated a tensor on {t.device}")
        self.steps.append(("empty", tuple(t.shape), t.stride(), t.dtype, t.device))
        self.slots.append(t)
        self.alive.append(t)
        ref = self.refs[id(t)] = (len(self.slots) - 1, None)
        return ref

    def _note_view(self, func, base: torch.Tensor, view: torch.Tensor) -> None:
        slot, _ = self.ref(base)
        root = self.slots[slot]
        if view.dtype != root.dtype or view.untyped_storage().data_ptr() != (
            root.untyped_storage().data_ptr()
        ):
            raise Unreplayable(f"FA4 ran {func}, a view with another dtype or storage")
        geometry = (tuple(view.shape), view.stride(), view.storage_offset())
        if geometry == (tuple(root.shape), root.stride(), root.storage_offset()):
            self.refs[id(view)] = (slot, None)
        else:
            size, stride, offset = geometry
            self.refs[id(view)] = (slot, (size, stride, offset - root.storage_offset()))
        self.alive.append(view)

    def ref(self, t: Any) -> Ref:
        """The reference of a tensor the call received or made."""
        ref = self.refs.get(id(t))
        if ref is None:
            raise Unreplayable(f"a tensor {tuple(t.shape)} that is neither an input nor made here")
        return ref

    def kernel(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Launch a compiled kernel and note the launch."""
        if self.problem is None:
            try:
                self._note_kernel(fn, args, kwargs)
            except Unreplayable as exc:
                self.problem = str(exc)
            except Exception as exc:
                self.problem = f"recording a kernel launch failed: {exc!r}"
        self.in_kernel = True  # what the launch does is the kernel's, replayed with it
        try:
            return fn(*args, **kwargs)
        finally:
            self.in_kernel = False

    def _note_kernel(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        for name, value in kwargs.items():
            _require_constant(value, f"kernel keyword argument {name!r}")
        template, fills, records = [], [], []
        for position, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                fills.append((position, self.ref(value)))
                template.append(None)
            elif _is_record(value) and any(isinstance(item, torch.Tensor) for item in value):
                records.append((position, type(value), *self._note_items(value, position)))
                template.append(None)
            else:
                _require_constant(value, f"kernel argument {position}")
                template.append(value)
        step = ("call", fn, tuple(template), tuple(fills), tuple(kwargs.items()), tuple(records))
        self.steps.append(step)

    def _note_items(self, record: tuple, position: int) -> tuple[tuple, tuple]:
        """A named tuple's items with each tensor replaced by ``None``, and ``(index, ref)`` of
        each tensor."""
        items, fills = [], []
        for index, item in enumerate(record):
            if isinstance(item, torch.Tensor):
                fills.append((index, self.ref(item)))
                items.append(None)
            else:
                _require_constant(item, f"kernel argument {position}, item {index}")
                items.append(item)
        return tuple(items), tuple(fills)

    def trace(self, result: Any, keep: Sequence[int]) -> Trace:
        """The trace of the call that returned ``result`` (items ``keep`` of it are kept)."""
        if self.problem is not None:
            raise Unreplayable(self.problem)
        if not any(step[0] == "call" for step in self.steps):
            raise Unreplayable("FA4 launched no kernel through its compile caches")
        outputs = tuple(None if result[i] is None else self.ref(result[i]) for i in keep)
        return Trace(self.n_inputs, tuple(self.steps), outputs)


# Plain values a kernel argument may hold: anything else (a stream, a device pointer, an object
# of the kernel's runtime) could stand for state of the recorded call, not of its signature.
_CONSTANT_TYPES = (type(None), bool, int, float, str, torch.dtype)


def _is_record(value: Any) -> bool:
    """A named tuple: FA4 hands a kernel tensors grouped in one (4.0.0b36's sinks' gradient,
    ``LearnableSinkBwdTensors``); a replay builds a new one of the same type per launch."""
    return isinstance(value, tuple) and hasattr(type(value), "_make")


def _require_constant(value: Any, what: str) -> None:
    """Reject a value a replay could not pass again as it is (a tensor, anything not plain)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _require_constant(item, what)
    elif isinstance(value, torch.Tensor):
        raise Unreplayable(f"{what} holds a tensor")
    elif not isinstance(value, _CONSTANT_TYPES):
        raise Unreplayable(f"{what} is a {type(value).__name__}")


class _RecordingCache:
    """Stands in for one of FA4's compile caches while a call is recorded: each kernel it hands
    out launches through the recorder."""

    def __init__(self, cache: Any, recorder: Recorder):
        self._cache = cache
        self._recorder = recorder

    def __getitem__(self, key: Any) -> Callable:
        kernel = self._cache[key]
        if threading.get_ident() != self._recorder.thread:
            return kernel  # another thread's call: not part of the recording
        return functools.partial(self._recorder.kernel, kernel)

    def get(self, key: Any, default: Any = None) -> Any:
        # 4.0.0b40's backward looks its kernel up with get(): it must launch through the
        # recorder too, or a recording would miss the kernel
        return self[key] if key in self._cache else default

    def __contains__(self, key: Any) -> bool:
        return key in self._cache

    def __setitem__(self, key: Any, fn: Any) -> None:
        self._cache[key] = fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)


@contextmanager
def recording(inputs: Sequence[torch.Tensor], owners: Sequence[Any]) -> Iterator[Recorder]:
    """Record what runs inside the block; ``owners``: FA4's functions with a ``compile_cache``.

    The caches are swapped for the whole process while the block runs: one recording at a time
    (the caller's lock), and launches from other threads pass through unrecorded."""
    recorder = Recorder(inputs)
    saved = [(owner, owner.compile_cache) for owner in owners]
    try:
        for owner, cache in saved:
            owner.compile_cache = _RecordingCache(cache, recorder)
        with recorder:
            yield recorder
    finally:
        for owner, cache in saved:
            owner.compile_cache = cache


def replayer(trace: Trace) -> Callable[[tuple], tuple]:
    """A function of the inputs (a tuple, as recorded) that redoes the trace's work and returns
    its outputs."""
    steps = tuple(_step(step) for step in trace.steps)
    outputs = trace.outputs

    def replay(inputs: tuple) -> tuple:
        if len(inputs) != trace.n_inputs:
            raise ValueError(f"inputs: expected {trace.n_inputs} tensors, got {len(inputs)}")
        # FA4 hands its kernels detached tensors, and a detached view of the same geometry is
        # recorded as the input itself: an input that requires grad (a saved tensor in an
        # autograd backward) is detached once here rather than at every launch that reads it
        slots = [t.detach() if t is not None and t.requires_grad else t for t in inputs]
        for step in steps:
            step(slots)
        return tuple([None if ref is None else _resolve(slots, ref) for ref in outputs])

    return replay


def _resolve(slots: list, ref: Ref) -> torch.Tensor:
    slot, view = ref
    t = slots[slot]
    if view is None:
        return t
    size, stride, offset = view
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _step(step: tuple) -> Callable[[list], None]:
    kind = step[0]
    if kind == "empty":
        _, size, stride, dtype, device = step
        empty = torch.empty_strided

        def allocate(slots: list) -> None:
            slots.append(empty(size, stride, dtype=dtype, device=device))

        return allocate
    if kind == "fill":
        _, ref, value = step
        if type(value) is int and value == 0:  # not -0.0, whose sign a fill keeps
            return lambda slots: _resolve(slots, ref).zero_()
        return lambda slots: _resolve(slots, ref).fill_(value)
    _, kernel, template, fills, kwargs, records = step
    keywords = dict(kwargs)

    def launch(slots: list) -> None:
        args = list(template)
        for position, ref in fills:
            args[position] = _resolve(slots, ref)  # detached where needed by ``replay``
        for position, cls, items, item_fills in records:
            values = list(items)
            for index, ref in item_fills:
                values[index] = _resolve(slots, ref)
            args[position] = cls._make(values)
        kernel(*args, **keywords)

    return launch
