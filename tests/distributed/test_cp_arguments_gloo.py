"""Context parallelism's argument checks on a real gloo group of 2 CPU ranks (loopback only).

Arguments are validated as ``attn_dispatch.attention`` validates them, with the same messages;
ranks called with different shapes or flags raise the same ``ValueError`` on every rank (one
small all-gather the first time a call is seen, none after). Each rank writes what it observed
to a JSON file and the assertions run here, so a failed check never leaves a peer waiting.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_group import message, spawn_group

import attn_dispatch as ad
import attn_dispatch.distributed as cp
from attn_dispatch.distributed import _agreement

WORLD = 2
SHAPE = (1, 4, 2, 8)  # [B, S/W, H, D]: zigzag chunks of 2 tokens


def _message(fn) -> str:
    return message(fn, errors=(ValueError, TypeError, RuntimeError))


def _shards(rank: int, dtype=torch.float64, length: int = SHAPE[1]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    return [torch.randn(*SHAPE[:1], length, *SHAPE[2:], generator=gen, dtype=dtype)] * 3


# Calls whose arguments each rank validates alone: the same bad value on every rank.
BAD_ARGUMENTS = {
    "scale_bool": dict(scale=True),
    "scale_str": dict(scale="0.5"),
    "scale_negative": dict(scale=-1.0),
    "scale_nan": dict(scale=float("nan")),
    "causal_str": dict(causal="yes"),
    "softcap_str": dict(softcap="1.0"),
    "window_bool_side": dict(strategy="ulysses", window=(True, 0)),
    "q_list": dict(q=[[0.0]]),
    "q_sparse": dict(q=torch.zeros(*SHAPE, dtype=torch.float64).to_sparse()),
}

# Calls where rank 1 differs from rank 0: (rank 0's arguments, rank 1's arguments).
DIFFERENT = {
    "causal": (dict(causal=True), dict(causal=False)),
    "shape": (dict(), dict(length=6)),
    "dtype": (dict(), dict(dtype=torch.float32)),
    "scale": (dict(scale=0.5), dict(scale=0.25)),
    "scale_bad_on_one_rank": (dict(), dict(scale=True)),
    "softcap": (dict(softcap=2.0), dict()),
    "window": (
        dict(strategy="ulysses", window=(2, 0)),
        dict(strategy="ulysses", window=(3, 0)),
    ),
    "strategy": (dict(strategy="ring"), dict(strategy="ulysses")),
    "load_balance": (dict(), dict(load_balance="contiguous")),
    "backward": (dict(grad=True), dict()),
    "backend": (dict(backend="reference"), dict()),
}


def _call(rank: int, length: int = SHAPE[1], dtype=torch.float64, grad=False, q=None, **flags):
    q_, k, v = (t.clone().requires_grad_(grad) for t in _shards(rank, dtype, length))
    q = q_ if q is None else q
    out = cp.context_parallel_attention(q, k, v, **flags)
    if grad:
        out.sum().backward()
    return out


class _CountingAllGather:
    """Counts the agreement's all-gathers (the real collective still runs)."""

    def __init__(self):
        self.calls = 0
        self.real = _agreement.dist.all_gather

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


def _rank_body(rank: int, result: dict) -> None:
    """Every refusal on this rank, then the agreement's traffic and a call that still works."""
    result["bad"] = {
        name: _message(lambda kw=kw: _call(rank, **kw)) for name, kw in BAD_ARGUMENTS.items()
    }
    result["different"] = {
        name: _message(lambda kws=kws: _call(rank, **kws[rank])) for name, kws in DIFFERENT.items()
    }
    x = torch.zeros(1, 4 + 2 * rank, 2)
    result["unshard_different"] = _message(lambda: cp.unshard_sequence(x))
    result["group_type"] = _message(lambda: _call(rank, group=3))
    only_rank0 = dist.new_group(ranks=[0])
    result["group_member"] = _message(lambda: _call(rank, group=only_rank0))
    # agreed calls communicate nothing extra; a new call is compared once
    counting = _CountingAllGather()
    _agreement.dist.all_gather = counting
    try:
        counts = []
        for flags in (dict(causal=True), dict(causal=True), dict(), dict(causal=True)):
            before = counting.calls
            _call(rank, **flags)
            counts.append(counting.calls - before)
        result["agreement_gathers"] = counts
    finally:
        _agreement.dist.all_gather = counting.real
    # the group is still usable after every refusal above
    out = _call(rank, causal=True)
    result["after"] = float(out.abs().sum())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn_group(_rank_body, WORLD, tmp_path_factory.mktemp("cp_arguments"))


@pytest.mark.parametrize("name", list(BAD_ARGUMENTS))
def test_arguments_are_refused_as_attention_refuses_them(ranks, name):
    kw = {k: v for k, v in BAD_ARGUMENTS[name].items() if k != "strategy"}
    k = torch.randn(*SHAPE, dtype=torch.float64)
    q = kw.pop("q", k)
    # a q that is no tensor never reaches ad.attention's own checks (the operator's schema
    # casts it first); ad.forward's check is the core's message for it
    core = ad.attention if q is k else ad.forward
    want = _message(lambda: core(q, k, k, **kw))
    assert want.startswith(("TypeError", "ValueError")), want
    for res in ranks:
        assert res["bad"][name] == want


@pytest.mark.parametrize("name", list(DIFFERENT))
def test_ranks_called_differently_raise_on_every_rank(ranks, name):
    field = {"shape": "q", "dtype": "q", "scale_bad_on_one_rank": "scale"}.get(name, name)
    if name == "backward":
        field = "records a backward"
    for rank, res in enumerate(ranks):
        got = res["different"][name]
        assert got.startswith("ValueError: context_parallel_attention: the ranks"), (rank, got)
        assert f"{field} (rank 0: " in got and "rank 1: " in got, (rank, got)


def test_unshard_with_different_shard_shapes_raises_on_every_rank(ranks):
    for res in ranks:
        got = res["unshard_different"]
        assert got.startswith("ValueError: unshard_sequence: the ranks"), got
        assert "x (rank 0: tensor (1, 4, 2) torch.float32 on cpu" in got, got
        assert "rank 1: tensor (1, 6, 2)" in got, got


def test_group_that_is_not_a_process_group_is_refused(ranks):
    for res in ranks:
        assert res["group_type"].startswith("TypeError: argument 'group'"), res["group_type"]
    # rank 1 is outside new_group([0]); rank 0 alone forms a group of one and computes
    assert ranks[0]["group_member"] == "no error"
    assert ranks[1]["group_member"].startswith("ValueError: argument 'group'")
    assert "not a member" in ranks[1]["group_member"]


def test_agreement_costs_one_all_gather_per_new_call(ranks):
    for res in ranks:
        assert res["agreement_gathers"] == [1, 0, 1, 0]
        assert res["after"] > 0


def test_uninitialised_torch_distributed_is_named_with_the_fix():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    q = torch.randn(*SHAPE)
    calls = {
        "context_parallel_attention": lambda: cp.context_parallel_attention(q, q, q),
        "shard_sequence": lambda: cp.shard_sequence(q),
        "unshard_sequence": lambda: cp.unshard_sequence(q),
        "explain": lambda: cp.explain(q, q, q),
    }
    for name, call in calls.items():
        got = _message(call)
        assert got.startswith("RuntimeError: torch.distributed is not initialised"), (name, got)
        assert "init_process_group" in got, (name, got)
