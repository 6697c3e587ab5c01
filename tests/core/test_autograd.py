"""``ad.attention``: gradients against the float64 oracle, gradcheck, opcheck, torch.compile.

The tests run one intra-op thread: the shapes are tiny, and two threads spinning on a busy
two-core machine make each small matmul thousands of times slower.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from dispatch_helpers import BOTTOM_RIGHT, EXACT

import attn_dispatch as ad
from attn_dispatch import _autograd, _call, _validation
from attn_dispatch._autograd import _bwd, _fwd
from attn_dispatch.testing.cases import Case
from attn_dispatch.testing.oracle import oracle
from attn_dispatch.testing.tolerances import error_metrics, tolerance_for


@pytest.fixture(autouse=True)
def one_thread(env):
    """The exact:oracle test plugin computes every call (the CUDA-graph test asks for the
    installed backends); one CPU thread."""
    env.set(**EXACT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# two query heads on one kv head, D = 8
SMALL_MQA = {"heads": 2, "kv_heads": 1, "head_dim": 8}
# a batch of four sequences, one without queries, keys shorter than queries; GQA 4/2
RAGGED = dict(seqlens_q=(5, 17, 0, 9), seqlens_k=(7, 17, 3, 2), heads=4, kv_heads=2, head_dim=16)

CASES = [
    Case((32,), (32,), heads=4, kv_heads=4, head_dim=16, seed=1),
    Case((24, 24), (40, 40), heads=4, kv_heads=2, head_dim=16, seed=2),  # GQA, Sq != Sk
    Case((33,), (33,), heads=4, kv_heads=1, head_dim=16, causal=True, seed=3),  # MQA
    Case((16,), (40,), heads=2, kv_heads=2, head_dim=8, causal=True, seed=4),
    Case((16,), (40,), heads=2, kv_heads=2, head_dim=8, **BOTTOM_RIGHT, seed=5),
    # rows that see no key
    Case((40,), (16,), heads=4, kv_heads=2, head_dim=8, **BOTTOM_RIGHT, seed=6),
    Case(**RAGGED, head_dim_v=8, **BOTTOM_RIGHT, varlen=True, seed=7),
    Case((11, 20), (11, 20), **SMALL_MQA, causal=True, varlen=True, layout="sliced", seed=8),
    Case((20,), (20,), heads=4, kv_heads=2, head_dim=16, layout="transposed", seed=9),
    Case((12,), (12,), **SMALL_MQA, layout="strided", scale=0.3, seed=10),
    # sliding windows and soft caps (exact:oracle declares both)
    Case((24,), (40,), heads=4, kv_heads=2, head_dim=16, window=(4, 2), seed=31),
    # rows that see no key
    Case((40,), (16,), **SMALL_MQA, **BOTTOM_RIGHT, window=(3, None), softcap=1.5, seed=32),
    Case(
        **RAGGED, window=(None, 1), softcap=2.0, causal_align="bottom_right", varlen=True, seed=33
    ),
]


def _run(case: Case, dtype: torch.dtype, backend: str | None):
    inp = case.make_inputs(dtype)
    q, k, v = (t.requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    out = ad.attention(q, k, v, backend=backend, **inp.flags())
    grads = torch.autograd.grad(out, (q, k, v), inp.grad_out)
    return out, grads, oracle(q, k, v, inp.grad_out, **_oracle_flags(inp.flags()))


def _oracle_flags(flags: dict) -> dict:
    return {k: v for k, v in flags.items() if not k.startswith("max_seqlen")}


def _assert_matches_oracle(out, grads, ref) -> None:
    """out, dq, dk, dv in float32, finite and within the float32 tolerance of the oracle."""
    tol = tolerance_for(torch.float32)
    for name, got, want in zip(
        ("out", "dq", "dk", "dv"), (out, *grads), (ref.out, ref.dq, ref.dk, ref.dv), strict=True
    ):
        assert got.shape == want.shape and got.dtype == torch.float32, name
        assert torch.isfinite(got).all(), f"{name} has non-finite values"
        max_err, rel_l2 = error_metrics(got, want)
        assert max_err <= tol.max_err and rel_l2 <= tol.rel_l2, (name, max_err, rel_l2)


@pytest.mark.parametrize("backend", [None, "exact"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradients_match_oracle(case: Case, backend: str | None) -> None:
    _assert_matches_oracle(*_run(case, torch.float32, backend))


GRADCHECK_CASES = [
    Case((3,), (5,), heads=2, kv_heads=1, head_dim=3, **BOTTOM_RIGHT, seed=11),
    Case((4,), (4,), heads=2, kv_heads=2, head_dim=2, head_dim_v=3, layout="transposed", seed=12),
    Case((2, 3), (3, 1), heads=2, kv_heads=1, head_dim=2, causal=True, varlen=True, seed=13),
    Case((5,), (6,), heads=2, kv_heads=1, head_dim=3, window=(1, 2), softcap=0.8, seed=34),
]


@pytest.mark.parametrize("case", GRADCHECK_CASES, ids=lambda c: c.id)
def test_gradcheck_float64(case: Case) -> None:
    inp = case.make_inputs(torch.float64)
    leaves = tuple(t.requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    flags = inp.flags()

    def fn(q, k, v):
        return ad.attention(q, k, v, backend="exact", **flags)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-8)


def _fwd_args(case: Case, dtype=torch.float64, requires_grad=True):
    inp = case.make_inputs(dtype)
    flags = inp.flags()
    q, k, v = (t.requires_grad_(requires_grad) for t in (inp.q, inp.k, inp.v))
    scale = flags.get("scale")
    args = (
        q,
        k,
        v,
        inp.cu_seqlens_q,
        inp.cu_seqlens_k,
        inp.max_seqlen_q,
        inp.max_seqlen_k,
        inp.causal,
        inp.causal_align,
        scale,
        False,
        "exact",
        *(inp.window or (None, None)),
        inp.softcap,
    )
    return args, inp.grad_out


OPCHECK_CASES = [
    Case((6,), (6,), heads=2, kv_heads=1, head_dim=4, causal=True, seed=14),
    Case((3, 4), (5, 2), heads=2, kv_heads=2, head_dim=4, varlen=True, seed=15),
    Case((5,), (7,), heads=2, kv_heads=1, head_dim=4, window=(2, None), softcap=3.0, seed=35),
    Case((5,), (7,), heads=2, kv_heads=1, head_dim=4, window=(None, 0), seed=36),
]


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=lambda c: c.id)
def test_opcheck_custom_ops(case: Case) -> None:
    args, grad_out = _fwd_args(case)
    torch.library.opcheck(_fwd, args)
    with torch.no_grad():
        out, lse = _fwd(*args)
    bwd_args = (grad_out, *(t.detach() for t in args[:3]), out, lse, *args[3:])
    torch.library.opcheck(_bwd, bwd_args)


def _spy_calls(monkeypatch) -> list:
    """The ``Call`` of every dispatch the operators make, in order."""
    seen = []
    real_dispatch = _autograd.dispatch

    def spy(mode, tensors, cu_q, cu_k, max_q, max_k, call, settings, sinks=None):
        seen.append(call)
        seqlens = (cu_q, cu_k, max_q, max_k)
        return real_dispatch(mode, tensors, *seqlens, call, settings, sinks)

    monkeypatch.setattr(_autograd, "dispatch", spy)
    return seen


def test_outputs_are_fresh_contiguous_tensors(monkeypatch) -> None:
    """An implementation may return views of its inputs; the op hands out copies."""
    q = torch.randn(1, 4, 2, 8).transpose(1, 2).contiguous().transpose(1, 2)  # [B,S,H,D] view
    k, v = q[:, :, :1].clone(), torch.randn(1, 4, 1, 8)

    def aliasing_dispatch(mode, tensors, *_):
        q = tensors[0]
        return q, q.new_zeros(q.shape[0], q.shape[2], q.shape[1])

    monkeypatch.setattr(_autograd, "dispatch", aliasing_dispatch)
    out, lse = _fwd(
        q, k, v, None, None, None, None, False, "top_left", None, False, None, None, None, None
    )
    assert out.is_contiguous() and lse.is_contiguous()
    assert out.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    torch.testing.assert_close(out, q)


def test_lse_is_not_differentiated_and_flags_reach_dispatch(monkeypatch) -> None:
    seen = _spy_calls(monkeypatch)
    q = torch.randn(1, 5, 2, 4, requires_grad=True)
    k = torch.randn(1, 7, 1, 4, requires_grad=True)
    v = torch.randn(1, 7, 1, 4, requires_grad=True)
    out = ad.attention(
        q,
        k,
        v,
        causal=True,
        causal_align="bottom_right",
        scale=0.5,
        deterministic=True,
        backend="exact",
    )
    out.sum().backward()  # grad_out is a broadcast (stride 0): made contiguous before dispatch
    assert [call.kind for call in seen] == ["forward", "backward"]
    for call in seen:
        assert call.causal is True and call.causal_align == "bottom_right" and call.scale == 0.5
        assert call.deterministic is True and call.backend == "exact"
        assert call.window is None and call.softcap is None
    ref = oracle(q, k, v, torch.ones_like(out), causal=True, causal_align="bottom_right", scale=0.5)
    torch.testing.assert_close(q.grad, ref.dq.float(), atol=1e-5, rtol=1e-4)


def test_window_and_softcap_are_checked_once_per_call(monkeypatch) -> None:
    """attention checks them; the operators and the cached dispatch do not check them again."""
    counts = {"window": 0, "softcap": 0}

    def counted(name, check):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return check(*args, **kwargs)

        return wrapper

    q = torch.randn(1, 6, 2, 4, requires_grad=True)

    def step():
        ad.attention(q, q, q, window=(2, 0), softcap=5.0, backend="exact").sum().backward()

    step()  # the first call of each signature validates everything with the tensors
    for module in (_autograd, _call, _validation):
        for name in counts:
            check = getattr(module, f"check_{name}", None)
            if check is not None:
                monkeypatch.setattr(module, f"check_{name}", counted(name, check))
    step()
    assert counts == {"window": 1, "softcap": 1}


def test_errors_are_the_dispatchers() -> None:
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ad.UnknownBackendError):
        ad.attention(q, q[:, :, :1], q[:, :, :1], backend="no_such_backend")
    with pytest.raises(ValueError, match="head dim"):
        ad.attention(q, torch.randn(1, 4, 2, 4), torch.randn(1, 4, 2, 4))
    for flags in ({"causal": 1}, {"deterministic": 0}, {"max_seqlen_q": 4.0}, {"backend": 3}):
        with pytest.raises(TypeError, match=f"argument '{next(iter(flags))}'"):
            ad.attention(q, q, q, **flags)


# ----------------------------------------------------------------------------------------------
# torch.compile


def _causal_self_attention(q, k, v, cu_seqlens=None, max_seqlen=None) -> torch.Tensor:
    """``ad.attention`` with a causal mask, queries and keys packed by the same ``cu_seqlens``."""
    return ad.attention(
        q,
        k,
        v,
        causal=True,
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen,
    )


class Block(torch.nn.Module):
    """Q/K/V projections (GQA: 4 query heads, 2 kv heads), ad.attention, output projection."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = torch.nn.Linear(dim, dim)
        self.wkv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.wo = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cu_seqlens=None, max_seqlen=None) -> torch.Tensor:
        shape = x.shape[:-1]
        q = self.wq(x).view(*shape, self.heads, self.head_dim)
        k, v = self.wkv(x).view(*shape, 2, self.kv_heads, self.head_dim).unbind(-3)
        o = _causal_self_attention(q, k, v, cu_seqlens, max_seqlen)
        return self.wo(o.reshape(*shape, -1))


