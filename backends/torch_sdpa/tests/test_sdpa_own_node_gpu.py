"""``torch_sdpa:flash`` and ``torch_sdpa:cudnn`` through PyTorch's own autograd node of their
forward op (``autograd_forward``) on a CUDA GPU.

Eager ``ad.attention`` calls after a signature's first record the forward operator's node,
whose backward is PyTorch's; their output and gradients must be those of the library's node (the
first call) and of float32 math, for gradients of any layout.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from attn_dispatch_torch_sdpa import _common

import attn_dispatch as ad

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def own_node_on(isolated_plugins):
    """The own node on (whatever the torch release), nothing cached from earlier tests."""
    isolated_plugins.set(**{_common.OWN_NODE_VARIABLE: "1"})
    return isolated_plugins


def _nodes(out: torch.Tensor) -> set[str]:
    """The class names of the autograd nodes two steps below ``out``."""
    names, frontier = set(), [out.grad_fn]
    for _ in range(2):
        names |= {type(n).__name__ for n in frontier if n is not None}
        frontier = [n for f in frontier if f is not None for n, _ in f.next_functions]
    return names


FLASH_NODE = "FlashAttentionBackward0"
CUDNN_NODE = "ScaledDotProductCudnnAttentionBackward0"
#: the node each implementation's later calls record, per layout: flash's op's, or sdpa's own
#: on [B, H, S, D]; cuDNN's op in both
OWN_NODES = {
    "torch_sdpa:flash": {"bshd": FLASH_NODE, "bhsd": "ScaledDotProductFlashAttentionBackward0"},
    "torch_sdpa:cudnn": {"bshd": CUDNN_NODE, "bhsd": CUDNN_NODE},
}
ALL_OWN_NODES = {node for nodes in OWN_NODES.values() for node in nodes.values()}
IMPLEMENTATIONS = list(OWN_NODES)


def _step(q, k, v, grad, layout, backend="torch_sdpa:flash", **flags):
    for t in (q, k, v):
        t.grad = None
    out = ad.attention(q, k, v, layout=layout, backend=backend, **flags)
    nodes = _nodes(out)
    (out * grad).sum().backward() if grad is not None else out.sum().backward()
    return out.detach().float(), nodes, [t.grad.float() for t in (q, k, v)]


def _math(q, k, v, grad, layout, causal, scale=None):
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    views = leaves if layout == "bhsd" else [t.transpose(1, 2) for t in leaves]
    out = F.scaled_dot_product_attention(*views, is_causal=causal, scale=scale, enable_gqa=True)
    out = out if layout == "bhsd" else out.transpose(1, 2)
    (out * grad.float()).sum().backward() if grad is not None else out.sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got - want).norm() / want.norm().clamp_min(1e-6) < 1e-2
    assert (got - want).abs().max() < 3e-2 * want.abs().max().clamp_min(1.0)


@pytest.mark.parametrize("backend", IMPLEMENTATIONS)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize(
    "shape", [(1, 128, 32, 8, 128), (2, 77, 6, 2, 64)], ids=["llama-128", "odd-77"]
)
@pytest.mark.parametrize("grad_kind", ["random", "other-memory", "broadcast"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_calls_after_the_first_run_through_the_operators_own_node(
    backend, layout, shape, grad_kind, dtype, causal
):
    batch, seqlen, heads, kv_heads, d = shape
    gen = torch.Generator(device="cuda").manual_seed(seqlen)

    def leaf(h: int) -> torch.Tensor:
        dims = (batch, h, seqlen, d) if layout == "bhsd" else (batch, seqlen, h, d)
        t = torch.randn(dims, generator=gen, device="cuda", dtype=dtype)
        return t.requires_grad_()

    q, k, v = leaf(heads), leaf(kv_heads), leaf(kv_heads)
    grad = None if grad_kind == "broadcast" else torch.randn_like(q)
    if grad_kind == "other-memory":  # q's shape in the other order of memory
        grad = grad.transpose(1, 2).contiguous().transpose(1, 2)
    want_out, want_grads = _math(q, k, v, grad, layout, causal)
    first = _step(q, k, v, grad, layout, backend, causal=causal)
    later = [_step(q, k, v, grad, layout, backend, causal=causal) for _ in range(2)]
    assert not ALL_OWN_NODES & first[1]
    for out, _, grads in (first, *later):
        _close(out, want_out)
        for g, w in zip(grads, want_grads):
            _close(g, w)
    for _, nodes, _ in later:
        assert OWN_NODES[backend][layout] in nodes, nodes


@pytest.mark.parametrize("backend", IMPLEMENTATIONS)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_the_own_node_takes_the_call_s_scale(backend, layout):
    gen = torch.Generator(device="cuda").manual_seed(1)
    dims = (2, 4, 96, 64) if layout == "bhsd" else (2, 96, 4, 64)
    q, k, v = (
        torch.randn(dims, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    want_out, want_grads = _math(q, k, v, grad, layout, True, scale=0.3)
    for _ in range(2):
        out, nodes, grads = _step(q, k, v, grad, layout, backend, causal=True, scale=0.3)
    assert OWN_NODES[backend][layout] in nodes
    _close(out, want_out)
    for g, w in zip(grads, want_grads):
        _close(g, w)


def test_a_second_differentiation_through_the_own_node_raises():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(
            1, 64, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16
        ).requires_grad_()
        for _ in range(3)
    )
    for _ in range(2):
        out = ad.attention(q, k, v, causal=True, backend="torch_sdpa:flash")
    assert FLASH_NODE in _nodes(out)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="_flash_attention_backward"):
        dq.sum().backward()


def test_rows_that_see_no_key_keep_the_library_node():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 64, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = (
        torch.randn(1, 32, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(2)
    )
    for t in (q, k, v):
        t.requires_grad_()
    for _ in range(3):
        out = ad.attention(
            q, k, v, causal=True, causal_align="bottom_right", backend="torch_sdpa:flash"
        )
        assert not ALL_OWN_NODES & _nodes(out)
        out.sum().backward()


@pytest.mark.parametrize("q_memory", ["bshd", "bhsd"])
def test_cudnn_own_node_is_right_for_each_layout_of_its_gradient_in_turn(q_memory):
    # PyTorch keeps one cuDNN backward graph per layout of q, k and v, which fixes O's and dO's
    # (benchmarks.md section 9): every layout of dO in turn on one q, k, v, through the own
    # node in both layouts and the library's backward between them, at a shape no other test
    # runs
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, seqlen, heads, kv_heads, d = 1, 152, 12, 4, 96
    rows = (batch, seqlen, heads, d)

    def tensor(h: int) -> torch.Tensor:
        shape = (batch, seqlen, h, d) if q_memory == "bshd" else (batch, h, seqlen, d)
        t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
        return (t if q_memory == "bshd" else t.transpose(1, 2)).requires_grad_()

    def gradient(kind: str) -> torch.Tensor:
        if kind == "broadcast":
            return torch.ones((), device="cuda", dtype=torch.bfloat16).expand(rows)
        if kind == "sliced":  # a view into wider rows
            wide = torch.randn(batch, seqlen, heads, 2 * d, generator=gen, device="cuda")
            return wide.to(torch.bfloat16)[..., :d]
        t = torch.randn(rows, generator=gen, device="cuda", dtype=torch.bfloat16)
        return t if kind == "bshd" else t.transpose(1, 2).contiguous().transpose(1, 2)

    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    leaves = [t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    math = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
    kinds = ("bshd", "bhsd", "broadcast", "sliced")
    paths = ("bshd", "bhsd", "library")
    for path, kind in itertools.product(paths, kinds):
        if path == "library" and kind == "broadcast":
            continue  # ad.backward takes no gradient without a contiguous last dim
        grad = gradient(kind)
        for t in leaves:
            t.grad = None
        math.backward(grad.float().transpose(1, 2), retain_graph=True)
        wants = [t.grad.transpose(1, 2) for t in leaves]
        if path == "library":
            with torch.no_grad():
                out, lse = ad.forward(q, k, v, causal=True, backend="torch_sdpa:cudnn")
            got = ad.backward(q, k, v, out, lse, grad, causal=True, backend="torch_sdpa:cudnn")
        else:
            given = (q, k, v) if path == "bshd" else tuple(t.transpose(1, 2) for t in (q, k, v))
            for _ in range(2):  # the signature's first call runs the library's node
                out = ad.attention(*given, layout=path, backend="torch_sdpa:cudnn", causal=True)
            assert CUDNN_NODE in _nodes(out), _nodes(out)
            for t in (q, k, v):
                t.grad = None
            (out if path == "bshd" else out.transpose(1, 2)).backward(grad)
            got = [t.grad for t in (q, k, v)]
        for name, g, want in zip(("dq", "dk", "dv"), got, wants, strict=True):
            error = ((g.float() - want).norm() / want.norm()).item()
            assert error < 1e-2, (name, path, kind, error)
