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

from attn_dispatch import backend as adb  # noqa: E402

# Tests that drive triton's own launcher code run where the runtime would replay through it.
needs_verified_triton = pytest.mark.skipif(
    not _plan.verified_triton(),
    reason="plans replay only on triton "
    + ", ".join(".".join(map(str, v)) for v in _plan.VERIFIED_TRITON)
    + " (the launcher they were checked against); this triton takes the kernel[grid] path",
)


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


# A launcher's leading arguments (grid, stream, function) and its trailing ones: no launch
# metadata or enter/exit hooks, then the call's Q pointer, the recorded 7 and the call's scale.
_HEAD = (3, 2, 1, 99, "function-handle")
_ARGUMENTS = (None, None, None, 123456, 7, 0.5)


def test_a_kernel_without_scratch_goes_to_the_c_launcher_with_call_s_arguments() -> None:
    launcher, _ = _replay(global_scratch=0)
    expected = (*_HEAD, False, True, None, None, ("packed", "metadata"), *_ARGUMENTS)
    assert launcher.calls == [("launch", expected)]


def test_a_kernel_with_scratch_keeps_triton_s_call_path() -> None:
    launcher, _ = _replay(global_scratch=256)
    assert launcher.calls == [("__call__", (*_HEAD, ("packed", "metadata"), *_ARGUMENTS))]


class _FakeDriver:
    """Stands in for the active GPU driver: ``fill_tma_descriptor`` returns its arguments, so
    a test sees which tensor map a launch would get."""

    class utils:  # noqa: N801 (the attribute path triton reads)
        @staticmethod
        def fill_tma_descriptor(*args):
            return ("tensor-map", *args)


@pytest.fixture
def fake_driver(monkeypatch):
    import triton

    monkeypatch.setattr(triton.runtime.driver, "_active", _FakeDriver())


# A kernel (A, desc_q, 5, desc_k, scale): the first descriptor is a TMA one (with metadata), the
# second is passed as pointer, shape and strides (no metadata), as triton 3.6 does either.
_SIGNATURE = {
    "a": "*bf16",
    "desc_q": "tensordesc<bf16[64, 128]>",
    "n": "i32",
    "desc_k": "tensordesc<bf16[128, 128]>",
    "scale": "fp32",
}
_META = [dict(swizzle=3, elem_size=2, elem_type=10, block_size=[64, 128], fp4_padded=False), None]


@needs_verified_triton
@pytest.mark.parametrize("meta", [_META, None], ids=["tma-and-pointer", "no-metadata"])
def test_a_replay_expands_descriptors_as_triton_s_wrapper_does(meta, fake_driver) -> None:
    """The C launcher behind triton's descriptor wrapper gets from a replay exactly what the
    wrapper would give it for descriptors around this call's pointers."""
    from triton.backends.nvidia.driver import wrap_handle_tensordesc

    got: list[tuple] = []
    kernel = _StandInKernel(global_scratch=0)
    kernel.run.launch = wrap_handle_tensordesc(lambda *args: got.append(args), _SIGNATURE, meta)
    q, k, scale = torch.zeros(8, 128), torch.zeros(8, 128), 0.25
    desc_q, desc_k = (_plan._Descriptor(t.data_ptr(), [8, 128], [128, 1]) for t in (q, k))
    recorder = _plan.Recorder()
    recorder.name(q, _plan.Q)
    recorder.name(scale, _plan.SCALE)
    recorder.name_descriptor(desc_q, _plan.Q)
    recorder.name_descriptor(desc_k, _plan.K)
    recorder.launches.append((kernel, (3, 2), [q, desc_q, 5, desc_k, scale], False))
    plan = recorder.plan(dict(tmp_shape=(2,), part_numel=None, acc=None))
    assert plan is not None and plan.launches[0].launcher is not kernel.run.launch

    values = [None] * _plan.N_VALUES
    values[_plan.Q], values[_plan.K], values[_plan.SCALE] = 4096, 8192, 0.5
    plan.run(values, torch.device("cpu"), stream=99)
    replayed = got.pop()
    expected_args = (
        4096,
        _plan._Descriptor(4096, [8, 128], [128, 1]),
        5,
        _plan._Descriptor(8192, [8, 128], [128, 1]),
        0.5,
    )
    kernel.run.launch(
        3,
        2,
        1,
        99,
        "function-handle",
        False,
        True,
        None,
        None,
        ("packed", "metadata"),
        None,
        None,
        None,
        *expected_args,
    )
    expected = got.pop()

    def pointers(args):  # triton's own expansion keeps the descriptor's base object
        return tuple(a.data_ptr() if isinstance(a, _plan._Pointer) else a for a in args)

    assert pointers(replayed) == pointers(expected)
    if meta:  # the tensor map is encoded around this call's pointer, not the recorded one
        assert ("tensor-map", 4096, 3, 2, 9, [64, 128], [8, 128], [128, 1], 0) in replayed
    assert 8192 in pointers(replayed) and k.data_ptr() not in replayed


