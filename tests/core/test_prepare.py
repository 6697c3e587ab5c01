"""``Implementation.prepare``: one plan per cached decision, handed to every call of its
signature as ``inp.plan`` (the ``planned`` test plugins)."""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_test_plugins import planned
from dispatch_helpers import make_inputs

import attn_dispatch as ad
from attn_dispatch import _dispatch


@pytest.fixture
def planned_env(env):
    """The planned plugins alone, with empty records."""
    planned.PREPARED.clear()
    planned.SEEN.clear()
    env.set(ATTN_DISPATCH_TEST_PLUGINS="planned", ATTN_DISPATCH_PLUGINS="planned")
    yield env
    planned.PREPARED.clear()
    planned.SEEN.clear()


def _plans_seen(mode: str) -> list:
    return [plan for seen_mode, plan in planned.SEEN if seen_mode == mode]


def test_prepare_runs_once_per_signature_and_every_call_gets_its_plan(planned_env):
    inputs = make_inputs()
    for _ in range(5):  # first call, dictionary, then the guard
        grads = ad.backward(*inputs)
    assert len(planned.PREPARED) == 1
    plan = planned.PREPARED[0]
    assert plan.mode == "backward" and plan.q_shape == tuple(inputs[0].shape)
    assert _plans_seen("backward") == [plan] * 5
    assert float(grads.dq.flatten()[0]) == plan.number


def test_calls_that_require_grad_get_the_plan_too(planned_env):
    inputs = make_inputs()
    for t in inputs[:3]:
        t.requires_grad_(True)
    for _ in range(3):
        ad.backward(*inputs)
    assert len(planned.PREPARED) == 1
    assert _plans_seen("backward") == planned.PREPARED * 3


def test_a_new_signature_gets_a_new_plan(planned_env):
    small, large = make_inputs(sq=8), make_inputs(sq=16)
    for _ in range(3):
        ad.backward(*small)
        ad.backward(*large)
    first, second = planned.PREPARED
    assert (first.q_shape[1], second.q_shape[1]) == (8, 16)
    assert _plans_seen("backward") == [first, second] * 3


def test_forward_and_backward_each_get_the_plan_of_their_decision(planned_env):
    q, k, v, out, lse, do = make_inputs()
    for _ in range(3):
        ad.forward(q, k, v)
        ad.backward(q, k, v, out, lse, do)
    fwd, bwd = planned.PREPARED
    assert (fwd.mode, bwd.mode) == ("forward", "backward")
    assert _plans_seen("forward") == [fwd] * 3 and _plans_seen("backward") == [bwd] * 3


def test_attention_hands_the_plans_to_its_forward_and_backward(planned_env):
    q, k, v = (t.requires_grad_(True) for t in make_inputs()[:3])
    for _ in range(2):
        ad.attention(q, k, v).sum().backward()
    fwd, bwd = planned.PREPARED
    assert (fwd.mode, bwd.mode) == ("forward", "backward")
    assert _plans_seen("forward") == [fwd] * 2 and _plans_seen("backward") == [bwd] * 2


def test_reload_drops_the_plans(planned_env):
    inputs = make_inputs()
    for _ in range(3):
        ad.backward(*inputs)
    ad.reload()
    for _ in range(3):
        ad.backward(*inputs)
    before, after = planned.PREPARED
    assert _plans_seen("backward") == [before] * 3 + [after] * 3


def _varlen(total: int = 12) -> tuple:
    """Varlen inputs (dictionary path only: the guards cover dense calls)."""
    q, k, v, out, do = (torch.randn(total, 2, 8) for _ in range(5))
    lse = torch.randn(2, total)
    cu = torch.tensor([0, total // 2, total], dtype=torch.int32)
    return (q, k, v, out, lse, do), dict(
        cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=total // 2, max_seqlen_k=total // 2
    )


def test_a_restarted_cache_makes_new_plans(planned_env, monkeypatch):
    monkeypatch.setattr(_dispatch, "MAX_CACHED_DECISIONS", 1)
    a, b = _varlen(12), _varlen(16)
    ad.backward(*a[0], **a[1])
    ad.backward(*a[0], **a[1])
    ad.backward(*b[0], **b[1])  # restarts the cache: a's decision and plan are gone
    ad.backward(*a[0], **a[1])
    first, second, third = planned.PREPARED
    assert _plans_seen("backward") == [first, first, second, third]
    assert first.q_shape == third.q_shape


def test_a_prepare_that_raises_fails_the_call_naming_the_implementation(planned_env):
    inputs = make_inputs()
    for _ in range(2):  # nothing is cached: the next call asks again
        with pytest.raises(ZeroDivisionError, match="bug in prepare") as caught:
            ad.backward(*inputs, backend="planned:broken")
        assert any("planned:broken" in note for note in caught.value.__notes__)
    assert planned.SEEN == []
    assert not ad._settings.current().decisions


def _meta(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_meta_tensors_never_prepare(planned_env):
    q, k, v = _meta(1, 8, 4, 16), _meta(1, 8, 2, 16), _meta(1, 8, 2, 16)
    for backend in (None, "planned:broken"):
        out, lse = ad.forward(q, k, v, backend=backend)
        ad.backward(q, k, v, out, lse, out, backend=backend)
        assert ad.explain(q, k, v, out, lse, out, backend=backend).selected
        assert ad.decide(q, k, v, out, lse, out, backend=backend) is not None
    assert planned.PREPARED == [] and planned.SEEN == []


def test_inputs_built_outside_dispatch_have_no_plan(planned_env):
    from attn_dispatch.backend import make_inputs as backend_inputs

    inp = backend_inputs(*make_inputs())
    assert inp.plan is None
    assert float(planned.Counted().backward(inp).dq.flatten()[0]) == 0.0


PAIR = """
PREPARED, SEEN = [], []


class First(Tagged):
    name, tag, priority = "first", 1.0, {"*": 20}

    def prepare(self, inp):
        PREPARED.append(self.name)
        return (self.name, len(PREPARED))

    def backward(self, inp):
        SEEN.append(inp.plan)
        return super().backward(inp)


class Second(First):
    name, priority = "second", {"*": 10}


class Breaks(First):
    name, priority = "breaks", {"*": 5}

    def prepare(self, inp):
        raise ZeroDivisionError("pair: bug in prepare (on purpose)")
"""


def test_autotune_times_each_candidate_with_its_plan_and_excludes_a_broken_prepare(
    plugins, env, tmp_path
):
    plugins.backend("pair", PAIR, "[First(), Second(), Breaks()]")
    env.set(
        ATTN_DISPATCH_PLUGINS="pair",
        ATTN_DISPATCH_AUTOTUNE="1",
        ATTN_DISPATCH_CACHE_DIR=str(tmp_path),
    )
    inputs = make_inputs()
    ad.backward(*inputs)
    module = __import__("rel_pair")
    # the measurement's calls, each with its candidate's plan, then the call's own run
    *measured, decided = module.SEEN
    assert {plan for plan in measured} == {("first", 1), ("second", 2)}
    report = ad.explain(*inputs)
    times = {t.name: t for t in report.autotune.timings}
    assert "bug in prepare" in times["pair:breaks"].excluded
    # the decision's own plan, made after the measurement, serves every later call
    assert decided == (report.selected.split(":")[1], 3)
    ad.backward(*inputs)
    ad.backward(*inputs)
    assert module.SEEN[-3:] == [decided] * 3
