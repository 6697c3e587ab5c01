"""The argument list a replayed launch plan hands triton's launcher (CPU).

triton's ``CudaLauncher`` needs a GPU driver to exist, so these tests stand in for it with an
object that has its attributes and records its calls. What they check is our side: a plan
passes the C launcher exactly what ``CudaLauncher.__call__`` would (grid, stream, function,
cooperative-grid and PDL flags, no scratch, packed metadata, no launch metadata or hooks, then
the kernel's arguments with this call's pointers and scale), and it keeps ``__call__`` for a
kernel that needs scratch memory. The GPU tests (``test_triton_plans_gpu.py``) replay real plans.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from attn_dispatch_triton import _plan  # noqa: E402


class _StandInLauncher:
    """The attributes of triton 3.6's ``CudaLauncher`` that a plan reads; records calls."""

    def __init__(self, global_scratch: int) -> None:
        self.global_scratch_size, self.profile_scratch_size = global_scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.calls: list[tuple[str, tuple]] = []
        self.launch = lambda *args: self.calls.append(("launch", args))

    def __call__(self, *args) -> None:
        self.calls.append(("__call__", args))


class _StandInKernel:
    def __init__(self, global_scratch: int) -> None:
        self.run = _StandInLauncher(global_scratch)
        self.function, self.packed_metadata = "function-handle", ("packed", "metadata")


def _replay(global_scratch: int) -> tuple[_StandInLauncher, list]:
    """Record one launch ``(Q pointer, 7, scale)`` with grid (3, 2), replay it with new values."""
    kernel = _StandInKernel(global_scratch)
    recorded_q, recorded_scale = torch.zeros(4), 0.25
    recorder = _plan.Recorder()
    recorder.name(recorded_q, _plan.Q)
    recorder.name(recorded_scale, _plan.SCALE)
    recorder.launches.append((kernel, (3, 2), [recorded_q, 7, recorded_scale], False))
    plan = recorder.plan(dict(tmp_shape=(2,), part_numel=None, acc=None))
    assert plan is not None
    values = [None] * _plan.N_VALUES
    values[_plan.Q], values[_plan.SCALE] = 123456, 0.5
    plan.run(values, torch.device("cpu"), stream=99)
    return kernel.run, values


def test_a_kernel_without_scratch_goes_to_the_c_launcher_with_call_s_arguments() -> None:
    launcher, _ = _replay(global_scratch=0)
    assert launcher.calls == [("launch", (
        3, 2, 1, 99, "function-handle", False, True, None, None, ("packed", "metadata"),
        None, None, None, 123456, 7, 0.5))]


def test_a_kernel_with_scratch_keeps_triton_s_call_path() -> None:
    launcher, _ = _replay(global_scratch=256)
    assert launcher.calls == [("__call__", (
        3, 2, 1, 99, "function-handle", ("packed", "metadata"), None, None, None, 123456, 7,
        0.5))]
