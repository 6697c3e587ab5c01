"""The front of eager ``ad.attention``: a dense call whose flags (as given) and scope an earlier
call checked skips the checks, for the guarded verdicts of its signatures (the ``noded`` test
plugins). Everything a fresh call would refuse or decide otherwise still is.
"""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_test_plugins import noded
from noded_helpers import LIBRARY_NODE, leaves, step

import attn_dispatch as ad
from attn_dispatch import _autograd, _settings


def _checked_twice(heads_first: bool = False):
    q, k, v = leaves(heads_first)
    grad = torch.ones(q.shape, dtype=q.dtype)
    step(q, k, v, grad, heads_first)
    step(q, k, v, grad, heads_first)
    noded.RUNS.clear()
    return q, k, v, grad


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "bhsd"])
def test_later_calls_of_checked_flags_skip_the_checks(noded_env, monkeypatch, heads_first):
    q, k, v, grad = _checked_twice(heads_first)

    def checked(name, value):
        raise AssertionError(f"{name} checked again")

    monkeypatch.setattr(_autograd, "_require_tensor", checked)
    assert step(q, k, v, grad, heads_first)[1] != LIBRARY_NODE
    assert noded.RUNS == ["node"]
    layout = "bhsd" if heads_first else "bshd"
    with pytest.raises(AssertionError, match="checked again"):  # other flags: checked
        ad.attention(q, k, v, causal=False, layout=layout)


@pytest.mark.parametrize(
    ("checked", "given", "error"),
    [
        ({}, {"causal": 1}, "causal"),
        ({"scale": 1.0}, {"scale": True}, "scale"),
        ({}, {"deterministic": 0}, "deterministic"),
        ({}, {"backend": ["noded:oracle"]}, "backend"),
        ({}, {"layout": ["bshd"]}, "layout"),
        ({}, {"causal_align": ["top_left"]}, "causal_align"),
    ],
)
def test_flags_that_equal_checked_ones_are_checked_all_the_same(noded_env, checked, given, error):
    # each bad value equals (or, unhashable, would fail to look up) the checked flags' key
    q, k, v, _ = _checked_twice()
    for _ in range(2):
        ad.attention(q, k, v, causal=True, **checked)
    with pytest.raises((TypeError, ValueError), match=error):
        ad.attention(q, k, v, **{"causal": True, **checked, **given})


def test_a_checked_scale_serves_only_its_own_value(noded_env):
    q, k, v, grad = _checked_twice()
    for _ in range(2):
        ad.attention(q, k, v, causal=True, scale=0.5)
    noded.RUNS.clear()
    with pytest.raises(ValueError, match="scale"):
        ad.attention(q, k, v, causal=True, scale=float("nan"))
    assert noded.RUNS == []


@pytest.mark.parametrize("change", ["use_backend", "execution_mode", "deterministic", "forget"])
def test_a_changed_scope_or_cache_gets_a_fresh_decision(noded_env, change):
    q, k, v, grad = _checked_twice()
    if change == "execution_mode":
        # under CUDA graphs noded:captured takes the backward: the library's node runs it
        with ad.execution_mode("graph"):
            assert step(q, k, v, grad, False)[1] == LIBRARY_NODE
        assert noded.RUNS == ["forward", "backward noded:captured"]
        return
    if change == "use_backend":
        with ad.use_backend("noded:oracle"):
            node = step(q, k, v, grad, False)[1]
    elif change == "deterministic":
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            node = step(q, k, v, grad, False)[1]
        finally:
            torch.use_deterministic_algorithms(before)
    else:
        _settings.current().forget()
        assert not _settings.current().fronts
        node = step(q, k, v, grad, False)[1]
    assert node == LIBRARY_NODE
    assert noded.RUNS == ["forward", "backward noded:oracle"]


def test_other_tensors_than_a_guard_s_take_the_checks(noded_env):
    q, k, v, grad = _checked_twice()
    meta = [torch.empty_like(t, device="meta") for t in (q, k, v)]
    assert ad.attention(*meta, causal=True).device.type == "meta"
    params = [torch.nn.Parameter(t.detach().clone()) for t in (q, k, v)]
    assert step(*params, grad, False)[1] == LIBRARY_NODE
    with pytest.raises(TypeError, match="argument 'q'"):
        ad.attention(q.tolist(), k, v, causal=True)


def test_a_tracer_sees_the_operators_after_a_checked_call(noded_env):
    from torch.fx.experimental.proxy_tensor import make_fx

    q, k, v, _ = _checked_twice()
    graph = make_fx(lambda q, k, v: ad.attention(q, k, v, causal=True))(q, k, v)
    targets = {str(node.target) for node in graph.graph.nodes}
    assert any(t.startswith("attn_dispatch.fwd") for t in targets), targets
    assert "node" not in noded.RUNS
