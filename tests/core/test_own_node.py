"""Eager ``ad.attention`` through an implementation's own autograd node
(``Implementation.autograd_forward``; the ``noded`` test plugins).

Where one implementation runs both passes of a dense signature, calls after the first record
that implementation's node instead of the library's Python one; everywhere else the library's
node stays. The gradients are the same either way.
"""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_test_plugins import noded
from noded_helpers import LIBRARY_NODE, NODED, expected, leaves, step

import attn_dispatch as ad
from attn_dispatch import _guards


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "bhsd"])
def test_calls_after_the_first_record_the_implementations_own_node(noded_env, heads_first):
    q, k, v = leaves(heads_first)
    grad = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(1))
    want = expected(q, k, v, grad, heads_first)
    nodes = []
    for _ in range(3):
        out, node, *grads = step(q, k, v, grad, heads_first)
        nodes.append(node)
        for got, ref in zip((out, *grads), want):
            torch.testing.assert_close(got, ref)
    assert nodes[0] == LIBRARY_NODE
    # torch's nodes of the plugin's operators on the caller's tensors, no view of the library's
    assert not {LIBRARY_NODE, "TransposeBackward0"} & set(nodes[1:]), nodes
    assert noded.RUNS == ["forward", "backward noded:oracle", "node", "node"]


def test_a_backward_decided_for_another_implementation_keeps_the_library_node(env):
    noded.RUNS.clear()
    env.set(**NODED)  # noded:backward ranks above noded:oracle, and has no forward
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    want = expected(q, k, v, grad, False)
    for _ in range(3):
        out, node, *grads = step(q, k, v, grad, False)
        assert node == LIBRARY_NODE
        for got, ref in zip((out, *grads), want):
            torch.testing.assert_close(got, ref)
    assert noded.RUNS == ["forward", "backward noded:backward"] * 3
    noded.RUNS.clear()


def test_a_backward_another_implementation_would_take_captured_keeps_the_own_node(noded_env):
    # noded:captured outranks noded:oracle under CUDA graphs only: an eager call's node is its
    # forward's implementation's where that would also run a captured backward
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    with ad.execution_mode("graph"):
        lse = torch.zeros(2, 4, 7, dtype=q.dtype)
        backward = ad.explain(q, k, v, q, lse, grad, causal=True)
    assert backward.selected == "noded:captured"
    nodes = [step(q, k, v, grad, False)[1] for _ in range(2)]
    assert nodes[0] == LIBRARY_NODE and nodes[1] != LIBRARY_NODE, nodes


def test_an_implementation_without_a_priority_under_graphs_keeps_the_library_node(
    noded_env, monkeypatch
):
    # a captured backward would never choose it there (noded:captured disabled too)
    noded_env.set(ATTN_DISPATCH_DISABLE="noded:backward,noded:captured")

    def eager_only(self, inp, arch, execution):
        return None if execution == "graph" else 50

    monkeypatch.setattr(noded.NodedOracle, "priority_for_execution", eager_only)
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    assert [step(q, k, v, grad, False)[1] for _ in range(3)] == [LIBRARY_NODE] * 3


def test_another_signature_gets_its_own_verdict(noded_env):
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    step(q, k, v, grad, False)
    step(q, k, v, grad, False)
    shorter = [t[:, :5].detach().requires_grad_() for t in (q, k, v)]
    step(*shorter, torch.ones(shorter[0].shape, dtype=q.dtype), False)
    step(*shorter, torch.ones(shorter[0].shape, dtype=q.dtype), False)
    assert noded.RUNS == ["forward", "backward noded:oracle", "node"] * 2


def _two_calls_per_length(q, k, v, lengths) -> None:
    for length in lengths:
        shorter = [t[:, :length].detach().requires_grad_() for t in (q, k, v)]
        grad = torch.ones(shorter[0].shape, dtype=q.dtype)
        step(*shorter, grad, False)
        step(*shorter, grad, False)


