"""``ad.decide``: the dispatcher's choice as a value (implementation, inputs, report), made by the
dispatcher's own selection, with its errors, running nothing; with the toy plugins."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dispatch_helpers import make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import backend as adb

FAST, SLOW, NONDET, EXPERIMENTAL, GPU_ONLY, GRAPH_ONLY = 1.0, 2.0, 3.0, 4.0, 5.0, 7.0
TAGS = {
    "toy:fast": FAST,
    "toy:slow": SLOW,
    "toy:nondet": NONDET,
    "toy:experimental": EXPERIMENTAL,
    "toy:gpu_only": GPU_ONLY,
    "toy:graph_only": GRAPH_ONLY,
}


def _raised(call, *args, **kwargs) -> BaseException:
    with pytest.raises(Exception) as info:
        call(*args, **kwargs)
    return info.value


@pytest.mark.parametrize(
    ("d", "flags", "expected"),
    [
        (16, {}, "toy:nondet"),  # 70 beats fast 50 and slow 10; experimental is opt-in
        (16, {"deterministic": True}, "toy:fast"),
        (32, {}, "toy:slow"),  # slow's priority_for_inputs: 90 at head_dim 32
        (128, {"causal": True}, "toy:nondet"),
        (16, {"backend": "toy:gpu_only"}, "toy:gpu_only"),  # forced: no priority needed
        (16, {"backend": "toy"}, "toy:experimental"),  # a forced backend admits its opt-ins
    ],
)
def test_the_choice_is_what_backward_then_runs(toys, d, flags, expected):
    inputs = make_inputs(d=d)
    choice = ad.decide(*inputs, **flags)
    assert choice.name == expected == choice.report.selected
    assert choice.implementation.full_name == expected
    assert tag_of(ad.backward(*inputs, **flags)) == TAGS[expected]
    # the inputs are those the implementation receives: calling it directly gives the same
    assert isinstance(choice.inputs, adb.BackwardInputs)
    assert choice.inputs.q is inputs[0] and choice.inputs.head_dim == d
    assert tag_of(choice.implementation.backward(choice.inputs)) == TAGS[expected]
    assert choice.report == ad.explain(*inputs, **flags)


def test_a_choice_is_a_frozen_value_and_deciding_runs_nothing(toys):
    inputs = make_inputs()
    settings = ad._settings.current()
    choice = ad.decide(*inputs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.name = "toy:fast"  # type: ignore[misc]
    # no decision is cached (nothing ran), and another decision on like tensors is equal
    assert not settings.decisions and not settings.guarded
    assert ad.decide(*make_inputs()) == choice
    assert ad.decide(*make_inputs(d=32)) != choice
    assert ad.decide(*inputs, backend="toy:fast") != choice  # the report says it was forced


def test_forcing_precedence_argument_context_env(toys):
    inputs = make_inputs()
    toys.set(ATTN_DISPATCH_BACKEND="toy:slow")
    assert ad.decide(*inputs).name == "toy:slow"
    with ad.use_backend("toy:fast"):
        choice = ad.decide(*inputs)
        assert choice.name == "toy:fast" and choice.report.forced == "toy:fast"
        assert tag_of(ad.backward(*inputs)) == FAST
        assert ad.decide(*inputs, backend="toy:gpu_only").name == "toy:gpu_only"
    assert ad.decide(*inputs).name == "toy:slow"
    toys.unset("ATTN_DISPATCH_BACKEND")
    choice = ad.decide(*inputs)
    assert choice.name == "toy:nondet" and choice.report.forced is None


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ({"backend": "toy:fastest"}, ad.UnknownBackendError),
        ({"backend": 3}, TypeError),
        ({"backend": "toy:fast", "d": 128}, ad.NoBackendError),  # forced never falls back
        ({"backend": "toy:nondet", "deterministic": True}, ad.NoBackendError),
        ({"causal": 1}, TypeError),
        ({"softcap": 1e39}, ValueError),
        ({"causal_align": "middle"}, ValueError),
    ],
)
def test_errors_are_the_dispatchers(toys, flags, error):
    inputs = make_inputs(d=flags.pop("d", 16))
    raised = _raised(ad.decide, *inputs, **flags)
    assert type(raised) is error
    assert str(raised) == str(_raised(ad.backward, *inputs, **flags))


def test_no_eligible_implementation_raises_no_backend_error(toys):
    toys.set(ATTN_DISPATCH_DISABLE="toy,exact,reference")
    inputs = make_inputs()
    raised = _raised(ad.decide, *inputs)
    assert isinstance(raised, ad.NoBackendError)
    assert "no installed implementation can run these backward inputs" in str(raised)
    assert str(raised) == str(_raised(ad.backward, *inputs))
    report = ad.explain(*inputs)  # explain never raises for a rejection
    assert report.selected is None


def test_forward_mode(toys):
    q, k, v = make_inputs()[:3]
    choice = ad.decide(q, k, v, mode="forward")
    assert choice.report.mode == "forward" and choice.name == "toy:nondet"
    assert type(choice.inputs) is adb.ForwardInputs
    out, lse = ad.forward(q, k, v)
    assert float(out.flatten()[0]) == TAGS[choice.name]
    assert choice.report == ad.explain(q, k, v)
    # an implementation without a forward is the dispatcher's forced-forward error
    raised = _raised(ad.decide, q, k, v, mode="forward", backend="toy:trivial")
    assert isinstance(raised, ad.NoBackendError) and "provides no forward" in str(raised)
    assert str(raised) == str(_raised(ad.forward, q, k, v, backend="toy:trivial"))


def test_mode_is_checked(toys):
    inputs = make_inputs()
    with pytest.raises(ValueError, match="argument 'mode': expected 'backward' or 'forward'"):
        ad.decide(*inputs, mode="both")
    with pytest.raises(TypeError, match="takes q, k and v only"):
        ad.decide(*inputs, mode="forward")


def test_execution_mode_and_hypothetical_arch(toys):
    inputs = make_inputs()
    assert ad.decide(*inputs, execution="graph").name == "toy:graph_only"
    with ad.execution_mode("graph"):
        assert ad.decide(*inputs).report.execution == "graph"
        assert ad.decide(*inputs).name == "toy:graph_only"
    meta = [t.to("meta") for t in inputs]
    choice = ad.decide(*meta, arch="sm_90")
    assert choice.name == "toy:gpu_only" and choice.report.arch.name == "sm_90"
    assert choice.inputs.q.device == torch.device("meta")


def test_a_backward_without_out_lse_and_grad_out_is_a_type_error(toys):
    """Validation alone takes q, k, v for a forward; a backward call names the missing tensor
    (it used to fail later, on an attribute of None)."""
    q, k, v = make_inputs()[:3]
    for call in (ad.decide, ad.backward):
        with pytest.raises(TypeError, match="argument 'out': expected a torch.Tensor, got None"):
            call(q, k, v, None, None, None)
