"""``torch.compile`` and the execution mode: a compiled program decides its calls when it runs,
as eager calls (each pays its host cost), and ``ad.explain`` says so. Only a CUDA graph capture
(or ``execution_mode("graph")``) makes a graph call."""

from __future__ import annotations

import torch
from dispatch_helpers import toy_leaves, toy_tag

import attn_dispatch as ad

NONDET, GRAPH_ONLY = 3.0, 7.0


TAGS = {"toy:nondet": NONDET, "toy:graph_only": GRAPH_ONLY}


def test_compiled_attention_runs_what_explain_says(toy_backends):
    torch.compiler.reset()
    q, k, v = toy_leaves()

    compiled = torch.compile(ad.attention, backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v)  # its backward is compiled too
    out.sum().backward()
    dq = q.grad
    forward = ad.explain(q, k, v)
    backward = ad.explain(q, k, v, out.detach(), out.detach()[..., 0].transpose(1, 2), out)
    assert forward.execution == backward.execution == "eager"
    assert toy_tag(out) == TAGS[forward.selected] == NONDET
    assert toy_tag(dq) == TAGS[backward.selected] == NONDET
    assert ad.explain(q, k, v, execution="graph").selected == "toy:graph_only"  # captured only


def test_tracing_is_no_graph_execution(toy_backends, monkeypatch):
    """While torch.compile traces, a call's mode stays eager: no dispatch made then is what the
    compiled program runs (it dispatches when it runs)."""
    inputs = [t.detach() for t in toy_leaves()]
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True, raising=False)
    assert torch.compiler.is_compiling()
    assert ad.explain(*inputs).execution == "eager"
    assert toy_tag(ad.forward(*inputs)[0]) == NONDET
