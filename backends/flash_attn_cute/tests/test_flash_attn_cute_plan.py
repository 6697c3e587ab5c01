"""flash_attn_cute's per-signature call plan, on the CPU: what every call of a signature passes
to FA4 is worked out once, and the first call of a new variant announces its compilation.

FA4 itself is not imported here (its kernels compile in test_flash_attn_cute_fake_compile.py
and run in test_flash_attn_cute_gpu.py); ``first_call`` is given the call to time.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import pytest
import torch
from attn_dispatch_flash_attn_cute import _fa4
from attn_dispatch_flash_attn_cute._support import mask_args

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.backend import make_inputs


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    monkeypatch.setattr(_fa4, "_plans", {})
    monkeypatch.setattr(_fa4, "_variants_ready", set())
    monkeypatch.setattr(_fa4, "_records", [])


def backward_inputs(sq=64, sk=96, d=64, **flags):
    q = torch.empty(2, sq, 8, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, sk, 2, d, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 8, sq, device="meta")
    flags = dict(
        dict(causal=True, causal_align="top_left", scale=None, deterministic=False), **flags
    )
    return make_inputs(q, k, k, q, lse, q, **flags)


def test_plan_is_made_once_per_signature():
    first = _fa4.plan_for("backward", backward_inputs())
    assert _fa4.plan_for("backward", backward_inputs()) is first
    assert _fa4.plan_for("backward", backward_inputs(causal=False)) is not first
    assert _fa4.plan_for("backward", backward_inputs(deterministic=True)) is not first
    assert _fa4.plan_for("forward", backward_inputs()) is not first


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [None, (16, 0), (None, 4)])
def test_plan_arguments_are_the_calls_own(align, window):
    inp = backward_inputs(causal_align=align, window=window, softcap=None, scale=0.5)
    m = mask_args(inp)
    assert _fa4.plan_for("backward", inp).kwargs == dict(
        softmax_scale=0.5,
        causal=m.causal,
        window_size_left=m.window_left,
        window_size_right=m.window_right,
        softcap=0.0,
        deterministic=False,
    )
    capped = backward_inputs(causal_align=align, window=window, softcap=30.0)
    fwd = _fa4.plan_for("forward", capped).kwargs
    assert fwd["softcap"] == 30.0 and fwd["return_lse"] is True


def test_first_call_of_a_variant_announces_compilation_once(capsys):
    plan = _fa4.plan_for("backward", backward_inputs())
    assert _fa4.first_call(plan, lambda: "result") == "result"
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "attn_dispatch: compiling FlashAttention-4 backward bfloat16 D=64 Dv=64 group=4 window "
        "dense kernels (once per variant) ..."
    )
    assert err[1].startswith("attn_dispatch: FlashAttention-4 backward bfloat16") and len(err) == 2
    assert plan.first_done
    # another signature of the same variant (other lengths): its kernels exist, no line
    other = _fa4.plan_for("backward", backward_inputs(sq=128, sk=160))
    assert other is not plan and other.variant == plan.variant
    _fa4.first_call(other, lambda: None)
    assert capsys.readouterr().err == ""
    assert _fa4.compile_log() == []  # FA4 not imported: no kernels were added


def test_failed_first_call_stays_first(capsys):
    plan = _fa4.plan_for("backward", backward_inputs())

    def fails():
        raise RuntimeError("compilation failed")

    with pytest.raises(RuntimeError, match="compilation failed"):
        _fa4.first_call(plan, fails)
    assert not plan.first_done


class RecordingFA4:
    """Stands in for ``flash_attn.cute.interface``: records the keyword arguments of each call."""

    def __init__(self):
        self.calls = []

    def _flash_attn_bwd(self, q, k, v, out, dout, lse, **kwargs):
        self.calls.append(kwargs)
        grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
        sink = kwargs.get("learnable_sink")
        # FA4's gradient of a learnable sink comes back in float32 whatever its dtype
        return grads if sink is None else (*grads, torch.ones(sink.shape))

    def _flash_attn_fwd(self, q, k, v, **kwargs):
        self.calls.append(kwargs)
        out = torch.zeros_like(q)
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1]), None, None, None


@pytest.fixture
def recording_fa4(monkeypatch):
    fa4 = RecordingFA4()
    monkeypatch.setattr(_fa4, "_interface", fa4)
    monkeypatch.setattr(_fa4, "_current_device", lambda: -1)  # CPU tensors: get_device() is -1
    return fa4


def planned(inp):
    """``inp`` with a plan of its own, as the first call of a dispatcher's decision has."""
    inp.plan = _fa4.prepare("backward" if isinstance(inp, adb.BackwardInputs) else "forward", inp)
    return inp


