"""The triton plugin: cheap import, supports() reasons on hypothetical arches, forcing on CPU;
``triton:fused_atomic`` ranked per arch and rejected when determinism is requested."""

from __future__ import annotations

import fnmatch
import subprocess
import sys

import pytest
import torch

import attn_dispatch as ad


@pytest.fixture(autouse=True)
def triton_sdpa_and_reference(isolated_plugins):
    """Selection among triton, torch_sdpa (cuDNN: the rank these tests compare against) and the
    reference alone, whatever else is installed."""
    isolated_plugins.set(ATTN_DISPATCH_PLUGINS="triton,torch_sdpa,reference")
    return isolated_plugins


def meta_inputs(*, dtype=torch.bfloat16, b=1, s=256, h=16, hk=4, d=128, dv=None, varlen=False):
    """Backward arguments on the meta device (explain on a hypothetical arch)."""
    dv = dv or d
    lead = (b * s,) if varlen else (b, s)
    q = torch.empty(*lead, h, d, dtype=dtype, device="meta")
    k = torch.empty(*lead, hk, d, dtype=dtype, device="meta")
    v = torch.empty(*lead, hk, dv, dtype=dtype, device="meta")
    o = torch.empty(*lead, h, dv, dtype=dtype, device="meta")
    lse = torch.empty(*((h, b * s) if varlen else (b, h, s)), dtype=torch.float32, device="meta")
    kw = {}
    if varlen:
        cu = torch.empty(b + 1, dtype=torch.int32, device="meta")
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)
    return (q, k, v, o, lse, o), kw


def verdict(arch: str, name: str = "triton:fused", **kw) -> ad.Candidate:
    (args, flags) = meta_inputs(
        **{k: v for k, v in kw.items() if k not in ("causal", "align", "deterministic")}
    )
    report = ad.explain(
        *args,
        **flags,
        causal=kw.get("causal", False),
        causal_align=kw.get("align", "top_left"),
        deterministic=kw.get("deterministic", False),
        arch=arch,
    )
    (cand,) = [c for c in report.candidates if c.name == name]
    return cand


def test_triton_plugin_import_does_not_import_triton() -> None:
    code = (
        "import sys, attn_dispatch_triton.plugin as p; p.Fused(); p.FusedAtomic(); "
        "assert 'triton' not in sys.modules, 'plugin imported triton'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm_80", "sm_90"])
@pytest.mark.parametrize(
    ("causal", "align", "varlen"), [(False, "top_left", False), (True, "bottom_right", True)]
)
def test_triton_supported_on_gpu_arches(arch, causal, align, varlen) -> None:
    cand = verdict(arch, causal=causal, align=align, varlen=varlen, deterministic=True)
    assert cand.reasons == (), cand.reasons
    assert cand.status in ("selected", "supported")
    assert cand.priority == (60 if arch.startswith("gfx") else 45)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm_80", "sm_90"])
def test_triton_fused_atomic_supported_and_ranked(arch) -> None:
    from attn_dispatch_triton.plugin import FusedAtomic

    cand = verdict(arch, "triton:fused_atomic", causal=True, align="bottom_right", varlen=True)
    assert cand.reasons == (), cand.reasons
    want = next(p for pat, p in FusedAtomic.priority.items() if fnmatch.fnmatch(arch, pat))
    assert cand.priority == want


@pytest.mark.parametrize("arch", ["gfx950", "sm_90"])
def test_triton_fused_atomic_rejected_when_deterministic(arch) -> None:
    cand = verdict(arch, "triton:fused_atomic", causal=True, deterministic=True)
    assert cand.status == "rejected"
    assert any("not deterministic" in r for r in cand.reasons), cand.reasons
    assert verdict(arch, causal=True, deterministic=True).reasons == ()


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_triton_is_the_default_on_amd(arch, deterministic) -> None:
    report = ad.explain(*meta_inputs()[0], causal=True, arch=arch, deterministic=deterministic)
    assert report.selected == "triton:fused", str(report)


def test_triton_fused_atomic_ranks_below_fused_above_fa2_on_sm90() -> None:
    from attn_dispatch_triton.plugin import Fused, FusedAtomic

    assert 40 < FusedAtomic.priority["sm_9*"] < Fused.priority["sm_9*"]


