"""The C-level guard front of the decision cache: it serves repeated dense calls, and any change
of shape, stride, dtype or device of any tensor still goes through validation and selection."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from dispatch_helpers import TOYS, make_inputs

import attn_dispatch as ad
from attn_dispatch import _dispatch, _guards

NAMES = ("q", "k", "v", "out", "lse", "grad_out")

pytestmark = pytest.mark.skipif(
    _guards._guard_class() is None, reason="this torch has no usable TensorGuards"
)


def _served_by_guard_only(monkeypatch, call):
    """Run ``call`` with the dictionary emptied and validation disabled: only a guard can serve."""
    settings = ad._settings.current()
    settings.decisions.clear()

    def no_validation(*args, **kwargs):
        raise AssertionError("the guard did not serve the call")

    monkeypatch.setattr(_dispatch, "build_inputs", no_validation)
    try:
        return call()
    finally:
        monkeypatch.undo()


def test_repeated_dense_call_is_served_by_a_guard(env, monkeypatch):
    env.set(**TOYS)
    inputs = make_inputs(h=4, hkv=2)
    expected = ad.backward(*inputs)
    assert sum(len(v) for v in ad._settings.current().guarded.values()) == 1
    same_metadata = [t.clone() for t in inputs]
    got = _served_by_guard_only(monkeypatch, lambda: ad.backward(*same_metadata))
    for a, b in zip(expected, got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    q, k, v = inputs[:3]
    out, lse = ad.forward(q, k, v)
    got_out, got_lse = _served_by_guard_only(monkeypatch, lambda: ad.forward(q, k, v))
    torch.testing.assert_close(got_out, out, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, lse, rtol=0, atol=0)


@pytest.mark.parametrize("index", range(6), ids=NAMES)
def test_changed_metadata_is_validated_again(env, index):
    """After a cached decision, a wrong dtype, device or shape in any tensor still raises."""
    env.set(**TOYS)
    inputs = list(make_inputs(h=4, hkv=2))
    for _ in range(2):
        ad.backward(*inputs)
    good = inputs[index]
    wrong = (
        good.to(torch.float64) if index != 4 else good.to(torch.float16),
        good.to("meta"),
        torch.zeros(*good.shape[:-1], good.shape[-1] + 1),
    )
    for bad in wrong:
        inputs[index] = bad
        with pytest.raises((ValueError, TypeError), match=NAMES[index]):
            ad.backward(*inputs)
    inputs[index] = good
    ad.backward(*inputs)


def test_changed_strides_and_flags_are_new_signatures(env):
    env.set(**TOYS)
    q, k, v, out, lse, do = make_inputs(sq=8)
    ad.backward(q, k, v, out, lse, do)
    wide = torch.randn(1, 8, 4, 32)[..., :16]
    ad.backward(wide, k, v, out, lse, do)
    ad.backward(q, k, v, out, lse, do, causal=True)
    settings = ad._settings.current()
    assert len(settings.decisions) == 3
    assert sorted(len(v) for v in settings.guarded.values()) == [1, 2]


def test_guards_keep_no_tensor_alive_and_are_forgotten(env):
    env.set(**TOYS)
    inputs = make_inputs()
    ad.backward(*inputs)
    refs = [weakref.ref(t) for t in inputs]
    del inputs
    gc.collect()
    assert all(ref() is None for ref in refs)
    settings = ad._settings.current()
    assert settings.guarded
    ad.enable("toy")  # installs new settings: the old caches are never read again
    fresh = ad._settings.current()
    assert fresh is not settings and not fresh.guarded and not fresh.decisions


def test_guards_per_flags_are_bounded(env):
    env.set(**TOYS)
    for sq in range(4, 4 + _guards.MAX_GUARDS_PER_FLAGS + 3):
        ad.backward(*make_inputs(sq=sq))
    settings = ad._settings.current()
    assert [len(v) for v in settings.guarded.values()] == [_guards.MAX_GUARDS_PER_FLAGS]
    assert len(settings.decisions) == _guards.MAX_GUARDS_PER_FLAGS + 3


def _weird(kind: str, like: torch.Tensor) -> torch.Tensor:
    if kind == "sparse":
        return like.to_sparse()
    if kind == "jagged":
        return torch.nested.nested_tensor([like[0]], layout=torch.jagged)
    return torch.nested.nested_tensor([like[0]])  # strided nested: no strides in C++


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["sparse", "nested", "jagged"])
@pytest.mark.parametrize("index", [0, 5], ids=["q", "grad_out"])
def test_non_dense_tensors_are_rejected_after_a_cached_decision(env, kind, index):
    """A nested tensor must not reach the C++ guard (reading its strides aborts the process)."""
    env.set(**TOYS)
    inputs = list(make_inputs())
    for _ in range(2):
        ad.backward(*inputs)
    inputs[index] = _weird(kind, inputs[index])
    with pytest.raises(TypeError, match=f"argument '{NAMES[index]}': expected a dense"):
        ad.backward(*inputs)
    q, k, v = make_inputs()[:3]
    for _ in range(2):
        ad.forward(q, k, v)
    with pytest.raises(TypeError, match="argument 'k': expected a dense"):
        ad.forward(q, _weird(kind, k), v)


def test_an_implementation_error_on_a_guarded_call_propagates_once(env, monkeypatch):
    env.set(**TOYS)
    inputs = make_inputs()
    chosen = ad.explain(*inputs).selected
    impl = ad._settings.current().registry.implementations[chosen]
    calls, broken = [], []
    works = impl.backward

    def backward(inp):
        calls.append(inp)
        if broken:
            raise TypeError("broken kernel")
        return works(inp)

    monkeypatch.setattr(impl, "backward", backward)  # before the decision caches the method
    for _ in range(2):
        ad.backward(*inputs)
    assert ad._settings.current().guarded
    broken.append(True)
    calls.clear()
    with pytest.raises(TypeError, match="broken kernel"):
        ad.backward(*inputs)
    assert len(calls) == 1


def test_max_seqlen_on_a_dense_call_is_validated_after_caching(env):
    env.set(**TOYS)
    inputs = make_inputs()
    for _ in range(2):
        ad.backward(*inputs)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        ad.backward(*inputs, max_seqlen_k=999)


def test_cache_eviction_keeps_the_hot_signature_guarded(env, monkeypatch):
    env.set(**TOYS)
    monkeypatch.setattr(_dispatch, "MAX_CACHED_DECISIONS", 8)
    hot = make_inputs(sq=4)
    for _ in range(2):
        ad.backward(*hot)
    # batches of new signatures overflow the dictionary, then want the guard slots before the
    # hot signature is called again
    for batch in range(4):
        for sq in range(5 + 6 * batch, 11 + 6 * batch):
            ad.backward(*make_inputs(sq=sq))
            ad.backward(*make_inputs(sq=sq))
        ad.backward(*hot)
        settings = ad._settings.current()
        assert len(settings.decisions) <= 8
        (entries,) = settings.guarded.values()
        assert _guards.match(entries, hot) is not None, f"batch {batch}"


def test_a_tensor_passed_twice_is_served_by_the_dictionary_without_new_guards(env, monkeypatch):
    """A guard cannot take one tensor object in two places; building one per call to find that
    out cost more than the whole dictionary path."""
    env.set(**TOYS)
    q, k, v, out, lse, do = make_inputs(hkv=4)
    aliased = (q, q, q, out, lse, do)
    for _ in range(2):
        ad.backward(*aliased)
    built = []
    real_build = _guards._build
    monkeypatch.setattr(_guards, "_build", lambda *a: built.append(1) or real_build(*a))
    for _ in range(3):
        ad.backward(*aliased)
    assert built == [] and not ad._settings.current().guarded
