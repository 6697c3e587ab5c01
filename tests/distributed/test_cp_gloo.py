"""Context parallelism on real gloo process groups of 2, 3 and 4 CPU ranks (loopback only).

One spawned group per world size runs every case, and each rank writes what it measured to a
JSON file; the assertions run here in the parent, so a failed check never leaves a peer waiting
in a collective. Every case compares the forward shard and the q/k/v gradient shards with the
single-process attention on the full sequence (same inputs, same backend); with attention
sinks, the sinks' gradient summed over the group too (each rank holds its share).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import pytest
import torch
import torch.distributed as dist
from gloo_group import message, spawn_group

import attn_dispatch as ad
import attn_dispatch.distributed as cp

TOL = {"float64": 1e-10, "float32": 1e-5}
WORLDS = (2, 3, 4)


@dataclass(frozen=True)
class Case:
    strategy: str
    load_balance: str
    causal: bool
    dtype: str
    heads: int
    kv_heads: int
    chunk: int = 3  # tokens per layout chunk: S = 2W·chunk (zigzag) or W·chunk (contiguous)
    head_dim_v: int = 8
    scale: float | None = None
    backend: str | None = None  # forced by backend= ...
    scoped: str | None = None  # ... or by use_backend()
    repeat_kv: int = 1  # Ulysses with few kv heads: the caller repeats k/v to W heads
    packed_kv: bool = False  # k and v are strided views of one [.., 2·Hkv, D] tensor
    window: tuple[int | None, int | None] | None = None  # (Ulysses only)
    softcap: float | None = None
    sinks: bool = False

    @property
    def name(self) -> str:
        return "-".join(f"{k}={v}" for k, v in asdict(self).items() if v != DEFAULTS.get(k))


DEFAULTS = {"chunk": 3, "head_dim_v": 8, "scale": None, "backend": None, "scoped": None}
DEFAULTS |= {"repeat_kv": 1, "packed_kv": False, "window": None, "softcap": None}
DEFAULTS |= {"sinks": False}
# The variants in the default suite at every W: a soft cap around the ring, and Ulysses with a
# window on the zigzag layout (reordered to global positions), causal or two-sided, capped too.
VARIANT_CASES = [
    dict(strategy="ring", load_balance="zigzag", causal=True, softcap=1.5),
    dict(strategy="ring", load_balance="contiguous", causal=False, softcap=0.7),
    dict(strategy="ulysses", load_balance="zigzag", causal=True, window=(4, None)),
    dict(strategy="ulysses", load_balance="zigzag", causal=False, window=(3, 2), softcap=2.0),
    dict(strategy="ulysses", load_balance="contiguous", causal=False, window=(None, 1)),
    # attention sinks: each row's softmax counts its sink once, merged by the ring after its
    # last step, per head group with Ulysses
    dict(strategy="ring", load_balance="zigzag", causal=True, sinks=True),
    dict(strategy="ring", load_balance="contiguous", causal=False, softcap=1.5, sinks=True),
    dict(strategy="ulysses", load_balance="zigzag", causal=True, window=(4, None), sinks=True),
    dict(strategy="ulysses", load_balance="contiguous", causal=False, sinks=True),
]


def cases(world: int, full: bool) -> list[Case]:
    """The whole matrix where ``full`` (default suite: W=2 only), else a cross-section of it."""
    out = [
        Case(strategy, lb, causal, dtype, heads=2 * world, kv_heads=world)
        for strategy in ("ring", "ulysses")
        for lb in ("zigzag", "contiguous")
        for causal in (False, True)
        for dtype in ("float64", "float32")
    ]
    out += [Case(**v, dtype="float64", heads=2 * world, kv_heads=world) for v in VARIANT_CASES]
    if not full:
        return [
            c
            for c in out
            if (c.dtype == "float64") == (c.causal == (c.load_balance == "zigzag"))
            or c.window is not None
            or c.softcap is not None
            or c.sinks
        ]
    out += [
        Case("ring", "zigzag", True, "float64", heads=3, kv_heads=1),  # MQA, odd H
        Case("ring", "contiguous", True, "float64", heads=4, kv_heads=2, head_dim_v=12),
        Case("ring", "zigzag", True, "float64", heads=2, kv_heads=2, chunk=1),  # 1-token chunks
        Case(
            "ring", "zigzag", True, "float32", heads=2, kv_heads=1, scale=0.3, backend="reference"
        ),
        Case("ulysses", "zigzag", True, "float64", heads=world, kv_heads=1, repeat_kv=world),
        Case("ring", "zigzag", True, "float64", 2 * world, world, packed_kv=True),
        Case("ulysses", "zigzag", True, "float64", 2 * world, world, packed_kv=True),
        Case("ulysses", "zigzag", True, "float32", 2 * world, world, chunk=2, scoped="reference"),
    ]
    return out


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach() - want).abs().max() / want.abs().max())


def run_case(case: Case, seed: int) -> dict[str, float]:
    """Max relative errors (out, dq, dk, dv, unshard) of this rank against the full computation."""
    world = dist.get_world_size()
    dtype = getattr(torch, case.dtype)
    seqlen = (2 if case.load_balance == "zigzag" else 1) * world * case.chunk
    gen = torch.Generator().manual_seed(seed)
    b, d = 2, 8

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q = rand(b, seqlen, case.heads, d)
    k = rand(b, seqlen, case.kv_heads, d)
    v = rand(b, seqlen, case.kv_heads, case.head_dim_v)
    dout = rand(b, seqlen, case.heads, case.head_dim_v)
    flags = {"causal": case.causal, "scale": case.scale, "softcap": case.softcap}
    flags["window"] = case.window
    sinks = rand(case.heads) if case.sinks else None

    # The single-process computation on the full sequence: what ad.attention runs, called
    # directly (ad.attention's custom operator would import torch._dynamo in every rank).
    with ad.use_backend(case.scoped) if case.scoped else _nothing():
        want, lse = ad.forward(q, k, v, **flags, backend=case.backend, sinks=sinks)
        full_grads = ad.backward(
            q, k, v, want, lse, dout, **flags, backend=case.backend, sinks=sinks
        )

    def shard(t: torch.Tensor) -> torch.Tensor:
        return cp.shard_sequence(t, load_balance=case.load_balance)

    local = [shard(t).detach().requires_grad_() for t in (q, k, v)]
    lk, lv = local[1:]
    if case.packed_kv:
        lk, lv = torch.cat([lk, lv], dim=2).split(case.kv_heads, dim=2)
        assert not lk.is_contiguous()
    if case.repeat_kv > 1:
        lk, lv = (t.repeat_interleave(case.repeat_kv, dim=2) for t in (lk, lv))
    call = {"strategy": case.strategy, "load_balance": case.load_balance, "backend": case.backend}
    if sinks is not None:
        call["sinks"] = local_sinks = sinks.clone().requires_grad_()
    with ad.use_backend(case.scoped) if case.scoped else _nothing():
        got = cp.context_parallel_attention(local[0], lk, lv, **flags, **call)
        got.backward(shard(dout))
    gathered = cp.unshard_sequence(got.detach(), load_balance=case.load_balance)
    errs = {"out": _rel_err(got, shard(want)), "unshard": _rel_err(gathered, want)}
    for name, mine, ref in zip(("dq", "dk", "dv"), local, full_grads):
        errs[name] = _rel_err(mine.grad, shard(ref))
    if sinks is not None:
        dsinks = local_sinks.grad.clone()
        dist.all_reduce(dsinks)  # each rank's share of the whole sequence's gradient
        errs["dsinks"] = _rel_err(dsinks, full_grads.dsinks)
    return errs


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def error_cases(world: int) -> dict[str, str]:
    """What each misuse raises (all local checks, except the forced backend, raised everywhere)."""
    x = torch.randn(1, 2 * world + 1, 2, 4)
    odd = x[:, : 2 * world - 1]  # a zigzag shard needs an even length
    heads = torch.randn(1, 2, world + 1, 4)
    shard = torch.randn(1, 2, world, 4)
    return {
        "shard_uneven_zigzag": message(lambda: cp.shard_sequence(x)),
        "shard_uneven_contiguous": message(
            lambda: cp.shard_sequence(x[:, : world + 1], load_balance="contiguous")
        ),
        "attention_uneven_zigzag": message(lambda: cp.context_parallel_attention(odd, odd, odd)),
        "ulysses_heads": message(
            lambda: cp.context_parallel_attention(heads, heads, heads, strategy="ulysses")
        ),
        "ulysses_kv_heads": message(
            lambda: cp.context_parallel_attention(
                shard, shard[:, :, :1], shard[:, :, :1], strategy="ulysses"
            )
        ),
        "bad_strategy": message(lambda: cp.context_parallel_attention(x, x, x, strategy="tree")),
        "ring_window": message(
            lambda: cp.context_parallel_attention(shard, shard, shard, window=(2, 0))
        ),
        "bad_softcap": message(
            lambda: cp.context_parallel_attention(shard, shard, shard, softcap=-1.0)
        ),
        "bad_sinks": message(
            lambda: cp.context_parallel_attention(shard, shard, shard, sinks=torch.zeros(world + 1))
        ),
        "bad_window": message(
            lambda: cp.context_parallel_attention(
                shard, shard, shard, strategy="ulysses", window=(-1, 0)
            )
        ),
        "forced_backend_ring": message(
            lambda: cp.context_parallel_attention(shard, shard, shard, backend="torch_sdpa")
        ),
        "forced_backend_ulysses": message(
            lambda: cp.context_parallel_attention(
                shard, shard, shard, strategy="ulysses", backend="torch_sdpa"
            )
        ),
    }


def explain_labels(world: int) -> list[str]:
    q = cp.shard_sequence(torch.randn(1, 4 * world, 2, 8))
    return [
        f"{label} -> {report.selected}"
        for label, report in cp.explain(q, q, q, causal=True, backend="reference")
    ]


def _rank_body(rank: int, result: dict, world: int, full: bool) -> None:
    """The misuse errors, every case of the matrix, and explain's labels on this rank."""
    result["cases"] = {}
    result["errors"] = error_cases(world)
    for i, case in enumerate(cases(world, full)):
        result["cases"][case.name] = run_case(case, seed=1000 * world + i)
    # the group is still usable after the forced-backend failures above: rerun the first case
    after = Case("ring", "zigzag", True, "float64", heads=2 * world, kv_heads=world)
    result["after_errors"] = run_case(after, seed=7)
    result["explain"] = explain_labels(world)


