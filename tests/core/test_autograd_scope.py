"""The scope of ``ad.attention``'s backward: the one its forward ran in.

``use_backend`` and ``execution_mode`` are context variables. Autograd runs a CUDA backward on a
device thread of its own, whose context has none of the caller's variables; on the CPU the same
is reproduced by running the backward in a fresh ``contextvars.Context()``. The toy backends
fill every output with their tag, so a gradient says which implementation computed it.
"""

from __future__ import annotations

import contextvars

import pytest
import torch
from dispatch_helpers import toy_leaves, toy_tag

import attn_dispatch as ad

FAST, SLOW, NONDET, GRAPH_ONLY = 1.0, 2.0, 3.0, 7.0


def in_fresh_context(fn) -> None:
    """``fn()`` with none of the caller's context variables, as autograd's device thread."""
    contextvars.Context().run(fn)


def test_backward_outside_the_forced_scope_runs_the_forced_backend(toy_backends):
    q, k, v = toy_leaves()
    with ad.use_backend("toy:slow"):
        out = ad.attention(q, k, v)
    assert toy_tag(out) == SLOW
    in_fresh_context(out.sum().backward)
    assert toy_tag(q.grad) == toy_tag(k.grad) == toy_tag(v.grad) == SLOW


def test_backward_in_another_scope_keeps_the_forwards(toy_backends):
    """The scope is the forward's, in whatever scope the backward runs: a forward outside any
    ``use_backend`` has its backward chosen automatically, even inside one."""
    q, k, v = toy_leaves()
    out = ad.attention(q, k, v)
    with ad.use_backend("toy:slow"):
        out.sum().backward()
    assert toy_tag(q.grad) == NONDET  # toy:nondet ranks first on the CPU
    with ad.use_backend("toy:fast"):
        out = ad.attention(q, k, v)
    with ad.use_backend("toy:slow"):
        out.sum().backward()
    assert toy_tag(q.grad) == NONDET + FAST  # accumulated onto the first gradient


def test_backward_of_a_graph_warm_up_decides_as_graph(toy_backends):
    """A warm-up under ``execution_mode("graph")`` makes the decisions its capture reuses: the
    backward's too, wherever autograd runs it."""
    q, k, v = toy_leaves()
    with ad.execution_mode("graph"):
        out = ad.attention(q, k, v)
    assert toy_tag(out) == GRAPH_ONLY
    in_fresh_context(out.sum().backward)
    assert toy_tag(q.grad) == GRAPH_ONLY


def test_backward_in_the_forwards_scope_sees_it_unchanged(toy_backends):
    q, k, v = toy_leaves()
    with ad.use_backend("toy:slow"), ad.execution_mode("eager"):
        ad.attention(q, k, v).sum().backward()
        assert ad._settings.forced_var.get() == "toy:slow"
    assert toy_tag(q.grad) == SLOW
    assert ad._settings.forced_var.get() is None and ad._execution._declared.get() is None


def test_backward_argument_still_beats_the_scope(toy_backends):
    q, k, v = toy_leaves()
    with ad.use_backend("toy:slow"):
        out = ad.attention(q, k, v, backend="toy:fast")
    in_fresh_context(out.sum().backward)
    assert toy_tag(q.grad) == FAST


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_cuda_backward_runs_in_the_forwards_scope(env, monkeypatch):
    """On a GPU autograd runs the backward on its device thread: the forced backend and the
    declared mode must reach it all the same."""
    env.unset("ATTN_DISPATCH_TEST_PLUGINS", "ATTN_DISPATCH_PLUGINS")  # the GPU's own backends
    seen = []
    original = ad._autograd.of_schema

    def spying(*args, **kwargs):  # the Call each pass dispatches with, as its operator built it
        call = original(*args, **kwargs)
        seen.append((call.kind, call.backend, call.execution))
        return call

    monkeypatch.setattr(ad._autograd, "of_schema", spying)
    q, k, v = (
        torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    with ad.use_backend("torch_sdpa"), ad.execution_mode("graph"):
        out = ad.attention(q, k, v, causal=True)
    out.float().sum().backward()  # outside the block, on autograd's CUDA device thread
    torch.cuda.synchronize()
    assert seen == [("forward", "torch_sdpa", "graph"), ("backward", "torch_sdpa", "graph")]
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_context_parallel_local_attention_backward_keeps_its_forwards_scope(toy_backends):
    """The head-sharded attention of ``strategy="ulysses"`` (one rank's part, no communication)
    follows the same rule as ``ad.attention``."""
    from attn_dispatch.distributed._ulysses import LocalAttention

    q, k, v = toy_leaves()
    with ad.use_backend("toy:slow"):
        out = LocalAttention.apply(q, k, v, {"causal": False})
    in_fresh_context(out.sum().backward)
    assert toy_tag(q.grad) == SLOW
