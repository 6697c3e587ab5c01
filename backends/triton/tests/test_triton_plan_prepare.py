"""Launch plans kept by the implementation's ``prepare`` (CPU).

A dispatcher decision calls ``prepare`` once per signature and hands its result to every call as
``inp.plan``: the backward then finds its plan by the two facts a decision does not fix (the
current device, the pointers' alignment) instead of a key built from every tensor. Plans only
run on NVIDIA GPUs, so here the launches are recorded without running (as in
``test_triton_plan_replay_args.py``) and replayed through stand-ins of triton's launcher, and the
current device and stream, which need a GPU driver, are fixed numbers. What runs for real is our
side: which plan a call finds, records or drops. The GPU tests replay real plans.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from attn_dispatch_triton import _plan, backward, tuning  # noqa: E402
from attn_dispatch_triton.plugin import Fused  # noqa: E402

from attn_dispatch import backend as adb  # noqa: E402


class _StandInLauncher:
    """The attributes of triton 3.6's ``CudaLauncher`` a plan reads; counts replayed launches."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, counter: list) -> None:
        self.launch = lambda *args: counter.append(args)


class _StandInKernel:
    function, packed_metadata = "function-handle", ("packed", "metadata")

    def __init__(self, counter: list) -> None:
        self.run = _StandInLauncher(counter)


@pytest.fixture
def launches(monkeypatch):
    """``(recorded, replayed)``: launches recorded (not run) and launches replayed so far."""
    recorded, replayed = [], []

    def record(self, kernel, grid, args, kwargs, side=None):
        recorded.append(kernel)
        full = list(args) + [kwargs[n] for n in kernel.arg_names[len(args) :]]
        self.launches.append((_StandInKernel(replayed), tuple(grid), full, side is not None))

    monkeypatch.setattr(_plan.Recorder, "launch", record)
    monkeypatch.setattr(backward, "_current_device", lambda: 0)
    monkeypatch.setattr(backward, "_current_stream", lambda device: 99)
    _plan.clear()
    yield recorded, replayed
    _plan.clear()


def _call(h: int = 4, hkv: int = 2, s: int = 40, d: int = 32, offset: int = 0) -> tuple:
    """A backward call's tensors (``offset`` elements into their storage: other alignment)."""

    def tensor(*shape):
        flat = torch.randn(offset + torch.Size(shape).numel(), dtype=torch.float16)
        return flat[offset:].view(shape)

    q, k, v, do = tensor(1, s, h, d), tensor(1, s, hkv, d), tensor(1, s, hkv, d), tensor(1, s, h, d)
    return q, k, v, torch.randn_like(q), torch.randn(1, h, s), do


_FLAGS = dict(band=adb.Band.of(None, True, "top_left"), softcap=None)


def _backward(tensors: tuple, plan) -> tuple:
    return backward.attention_backward(*tensors, **_FLAGS, scale=0.2, plan=plan)


def test_a_prepared_signature_records_once_and_replays_after(launches) -> None:
    recorded, replayed = launches
    prepared = backward.signature(*_call(), **_FLAGS)
    _backward(_call(), prepared)
    assert recorded and not replayed, "the first call records its launches"
    n = len(recorded)
    for _ in range(2):
        _backward(_call(), prepared)
    assert len(recorded) == n and len(replayed) == 2 * n, "later calls replay the plan"
    assert not _plan._PLANS, "a prepared call keeps its plan in its signature, not by key"
    assert list(prepared.plans) == [(0, 0)]


def test_a_prepared_signature_keeps_a_plan_per_alignment(launches) -> None:
    """A decision serves every pointer: a call with other 16-byte alignments records its own."""
    recorded, _ = launches
    prepared = backward.signature(*_call(), **_FLAGS)
    _backward(_call(), prepared)
    n = len(recorded)
    _backward(_call(offset=1), prepared)  # 2 bytes off: every pointer misaligned
    assert len(recorded) == 2 * n
    assert len(prepared.plans) == 2


def test_a_tuning_change_drops_the_prepared_plans(launches) -> None:
    """Configurations tried by ``tuning.trial`` must not be replayed from a plan recorded with
    the earlier ones (nor those after the trial from one recorded within it)."""
    recorded, replayed = launches
    prepared = backward.signature(*_call(), **_FLAGS)
    _backward(_call(), prepared)
    n = len(recorded)
    key = tuning.lookup_keys(32, True, 2, 40)[0]
    with tuning.trial("cpu", key, {}):
        _backward(_call(), prepared)
        assert len(recorded) == 2 * n and not replayed, "recorded again within the trial"
    _backward(_call(), prepared)
    assert len(recorded) == 3 * n and not replayed, "recorded again after the trial"
    _backward(_call(), prepared)
    assert len(replayed) == n


def test_a_call_without_a_prepared_signature_keeps_the_key_path(launches, monkeypatch) -> None:
    """Inputs built outside dispatch (``inp.plan`` is ``None``) find their plan by key."""
    recorded, replayed = launches
    monkeypatch.setattr(backward, "plannable", lambda q: True)  # CPU tensors stand for a GPU's
    for _ in range(2):
        _backward(_call(), None)
    assert len(_plan._PLANS) == 1 and len(replayed) == len(recorded)
    assert len(_plan.recorded()) == 1


