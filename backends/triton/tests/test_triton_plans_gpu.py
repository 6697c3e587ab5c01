"""Launch plans (recorded once per signature, replayed with new data pointers) on a real GPU.

The risk a replay carries is a stale argument: a pointer or scalar of the recording call reused
for later calls. So each case records a plan on one set of tensors, then runs fresh tensors of
the same signature through the replay and compares them with the reference backend.
"""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as ad

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = [  # (heads, kv_heads, seqlen_q, seqlen_k, causal, align, varlen, impl)
    (8, 2, 384, 384, True, "top_left", False, "triton:fused"),
    (8, 8, 200, 333, True, "bottom_right", False, "triton:fused"),
    (16, 2, 256, 256, False, "top_left", True, "triton:fused"),
    (8, 2, 384, 384, True, "top_left", False, "triton:fused_atomic"),
]


def _fresh(h, hkv, sq, sk, causal, align, varlen, seed, d=64, bhsd=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(causal=causal, causal_align=align)
    if varlen:  # three sequences, one of them empty, packed
        lens_q, lens_k = [sq // 2, 0, sq - sq // 2], [sk // 3, 0, sk - sk // 3]

        def cu(lens: list[int]) -> torch.Tensor:
            cumulative = [0, *torch.tensor(lens).cumsum(0).tolist()]
            return torch.tensor(cumulative, dtype=torch.int32, device="cuda")

        kw.update(
            cu_seqlens_q=cu(lens_q),
            cu_seqlens_k=cu(lens_k),
            max_seqlen_q=max(lens_q),
            max_seqlen_k=max(lens_k),
        )
        shapes = ((sq, h, d), (sk, hkv, d), (sk, hkv, d), (sq, h, d))
    else:
        shapes = ((2, sq, h, d), (2, sk, hkv, d), (2, sk, hkv, d), (2, sq, h, d))
    q, k, v, do = (torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes)
    out, lse = ad.forward(q, k, v, backend="reference", **kw)
    tensors = [q, k, v, out.to(torch.bfloat16), lse, do]
    if bhsd:  # [B, S, H, D] views of [B, H, S, D] memory, as ad.attention(layout="bhsd") passes
        tensors[:4] = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors[:4]]
        tensors[5] = tensors[5].transpose(1, 2).contiguous().transpose(1, 2)
    return tuple(tensors), kw


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c[7]}-h{c[0]}kv{c[1]}-{c[5]}-{'varlen' if c[6] else 'dense'}"
)
def test_replayed_plan_uses_the_new_tensors(case, d=64, bhsd=False):
    *shape, impl = case
    recorded, kw = _fresh(*shape, seed=0, d=d, bhsd=bhsd)
    ad.backward(*recorded, backend=impl, **kw)  # records the plan
    ad.backward(*recorded, backend=impl, **kw)
    for seed in (1, 2):
        args, kw = _fresh(*shape, seed=seed, d=d, bhsd=bhsd)
        got = ad.backward(*args, backend=impl, **kw)
        ref = ad.backward(
            *[t.float() if t.dtype == torch.bfloat16 else t for t in args],
            backend="reference",
            **kw,
        )
        for name, g, r in zip(("dq", "dk", "dv"), got, ref):
            err = ((g.double() - r.double()).norm() / r.double().norm().clamp_min(1e-30)).item()
            assert err < 1e-2, f"{impl} replay seed {seed}: {name} rel_l2 {err:.2e}"


@pytest.fixture
def tuned_d64(tmp_path, monkeypatch):
    """Install tuned configs for the d64 GQA causal short class from a temporary cache file
    (``tuned_d64(dkdv=..., dq=...)``: keys added to the table's entries); undone afterwards."""
    from attn_dispatch_triton import _plan, tuning

    monkeypatch.setenv("ATTN_DISPATCH_TRITON_CACHE", str(tmp_path))
    tuning._tuned.cache_clear()
    arch = tuning.arch_of(torch.device("cuda"))

    def install(**extra):
        base = tuning.lookup(arch, 64, True, 4, 384)
        tuning.save_tuned(
            arch,
            tuning.shape_class(64, True, 4, 384),
            {k: {**base[k], **extra.get(k, {})} for k in ("dkdv", "dq")},
        )

    yield install
    monkeypatch.delenv("ATTN_DISPATCH_TRITON_CACHE")
    tuning._tuned.cache_clear()
    tuning.lookup.cache_clear()
    _plan.clear()