def cpu_backward_inputs(like=None, **flags):
    """CPU backward inputs; with ``like``, sharing its facts and plan, as the dispatcher's calls
    of one decision do (else with a plan of their own)."""
    q = torch.randn(1, 16, 2, 8)
    lse = torch.zeros(1, 2, 16)
    flags = dict(
        dict(causal=False, causal_align="top_left", scale=None, deterministic=False), **flags
    )
    inp = make_inputs(q, q, q, q, lse, q, **flags)
    if like is None:
        return planned(inp)
    inp.facts, inp.plan = like.facts, like.plan
    return inp


def test_repeated_call_goes_straight_to_fa4_with_its_plan(recording_fa4, monkeypatch):
    inp = cpu_backward_inputs()
    first = _fa4.backward(inp)
    planned = []
    monkeypatch.setattr(_fa4, "plan_for", lambda *a: planned.append(a) or pytest.fail("planned"))
    again = _fa4.backward(cpu_backward_inputs(like=inp))
    assert isinstance(first, ad.Gradients) and isinstance(again, ad.Gradients)
    assert recording_fa4.calls[0] == recording_fa4.calls[1] and not planned


def test_each_decision_calls_fa4_with_the_arguments_of_its_own_plan(recording_fa4):
    inp = cpu_backward_inputs()
    _fa4.backward(inp)
    _fa4.backward(cpu_backward_inputs(like=inp))  # the hot path
    # a flag the facts do not hold: another decision of the dispatcher, with its own plan
    other = cpu_backward_inputs(deterministic=True)
    _fa4.backward(other)
    _fa4.backward(cpu_backward_inputs(like=other, deterministic=True))
    assert [c["deterministic"] for c in recording_fa4.calls] == [False, False, True, True]


def test_inputs_without_a_plan_find_theirs_by_their_facts(recording_fa4):
    q = torch.randn(1, 16, 2, 8)
    inp = make_inputs(q, q, q, q, torch.zeros(1, 2, 16), q)
    assert inp.plan is None
    _fa4.backward(inp)
    _fa4.backward(inp)
    assert len(_fa4._plans) == 1 and recording_fa4.calls[0] == recording_fa4.calls[1]


def test_call_on_another_device_than_the_current_takes_the_planned_path(recording_fa4, monkeypatch):
    inp = cpu_backward_inputs()
    _fa4.backward(inp)
    monkeypatch.setattr(_fa4, "_current_device", lambda: 0)
    switched = []
    monkeypatch.setattr(
        torch.cuda, "device", lambda device: switched.append(device) or contextlib.nullcontext()
    )
    _fa4.backward(inp)
    assert switched == [inp.q.device]


def test_forward_hot_path_returns_out_and_lse(recording_fa4):
    q = torch.randn(1, 16, 2, 8)
    inp = make_inputs(
        q, q, q, causal=False, causal_align="top_left", scale=None, deterministic=False
    )
    first = _fa4.forward(planned(inp))
    again = _fa4.forward(inp)
    assert len(first) == len(again) == 2 and len(recording_fa4.calls) == 2
    assert recording_fa4.calls[0] == recording_fa4.calls[1]


def test_a_ready_call_enters_no_python_function_of_ours_but_one(recording_fa4, monkeypatch):
    """The implementation's ``backward`` is ``_fa4.backward`` itself, which finds the plan inline
    and reads the current device from C: a repeated call that runs FA4's host code (replay off;
    test_flash_attn_cute_replay covers the replay) enters that one function, then FA4."""
    from attn_dispatch_flash_attn_cute.plugin import Sm90

    monkeypatch.setattr(_fa4, "_current_device", functools.partial(int, -1))  # C, as torch's
    monkeypatch.setenv(_fa4.REPLAY_VARIABLE, "0")
    inp = cpu_backward_inputs()
    impl = Sm90()
    impl.backward(inp)
    entered = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(frame.f_code.co_name)

    again = cpu_backward_inputs(like=inp)
    sys.setprofile(profile)
    try:
        impl.backward(again)
    finally:
        sys.setprofile(None)
    assert entered == ["backward", "_flash_attn_bwd"], entered
    assert len(recording_fa4.calls) == 2