def test_preallocated_gradients_take_the_key_path(launches, monkeypatch) -> None:
    """The prepared key holds no dq/dk/dv: a call given them is planned by its full key."""
    monkeypatch.setattr(backward, "plannable", lambda q: True)
    tensors = _call()
    prepared = backward.signature(*tensors, **_FLAGS)
    grads = {name: torch.empty_like(t) for name, t in zip(("dq", "dk", "dv"), tensors[:3])}
    backward.attention_backward(*tensors, **_FLAGS, scale=0.2, plan=prepared, **grads)
    assert not prepared.plans and len(_plan._PLANS) == 1


def test_the_prepared_key_is_fixed_by_the_signature() -> None:
    """Same shapes, strides, dtypes and flags: one key, whatever the data and pointers; a tensor
    whose last dim is strided is keyed as the contiguous copy the backward runs on."""
    key = backward.signature(*_call(), **_FLAGS).key
    assert backward.signature(*_call(offset=3), **_FLAGS).key == key
    assert backward.signature(*_call(s=48), **_FLAGS).key != key
    causal = dict(_FLAGS, band=adb.Band.of(None, False, "top_left"))
    assert backward.signature(*_call(), **causal).key != key
    q, *rest = _call()
    strided = torch.randn(q.shape[::-1], dtype=q.dtype).permute(3, 2, 1, 0)
    assert strided.stride(-1) != 1
    assert backward.signature(strided, *rest, **_FLAGS).key == key


def test_prepare_makes_no_signature_where_plans_never_run() -> None:
    """The forward has no plans, and plans run on CUDA only: ``prepare`` returns ``None``."""
    q, k, v, out, lse, do = _call()
    assert Fused().prepare(adb.make_inputs(q, k, v)) is None
    assert Fused().prepare(adb.make_inputs(q, k, v, out, lse, do)) is None


def test_a_call_on_bhsd_memory_with_a_split_group_records_a_plan(launches, monkeypatch) -> None:
    """q, k, v as [B, S, H, D] views of [B, H, S, D] memory (``ad.attention(layout="bhsd")``)
    with the GQA group split across programs, as on a GPU at short lengths: the partials are
    strided like dK / dV (laid out like k and v) and summed by a launch, so the call keeps a
    plan and later calls replay it instead of recording again."""
    from attn_dispatch_triton import _launch_policy

    monkeypatch.setattr(_launch_policy, "group_split", lambda p, config, block_n, sms: 2)

    def bhsd_call() -> tuple:
        q, k, v, out, lse, do = _call()
        q, k, v, out, do = (
            t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, out, do)
        )
        return q, k, v, out, lse, do

    tensors = bhsd_call()
    assert not tensors[1].is_contiguous()
    prepared = backward.signature(*tensors, **_FLAGS)
    first = _backward(tensors, prepared)
    recorded, replayed = launches
    assert prepared.plans.get((0, 0)) is not None, "the first call keeps its plan"
    again = _backward(bhsd_call(), prepared)
    assert len(replayed) == len(recorded), "the second call replays it"
    strides = [t.stride() for t in tensors[:3]]
    assert [g.stride() for g in first] == [g.stride() for g in again] == strides, (
        "recorded and replayed calls allocate the gradients alike, laid out like q, k, v"
    )


def test_a_signature_that_is_not_plannable_is_launched_directly_after_its_first_call(
    launches, monkeypatch
) -> None:
    """A recording that makes no plan is remembered: later calls of the signature launch
    through ``kernel[grid]`` without recording again (recording costs more host time)."""
    from attn_dispatch_triton import _launch_strategy

    direct = []
    monkeypatch.setattr(_plan.Recorder, "plan", lambda self, extra: None)
    monkeypatch.setattr(
        _launch_strategy.DirectStrategy, "launch", staticmethod(lambda k, *a: direct.append(k))
    )
    recorded, replayed = launches
    prepared = backward.signature(*_call(), **_FLAGS)
    _backward(_call(), prepared)
    n = len(recorded)
    assert n and not direct and prepared.plans == {(0, 0): None}
    _backward(_call(), prepared)
    assert len(recorded) == n and len(direct) == n and not replayed


def test_a_call_with_one_tensor_in_two_roles_does_not_mark_its_signature(launches) -> None:
    """``k is v`` makes no plan (one object, two roles), but that is the call's, not the
    signature's: a later call of the signature with two tensors records a plan."""
    recorded, replayed = launches
    q, k, _, out, lse, do = _call(hkv=4)
    prepared = backward.signature(q, k, k, out, lse, do, **_FLAGS)
    _backward((q, k, k, out, lse, do), prepared)
    assert recorded and not prepared.plans
    _backward(_call(hkv=4), prepared)
    assert prepared.plans.get((0, 0)) is not None
