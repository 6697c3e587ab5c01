"""``ad.attention``'s two paths: eager calls dispatch directly, traced calls take the operators.

In eager mode one ``torch.autograd.Function`` calls the dispatcher in its forward and backward;
the custom operators (``attn_dispatch::fwd``, ``::bwd``, ``::bwd_sinks``) serve whatever traces
or transforms the call: ``torch.compile``, export, dispatch modes, meta and subclass tensors, and
a backward that compiled autograd traces. Here each path is shown taken, and each gives the
eager gradients. The exact:oracle test plugin computes every call, on one CPU thread.
"""

from __future__ import annotations

import pytest
import torch
from dispatch_helpers import EXACT
from torch._subclasses.fake_tensor import FakeTensorMode

import attn_dispatch as ad
from attn_dispatch import _autograd


@pytest.fixture(autouse=True)
def exact_one_thread(env):
    env.set(**EXACT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def op_calls(monkeypatch) -> list[str]:
    """The names of the custom operators ``ad.attention`` calls, in order."""
    calls = []
    for name in ("_fwd", "_bwd", "_bwd_sinks"):
        op = getattr(_autograd, name)

        def counted(*args, _op=op, _name=name):
            calls.append(_name)
            return _op(*args)

        monkeypatch.setattr(_autograd, name, counted)
    return calls


def leaves(heads_first: bool = False, sinks: bool = False):
    gen = torch.Generator().manual_seed(0)
    shapes = ((1, 4, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8))
    if not heads_first:
        shapes = tuple((b, s, h, d) for b, h, s, d in shapes)
    tensors = [torch.randn(s, generator=gen).requires_grad_(True) for s in shapes]
    if sinks:
        tensors.append(torch.randn(4, generator=gen).requires_grad_(True))
    return tensors


def attention(q, k, v, sinks=None, heads_first=False):
    layout = "bhsd" if heads_first else "bshd"
    return ad.attention(q, k, v, causal=True, layout=layout, sinks=sinks)


def eager_node(out: torch.Tensor):
    """The autograd node of the attention call behind ``out`` (past a layout transpose)."""
    node = out.grad_fn
    if type(node).__name__ == "TransposeBackward0":
        node = node.next_functions[0][0]
    return node


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "bhsd"])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
def test_eager_call_takes_no_operator(op_calls, heads_first, with_sinks):
    tensors = leaves(heads_first, with_sinks)
    out = attention(*tensors[:3], sinks=tensors[3] if with_sinks else None, heads_first=heads_first)
    assert type(eager_node(out)) is _autograd._EAGER_NODE
    out.sum().backward()
    assert op_calls == []
    got = [t.grad for t in tensors]
    want_tensors = [t.detach().clone().requires_grad_(True) for t in tensors]
    q, k, v = want_tensors[:3]
    if heads_first:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    # the operators' results, the other path: the same gradients
    flags = (None, None, None, None, True, "top_left", None, False, None, None, None, None)
    sinks = (want_tensors[3],) if with_sinks else ()
    want_out, _ = torch.ops.attn_dispatch.fwd(q, k, v, *flags, *sinks)
    want_out.sum().backward()
    torch.testing.assert_close(out, want_out.transpose(1, 2) if heads_first else want_out)
    for g, w in zip(got, want_tensors):
        torch.testing.assert_close(g, w.grad)


def test_eager_gradients_are_contiguous_in_the_leaves_layout():
    """With layout='bhsd' the gradients come back [B, H, S, D]-contiguous, like the leaves."""
    q, k, v = leaves(heads_first=True)
    attention(q, k, v, heads_first=True).sum().backward()
    assert all(t.grad.is_contiguous() for t in (q, k, v))


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "bhsd"])
def test_eager_backward_reads_a_gradient_in_the_callers_layout_in_place(monkeypatch, heads_first):
    """A gradient contiguous in the caller's layout, as q is, reaches the dispatcher uncopied
    ([B, H, S, D] as a transposed view, like q, k and v); a broadcast one is made contiguous."""
    seen = record_backward_gradients(monkeypatch)
    q, k, v = leaves(heads_first)
    out = attention(q, k, v, heads_first=heads_first)
    grad = torch.randn(out.shape)  # contiguous as the caller has it (out itself is a view)
    out.backward(grad)
    assert seen[0].data_ptr() == grad.data_ptr()
    assert seen[0].shape == (1, 6, 4, 8)
    attention(q, k, v, heads_first=heads_first).sum().backward()
    assert seen[1].is_contiguous() and 0 not in seen[1].stride()