def _recorded_launches() -> list:
    from attn_dispatch_triton import _plan

    return [launch for plan in _plan.recorded() for launch in plan.launches]


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_replayed_plan_with_tma_tile_loads(varlen, tuned_d64):
    """Configs with ``LOAD_TMA`` (tensor descriptors as kernel arguments): the replay rebuilds
    each descriptor around the new call's pointer."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA copies need sm_90 or newer")
    tuned_d64(dkdv={"LOAD_TMA": 1}, dq={"LOAD_TMA": 1})
    test_replayed_plan_uses_the_new_tensors(
        (8, 2, 384, 384, True, "top_left", varlen, "triton:fused")
    )
    descriptors = [d for launch in _recorded_launches() for d in launch.descs]
    assert len(descriptors) == 4, "the plan should rebuild Q/dO and K/V descriptors"


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_replayed_plan_with_concurrent_dq(varlen, tuned_d64):
    """``CONCURRENT_MAX_SK``: dQ on the side stream, forked and joined on every replay."""
    tuned_d64(dq={"CONCURRENT_MAX_SK": 4096})
    test_replayed_plan_uses_the_new_tensors(
        (8, 2, 384, 384, True, "top_left", varlen, "triton:fused")
    )
    assert [launch.on_side for launch in _recorded_launches()].count(True) == 1


def test_concurrent_dq_under_cuda_graph_capture(tuned_d64):
    """The side stream's fork and join are captured into a CUDA graph; a replay on new data
    gives the reference gradients."""
    tuned_d64(dq={"CONCURRENT_MAX_SK": 4096}, dkdv={"SPLIT": 2})
    static, kw = _fresh(8, 2, 384, 384, True, "top_left", False, seed=0)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):  # records the plan, then replays it
            ad.backward(*static, backend="triton:fused", **kw)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = ad.backward(*static, backend="triton:fused", **kw)
    fresh, _ = _fresh(8, 2, 384, 384, True, "top_left", False, seed=5)
    for t, f in zip(static, fresh):
        t.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    ref = ad.backward(
        *[t.float() if t.dtype == torch.bfloat16 else t for t in fresh], backend="reference", **kw
    )
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        err = ((g.double() - r.double()).norm() / r.double().norm()).item()
        assert err < 1e-2, f"graph replay: {name} rel_l2 {err:.2e}"


def test_concurrent_dq_joins_the_callers_own_stream(tuned_d64):
    """Replays of one plan from two caller streams: each forks from and joins back into its own
    stream (the side stream keeps one stream object per caller handle), so work queued on that
    stream right after the call sees the finished gradients."""
    from attn_dispatch_triton import _plan

    tuned_d64(dq={"CONCURRENT_MAX_SK": 4096})
    args, kw = _fresh(8, 2, 384, 384, True, "top_left", False, seed=3)
    ref = ad.backward(
        *[t.float() if t.dtype == torch.bfloat16 else t for t in args], backend="reference", **kw
    )
    callers = [torch.cuda.Stream(), torch.cuda.Stream()]
    for caller in callers:
        caller.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(caller):
            for _ in range(3):  # records the plan (first stream), then replays it
                grads = ad.backward(*args, backend="triton:fused", **kw)
                copies = [g.clone() for g in grads]  # queued on the caller after the join
        torch.cuda.current_stream().wait_stream(caller)
        torch.cuda.synchronize()
        for name, g, r in zip(("dq", "dk", "dv"), copies, ref):
            err = ((g.double() - r.double()).norm() / r.double().norm()).item()
            assert err < 1e-2, f"caller stream {caller.cuda_stream:#x}: {name} rel_l2 {err:.2e}"
    side = _plan.side_stream(args[0].device)
    for caller in callers:
        assert side._callers[caller.cuda_stream].cuda_stream == caller.cuda_stream


@pytest.mark.parametrize(
    ("impl", "n_descriptors"), [("triton:fused", 8), ("triton:fused_atomic", 5)]
)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_replayed_plan_of_the_gluon_kernels(varlen, impl, n_descriptors):
    """D=128 GQA causal on sm_90: the table runs the Gluon kernels, whose TMA descriptors are
    rebuilt around the new call's pointers on every replay: Q, K, V, dO for each of the dK/dV
    and dQ kernels (``triton:fused``), or for the dK/dV kernel plus the fresh dQ scratch it
    reduces into (``triton:fused_atomic``)."""
    from attn_dispatch_triton import _plan
    from attn_dispatch_triton._kernel_support import gluon_sm90

    if not gluon_sm90(torch.device("cuda")):
        pytest.skip("the Gluon kernels need an sm_90 GPU and triton 3.6")
    _plan.clear()
    test_replayed_plan_uses_the_new_tensors(
        (8, 2, 384, 384, True, "bottom_right", varlen, impl), d=128
    )
    descriptors = [d for launch in _recorded_launches() for d in launch.descs]
    assert len(descriptors) == n_descriptors, descriptors


def _replays_zero_the_added_buffer(case: tuple, **keys: int) -> list[tuple]:
    """Replay ``triton:fused_atomic`` at ``case`` (``_fresh``'s arguments) with the ``dkdvq``
    entry's ``keys`` changed; the plan must zero the fp32 dK / dV buffer on every call. Returns
    the recorded launches' grids (read before the trial's end clears the plans)."""
    from attn_dispatch_triton import _plan, tuning
    from attn_dispatch_triton._kernel_support import gluon_sm90

    device = torch.device("cuda")
    if not gluon_sm90(device):
        pytest.skip("the Gluon kernels need an sm_90 GPU and triton 3.6")
    h, hkv, sq, sk, causal = case[:5]
    with tuning.trial_with(tuning.arch_of(device), "dkdvq", 128, causal, h // hkv, sk, **keys):
        _plan.clear()
        test_replayed_plan_uses_the_new_tensors((*case, "triton:fused_atomic"), d=128)
        assert any(plan.part_zeroed for plan in _plan.recorded())
        return [launch.grid for launch in _recorded_launches()]


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_replayed_plan_zeroes_the_added_slices(varlen):
    """``SPLIT_ADD`` (Gluon fused-atomic kernel, GQA group split): the slices add dK / dV into a
    buffer that every replay must zero-fill again; with new data each time, a replay that reused
    or skipped the zeroing would be off by the earlier call's gradients."""
    _replays_zero_the_added_buffer(
        (8, 2, 384, 384, True, "bottom_right", varlen), SPLIT=4, SPLIT_ADD=1
    )


