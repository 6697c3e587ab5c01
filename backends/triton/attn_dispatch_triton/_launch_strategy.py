"""How :class:`~._launcher.BackwardLaunch` launches: directly, or recording a launch plan.

The launcher allocates and launches the same way for every call and tells its strategy, chosen
once when it is built, what it made: each kernel launch (``launch``; those made within
``on_side`` go to the side stream) and which per-call value (:mod:`._plan`'s indices) each
argument, buffer and tensor descriptor is.

- :data:`DIRECT` (:class:`DirectStrategy`) launches through ``kernel[grid]`` and keeps nothing:
  its naming methods return at once and it holds no state. Every call that records no plan
  (explicit configs, the tools, off NVIDIA, under the interpreter) takes it.
- :class:`RecordingStrategy` launches through its :class:`~._plan.Recorder`, which remembers
  each compiled kernel and argument list, and passes the names on to it; after the call,
  :meth:`RecordingStrategy.plan` is the call's :class:`~._plan.Plan` (``None`` when some
  argument has no known role or a step is no kernel launch a plan can replay).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from . import _plan

if TYPE_CHECKING:
    from ._launcher import BackwardLaunch


class DirectStrategy:
    """Launch through ``kernel[grid]``; record nothing."""

    __slots__ = ()

    @staticmethod
    def launch(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
        """``kernel[grid](*args, **kwargs)``, on the current stream."""
        kernel[grid](*args, **kwargs)

    @staticmethod
    def on_side(side: _plan.SideStream):
        """Within it, launches go to ``side`` (forked from the current stream by the caller)."""
        return torch.cuda.stream(side.stream)

    def name_arguments(self, launch: BackwardLaunch) -> None:
        """(Recording: the per-call values among ``launch``'s arguments.)"""

    def name(self, tensor: torch.Tensor, index: int) -> None:
        """(Recording: ``tensor`` is per-call value ``index``.)"""

    def name_partials(self, part: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
        """(Recording: the dK/dV partials buffer and its two views.)"""

    def name_descriptor(self, desc: Any, index: int) -> None:
        """(Recording: ``desc`` addresses per-call tensor ``index``.)"""

    def name_descriptors(self, descs: tuple, indices: tuple[int, ...]) -> None:
        """(Recording: each descriptor addresses the per-call tensor of its index.)"""

    def unplannable(self) -> None:
        """(Recording: this call does a step no plan can replay.)"""

    def plan(self, extra: dict) -> None:
        """Nothing was recorded: no plan."""
        return None


DIRECT = DirectStrategy()


class RecordingStrategy:
    """Launch through ``recorder`` and tell it which per-call value each argument is."""

    __slots__ = ("recorder", "side")

    def __init__(self, recorder: _plan.Recorder) -> None:
        self.recorder = recorder
        self.side: _plan.SideStream | None = None  # where launches go instead of the current

    def launch(self, kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
        """Launch as :class:`DirectStrategy` does, and remember the compiled kernel, grid,
        arguments and stream (see :meth:`~._plan.Recorder.launch`)."""
        self.recorder.launch(kernel, grid, args, kwargs, self.side)

    @contextlib.contextmanager
    def on_side(self, side: _plan.SideStream) -> Iterator[None]:
        """Within it, launches go to ``side``, and the plan replays them there."""
        self.side = side
        try:
            yield
        finally:
            self.side = None

    def name_arguments(self, launch: BackwardLaunch) -> None:
        """The caller's tensors and scale, the scratch of delta and lse2 (one buffer, ``TMP``),
        the cumulative lengths when varlen, and the soft cap, fixed by the plan's signature."""
        rec = self.recorder
        for t, index in (
            (launch.q, _plan.Q),
            (launch.k, _plan.K),
            (launch.v, _plan.V),
            (launch.out, _plan.OUT),
            (launch.lse, _plan.LSE),
            (launch.grad_out, _plan.DO),
            (launch.dq, _plan.DQ),
            (launch.dk, _plan.DK),
            (launch.dv, _plan.DV),
            (launch.scale, _plan.SCALE),
            (launch.qk_scale, _plan.QK_SCALE),
        ):
            rec.name(t, index, None if isinstance(t, float) else 0)
        rec.name(launch.lse2, _plan.TMP, 0)  # lse2 is the buffer's first half
        rec.name(launch.delta, _plan.TMP, launch.delta.data_ptr() - launch.lse2.data_ptr())
        if launch.varlen:
            rec.name(launch.cu_q, _plan.CU_Q)
            rec.name(launch.cu_k, _plan.CU_K)
        rec.constant(launch.band_args[2])

    def name(self, tensor: torch.Tensor, index: int) -> None:
        """``tensor`` is per-call value ``index`` (its pointer, no offset)."""
        self.recorder.name(tensor, index)

    def name_partials(self, part: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
        """``part`` is per-call buffer ``PART``; ``dk`` and ``dv`` are views into it."""
        rec = self.recorder
        rec.name(dk, _plan.PART, 0)
        rec.name(dv, _plan.PART, dv.data_ptr() - part.data_ptr())
        rec.name(part, _plan.PART, 0)

    def name_descriptor(self, desc: Any, index: int) -> None:
        """``desc`` addresses per-call tensor ``index`` (only its pointer changes per call)."""
        self.recorder.name_descriptor(desc, index)

    def name_descriptors(self, descs: tuple, indices: tuple[int, ...]) -> None:
        """Each descriptor of ``descs`` addresses the per-call tensor of its index."""
        for desc, index in zip(descs, indices):
            self.recorder.name_descriptor(desc, index)

    def unplannable(self) -> None:
        """This call does a step that is no kernel launch (a torch sum): make no plan of it."""
        self.recorder.ok = False

    def plan(self, extra: dict) -> _plan.Plan | None:
        """The recorded call's plan (``extra``: its scratch, ``BackwardLaunch.plan_extra``)."""
        return self.recorder.plan(extra)


LaunchStrategy = DirectStrategy | RecordingStrategy