def test_a_bhsd_gradient_is_copied_to_the_layout_of_qs_memory(monkeypatch):
    """q, k, v as [B, H, S, D] views of [B, S, H, D] memory (Hugging Face's projections): a
    [B, H, S, D]-contiguous gradient is copied to [B, S, H, D], the layout of the rows q has."""
    seen = record_backward_gradients(monkeypatch)
    q, k, v = (t.detach().transpose(1, 2).requires_grad_(True) for t in leaves(False))
    out = attention(q, k, v, heads_first=True)
    grad = torch.randn(out.shape)
    out.backward(grad)
    assert seen[0].is_contiguous() and seen[0].data_ptr() != grad.data_ptr()
    torch.testing.assert_close(seen[0], grad.transpose(1, 2), rtol=0, atol=0)


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "bhsd"])
def test_gradients_laid_out_like_their_inputs_reach_the_leaves_uncopied(monkeypatch, heads_first):
    """A kernel that allocates dq, dk and dv like q, k and v (``empty_like``, as FA4 does) on
    inputs that are transposed views of the caller's leaves: each gradient becomes its leaf's
    ``.grad`` as it is, not copied to contiguous rows and then back by autograd."""
    returned = []
    dispatch = _autograd.dispatch

    def like_inputs(mode, tensors, *rest):
        result = dispatch(mode, tensors, *rest)
        if mode.kind != "backward":
            return result
        grads = [torch.empty_like(x).copy_(g) for x, g in zip(tensors[:3], result)]
        returned.extend(grads)
        return ad.Gradients(*grads)

    monkeypatch.setattr(_autograd, "dispatch", like_inputs)
    tensors = leaves(not heads_first)  # the other order: the call sees transposed views
    out = attention(*(t.transpose(1, 2) for t in tensors), heads_first=heads_first)
    grad = torch.randn(out.shape)
    out.backward(grad)
    for leaf, returned_grad in zip(tensors, returned):
        assert leaf.grad.data_ptr() == returned_grad.data_ptr()
    monkeypatch.setattr(_autograd, "dispatch", dispatch)
    want = [t.detach().clone().requires_grad_(True) for t in tensors]
    attention(*(t.transpose(1, 2) for t in want), heads_first=heads_first).backward(grad)
    for got, w in zip(tensors, want):
        torch.testing.assert_close(got.grad, w.grad, rtol=0, atol=0)


def record_backward_gradients(monkeypatch) -> list[torch.Tensor]:
    """The grad_out of every backward ``ad.attention``'s eager node dispatches, in order."""
    seen = []
    dispatch = _autograd.dispatch

    def recording(mode, tensors, *rest):
        if mode.kind == "backward":
            seen.append(tensors[-1])
        return dispatch(mode, tensors, *rest)

    monkeypatch.setattr(_autograd, "dispatch", recording)
    return seen


def test_eager_output_is_fresh_when_the_implementation_aliases(monkeypatch):
    """An implementation may return views of its inputs: the eager node hands out copies too."""
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    k, v = q[:, :, :1].detach().clone(), torch.randn(1, 4, 1, 8)

    def aliasing(mode, tensors, *_):
        q = tensors[0]
        if mode.kind == "forward":
            return q, q.new_zeros(q.shape[0], q.shape[2], q.shape[1])
        grads = ad.Gradients(q, tensors[1], tensors[2])
        return grads

    monkeypatch.setattr(_autograd, "dispatch", aliasing)
    out = ad.attention(q, k, v)
    assert out.is_contiguous()
    assert out.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    (dq,) = torch.autograd.grad(out, q, torch.ones_like(out))
    assert dq.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()