def test_replayed_plan_with_tail_slices(monkeypatch):
    """``TAIL_SLICES`` (no mask): whole units in full waves, then the rest cut into slices that
    add into the zero-filled buffer. With a pretended SM count of 8, the 20 units of a 640-key
    GQA 8/2 call (B=2) make 2 full waves, and the other 4 units run in 2 slices each. Replays on
    new data must zero the buffer again."""
    from attn_dispatch_triton import _launch_policy, tuning

    monkeypatch.setattr(tuning, "sm_count", lambda device: 8)
    monkeypatch.setattr(_launch_policy, "MIN_SLICE_STEPS", 16)  # (a small call's units are short)
    grids = _replays_zero_the_added_buffer(
        (8, 2, 640, 640, False, "top_left", False), SPLIT=1, TAIL_SLICES=4
    )
    assert (16, 1, 1) in grids and (4, 1, 2) in grids, grids


@pytest.mark.parametrize("impl", ["triton:fused", "triton:fused_atomic"])
def test_replayed_plan_on_bhsd_memory(impl):
    """q, k, v, out and dO as [B, S, H, D] views of [B, H, S, D] memory at a short GQA length,
    where the group is split across programs: the call keeps a plan (dK / dV partials summed by
    a launch into contiguous outputs) and its replays on new tensors match the reference."""
    from attn_dispatch_triton import _plan

    _plan.clear()
    test_replayed_plan_uses_the_new_tensors(
        (32, 8, 128, 128, True, "top_left", False, impl), d=128, bhsd=True
    )
    assert _plan.recorded(), "the call on [B, H, S, D] memory should keep a plan"