@pytest.mark.parametrize(
    "kw",
    [
        {"s": 1024, "h": 8, "hk": 8, "causal": True},
        {"s": 4096, "h": 8, "hk": 8, "causal": True},
        {"s": 1024, "h": 64, "hk": 8, "causal": False},
        {"s": 16384, "h": 64, "hk": 8, "causal": True},
        {"s": 4096, "h": 32, "hk": 4, "b": 2, "causal": True, "d": 64},
    ],
)
def test_triton_priorities_are_the_archs_at_every_shape(kw) -> None:
    """No shape rule: where triton is faster than cuDNN is the cost table's to say."""
    for arch in ("sm_90", "sm_80"):
        assert verdict(arch, **kw).priority == 45
        assert verdict(arch, "triton:fused_atomic", **kw).priority == 43
    # asking for determinism rules the atomic one out wherever it ranks
    assert verdict("sm_90", "triton:fused_atomic", **kw, deterministic=True).status == "rejected"


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"arch": "sm_75"}, "arch=sm_75"),
        ({"arch": "gfx90a"}, "arch=gfx90a"),
        ({"arch": "gfx950", "dtype": torch.float32}, "dtype=float32"),
        ({"arch": "sm_90", "d": 16}, "head_dim=16"),
        ({"arch": "gfx942", "d": 128, "dv": 512}, "head_dim_v=512"),
        ({"arch": "gfx950", "b": 2, "h": 40000, "hk": 40000, "d": 32, "s": 1}, "batch*heads=80000"),
    ],
)
def test_triton_rejects_with_named_value(kw, needle) -> None:
    arch = kw.pop("arch")
    cand = verdict(arch, **kw)
    assert cand.status == "rejected"
    assert any(needle in r for r in cand.reasons), cand.reasons


def test_triton_rejects_cpu_tensors_and_forcing_lists_reasons() -> None:
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 8)
    report = ad.explain(q, q, q, q, lse, q, arch="cpu")
    (cand,) = [c for c in report.candidates if c.name == "triton:fused"]
    assert any("device vendor 'cpu'" in r for r in cand.reasons), cand.reasons
    with pytest.raises(ValueError, match="device vendor 'cpu'"):
        ad.backward(q, q, q, q, lse, q, backend="triton")


def test_window_and_softcap_are_accepted_and_explained_on_sm90():
    args, _ = meta_inputs(s=1024, h=8, hk=8, d=128)
    for tensors in (args, args[:3]):  # backward, forward
        report = ad.explain(
            *tensors, window=(128, None), softcap=30.0, arch="sm_90", backend="triton"
        )
        assert report.selected == "triton:fused", str(report)
        assert "window=(128, None) softcap=30.0" in report.inputs
        assert "torch_sdpa:cudnn" not in {c.name for c in report.candidates if not c.reasons}


def test_window_and_softcap_run_on_meta_through_dispatch(triton_sdpa_and_reference):
    triton_sdpa_and_reference.set(ATTN_DISPATCH_ARCH="sm_90")
    tensors, _ = meta_inputs(s=512, h=8, hk=8, d=64)
    grads = ad.backward(*tensors, window=(32, 0), softcap=10.0, backend="triton")
    assert grads.dq.device.type == "meta" and grads.dq.shape == tensors[0].shape
    choice = ad.decide(*tensors, window=(32, 0), softcap=10.0, backend="triton")
    assert choice.name == "triton:fused"
    assert choice.inputs.window == (32, 0) and choice.inputs.softcap == 10.0


def test_declares_window_and_softcap():
    (info,) = [b for b in ad.backends() if b.name == "triton"]
    fused = next(i for i in info.implementations if i.name == "triton:fused")
    assert fused.to_dict()["window"] is True and fused.softcap


def test_declares_sinks_and_only_triton_runs_them_among_sdpa_and_triton():
    (info,) = [b for b in ad.backends() if b.name == "triton"]
    assert all(i.sinks for i in info.implementations)
    args, flags = meta_inputs(s=4096, h=8, hk=8)
    sinks = torch.empty(8, dtype=torch.float32, device="meta")
    with_sinks = ad.explain(*args, **flags, causal=True, arch="sm_90", sinks=sinks)
    assert with_sinks.selected == "triton:fused"  # cuDNN and FA2 refuse sinks
    for name in ("torch_sdpa:cudnn", "torch_sdpa:flash", "torch_sdpa:efficient"):
        (cand,) = [c for c in with_sinks.candidates if c.name == name]
        assert any("sinks" in r for r in cand.reasons), cand.reasons


def test_sinks_calls_leave_gluon_configs_to_the_tl_kernels(monkeypatch):
    """``attention_backward(gluon=False)`` strips GLUON from every kernel's configuration."""
    from attn_dispatch_triton import backward

    seen = []

    class Stop(Exception):
        pass

    def run(self, config):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(backward.BackwardLaunch, "run", run)
    q = torch.randn(1, 8, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 8)
    band = ad.backend.make_inputs(q, q, q).band
    gluon_config = {"pre": {"BLOCK_M": 16}, "dkdv": {"BLOCK_M": 64, "GLUON": 1}}
    for gluon in (True, False):
        with pytest.raises(Stop):
            backward.attention_backward(
                q, q, q, q, lse, q, band=band, scale=0.1, config=gluon_config, gluon=gluon
            )
    assert seen[0]["dkdv"].get("GLUON") == 1
    assert "GLUON" not in seen[1]["dkdv"] and seen[1]["dkdv"]["BLOCK_M"] == 64