def test_a_descriptor_with_no_known_tensor_makes_no_plan() -> None:
    """A descriptor argument the launch recorded no role for cannot be replayed."""
    from triton.backends.nvidia.driver import wrap_handle_tensordesc

    kernel = _StandInKernel(global_scratch=0)
    kernel.run.launch = wrap_handle_tensordesc(lambda *args: None, _SIGNATURE, None)
    q = torch.zeros(8, 128)
    stray = _plan._Descriptor(q.data_ptr(), [8, 128], [128, 1])
    recorder = _plan.Recorder()
    recorder.name(q, _plan.Q)
    recorder.launches.append((kernel, (1,), [q, stray, 5, stray, 0.5], False))
    assert recorder.plan(dict(tmp_shape=(2,), part_numel=None, acc=None)) is None


@pytest.mark.parametrize(
    ("window", "softcap"),
    [(None, None), ((8, 0), None), (None, 3.0), ((5, 2), 1.5)],
    ids=["plain", "window", "softcap", "window-softcap"],
)
def test_every_launch_argument_of_the_launcher_has_a_plan_role(window, softcap, monkeypatch):
    """The backward's real argument lists (the portable kernels' launches, recorded instead of
    run): every tensor and float is a per-call value or a constant of the signature, so a plan
    is made. A float with neither role (a soft cap, a window's) made every call plan-less."""
    from attn_dispatch_triton._launcher import BackwardLaunch
    from attn_dispatch_triton.tuning import get_backward_config

    def record(self, kernel, grid, args, kwargs, side=None):
        full = list(args) + [kwargs[n] for n in kernel.arg_names[len(args) :]]
        self.launches.append((_StandInKernel(0), tuple(grid), full, side is not None))

    monkeypatch.setattr(_plan.Recorder, "launch", record)
    q, k, v, do = (torch.randn(1, 40, h, 32, dtype=torch.float16) for h in (4, 2, 2, 4))
    out, lse = torch.randn_like(q), torch.randn(1, 4, 40)
    recorder = _plan.Recorder()
    band = adb.Band.of(window, True, "top_left")
    flags = dict(band=band, scale=0.2, softcap=softcap)
    for atomic in (False, True):
        launch = BackwardLaunch(q, k, v, out, lse, do, **flags, atomic_dq=atomic, recorder=recorder)
        launch.run(get_backward_config(q.device, 32, True, 2, 40))
        assert recorder.launches, "no launch recorded"
        assert recorder.plan(launch.plan_extra) is not None
        recorder = _plan.Recorder()


@pytest.fixture
def plans_setting(monkeypatch):
    """``plans_enabled`` read afresh, where nothing else turns plans off (no interpreter)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    _plan.plans_enabled.cache_clear()
    yield monkeypatch
    _plan.plans_enabled.cache_clear()


@pytest.mark.parametrize("off", ["0", "false", "off", "no", "FALSE"])
def test_plans_are_off_for_every_spelling_of_false(plans_setting, off):
    import triton

    plans_setting.setattr(triton, "__version__", "3.6.0")
    plans_setting.setenv("ATTN_DISPATCH_TRITON_PLANS", off)
    assert not _plan.plans_enabled()
    plans_setting.setenv("ATTN_DISPATCH_TRITON_PLANS", "true")
    _plan.plans_enabled.cache_clear()
    assert _plan.plans_enabled()


@pytest.mark.parametrize("value", ["", "2", "disabled"])
def test_a_bad_plans_setting_is_named(plans_setting, value):
    plans_setting.setenv("ATTN_DISPATCH_TRITON_PLANS", value)
    with pytest.raises(adb.SettingError, match=f"ATTN_DISPATCH_TRITON_PLANS={value!r} is not"):
        _plan.plans_enabled()


def test_a_bad_plans_setting_is_an_error_when_the_plugins_load(isolated_plugins, monkeypatch):
    """Even where plans are never used (here: the interpreter, or no GPU), a bad value is the
    caller's error when the plugins load, and on every call after."""
    import attn_dispatch as ad

    monkeypatch.setenv("ATTN_DISPATCH_TRITON_PLANS", "maybe")
    with pytest.raises(adb.SettingError, match="ATTN_DISPATCH_TRITON_PLANS='maybe' is not"):
        ad.reload()
    q = torch.empty(1, 16, 2, 64, device="meta")
    with pytest.raises(adb.SettingError, match="ATTN_DISPATCH_TRITON_PLANS='maybe' is not"):
        ad.explain(q, q, q, arch="sm_90")
