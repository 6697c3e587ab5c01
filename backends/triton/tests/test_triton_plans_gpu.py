"""Launch plans (recorded once per signature, replayed with new data pointers) on a real GPU.

The risk a replay carries is a stale argument: a pointer or scalar of the recording call reused
for later calls. So each case records a plan on one set of tensors, then runs fresh tensors of
the same signature through the replay and compares them with the reference backend.
"""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as ad

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = [  # (heads, kv_heads, seqlen_q, seqlen_k, causal, align, varlen, impl)
    (8, 2, 384, 384, True, "top_left", False, "triton:fused"),
    (8, 8, 200, 333, True, "bottom_right", False, "triton:fused"),
    (16, 2, 256, 256, False, "top_left", True, "triton:fused"),
    (8, 2, 384, 384, True, "top_left", False, "triton:fused_atomic"),
]


def _fresh(h, hkv, sq, sk, causal, align, varlen, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(causal=causal, causal_align=align)
    if varlen:  # three sequences, one of them empty, packed
        lens_q, lens_k = [sq // 2, 0, sq - sq // 2], [sk // 3, 0, sk - sk // 3]
        cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()],  # noqa: E731
                                       dtype=torch.int32, device="cuda")
        kw.update(cu_seqlens_q=cu(lens_q), cu_seqlens_k=cu(lens_k), max_seqlen_q=max(lens_q),
                  max_seqlen_k=max(lens_k))
        shapes = ((sq, h, 64), (sk, hkv, 64), (sk, hkv, 64), (sq, h, 64))
    else:
        shapes = ((2, sq, h, 64), (2, sk, hkv, 64), (2, sk, hkv, 64), (2, sq, h, 64))
    q, k, v, do = (torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g)
                   for s in shapes)
    out, lse = ad.forward(q, k, v, backend="reference", **kw)
    return (q, k, v, out.to(torch.bfloat16), lse, do), kw


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[7]}-h{c[0]}kv{c[1]}-{c[5]}-"
                         f"{'varlen' if c[6] else 'dense'}")
def test_replayed_plan_uses_the_new_tensors(case):
    *shape, impl = case
    recorded, kw = _fresh(*shape, seed=0)
    ad.backward(*recorded, backend=impl, **kw)  # records the plan
    ad.backward(*recorded, backend=impl, **kw)
    for seed in (1, 2):
        args, kw = _fresh(*shape, seed=seed)
        got = ad.backward(*args, backend=impl, **kw)
        ref = ad.backward(*[t.float() if t.dtype == torch.bfloat16 else t for t in args],
                          backend="reference", **kw)
        for name, g, r in zip(("dq", "dk", "dv"), got, ref):
            err = ((g.double() - r.double()).norm() / r.double().norm().clamp_min(1e-30)).item()
            assert err < 1e-2, f"{impl} replay seed {seed}: {name} rel_l2 {err:.2e}"


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_replayed_plan_with_tma_tile_loads(varlen, tmp_path, monkeypatch):
    """Configs with ``LOAD_TMA`` (tensor descriptors as kernel arguments): the replay rebuilds
    each descriptor around the new call's pointer."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA copies need sm_90 or newer")
    from attn_dispatch_triton import _plan, tuning

    monkeypatch.setenv("ATTN_DISPATCH_TRITON_CACHE", str(tmp_path))
    tuning._tuned.cache_clear()
    arch = tuning.arch_of(torch.device("cuda"))
    base = tuning.lookup(arch, 64, True, 4, 384)
    tuning.save_tuned(arch, tuning.shape_class(64, True, 4, 384),
                      {k: {**base[k], "LOAD_TMA": 1} for k in ("dkdv", "dq")})
    try:
        test_replayed_plan_uses_the_new_tensors((8, 2, 384, 384, True, "top_left", varlen,
                                                 "triton:fused"))
        descriptors = [d for plan in _plan._PLANS.values() if plan is not None
                       for launch in plan.launches for d in launch[-1]]
        assert len(descriptors) == 4, "the plan should rebuild Q/dO and K/V descriptors"
    finally:
        monkeypatch.delenv("ATTN_DISPATCH_TRITON_CACHE")
        tuning._tuned.cache_clear()
        tuning.lookup.cache_clear()
        _plan.clear()