_RUNS: dict[tuple[int, bool], list[dict]] = {}


def run_group(world: int, tmp_path_factory, full: bool | None = None) -> list[dict]:
    """Spawn the group once per world size and matrix; every test of it reads the same results."""
    full = world == 2 if full is None else full
    if (world, full) not in _RUNS:
        out_dir = tmp_path_factory.mktemp(f"cp{world}")
        env = {"OMP_NUM_THREADS": "1"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            _RUNS[world, full] = spawn_group(_rank_body, world, out_dir, world, full)
        finally:
            for k, val in old.items():
                if val is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = val
    return _RUNS[world, full]


def _params():
    for w in WORLDS:
        yield from (pytest.param(w, False, c, id=f"W{w}-{c.name}") for c in cases(w, w == 2))
        if w != 2:  # the rest of the matrix, in its own group
            default = {c.name for c in cases(w, False)}
            yield from (
                pytest.param(w, True, c, id=f"W{w}-full-{c.name}", marks=pytest.mark.slow)
                for c in cases(w, True)
                if c.name not in default
            )


@pytest.mark.parametrize(("world", "full", "case"), list(_params()))
def test_matches_single_process_attention(world, full, case, tmp_path_factory):
    tol = TOL[case.dtype]
    for rank, res in enumerate(run_group(world, tmp_path_factory, full or None)):
        errs = res["cases"][case.name]
        bad = {k: e for k, e in errs.items() if not e <= tol}
        assert not bad, f"rank {rank} of {world}: {bad} > {tol}"


@pytest.mark.parametrize("world", WORLDS)
def test_misuse_raises_named_errors(world, tmp_path_factory):
    for res in run_group(world, tmp_path_factory):
        errors = res["errors"]
        s = 2 * world + 1
        assert errors["shard_uneven_zigzag"].startswith("ValueError"), errors
        assert f"S={s}" in errors["shard_uneven_zigzag"]
        assert f"W={world}" in errors["shard_uneven_zigzag"]
        assert f"2W = {2 * world}" in errors["shard_uneven_zigzag"]
        assert f"S={world + 1} does not divide over W={world}" in errors["shard_uneven_contiguous"]
        assert f"S={world * (2 * world - 1)}" in errors["attention_uneven_zigzag"]
        assert "H=" in errors["ulysses_heads"] and f"W={world}" in errors["ulysses_heads"]
        assert "Hkv=1" in errors["ulysses_kv_heads"] and "ring" in errors["ulysses_kv_heads"]
        assert errors["bad_strategy"].startswith("ValueError: argument 'strategy'")
        assert errors["ring_window"].startswith("ValueError: argument 'window'")
        assert "strategy='ulysses'" in errors["ring_window"]
        assert errors["bad_softcap"].startswith("ValueError") and "softcap" in errors["bad_softcap"]
        assert errors["bad_window"].startswith("ValueError") and "window" in errors["bad_window"]
        want = f"ValueError: argument 'sinks': expected shape ({world},)"
        assert errors["bad_sinks"].startswith(want), errors["bad_sinks"]
        for key in ("forced_backend_ring", "forced_backend_ulysses"):
            assert errors[key].startswith("NoBackendError") and "torch_sdpa" in errors[key]
        assert all(e <= TOL["float64"] for e in res["after_errors"].values()), res["after_errors"]


@pytest.mark.parametrize("world", WORLDS)
def test_explain_lists_each_distinct_block_call(world, tmp_path_factory):
    for rank, res in enumerate(run_group(world, tmp_path_factory)):
        labels = res["explain"]
        assert all(label.endswith("-> reference:chunked") for label in labels), labels
        # own shard: one causal square block; then half-shard blocks by zigzag position
        assert any("ring steps [0]: Sq=4 Sk=4 causal=True forward" in x for x in labels), labels
        if rank > 0:
            assert any("Sq=4 Sk=2 causal=False" in x for x in labels), labels
        if rank < world - 1:
            assert any("Sq=2 Sk=4 causal=False" in x for x in labels), labels