class _NoGradient(torch.autograd.Function):
    """The identity, passing no gradient back (as a branch autograd has nothing for)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def test_missing_output_gradient_gives_no_gradients(monkeypatch):
    """``set_materialize_grads(False)``: an output with no gradient dispatches no backward."""
    seen = []
    real = _autograd.dispatch

    def spy(mode, *args):
        seen.append(mode.kind)
        return real(mode, *args)

    monkeypatch.setattr(_autograd, "dispatch", spy)
    q, k, v = leaves()
    out = attention(q, k, v)
    (_NoGradient.apply(out).sum() + q.sum()).backward()
    assert seen == ["forward"]
    assert torch.equal(q.grad, torch.ones_like(q)) and k.grad is None


def test_compile_fullgraph_takes_both_operators():
    torch.compiler.reset()
    forward_graphs, backward_graphs = [], []

    def recorder(graphs):
        def compile_graph(gm, example_inputs):
            graphs.append([str(node.target) for node in gm.graph.nodes])
            return make_boxed_func(gm.forward)

        return compile_graph

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=recorder(forward_graphs), bw_compiler=recorder(backward_graphs)
    )
    compiled = torch.compile(attention, backend=backend, fullgraph=True)
    q, k, v = leaves()
    got = torch.autograd.grad(compiled(q, k, v).sum(), (q, k, v))
    want = torch.autograd.grad(attention(q, k, v).sum(), (q, k, v))
    assert any("attn_dispatch.fwd" in t for t in forward_graphs[0]), forward_graphs
    assert any("attn_dispatch.bwd" in t for t in backward_graphs[0]), backward_graphs
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.compiler.reset()


def test_compiled_autograd_traces_the_backward_operator():
    """An eager forward's backward run by compiled autograd: dynamo traces the node's backward,
    which takes the backward operator there; the gradients are the eager ones."""
    torch.compiler.reset()
    from torch._dynamo import compiled_autograd

    graphs = []

    def recording(gm, example_inputs):
        graphs.append([str(node.target) for node in gm.graph.nodes])
        return gm.forward

    q, k, v = leaves(heads_first=True)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(attention(q, k, v, heads_first=True), (q, k, v), grad_out)
    out = attention(q, k, v, heads_first=True)
    assert type(eager_node(out)) is _autograd._EAGER_NODE
    with compiled_autograd._enable(torch.compile(backend=recording, fullgraph=True)):
        out.backward(grad_out)
    assert any("attn_dispatch.bwd" in t for graph in graphs for t in graph), graphs
    for got, w in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, w)
    torch.compiler.reset()


def test_fake_tensors_take_the_operators(op_calls):
    with FakeTensorMode():
        q, k, v = leaves()
        out = attention(q, k, v)
        out.sum().backward()
        shapes = [tuple(t.grad.shape) for t in (q, k, v)]
    assert op_calls == ["_fwd", "_bwd"]
    assert tuple(out.shape) == tuple(q.shape) and shapes == [tuple(t.shape) for t in (q, k, v)]


def test_meta_tensors_take_the_operators(op_calls):
    q, k, v = (t.detach().to("meta").requires_grad_(True) for t in leaves())
    out = attention(q, k, v)
    out.sum().backward()
    assert op_calls == ["_fwd", "_bwd"]
    assert out.device.type == "meta" and q.grad.shape == q.shape


def test_subclass_tensors_take_the_operators(op_calls):
    """A tensor subclass (here a plain Python one) may carry a dispatch of its own."""

    class Tagged(torch.Tensor):
        pass

    q, k, v = (t.detach().as_subclass(Tagged).requires_grad_(True) for t in leaves())
    attention(q, k, v).sum().backward()
    assert op_calls == ["_fwd", "_bwd"]


def test_make_fx_traces_the_operators():
    from torch.fx.experimental.proxy_tensor import make_fx

    q, k, v = (t.detach() for t in leaves())
    graph = make_fx(lambda q, k, v: attention(q, k, v))(q, k, v)
    targets = [str(node.target) for node in graph.graph.nodes]
    assert any("attn_dispatch.fwd" in t for t in targets), targets


def test_export_keeps_the_operator():
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return attention(q, k, v)

    q, k, v = (t.detach() for t in leaves())
    program = torch.export.export(Attention(), (q, k, v))
    targets = [str(node.target) for node in program.graph.nodes]
    assert any("attn_dispatch.fwd" in t for t in targets), targets
    torch.testing.assert_close(program.module()(q, k, v), attention(q, k, v))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing_recomputes_the_eager_node(reentrant):
    """``torch.utils.checkpoint`` reruns the eager forward in the backward: same gradients."""
    from torch.utils.checkpoint import checkpoint

    q, k, v = leaves(heads_first=True)
    want = torch.autograd.grad(attention(q, k, v, heads_first=True).sum(), (q, k, v))
    out = checkpoint(attention, q, k, v, None, True, use_reentrant=reentrant)
    out.sum().backward()
    for got, w in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, w)


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "bhsd"])
def test_double_backward_is_refused_not_dropped(heads_first):
    """``create_graph=True``: the backward takes the operator, whose gradients carry a node that
    refuses a second differentiation; an eager gradient without a node would let a gradient
    penalty silently lose attention's share."""
    q, k, v = leaves(heads_first=heads_first)
    out = attention(q, k, v, heads_first=heads_first)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    assert dq.requires_grad
    with pytest.raises(RuntimeError, match="attn_dispatch.bwd"):
        dq.square().sum().backward()


# torch.func's first use scripts helpers of its own; torch 2.13 warns that torch.jit is deprecated
_TORCH_FUNC_IMPORT = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)


@_TORCH_FUNC_IMPORT
def test_vmap_maps_attention_over_a_leading_dimension():
    """torch.func.vmap takes the operators: each slice is the eager call on that slice."""
    q, k, v = (t.detach() for t in leaves())
    stacked = [torch.stack([t, 2 * t]) for t in (q, k, v)]
    got = torch.func.vmap(attention)(*stacked)
    for i in range(2):
        torch.testing.assert_close(got[i], attention(*(t[i] for t in stacked)))


@pytest.mark.parametrize(
    "transform, mode",
    [
        (lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),)), "forward-mode"),
        (lambda f, x: torch.func.jacfwd(f)(x), "forward-mode"),
        (lambda f, x: torch.func.grad(lambda y: f(y).sum())(x), "reverse-mode"),
        (lambda f, x: torch.func.vjp(f, x), "reverse-mode"),
        (lambda f, x: torch.func.vmap(torch.func.jacrev(f))(x[None]), "reverse-mode"),
    ],
    ids=["jvp", "jacfwd", "grad", "vjp", "vmap-jacrev"],
)
@_TORCH_FUNC_IMPORT
def test_torch_func_differentiation_is_refused_by_name(transform, mode):
    """No derivative formula runs under torch.func's differentiating transforms: forward mode
    would return a zero tangent, reverse mode fails inside PyTorch's own layers; the call says
    so and names torch.autograd, which differentiates it."""
    q, k, v = (t.detach() for t in leaves())
    with pytest.raises(NotImplementedError, match=f"{mode}.*torch.autograd"):
        transform(lambda x: attention(x, k, v), q)
