"""The dispatcher: what keys a cached decision (data pointers, cu_seqlens identity, the strides
of every tensor, windows and caps), meta inputs, errors raised by an implementation, and calls
that record no autograd graph.

Plugins here are real entry points written for the test (``dispatch_helpers.Plugins``).
"""

from __future__ import annotations

import sys
import time
import warnings

import pytest
import torch
from dispatch_helpers import EXACT, TOYS, make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import _selection
from attn_dispatch.testing import oracle


def test_attention_refuses_a_meta_tensor_among_real_ones(env):
    q = v = torch.randn(1, 64, 2, 8)
    k = q.to("meta")
    with pytest.raises(ValueError, match="argument 'k': expected device cpu .* got meta"):
        ad.attention(q, k, v)
    with pytest.raises(ValueError, match="argument 'v'"):
        ad.attention(q, q, k)


ALIGN = """
SEEN = []


class Aligned(Tagged):
    '''Reads data pointers in supports (without declaring ``alignment``).'''

    name, tag, priority = "aligned", 1.0, {"*": 50}

    def supports(self, inp, arch):
        pointers = [t.data_ptr() for t in (inp.q, inp.k, inp.v)]
        SEEN.extend(pointers)
        return [] if all(p % 16 == 0 for p in pointers) else ["misaligned"]


class Declared(Tagged):
    '''Declares ``alignment``: the core reads the pointers.'''

    name, tag, priority, alignment = "declared", 2.0, {"*": 40}, 16
"""

IDENTITY = """
class SameOffsets(Tagged):
    '''Depends on ``cu_seqlens_q is cu_seqlens_k``.'''

    name, tag, priority = "same_offsets", 3.0, {"*": 50}

    def supports(self, inp, arch):
        return [] if inp.cu_seqlens_q is inp.cu_seqlens_k else ["distinct cu_seqlens"]
"""


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose data pointer is 4 bytes past an aligned one."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16
    return view


@pytest.mark.parametrize("impl", ["aligned", "declared"])
def test_a_decision_that_read_data_pointers_is_remade_for_other_alignments(plugins, env, impl):
    plugins.backend("align", ALIGN, "[Aligned(), Declared(), Fallback()]")
    other = {"aligned": "align:declared", "declared": "align:aligned"}[impl]
    env.set(ATTN_DISPATCH_PLUGINS="align", ATTN_DISPATCH_DISABLE=other)
    inputs = make_inputs()
    want = {"aligned": 1.0, "declared": 2.0}[impl]
    for _ in range(3):  # first call, dictionary, guard
        assert tag_of(ad.backward(*inputs)) == want
    bad = tuple(_misaligned(t) for t in inputs)
    assert ad.explain(*bad).selected == "align:fallback"
    for _ in range(3):
        assert tag_of(ad.backward(*bad)) == 9.0
    for _ in range(2):
        assert tag_of(ad.backward(*inputs)) == want
        assert tag_of(ad.backward(*bad)) == 9.0


TOP = """
class Top(Tagged):
    name, tag, priority = "top", 4.0, {"*": 60}
"""


def _cached_pointers() -> list:
    return [d.pointers for d in ad._settings.current().decisions.values()]