def test_signatures_beyond_the_guards_room_get_the_own_node_too(noded_env):
    # one flag combination has room for MAX_GUARDS_PER_FLAGS guards; later signatures keep
    # their verdicts under their dictionary keys
    q, k, v = leaves()
    lengths = range(7, 7 - _guards.MAX_GUARDS_PER_FLAGS - 2, -1)
    _two_calls_per_length(q, k, v, lengths)
    assert noded.RUNS == ["forward", "backward noded:oracle", "node"] * len(lengths)


def test_without_guards_the_own_node_is_kept_by_signature(noded_env, monkeypatch):
    monkeypatch.setattr(_guards, "_guard_class", lambda: None)
    q, k, v = leaves()
    _two_calls_per_length(q, k, v, (7, 5))
    assert noded.RUNS == ["forward", "backward noded:oracle", "node"] * 2


def test_which_inputs_require_grad_is_part_of_the_signature(noded_env, monkeypatch):
    monkeypatch.setattr(_guards, "_guard_class", lambda: None)  # the dictionary alone
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    step(q, k, v, grad, False)
    step(q, k, v, grad, False)
    fixed_q = q.detach()
    step(fixed_q, k, v, grad, False)
    step(fixed_q, k, v, grad, False)
    assert noded.RUNS == ["forward", "backward noded:oracle", "node"] * 2


def _offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """``t``'s values in memory ``elements`` further on (16 bytes for 2 float64)."""
    base = torch.empty(t.numel() + elements, dtype=t.dtype)
    moved = base[elements:].view(t.shape)
    return moved.copy_(t.detach()).requires_grad_()


def test_a_call_aligned_otherwise_than_the_first_keeps_the_library_node(noded_env):
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    step(q, k, v, grad, False)
    own = step(q, k, v, grad, False)
    moved = [_offset(t, 2) for t in (q, k, v)]  # aligned to 16 bytes, another residue
    assert moved[0].data_ptr() % 256 != q.data_ptr() % 256
    noded.RUNS.clear()
    other = step(*moved, grad, False)
    assert other[1] == LIBRARY_NODE
    assert noded.RUNS == ["forward", "backward noded:oracle"]
    for got, ref in zip((other[0], *other[2:]), (own[0], *own[2:])):
        torch.testing.assert_close(got, ref)


def test_a_scope_gets_its_own_verdict(noded_env):
    q, k, v = leaves()
    grad = torch.ones(q.shape, dtype=q.dtype)
    step(q, k, v, grad, False)
    with ad.use_backend("noded:oracle"):
        first = step(q, k, v, grad, False)
        later = step(q, k, v, grad, False)
    assert (first[1], later[1] != LIBRARY_NODE) == (LIBRARY_NODE, True)


def test_an_autograd_forward_that_raises_fails_the_call_naming_it(noded_env, monkeypatch):
    def broken(self, inp, layout):
        raise ZeroDivisionError("bug in autograd_forward (on purpose)")

    monkeypatch.setattr(noded.NodedOracle, "autograd_forward", broken)
    q, k, v = leaves()
    with pytest.raises(ZeroDivisionError) as raised:
        ad.attention(q, k, v, causal=True)
    assert "noded:oracle.autograd_forward" in str(raised.value.__notes__)


def test_calls_without_gradients_take_the_node_too(noded_env):
    q, k, v = (t.detach() for t in leaves())
    with torch.no_grad():
        outs = [ad.attention(q, k, v, causal=True) for _ in range(3)]
    assert noded.RUNS == ["forward", "node", "node"]
    torch.testing.assert_close(outs[0], outs[2])


def test_a_signature_the_implementation_declines_keeps_the_library_node(noded_env):
    q, k, v = leaves()
    for _ in range(3):
        out = ad.attention(q, k, v, causal=True, window=(3, 0))
        assert type(out.grad_fn).__name__ == LIBRARY_NODE
        out.sum().backward()
    assert "node" not in noded.RUNS
