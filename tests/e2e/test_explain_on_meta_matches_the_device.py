"""``explain`` on meta tensors, with this device's arch, chooses what the dispatcher runs on the
device: at every shape ``benchmarks/cost_grid.py evaluate`` times (the 20 seed shapes and the
held-out model shapes), forward and backward, eager and in graph mode, autotune off. The cost
tables' predictions read only shapes and flags (``attn_dispatch._costs``), and so must every
verdict that decides these shapes; a verdict that reads the device (its capability, a tensor's
alignment) and answers otherwise on meta would make ``attn-dispatch explain --arch`` wrong.

On a CPU the meta half runs alone: every shape is decided on sm_90 by a GPU implementation, and
``decide`` (the dispatcher's selection) agrees with ``explain``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch.tools import grid

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
EXECUTIONS = ("eager", "graph")


def _cost_grid():
    """benchmarks/cost_grid.py as a module (it imports its neighbour ``_provenance``)."""
    if "cost_grid" in sys.modules:
        return sys.modules["cost_grid"]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("cost_grid", BENCHMARKS / "cost_grid.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["cost_grid"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


SHAPES = _cost_grid().evaluated_shapes()
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")


def meta_choice(point: grid.Point, kind: str, arch: str, execution: str) -> ad.Report:
    args, flags = grid.meta_call(point, kind)
    return ad.explain(*args, **flags, arch=arch, execution=execution)


@pytest.mark.parametrize("point", SHAPES, ids=lambda p: p.label)
def test_meta_explain_decides_every_evaluated_shape_on_sm_90(env, tmp_path, point) -> None:
    env.set(ATTN_DISPATCH_CACHE_DIR=str(tmp_path))  # the shipped tables, not a user's own
    for kind in grid.KINDS:
        for execution in EXECUTIONS:
            report = meta_choice(point, kind, "sm_90", execution)
            assert report.selected is not None, str(report)
            assert not report.selected.startswith("reference:"), str(report)
            args, flags = grid.meta_call(point, kind)
            args = args if kind == "backward" else args[:3]
            chosen = ad.decide(*args, **flags, mode=kind, arch="sm_90", execution=execution)
            assert chosen.name == report.selected


def run_on_device(
    point: grid.Point, execution: str, caplog, device: str = "cuda"
) -> dict[str, str]:
    """The implementation the dispatcher runs, per kind, for ``point``'s call on ``device``
    (its first call of a signature logs the decision it makes)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    b, s, d = point.batch, point.seqlen, point.head_dim
    q, dout = rand(b, s, point.heads, d), rand(b, s, point.heads, d)
    k, v = rand(b, s, point.kv_heads, d), rand(b, s, point.kv_heads, d)
    flags = point.flags()
    if point.sinks:
        flags["sinks"] = rand(point.heads, dtype=torch.float32)
    caplog.clear()
    with caplog.at_level("INFO", logger="attn_dispatch"), ad.execution_mode(execution):
        out, lse = ad.forward(q, k, v, **flags)
        ad.backward(q, k, v, out, lse, dout, **flags)
    ran = {}
    for record in caplog.records:
        if record.msg.startswith("attn_dispatch: %s %r -> %s on "):  # _dispatch's decision
            kind, _, name = record.args[:3]
            ran[str(kind)] = name
    return ran


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("point", SHAPES, ids=lambda p: p.label)
def test_meta_explain_chooses_what_the_device_runs(env, tmp_path, caplog, point) -> None:
    env.set(ATTN_DISPATCH_CACHE_DIR=str(tmp_path))  # the shipped tables, not a user's own
    arch = ad.detect_arch().name
    with ad.autotune(False):
        for execution in EXECUTIONS:
            ran = run_on_device(point, execution, caplog)
            assert set(ran) == set(grid.KINDS), ran
            for kind in grid.KINDS:
                report = meta_choice(point, kind, arch, execution)
                assert ran[kind] == report.selected, (
                    f"{kind} {execution}: ran {ran[kind]}\n{report}"
                )
            torch.cuda.empty_cache()