def test_a_pointer_reader_ranked_below_the_winner_leaves_the_decision_to_any_alignment(
    plugins, env
):
    plugins.backend("align", ALIGN + TOP, "[Top(), Aligned(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="align")
    inputs = make_inputs()
    for _ in range(2):
        assert tag_of(ad.backward(*inputs)) == 4.0
        assert tag_of(ad.backward(*tuple(_misaligned(t) for t in inputs))) == 4.0
    assert _cached_pointers() == [None]


@pytest.mark.parametrize("forced", [None, "align:aligned"])
def test_a_pointer_reader_that_could_win_keys_the_decision_on_alignment(plugins, env, forced):
    plugins.backend("align", ALIGN + TOP, "[Top(), Aligned(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="align", ATTN_DISPATCH_DISABLE="align:top")
    inputs = make_inputs()
    bad = tuple(_misaligned(t) for t in inputs)
    if forced is None:
        assert tag_of(ad.backward(*bad)) == 9.0  # the reader rejected it, and it ranks above
        assert tag_of(ad.backward(*inputs)) == 1.0
    else:
        assert tag_of(ad.backward(*inputs, backend=forced)) == 1.0
        with pytest.raises(ad.NoBackendError, match="misaligned"):
            ad.backward(*bad, backend=forced)
    assert all(p is not None for p in _cached_pointers())


def test_supports_sees_only_pointer_residues(plugins, env):
    plugins.backend("align", ALIGN, "[Aligned(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="align")
    ad.backward(*make_inputs())
    seen = sys.modules["rel_align"].SEEN
    assert seen and all(0 <= p < _selection.POINTER_RESIDUE for p in seen)


def test_a_decision_is_keyed_on_cu_seqlens_identity(plugins, env):
    plugins.backend("ident", IDENTITY, "[SameOffsets(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="ident")
    q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    flags = dict(max_seqlen_q=5, max_seqlen_k=5, causal=True)
    for _ in range(2):
        out, _ = ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, **flags)
        assert float(out.flatten()[0]) == 3.0
    other = cu.clone()
    for _ in range(2):
        out, _ = ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=other, **flags)
        assert float(out.flatten()[0]) == 9.0


STRIDED_VECTORS = """
class DenseVectors(Tagged):
    '''Refuses strided sinks and cu_seqlens (as a kernel that indexes them as X + i would).'''

    name, tag, priority, sinks = "dense", 5.0, {"*": 50}, True

    def supports(self, inp, arch):
        small = (inp.sinks, inp.cu_seqlens_q, inp.cu_seqlens_k)
        if all(t is None or t.is_contiguous() for t in small):
            return []
        return ["strided sinks or cu_seqlens"]


class AnyVectors(Tagged):
    name, tag, priority, sinks = "any", 9.0, {"*": 1}, True
"""


def _every_other(values: list, dtype: torch.dtype) -> torch.Tensor:
    """``values`` as a view of stride 2 into a tensor twice as long."""
    return torch.tensor([x for value in values for x in (value, 99)], dtype=dtype)[::2]


def test_a_decision_is_keyed_on_the_strides_of_sinks(plugins, env):
    plugins.backend("vectors", STRIDED_VECTORS, "[DenseVectors(), AnyVectors()]")
    env.set(ATTN_DISPATCH_PLUGINS="vectors")
    q, k, v, *_ = make_inputs()
    dense = torch.tensor([0.5, -1.0, 2.0, 0.0])
    strided = _every_other(dense.tolist(), torch.float32)
    assert strided.shape == dense.shape and strided.stride() == (2,)
    for _ in range(2):  # first call, then the cached decision
        assert float(ad.forward(q, k, v, sinks=dense)[0].flatten()[0]) == 5.0
        assert float(ad.forward(q, k, v, sinks=strided)[0].flatten()[0]) == 9.0


def test_a_decision_is_keyed_on_the_strides_of_cu_seqlens(plugins, env):
    plugins.backend("vectors", STRIDED_VECTORS, "[DenseVectors(), AnyVectors()]")
    env.set(ATTN_DISPATCH_PLUGINS="vectors")
    q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
    dense = torch.tensor([0, 3, 8], dtype=torch.int32)
    strided = _every_other([0, 3, 8], torch.int32)
    flags = dict(max_seqlen_q=5, max_seqlen_k=5)
    for _ in range(2):
        for cu_q, cu_k, tag in (
            (dense, dense, 5.0),
            (strided, strided, 9.0),
            (dense, strided, 9.0),
        ):
            out, _ = ad.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **flags)
            assert float(out.flatten()[0]) == tag


RECORDS = """
CALLS = []


class Records(Tagged):
    name, tag, priority = "records", 1.0, {"*": 10}

    def backward(self, inp):
        CALLS.append("backward")
        return super().backward(inp)

    def forward(self, inp):
        CALLS.append("forward")
        return super().forward(inp)
"""


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_meta_inputs_run_no_kernel(plugins, env):
    plugins.backend("rec", RECORDS, "[Records()]")
    env.set(ATTN_DISPATCH_PLUGINS="rec")
    q, k, v = _meta(2, 16, 4, 32), _meta(2, 16, 2, 32), _meta(2, 16, 2, 24)
    out, lse = ad.forward(q, k, v)
    assert (out.shape, out.device, lse.shape, lse.dtype) == (
        (2, 16, 4, 24),
        torch.device("meta"),
        (2, 4, 16),
        torch.float32,
    )
    grads = ad.backward(q, k, v, out, lse, out)
    assert isinstance(grads, ad.Gradients)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert sys.modules["rel_rec"].CALLS == []


def test_meta_backward_costs_only_shape_logic(env):
    env.set(**EXACT)
    s, h, d = 2**21, 64, 128
    q, out = _meta(1, s, h, d), _meta(1, s, h, d)
    start = time.perf_counter()
    ad.backward(q, q, q, out, _meta(1, h, s, dtype=torch.float32), out)
    assert time.perf_counter() - start < 5


ERRORS = """
class Boom(Tagged):
    name, priority = "boom", {"*": 10}

    def backward(self, inp):
        raise RuntimeError("rt: backward exploded")


class Nothing(Tagged):
    name = "nothing"

    def backward(self, inp):
        return None
"""


def test_a_backend_error_names_the_implementation(plugins, env):
    plugins.backend("errs", ERRORS, "[Boom(), Nothing()]")
    env.set(ATTN_DISPATCH_PLUGINS="errs")
    inputs = make_inputs()
    for _ in range(3):  # first call, dictionary, guard
        with pytest.raises(RuntimeError, match="backward exploded") as caught:
            ad.backward(*inputs)
        assert any("errs:boom" in note for note in caught.value.__notes__)
    with pytest.raises(ValueError, match="errs:nothing returned NoneType"):
        ad.backward(*inputs, backend="errs:nothing")


def test_backends_run_without_grad_recording(env):
    env.set(**EXACT)
    q, k, v, out, lse, do = make_inputs()
    for t in (q, k, v):
        t.requires_grad_(True)
    for _ in range(3):  # first call, dictionary, guard
        grads = ad.backward(q, k, v, out, lse, do)
        assert all(g.grad_fn is None and not g.requires_grad for g in grads)
        out2, lse2 = ad.forward(q, k, v)
        assert out2.grad_fn is None and lse2.grad_fn is None
    assert torch.is_grad_enabled()


def test_no_warning_from_a_plain_session(env):
    env.set(**EXACT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ad.backward(*make_inputs())


def test_same_shapes_with_other_windows_are_other_signatures(env):
    q, k, v, _, _, do = make_inputs(sq=16, sk=16, h=2, hkv=1, d=8, dtype=torch.float64)
    variants = [
        {},
        {"window": (2, 0)},
        {"window": (2, 1)},
        {"window": (None, 0)},
        {"softcap": 1.0},
        {"softcap": 2.0},
        {"window": (2, 0), "softcap": 1.0},
    ]
    results = {}
    for _ in range(3):  # the later rounds run from the dictionary, then from the guards
        for i, flags in enumerate(variants):
            out, lse = ad.forward(q, k, v, **flags)
            grads = ad.backward(q, k, v, out, lse, do, **flags)
            ref = oracle(q, k, v, do, **flags)
            for got, want in zip((out, lse, *grads), ref):
                torch.testing.assert_close(got, want)
            results.setdefault(i, grads.dq)
    assert len(ad._settings.current().decisions) == 2 * len(variants)  # forward and backward
    for i in results:
        for j in range(i):
            assert not torch.allclose(results[i], results[j]), (variants[i], variants[j])


def _python_frames(fn) -> list[str]:
    """The Python functions one call of ``fn`` enters (C functions not counted)."""
    entered: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entered[1:]  # the lambda itself


def test_a_repeated_call_enters_few_python_functions(env):
    """The hot path's cost grows with the Python frames it enters (more so after a kernel's own
    host code has taken the CPU's caches): a guarded repeat enters the shell, the flag parsing,
    the execution probe, the dispatcher and its guard match, the inputs object and the
    implementation, nothing else."""
    env.set(**TOYS)
    inputs = make_inputs()
    for _ in range(3):
        ad.backward(*inputs, backend="toy:trivial")
    frames = _python_frames(lambda: ad.backward(*inputs, backend="toy:trivial"))
    assert frames == [
        "_api.py:backward",
        "_call.py:parse",
        "_call.py:_forced",
        "_execution.py:current_execution",
        "_dispatch.py:dispatch",
        "_guards.py:match",
        "_inputs.py:__init__",
        "toy.py:backward",
        "_implementation.py:__new__",  # the toy's Gradients(...), one frame
    ], frames