def test_sinks_go_to_fa4_as_learnable_sink_on_every_call(recording_fa4):
    """A call with sinks passes them as FA4's ``learnable_sink`` (the call's own tensor, every
    time: never remembered for the hot path or a replay, which have no such input) and returns
    FA4's sink gradient as ``dsinks`` in the sinks' dtype; a call without sinks after it is
    unchanged."""
    q = torch.randn(1, 16, 2, 8, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 16)
    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    for dtype in (torch.float32, torch.bfloat16):
        sinks = torch.zeros(2, dtype=dtype)
        for _ in range(2):
            out, _ = _fa4.forward(make_inputs(q, q, q, sinks=sinks, **flags))
            grads = _fa4.backward(make_inputs(q, q, q, q, lse, q, sinks=sinks, **flags))
            assert recording_fa4.calls[-2]["learnable_sink"] is sinks
            assert recording_fa4.calls[-1]["learnable_sink"] is sinks
            assert grads.dsinks.dtype == dtype and grads.dsinks.shape == (2,)
    variants = {p.variant for p in _fa4._plans.values()}
    assert "backward bfloat16 D=8 Dv=8 group=1 causal dense sinks=bfloat16" in variants
    _fa4.backward(make_inputs(q, q, q, q, lse, q, **flags))
    assert "learnable_sink" not in recording_fa4.calls[-1]


def test_sinks_without_keys_give_the_sink_all_the_mass(recording_fa4):
    q = torch.randn(1, 4, 2, 8)
    k = torch.randn(1, 0, 2, 8)
    sinks = torch.tensor([0.5, -1.0])
    out, lse = _fa4.forward(make_inputs(q, k, k, sinks=sinks))
    assert (out == 0).all() and torch.equal(lse, sinks[None, :, None].expand(1, 2, 4))
    grads = _fa4.backward(make_inputs(q, k, k, out, lse, out, sinks=sinks))
    assert (grads.dsinks == 0).all() and not recording_fa4.calls


class StrideRecordingFA4(RecordingFA4):
    """Records the strides of the tensors FA4's backward gets."""

    def __init__(self):
        super().__init__()
        self.strides = []

    def _flash_attn_bwd(self, *tensors, **kwargs):
        self.strides.append([t.stride() for t in tensors])
        return super()._flash_attn_bwd(*tensors, **kwargs)


def unit_sliced_inputs() -> adb.BackwardInputs:
    """Backward inputs of one token and one head, q, k, v, out and grad_out slices of wider
    rows: contiguous to torch, with size-1 dims whose strides are the wider rows'."""
    row = torch.randn(1, 1, 2, 11)[:, :, :1, :8]  # [B, S, H, D], strides (22, 22, 11, 1)
    assert row.is_contiguous() and row.stride() != (8, 8, 8, 1)
    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    return make_inputs(row, row, row, row, torch.zeros(1, 1, 1), row, **flags)


@pytest.mark.parametrize("plan", [True, False], ids=["dispatcher-plan", "no-plan"])
def test_the_backward_gets_packed_strides_where_size_1_dims_have_others(monkeypatch, plan):
    fa4 = StrideRecordingFA4()
    monkeypatch.setattr(_fa4, "_interface", fa4)
    monkeypatch.setattr(_fa4, "_current_device", lambda: -1)
    inp = unit_sliced_inputs()
    if plan:
        planned(inp)
        assert inp.plan.plan.restride
    for _ in range(3):  # the first call, then the hot path (where the plan marks it)
        _fa4.backward(inp)
    assert [strides[0] for strides in fa4.strides] == [(8, 8, 8, 1)] * 3
    assert [strides[5] for strides in fa4.strides] == [(1, 1, 1)] * 3  # lse: already packed


def test_packed_strides_are_views_of_the_same_elements():
    wide = torch.randn(1, 2, 11)
    t = wide[:, :1, :8]
    (packed,) = _fa4.packed_strides((t,))
    assert packed.stride() == (8, 8, 1) and packed.data_ptr() == t.data_ptr()
    assert torch.equal(packed, t)
    other = torch.randn(3, 4)[:, :2]  # not contiguous: FA4's own business, untouched
    assert _fa4.packed_strides((other,))[0] is other