def _train(model, inputs, target, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = (model(*inputs) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _compiled_matches_eager(compile_backend: str, varlen: bool) -> None:
    torch.compiler.reset()
    torch.manual_seed(0)
    eager = Block()
    compiled = Block()
    compiled.load_state_dict(eager.state_dict())
    if varlen:
        lengths = [5, 11, 0, 8]
        cu = torch.tensor([0, 5, 16, 16, 24], dtype=torch.int32)
        inputs, target = (torch.randn(24, 32), cu, max(lengths)), torch.randn(24, 32)
    else:
        inputs, target = (torch.randn(2, 12, 32),), torch.randn(2, 12, 32)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend(compile_backend)(gm, example_inputs)

    fn = torch.compile(compiled, backend=counting, fullgraph=True)
    want = _train(eager, inputs, target)
    got = _train(fn, inputs, target)
    assert len(graphs) == 1  # one graph, no recompiles
    targets = [str(node.target) for node in graphs[0].graph.nodes]
    assert any("attn_dispatch.fwd" in t for t in targets), targets
    assert want[-1] < want[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.compiler.reset()


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_compile_fullgraph_trains_like_eager(varlen: bool) -> None:
    """AOTAutograd with the fake implementations, no graph break; ``aot_eager`` for speed."""
    _compiled_matches_eager("aot_eager", varlen)


def test_compile_dynamic_varlen_is_one_graph() -> None:
    """Changing token counts and max_seqlen reuse one dynamic graph; results match eager."""
    torch.compiler.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=counting, fullgraph=True, dynamic=True)
    def step(q, k, v, cu, max_len):
        return _causal_self_attention(q, k, v, cu, max_len)

    for lengths in ([3, 7], [6, 7], [12, 8, 1]):
        total = sum(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        q = torch.randn(total, 4, 8, requires_grad=True)
        k, v = (torch.randn(total, 2, 8, requires_grad=True) for _ in range(2))
        grad_out = torch.randn(total, 4, 8)
        got = torch.autograd.grad(step(q, k, v, cu, max(lengths)), (q, k, v), grad_out)
        ref = oracle(q, k, v, grad_out, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
        for g, r in zip(got, (ref.dq, ref.dk, ref.dv)):
            torch.testing.assert_close(g, r.float(), atol=1e-5, rtol=1e-4)
    assert len(graphs) == 1
    torch.compiler.reset()


def test_compiled_op_follows_deterministic_mode(monkeypatch) -> None:
    calls = _spy_calls(monkeypatch)
    torch.compiler.reset()
    fn = torch.compile(lambda q: ad.attention(q, q, q), backend="aot_eager", fullgraph=True)
    q = torch.randn(1, 4, 2, 8)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        fn(q)
        torch.use_deterministic_algorithms(True)
        fn(q)
    finally:
        torch.use_deterministic_algorithms(was)
    torch.compiler.reset()
    assert [call.deterministic for call in calls] == [was, True]


@pytest.mark.slow
def test_compile_inductor_trains_like_eager() -> None:
    """The same with inductor (C++ code generation takes ~30 s on a two-core CPU)."""
    _compiled_matches_eager("inductor", varlen=False)


# ----------------------------------------------------------------------------------------------
# CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_cuda_graph_replay_matches_eager(env) -> None:
    """A forward+backward step captured after warm-up replays to the eager gradients."""
    env.unset("ATTN_DISPATCH_TEST_PLUGINS", "ATTN_DISPATCH_PLUGINS")  # the GPU's own backends
    dev = "cuda"
    torch.manual_seed(0)
    dtype = torch.bfloat16
    shapes = ((2, 256, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64))
    static = [torch.randn(s, device=dev, dtype=dtype, requires_grad=True) for s in shapes]
    grad_out = torch.randn(2, 256, 8, 64, device=dev, dtype=dtype)

    def step():
        for t in static:
            t.grad = None
        out = ad.attention(*static, causal=True)
        out.backward(grad_out)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up: selection cached, kernels compiled
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for t in static:
        t.grad = None
    with torch.cuda.graph(graph):
        static_out = ad.attention(*static, causal=True)
        static_out.backward(grad_out)
    static_grads = [t.grad for t in static]

    fresh = [torch.randn(s, device=dev, dtype=dtype) for s in shapes]
    with torch.no_grad():
        for t, f in zip(static, fresh):
            t.copy_(f)
    graph.replay()
    torch.cuda.synchronize()

    leaves = [f.clone().requires_grad_(True) for f in fresh]
    want_out = ad.attention(*leaves, causal=True)
    want = torch.autograd.grad(want_out, leaves, grad_out)
    # Atomic-accumulating kernels may sum in another order: bf16-level tolerance.
    torch.testing.assert_close(static_out, want_out, atol=2e-2, rtol=2e-2)
    for got, exp in zip(static_grads, want):
        torch.testing.assert_close(got, exp, atol=2e-2, rtol=2e-2)


def test_non_tensor_inputs_raise_the_dispatchers_type_error() -> None:
    """A numpy array is the same TypeError as in ``ad.forward``, not the operator schema's
    RuntimeError that prints the array."""
    np = pytest.importorskip("numpy")
    a = np.zeros((1, 4, 2, 8), dtype=np.float32)
    with pytest.raises(TypeError) as want:
        ad.forward(a, a, a)
    with pytest.raises(TypeError) as got:
        ad.attention(a, a, a)
    assert str(got.value) == str(want.value) == "argument 'q': expected a torch.Tensor, got ndarray"
    t = torch.zeros(4, 2, 8)
    cu = np.array([0, 4], dtype=np.int32)
    with pytest.raises(TypeError, match="argument 'cu_seqlens_q': expected a torch.Tensor"):
        ad.attention(t, t, t, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=4, max_seqlen_k=4)


def test_compile_fullgraph_takes_changing_scale_and_softcap() -> None:
    """From the second value on, torch traces a float symbolically: the checks must not need
    its value there (the operator checks it where it runs, with the same errors)."""
    torch.compiler.reset()
    torch.manual_seed(0)
    q = torch.randn(1, 6, 2, 8)

    def fn(q, cap, scale):
        return ad.attention(q, q, q, softcap=cap, scale=scale)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for cap, scale in ((1.0, 0.5), (2.0, 0.25), (3.5, 0.125)):
        torch.testing.assert_close(compiled(q, cap, scale), fn(q, cap, scale))
    for name, cap, scale in (("softcap", -1.0, 0.5), ("scale", 1.0, 1e39)):
        with pytest.raises(ValueError, match=f"argument '{name}'"):
            compiled(q, cap, scale)
    torch.compiler.reset()


def test_max_seqlen_beyond_int64_is_the_dispatchers_error() -> None:
    """The operator schema is int64: a larger value on dense inputs gets the dispatcher's
    ValueError naming it, not the schema's RuntimeError."""
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError) as want:
        ad.forward(q, q, q, max_seqlen_q=2**64)
    with pytest.raises(ValueError) as got:
        ad.attention(q, q, q, max_seqlen_q=2**64)
    assert str(got.value) == str(want.value) and "'max_seqlen_q'" in str(got.value)


def test_numpy_ints_are_taken_as_in_forward() -> None:
    """``ad.forward`` takes any integral max_seqlen (a numpy int from a collator's arrays);
    ``ad.attention`` takes the same, not only the schema's Python int."""
    np = pytest.importorskip("numpy")
    t = torch.randn(5, 2, 8)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    flags = dict(
        cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=np.int64(3), max_seqlen_k=np.int32(3)
    )
    torch.testing.assert_close(ad.attention(t, t, t, **flags), ad.forward(t, t, t, **flags)[0])
    with pytest.raises(TypeError, match="argument 'max_seqlen_q'"):
        ad.attention(t, t, t, **dict(flags, max_seqlen_q=np.bool_(True)))


def test_attention_window_softcap_matches_the_oracle_varlen_gqa():
    variants = dict(window=(3, 1), softcap=1.7, causal_align="bottom_right")
    case = Case((9, 0, 14), (11, 4, 14), kv_heads=2, head_dim=8, varlen=True, **variants, seed=5)
    _assert_matches_oracle(*_run(case, torch.float32, None))


def test_attention_flags_reach_both_passes(monkeypatch):
    calls = _spy_calls(monkeypatch)
    q = torch.randn(1, 5, 2, 4, requires_grad=True)
    ad.attention(q, q, q, window=[2, None], softcap=3).sum().backward()
    assert [(c.window, c.softcap) for c in calls] == [((2, None), 3.0), ((2, None), 3.0)]
    calls.clear()
    ad.attention(q, q, q, window=(None, None)).sum().backward()
    assert [(c.window, c.softcap) for c in calls] == [(None, None), (None, None)]


def _block_step(fn, q, k, v, grad_out):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out))


def test_compile_fullgraph_with_window_and_softcap_matches_eager():
    torch.compiler.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(gm, example_inputs)

    def attn(q, k, v):
        return ad.attention(
            q, k, v, causal=True, causal_align="bottom_right", window=(4, None), softcap=2.5
        )

    compiled = torch.compile(attn, backend=counting, fullgraph=True)
    torch.manual_seed(3)
    q = torch.randn(2, 10, 4, 8, requires_grad=True)
    k, v = (torch.randn(2, 13, 2, 8, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(2, 10, 4, 8)
    want = _block_step(attn, q, k, v, grad_out)
    got = _block_step(compiled, q, k, v, grad_out)
    assert len(graphs) == 1
    nodes = [n for n in graphs[0].graph.nodes if "attn_dispatch.fwd" in str(n.target)]
    assert nodes and (4, None, 2.5) == tuple(nodes[0].args[-3:])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    ref = oracle(
        q, k, v, grad_out, causal=True, causal_align="bottom_right", window=(4, None), softcap=2.5
    )
    for a, b in zip(got, (ref.out, ref.dq, ref.dk, ref.dv)):
        torch.testing.assert_close(a, b.float(), atol=1e-5, rtol=1e-4)
    torch.compiler.reset()


def test_attention_outside_a_compiler_leaves_the_temp_directory_empty(tmp_path) -> None:
    """A plain training step writes nothing in the temporary directory: importing torch's
    compiler stack (which the operators' kernels must not do) creates torchinductor's cache
    directory there."""
    script = (
        "import torch, attn_dispatch as ad\n"
        "q = torch.randn(1, 8, 2, 16, requires_grad=True)\n"
        "ad.attention(q, q, q, causal=True).sum().backward()\n"
        "assert q.grad is not None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
