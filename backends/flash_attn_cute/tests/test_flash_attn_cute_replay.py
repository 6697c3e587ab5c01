"""The replay of FA4's host code, on the CPU against a stand-in shaped like it (toy_fa4).

A recording watches one call; its trace, replayed on fresh inputs, must give what the oracle
gives for those inputs while FA4's Python is not entered. A call that does anything a replay
would not reproduce is refused with the reason. Through the backend: two recorded calls that
agree make the replay, and the calls after them use it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from typing import Any, NamedTuple

import pytest
import torch
from attn_dispatch_flash_attn_cute import _fa4, _replay, _support
from toy_fa4 import ToyFA4

from attn_dispatch import backend as adb
from attn_dispatch.backend import make_inputs
from attn_dispatch.testing.oracle import oracle
from attn_dispatch.testing.tolerances import error_metrics, tolerance_for

B, S, H, HKV, D = 2, 24, 4, 2, 16


def qkv(seed: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=gen).to(dtype)
    k, v = (torch.randn(B, S + 8, HKV, D, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


def backward_tensors(seed: int, sinks=None) -> tuple[torch.Tensor, ...]:
    """q, k, v, out, dout, lse (FA4's order) of a bottom-right causal call with ``sinks``."""
    q, k, v = qkv(seed)
    ref = oracle(q, k, v, causal=True, causal_align="bottom_right", sinks=sinks)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
    return q, k, v, ref.out.to(q.dtype), dout, ref.lse.float()


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = tolerance_for(torch.bfloat16)
    max_err, rel_l2 = error_metrics(got, want)
    assert max_err <= tol.max_err and rel_l2 <= tol.rel_l2, (max_err, rel_l2)


def owners(fa4: ToyFA4) -> list:
    return [fa4._flash_attn_fwd, fa4._flash_attn_bwd, fa4._bwd_preprocess]


def record(fa4: ToyFA4, fn, tensors: tuple, keep: tuple, **kwargs) -> _replay.Trace:
    with _replay.recording(tensors, owners(fa4)) as recorder:
        result = fn(*tensors, **kwargs)
    return recorder.trace(result, keep)


def test_a_recorded_forward_replays_on_new_inputs_without_the_host_code():
    fa4 = ToyFA4()
    fa4._flash_attn_fwd(*qkv(0), softmax_scale=0.3, causal=True)  # compiles
    trace = record(fa4, fa4._flash_attn_fwd, qkv(1), (0, 1), softmax_scale=0.3, causal=True)
    assert [step[0] for step in trace.steps] == ["empty", "empty", "call"]
    replay = _replay.replayer(trace)
    for seed in (2, 3):
        q, k, v = qkv(seed)
        out, lse = replay((q, k, v))
        want = oracle(q, k, v, causal=True, causal_align="bottom_right", scale=0.3)
        assert_close(out, want.out)
        torch.testing.assert_close(lse.double(), want.lse, atol=1e-5, rtol=1e-5)
    assert fa4.host_calls == ["fwd", "fwd"] and fa4.launches == ["fwd"] * 4


@pytest.mark.parametrize("lookup", ["index", "get"])
def test_a_recorded_backward_replays_its_fills_views_and_three_kernels(lookup):
    """Whether FA4 looks its kernels up as ``cache[key]`` (4.0.0b36) or ``cache.get(key)``
    (4.0.0b40), each launch is recorded."""
    fa4 = ToyFA4(lookup)
    fa4._flash_attn_bwd(*backward_tensors(0), causal=True)
    trace = record(fa4, fa4._flash_attn_bwd, backward_tensors(1), (0, 1, 2), causal=True)
    kinds = [step[0] for step in trace.steps]
    assert kinds == ["empty", "empty", "fill", "empty", "empty", "empty", "call", "call", "call"]
    pre = trace.steps[6]
    assert pre[3][2][1] is not None  # dpsum passed as a transposed view of its allocation
    replay = _replay.replayer(trace)
    for seed in (2, 4):
        tensors = backward_tensors(seed)
        q, k, v, _, dout, _ = tensors
        dq, dk, dv = replay(tensors)
        want = oracle(q, k, v, dout, causal=True, causal_align="bottom_right")
        for got, ref in ((dq, want.dq), (dk, want.dk), (dv, want.dv)):
            assert_close(got, ref)
    assert fa4.host_calls == ["bwd", "bwd"]
    assert fa4.launches == ["pre", "bwd", "post"] * 4


def test_recordings_of_the_same_work_are_equal_and_of_other_work_are_not():
    fa4 = ToyFA4()
    fwd = fa4._flash_attn_fwd
    fwd(*qkv(0), softmax_scale=0.3)
    fwd(*qkv(0), softmax_scale=0.3, causal=True)
    first = record(fa4, fwd, qkv(1), (0, 1), softmax_scale=0.3)
    assert record(fa4, fwd, qkv(2), (0, 1), softmax_scale=0.3) == first
    assert record(fa4, fwd, qkv(2), (0, 1), softmax_scale=0.5) != first
    assert record(fa4, fwd, qkv(2), (0, 1), softmax_scale=0.3, causal=True) != first


FOREIGN = torch.zeros(4)


@pytest.mark.parametrize(
    "host, reason",
    [
        (lambda q, launch: launch(q.clone()), "FA4 ran aten.clone"),
        (lambda q, launch: launch(q, FOREIGN), "neither an input nor made here"),
        (lambda q, launch: launch(q, object()), "kernel argument 1 is a object"),
        (lambda q, launch: launch((q, None)), "kernel argument 0 holds a tensor"),
        (lambda q, launch: launch(Pair(q, [q])), "kernel argument 0, item 1 holds a tensor"),
        (lambda q, launch: launch(q.view(torch.int16)), "a view with another dtype"),
        (lambda q, launch: q.new_empty(3), "launched no kernel"),
        (lambda q, launch: launch(q, torch.empty(2, device="meta")), "a tensor on meta"),
    ],
    ids=[
        "other-op",
        "foreign-tensor",
        "object",
        "tensor-in-tuple",
        "tensor-in-list-in-named-tuple",
        "dtype-view",
        "no-kernel",
        "other-device",
    ],
)
def test_a_call_a_replay_would_not_reproduce_is_refused_with_the_reason(host, reason):
    def entry(q):
        host(q, entry.compile_cache["kernel"])
        return (q,)

    entry.compile_cache = {"kernel": lambda *args: None}
    q = torch.zeros(2, 3, dtype=torch.bfloat16)
    with _replay.recording((q,), [entry]) as recorder:
        result = entry(q)
    with pytest.raises(_replay.Unreplayable, match=reason):
        recorder.trace(result, (0,))


class Pair(NamedTuple):
    first: Any
    second: Any


def test_a_named_tuple_argument_is_replayed_with_each_calls_tensors():
    """A kernel argument that groups tensors in a named tuple (as FA4 4.0.0b36 hands the sinks'
    gradient kernel its tensors) is rebuilt per replay, of its type, on that call's tensors."""

    def entry(a, b):
        out = torch.empty_like(a)
        entry.compile_cache["kernel"](Pair(a, 2.0), Pair(b, out))
        return (out,)

    def kernel(scaled: Pair, into: Pair):
        assert type(scaled) is Pair and type(into) is Pair
        into.second.copy_(scaled.first * scaled.second + into.first)

    entry.compile_cache = {"kernel": kernel}
    a, b = torch.randn(3), torch.randn(3)
    with _replay.recording((a, b), [entry]) as recorder:
        result = entry(a, b)
    replay = _replay.replayer(recorder.trace(result, (0,)))
    for _ in range(2):
        a, b = torch.randn(3), torch.randn(3)
        (out,) = replay((a, b))
        torch.testing.assert_close(out, a * 2.0 + b)


def test_one_tensor_in_two_input_places_cannot_be_recorded():
    q = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one tensor passed in two places"):
        _replay.Recorder((q, q))


def test_launches_from_another_thread_are_not_recorded():
    kernel = ToyFA4()._flash_attn_fwd  # any callable stands for a compiled kernel here

    def entry(q):
        return (q,)

    entry.compile_cache = {"kernel": kernel}
    handed = []
    with _replay.recording((torch.zeros(2),), [entry]):
        assert entry.compile_cache["kernel"] is not kernel  # this thread: through the recorder
        other = threading.Thread(target=lambda: handed.append(entry.compile_cache["kernel"]))
        other.start()
        other.join()
    assert handed == [kernel]
    assert entry.compile_cache == {"kernel": kernel}  # restored


# Through the backend: _fa4 with the stand-in as its FA4.


@pytest.fixture
def toy_fa4(monkeypatch):
    fa4 = ToyFA4()
    monkeypatch.setattr(_fa4, "_interface", fa4)
    monkeypatch.setattr(_fa4, "_plans", {})
    monkeypatch.setattr(_fa4, "_variants_ready", set())
    monkeypatch.setattr(_fa4, "_records", [])
    # CPU tensors (get_device() is -1), read from C as torch's own
    monkeypatch.setattr(_fa4, "_current_device", functools.partial(int, -1))
    monkeypatch.delenv(_fa4.REPLAY_VARIABLE, raising=False)
    # a release the replay was proven on, whichever is installed (the stand-in is FA4 here)
    monkeypatch.setattr(_support, "installed_version", lambda: "4.0.0b36")
    return fa4


def signature_inputs(tensors: tuple, like=None, sinks=None):
    """Backend inputs of ``tensors`` (q, k, v[, out, dout, lse]: FA4's order), bottom-right
    causal, with ``sinks`` if given; with ``like``, sharing its facts and plan, as the
    dispatcher's calls of one decision do; else with a new plan, as the first call of a
    decision has."""
    if len(tensors) == 6:
        q, k, v, out, dout, lse = tensors
        tensors = (q, k, v, out, lse, dout)
    flags = dict(causal=True, causal_align="bottom_right", scale=None, deterministic=False)
    inp = make_inputs(*tensors, **flags, sinks=sinks)
    if like is None:
        kind = "backward" if isinstance(inp, adb.BackwardInputs) else "forward"
        inp.plan = _fa4.prepare(kind, inp)
        return inp
    inp.facts, inp.plan = like.facts, like.plan
    return inp


def test_the_backend_replays_a_signature_after_two_agreeing_recordings(toy_fa4):
    first = signature_inputs(backward_tensors(0))
    for seed in range(5):
        inp = first if seed == 0 else signature_inputs(backward_tensors(seed), like=first)
        grads = _fa4.backward(inp)
        want = oracle(inp.q, inp.k, inp.v, inp.grad_out, causal=True, causal_align="bottom_right")
        for got, ref in zip(grads, (want.dq, want.dk, want.dv), strict=True):
            assert_close(got, ref)
    # the first call plans, the next two are recorded; the last two are replays
    assert toy_fa4.host_calls == ["bwd"] * 3
    assert toy_fa4.launches == ["pre", "bwd", "post"] * 5


def test_the_backend_replays_forward_calls_too(toy_fa4, capsys):
    first = signature_inputs(qkv(0))
    for seed in range(4):
        inp = first if seed == 0 else signature_inputs(qkv(seed), like=first)
        out, lse = _fa4.forward(inp)
        want = oracle(inp.q, inp.k, inp.v, causal=True, causal_align="bottom_right")
        assert_close(out, want.out)
    assert toy_fa4.host_calls == ["fwd"] * 3 and toy_fa4.launches == ["fwd"] * 4


def sinks_of(seed: int, stride: int = 1) -> torch.Tensor:
    """Fresh sink logits of H heads (a strided view with ``stride`` > 1)."""
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(H * stride, generator=gen).to(torch.bfloat16)[::stride]


@pytest.mark.parametrize("stride", [1, 2])
def test_the_backend_replays_forward_calls_with_sinks_on_each_calls_sinks(toy_fa4, stride):
    """The sinks are one more input of the recording: each replayed call computes with its own
    sinks (a strided view is copied to contiguous first, a new tensor every call)."""
    first = signature_inputs(qkv(0), sinks=sinks_of(0, stride))
    for seed in range(5):
        sinks = sinks_of(seed, stride)
        inp = first if seed == 0 else signature_inputs(qkv(seed), like=first, sinks=sinks)
        out, lse = _fa4.forward(inp)
        want = oracle(inp.q, inp.k, inp.v, causal=True, causal_align="bottom_right", sinks=sinks)
        assert_close(out, want.out)
        assert torch.allclose(lse.double(), want.lse, atol=1e-3), seed
    assert toy_fa4.host_calls == ["fwd"] * 3 and toy_fa4.launches == ["fwd"] * 5


@pytest.mark.parametrize("sinks_grad", [False, True], ids=["plain", "requires-grad"])
def test_the_backend_replays_backward_calls_with_sinks_and_their_gradient(toy_fa4, sinks_grad):
    """Sinks that require grad (a parameter, as autograd's backward hands it on) are replayed
    too: the replay hands the kernels detached tensors, as FA4 does."""
    first = None
    for seed in range(5):
        sinks = sinks_of(seed).requires_grad_(sinks_grad)
        inp = signature_inputs(backward_tensors(seed, sinks), like=first, sinks=sinks)
        first = first or inp
        grads = _fa4.backward(inp)
        want = oracle(
            inp.q, inp.k, inp.v, inp.grad_out, causal=True, causal_align="bottom_right", sinks=sinks
        )
        for got, ref in zip((*grads, grads.dsinks), (*want[2:], want.dsinks), strict=True):
            assert_close(got, ref)
        assert grads.dsinks.dtype == sinks.dtype and len(grads) == 3
    assert toy_fa4.host_calls == ["bwd"] * 3
    assert toy_fa4.launches == ["pre", "bwd", "post"] * 5


def test_a_misaligned_sinks_tensor_runs_the_host_code(toy_fa4):
    first = signature_inputs(qkv(0), sinks=sinks_of(0))
    for seed in range(3):
        inp = first if seed == 0 else signature_inputs(qkv(seed), like=first, sinks=sinks_of(seed))
        _fa4.forward(inp)
    q, k, v = qkv(7)
    sinks = misaligned(sinks_of(7))
    out, _ = _fa4.forward(signature_inputs((q, k, v), like=first, sinks=sinks))
    want = oracle(q, k, v, causal=True, causal_align="bottom_right", sinks=sinks)
    assert_close(out, want.out)
    assert toy_fa4.host_calls == ["fwd"] * 4


def test_a_misaligned_sinks_tensor_runs_the_backward_host_code(toy_fa4):
    first = None
    for seed in range(3):
        sinks = sinks_of(seed)
        inp = signature_inputs(backward_tensors(seed, sinks), like=first, sinks=sinks)
        first = first or inp
        _fa4.backward(inp)
    sinks = misaligned(sinks_of(7))
    assert sinks.data_ptr() % 16
    inp = signature_inputs(backward_tensors(7, sinks), like=first, sinks=sinks)
    grads = _fa4.backward(inp)
    want = oracle(
        inp.q, inp.k, inp.v, inp.grad_out, causal=True, causal_align="bottom_right", sinks=sinks
    )
    for got, ref in zip((*grads, grads.dsinks), (*want[2:], want.dsinks), strict=True):
        assert_close(got, ref)
    assert toy_fa4.host_calls == ["bwd"] * 4


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values at the same shape and strides, its pointer 2 bytes off 16-byte alignment."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)[1:]
    return flat.view(t.shape).copy_(t)


def test_a_misaligned_input_runs_the_host_code(toy_fa4):
    first = signature_inputs(qkv(0))
    for seed in range(3):
        _fa4.forward(first if seed == 0 else signature_inputs(qkv(seed), like=first))
    q, k, v = qkv(7)
    inp = signature_inputs((misaligned(q), k, v), like=first)
    assert inp.q.data_ptr() % 16
    out, _ = _fa4.forward(inp)
    assert_close(out, oracle(q, k, v, causal=True, causal_align="bottom_right").out)
    assert toy_fa4.host_calls == ["fwd"] * 4


def test_inputs_that_require_grad_reach_the_kernels_detached(toy_fa4):
    """As FA4 does (its kernels' DLPack export refuses tensors that require grad): the trace
    records ``q.detach()`` as q itself, so the replay detaches."""
    first = None
    with torch.no_grad():  # as the dispatcher runs an implementation
        for seed in range(5):
            q, k, v = (t.requires_grad_() for t in qkv(seed))
            inp = signature_inputs((q, k, v), like=first)
            first = first or inp
            out, _ = _fa4.forward(inp)
            assert_close(out, oracle(q, k, v, causal=True, causal_align="bottom_right").out)
    assert toy_fa4.host_calls == ["fwd"] * 3


def test_a_call_passing_one_tensor_twice_is_not_recorded(toy_fa4):
    """Self-attention written as ``(x, x, x)`` shares its signature with distinct q, k, v of
    the same shapes: a trace recorded from it would pass q where k and v belong."""
    gen = torch.Generator().manual_seed(5)
    same = [torch.randn(B, S, H, D, generator=gen).to(torch.bfloat16) for _ in range(6)]
    first = signature_inputs((same[0],) * 3)
    for x in same[:3]:
        _fa4.forward(first if x is same[0] else signature_inputs((x, x, x), like=first))
    q, k, v = same[3:]
    for _ in range(3):
        out, _lse = _fa4.forward(signature_inputs((q, k, v), like=first))
        assert_close(out, oracle(q, k, v, causal=True, causal_align="bottom_right").out)
    assert toy_fa4.host_calls == ["fwd"] * 5  # the distinct calls recorded twice, then replayed


def learned_forward(toy_fa4) -> object:
    """The inputs of a signature whose forward replays (after four calls)."""
    first = signature_inputs(qkv(0))
    for seed in range(4):
        _fa4.forward(first if seed == 0 else signature_inputs(qkv(seed), like=first))
    assert toy_fa4.host_calls == ["fwd"] * 3
    return first


def test_fake_tensors_of_a_replayed_signature_run_the_host_code(toy_fa4):
    """Fake tensors have the facts of real ones; FA4 launches nothing for them, so a replay
    (which launches) must not serve them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    first = learned_forward(toy_fa4)
    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(t) for t in qkv(8))
        _fa4.forward(signature_inputs(fake, like=first))
    assert toy_fa4.host_calls == ["fwd"] * 4


def test_a_call_on_the_planned_path_keeps_the_learned_replay(toy_fa4, monkeypatch):
    first = learned_forward(toy_fa4)
    monkeypatch.setattr(_fa4, "_current_device", functools.partial(int, 0))  # not q's device
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    _fa4.forward(signature_inputs(qkv(5), like=first))
    monkeypatch.setattr(_fa4, "_current_device", functools.partial(int, -1))
    q, k, v = qkv(6)
    out, _ = _fa4.forward(signature_inputs((q, k, v), like=first))
    assert_close(out, oracle(q, k, v, causal=True, causal_align="bottom_right").out)
    assert toy_fa4.host_calls == ["fwd"] * 4  # the planned call only; then the replay


def test_recordings_that_disagree_leave_the_host_code_on(toy_fa4, monkeypatch, caplog):
    calls = iter(range(100))
    host = toy_fa4._flash_attn_fwd

    def varying(q, k, v, **kwargs):  # passes its call count to the kernel: no two alike
        out, lse, *_ = host(q, k, v, **kwargs)
        toy_fa4._flash_attn_fwd.compile_cache["count"](out, next(calls))
        return out, lse, None, None, None

    varying.compile_cache = {"count": lambda out, n: None}
    monkeypatch.setattr(toy_fa4, "_flash_attn_fwd", varying)
    first = signature_inputs(qkv(0))
    caplog.set_level(logging.INFO, logger="attn_dispatch.flash_attn_cute")
    for seed in range(5):
        _fa4.forward(first if seed == 0 else signature_inputs(qkv(seed), like=first))
    assert toy_fa4.host_calls == ["fwd"] * 5
    assert "host code runs on every call (two calls did different work)" in caplog.text


@pytest.mark.parametrize("off", ["0", "false", "OFF", "no"])
def test_replay_can_be_switched_off(toy_fa4, monkeypatch, off):
    monkeypatch.setenv(_fa4.REPLAY_VARIABLE, off)
    first = signature_inputs(qkv(0))
    for seed in range(4):
        _fa4.forward(first if seed == 0 else signature_inputs(qkv(seed), like=first))
    assert toy_fa4.host_calls == ["fwd"] * 4


@pytest.mark.parametrize("on", ["1", "true", "Yes", "on"])
def test_replay_is_on_for_every_spelling_of_true(toy_fa4, monkeypatch, on):
    monkeypatch.setenv(_fa4.REPLAY_VARIABLE, on)
    learned_forward(toy_fa4)


@pytest.mark.parametrize("value", ["maybe", "", "2"])
def test_a_bad_replay_setting_is_named(toy_fa4, monkeypatch, value):
    monkeypatch.setenv(_fa4.REPLAY_VARIABLE, value)
    message = f"ATTN_DISPATCH_FA4_REPLAY={value!r} is not a boolean"
    with pytest.raises(adb.SettingError, match=message):
        _fa4.forward(signature_inputs(qkv(0)))
    assert toy_fa4.host_calls == []


def test_replay_switched_off_then_reloaded_stops_a_learned_replay(toy_fa4, monkeypatch):
    """After ``ad.reload()`` the dispatcher's decisions are new, and so are their plans
    (``prepare``): each has the replay setting in force when it was made."""
    learned_forward(toy_fa4)
    monkeypatch.setenv(_fa4.REPLAY_VARIABLE, "0")
    reloaded = signature_inputs(qkv(10))  # a decision made after the reload: a new plan
    for seed in range(10, 15):
        q, k, v = qkv(seed)
        inp = reloaded if seed == 10 else signature_inputs((q, k, v), like=reloaded)
        out, _ = _fa4.forward(inp)
        assert_close(out, oracle(q, k, v, causal=True, causal_align="bottom_right").out)
    assert toy_fa4.host_calls == ["fwd"] * (3 + 5)  # every call after the reload runs FA4's
    monkeypatch.setenv(_fa4.REPLAY_VARIABLE, "1")
    again = signature_inputs(qkv(20))
    for seed in range(20, 24):
        _fa4.forward(again if seed == 20 else signature_inputs(qkv(seed), like=again))
    assert toy_fa4.host_calls == ["fwd"] * (3 + 5 + 3)  # on again: planned, recorded twice


def test_a_replayed_call_enters_no_function_of_fa4s_host_code(toy_fa4):
    from attn_dispatch_flash_attn_cute.plugin import Sm90

    impl = Sm90()
    first = signature_inputs(backward_tensors(0))
    for seed in range(3):
        impl.backward(first if seed == 0 else signature_inputs(backward_tensors(seed), like=first))
    again = signature_inputs(backward_tensors(9), like=first)
    entered = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        impl.backward(again)
    finally:
        sys.setprofile(None)
    assert entered[:2] == ["backward", "replay"], entered
    assert "entry" not in entered and "_backward" not in entered
    assert entered.count("kernel") == 3  # the three launches, nothing of the host code


def test_the_replay_is_refused_on_a_release_it_was_not_proven_on(toy_fa4, monkeypatch, caplog):
    """4.0.0b40's row says the replay was not tested on it: FA4's host code runs on every call,
    and the reason is logged once."""
    monkeypatch.setattr(_support, "installed_version", lambda: "4.0.0b40")
    monkeypatch.setattr(_fa4, "_replay_refusals", set())
    caplog.set_level(logging.WARNING, logger="attn_dispatch.flash_attn_cute")
    first = signature_inputs(qkv(0))
    for seed in range(5):
        inp = first if seed == 0 else signature_inputs(qkv(seed), like=first)
        out, _ = _fa4.forward(inp)
        assert_close(out, oracle(inp.q, inp.k, inp.v, causal=True, causal_align="bottom_right").out)
    assert toy_fa4.host_calls == ["fwd"] * 5
    assert _fa4.replay_enabled() is False
    refusals = [r.getMessage() for r in caplog.records if "replay off" in r.getMessage()]
    assert refusals == [
        "FA4 host-code replay off: the replay was not proven on FA4 4.0.0b40 (proven on: "
        "4.0.0b36); FA4's host code runs on every call"
    ]


def test_the_replay_runs_on_a_release_it_was_proven_on(toy_fa4, monkeypatch):
    monkeypatch.setattr(_support, "installed_version", lambda: "4.0.0b36")
    assert _fa4.replay_enabled() is True
    learned_forward(toy_fa4)
