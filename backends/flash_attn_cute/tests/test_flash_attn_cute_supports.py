"""flash_attn_cute on the CPU: what each implementation accepts and why it declines, its
priorities, the causal-mask mapping, and that discovery and explain import no FA4 code.

Tensors live on the ``meta`` device and ``arch=`` names a hypothetical chip. These tests need
the real ``flash-attn-4`` distribution installed (scripts/setup.sh installs it); the kernels
themselves run in test_flash_attn_cute_gpu.py.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch
from attn_dispatch_flash_attn_cute import _releases, _support, plugin
from attn_dispatch_flash_attn_cute._support import MaskArgs, mask_args

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.backend import make_inputs
from attn_dispatch.testing import visible_mask

NAMES = ("flash_attn_cute:sm90", "flash_attn_cute:sm100")
FA4_MODULES = ("flash_attn", "cutlass", "tvm_ffi", "quack")


@pytest.fixture(autouse=True)
def selection_env(isolated_plugins, monkeypatch):
    """This backend (enabled: its Blackwell implementation is opt-in), torch_sdpa (cuDNN at 50
    on sm_90) and the reference only; the table read for FA4 4.0.0b36 whichever release is
    installed (tests of another release say so with ``installed``)."""
    monkeypatch.setattr(_support, "installed_version", lambda: "4.0.0b36")
    isolated_plugins.set(
        ATTN_DISPATCH_PLUGINS="flash_attn_cute,torch_sdpa,reference",
        ATTN_DISPATCH_ENABLE="flash_attn_cute",
    )
    return isolated_plugins


def dense(sq=1024, sk=None, h=64, hkv=8, d=128, dv=None, b=1, dtype=torch.bfloat16):
    """Backward arguments on the meta device."""
    sk = sq if sk is None else sk
    dv = d if dv is None else dv
    q = torch.empty(b, sq, h, d, dtype=dtype, device="meta")
    k = torch.empty(b, sk, hkv, d, dtype=dtype, device="meta")
    v = torch.empty(b, sk, hkv, dv, dtype=dtype, device="meta")
    out = torch.empty(b, sq, h, dv, dtype=dtype, device="meta")
    lse = torch.empty(b, h, sq, dtype=torch.float32, device="meta")
    return q, k, v, out, lse, out


def varlen(same_offsets: bool, tq=96, tk=80, h=8, hkv=2, d=64):
    q = torch.empty(tq, h, d, dtype=torch.float16, device="meta")
    k = torch.empty(tk, hkv, d, dtype=torch.float16, device="meta")
    out = torch.empty_like(q)
    lse = torch.empty(h, tq, device="meta")
    cu_q = torch.empty(4, dtype=torch.int32, device="meta")
    cu_k = cu_q if same_offsets else torch.empty(4, dtype=torch.int32, device="meta")
    if same_offsets:
        k = torch.empty(tq, hkv, d, dtype=torch.float16, device="meta")
    flags = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=40, max_seqlen_k=40)
    return (q, k, k, out, lse, out), flags


def verdicts(report: ad.Report) -> dict[str, ad.Candidate]:
    return {c.name: c for c in report.candidates if c.name in NAMES}


def explain(args, arch, **flags) -> ad.Report:
    return ad.explain(*args, arch=arch, **flags)


# ----------------------------------------------------------------------------------------------
# Registration and imports


def test_registered_on_by_default_on_hopper_and_deterministic_capable():
    (info,) = [b for b in ad.backends() if b.name == "flash_attn_cute"]
    assert info.distribution == "attn-dispatch-flash-attn-cute"
    assert info.error is None
    assert [i.name for i in info.implementations] == list(NAMES)
    for impl in info.implementations:
        assert impl.deterministic and impl.has_forward
    sm90, sm100 = info.implementations
    assert not sm90.opt_in and sm90.opt_in_reason is None
    assert sm100.opt_in and "not run on Blackwell hardware" in sm100.opt_in_reason
    assert sm90.priority == {"sm_90": 60}
    assert sm100.priority == {"sm_100": 60, "sm_103": 60}


def test_hopper_chosen_without_enabling():
    os_env_free = explain(dense(4096), "sm_90", causal=True)
    assert os_env_free.selected == "flash_attn_cute:sm90"


def test_blackwell_opt_in_says_why_and_forcing_works(monkeypatch):
    """Blackwell stays opt-in (this backend has not run there): without an opt-in the seed shape
    goes to another implementation, and the reason says why; forcing still works."""
    monkeypatch.delenv("ATTN_DISPATCH_ENABLE")
    ad.reload(reset_enabled=True)
    args = dense(4096)
    assert explain(args, "sm_90", causal=True).selected == "flash_attn_cute:sm90"
    report = explain(args, "sm_100", causal=True)
    cand = verdicts(report)["flash_attn_cute:sm100"]
    assert cand.status == "opt-in"
    assert cand.reasons[0] == "opt-in because this backend has not run on Blackwell hardware yet"
    assert cand.reasons[1].startswith("opt-in: enable with ATTN_DISPATCH_ENABLE=flash_attn_cute")
    assert report.selected is not None and not report.selected.startswith("flash_attn_cute")
    forced = explain(args, "sm_100", causal=True, backend="flash_attn_cute")
    assert forced.selected == "flash_attn_cute:sm100"
    ad.enable("flash_attn_cute")
    assert explain(args, "sm_100", causal=True).selected == "flash_attn_cute:sm100"


def test_discovery_and_explain_import_no_fa4_code():
    """Listing, explaining on every arch and the plugin's supports() leave FA4, CUTLASS's DSL,
    TVM-FFI and quack unimported (importing them takes seconds)."""
    code = textwrap.dedent(
        f"""
        import sys, torch
        import attn_dispatch as ad
        ad.backends()
        for arch in ("sm_90", "sm_100", "sm_103", "sm_80", "gfx942"):
            for causal in (False, True):
                q = torch.empty(1, 256, 8, 128, dtype=torch.bfloat16, device="meta")
                k = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16, device="meta")
                lse = torch.empty(1, 8, 256, device="meta")
                ad.explain(q, k, k, q, lse, q, causal=causal, arch=arch)
                ad.explain(q, k, k, causal=causal, arch=arch)
        q = torch.empty(1, 2048, 8, 128, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(1, 8, 2048, device="meta")
        report = ad.explain(q, q, q, q, lse, q, arch="sm_90", execution="graph")
        assert report.selected == "flash_attn_cute:sm90", str(report)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FA4_MODULES!r})
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fa4_requirement_is_the_distributions_dependency():
    """The package's flash-attn-4 dependency is FA4_REQUIREMENT, and it spans exactly the
    tested releases: the oldest and the newest row of the table are its bounds."""
    from pathlib import Path

    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = Path(plugin.__file__).resolve().parents[1] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    requires = [Requirement(r) for r in project["dependencies"]]
    gate = Requirement(_support.FA4_REQUIREMENT)
    assert [(r.name, r.specifier) for r in requires if r.name == gate.name] == [
        (gate.name, gate.specifier)
    ]
    tested = _releases.tested_versions()
    assert all(gate.specifier.contains(v, prereleases=True) for v in tested)
    below = {s.version for s in gate.specifier if s.operator == ">="}
    above = {s.version for s in gate.specifier if s.operator == "<="}
    assert (below, above) == ({tested[0]}, {tested[-1]})
    assert _support.fa4_problem() is None  # the real dependency is installed and intact


# ----------------------------------------------------------------------------------------------
# Arch and device


def test_sm90_seed_shape_selects_fa4():
    report = explain(dense(4096), "sm_90", causal=True)
    assert report.selected == "flash_attn_cute:sm90"
    c = verdicts(report)
    assert c["flash_attn_cute:sm90"].priority == 60
    assert c["flash_attn_cute:sm100"].reasons == ("arch=sm_90: runs on sm_100, sm_103 only",)


@pytest.mark.parametrize("execution", ["eager", "graph"])
@pytest.mark.parametrize(
    ("shape", "causal", "expected"),
    [
        (dict(sq=4096), True, "flash_attn_cute:sm90"),
        (dict(sq=16384, h=8, hkv=8), False, "flash_attn_cute:sm90"),
    ],
)
def test_sm90_default_choice_with_every_gpu_backend(
    monkeypatch, execution, shape, causal, expected
):
    """No enabling: with triton and torch_sdpa installed too, sm_90 goes to FA4 or to the
    implementation measured faster."""
    monkeypatch.setenv("ATTN_DISPATCH_PLUGINS", "flash_attn_cute,torch_sdpa,triton,reference")
    monkeypatch.delenv("ATTN_DISPATCH_ENABLE")
    ad.reload(reset_enabled=True)
    report = explain(dense(**shape), "sm_90", causal=causal, execution=execution)
    assert report.selected == expected, str(report)


def test_sm90_short_mha_keeps_fa4_priority_eager_and_under_graphs(monkeypatch):
    """FA4's replayed host code costs less than any other GPU implementation's: at MHA 8 1K its
    priority is the same eager as under CUDA graphs (where the cost table covers the call, its
    measured times rank it; under any installed versions, see docs/design.md)."""
    monkeypatch.setenv("ATTN_DISPATCH_PLUGINS", "flash_attn_cute,torch_sdpa,triton,reference")
    monkeypatch.delenv("ATTN_DISPATCH_ENABLE")
    ad.reload(reset_enabled=True)
    for causal in (False, True):
        for execution in ("eager", "graph"):
            report = explain(dense(1024, h=8, hkv=8), "sm_90", causal=causal, execution=execution)
            assert verdicts(report)["flash_attn_cute:sm90"].priority == 60, str(report)


@pytest.mark.parametrize("arch", ["sm_100", "sm_103"])
def test_blackwell_selects_fa4(arch):
    report = explain(dense(2048, h=16, hkv=16), arch, causal=True)
    assert report.selected == "flash_attn_cute:sm100"
    c = verdicts(report)
    assert c["flash_attn_cute:sm100"].priority == 60
    assert c["flash_attn_cute:sm90"].reasons == (f"arch={arch}: runs on sm_90 only",)


def test_sm80_rejected_by_both():
    c = verdicts(explain(dense(), "sm_80"))
    assert c["flash_attn_cute:sm90"].reasons == ("arch=sm_80: runs on sm_90 only",)
    assert c["flash_attn_cute:sm100"].reasons == ("arch=sm_80: runs on sm_100, sm_103 only",)
    assert all(v.status == "rejected" for v in c.values())


def test_gfx942_rejected_by_vendor():
    report = explain(dense(), "gfx942")
    for cand in verdicts(report).values():
        assert cand.status == "rejected"
        assert cand.reasons == (
            "device vendor 'rocm' (tensors on meta): needs an NVIDIA (CUDA) GPU",
        )


def test_cpu_tensors_forced_give_reasons_not_a_crash():
    q = torch.randn(1, 16, 2, 32)
    with pytest.raises(ad.NoBackendError, match="needs an NVIDIA"):
        ad.forward(q, q, q, backend="flash_attn_cute")


# ----------------------------------------------------------------------------------------------
# Dtypes and head dims, per arch


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_float32_rejected(arch):
    name = "flash_attn_cute:sm90" if arch == "sm_90" else "flash_attn_cute:sm100"
    cand = verdicts(explain(dense(dtype=torch.float32), arch))[name]
    assert cand.reasons == ("dtype=float32: needs one of bfloat16, float16",)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [24, 32, 64, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("hkv", [8, 64])
def test_sm90_proven_head_dims_accepted(dtype, d, hkv):
    """Every D = Dv of the table, MHA and GQA, forward and backward, without enabling."""
    args = dense(256, d=d, hkv=hkv, dtype=dtype)
    backward = verdicts(explain(args, "sm_90"))["flash_attn_cute:sm90"]
    assert backward.reasons == () and backward.status in ("selected", "supported")
    forward = verdicts(explain(args[:3], "sm_90"))["flash_attn_cute:sm90"]
    assert forward.reasons == ()


@pytest.fixture
def installed(monkeypatch):
    """Pretend ``version`` is the installed FA4 (the table is read for it): a function."""

    def install(version: str) -> None:
        monkeypatch.setattr(_support, "installed_version", lambda: version)
        ad.reload()

    return install


@pytest.mark.parametrize("version", ["4.0.0b36", "4.0.0b40"])
def test_sm90_head_dim_table_is_the_one_admission(installed, version):
    """Exactly the installed release's proven head dims (D = Dv, MHA and GQA) pass supports()
    among FA4's own head dims."""
    installed(version)
    proven = _releases.RELEASES[version].sm90_head_dims
    for d in range(8, 257, 8):
        for hkv in (8, 64):
            cand = verdicts(explain(dense(128, d=d, hkv=hkv), "sm_90"))["flash_attn_cute:sm90"]
            assert (cand.reasons == ()) == (d in proven), (version, d, hkv, cand.reasons)


def test_the_releases_proven_and_refused_head_dims():
    """The rows as measured on an H200: b40 adds 56, 88, 120 and every multiple of 8 from 136
    to 256; both refuse 112 with the other dQ accumulator head dims."""
    b36, b40 = _releases.RELEASES["4.0.0b36"], _releases.RELEASES["4.0.0b40"]
    assert sorted(b36.sm90_head_dims) == [24, 32, 64, 96, 128, 160, 192, 256]
    assert sorted(b40.sm90_head_dims) == [24, 32, 56, 64, 88, 96, 120, 128, *range(136, 257, 8)]
    for release in (b36, b40):
        assert sorted(release.sm90_wrong_backward) == [8, 16, 40, 48, 72, 80, 104, 112]
        # the defect's pattern: D <= 128 whose round-up to 16 differs from its round-up to 32
        pattern = {d for d in range(8, 129, 8) if -(-d // 16) * 16 != -(-d // 32) * 32}
        assert release.sm90_wrong_backward == pattern
        assert not release.sm90_head_dims & release.sm90_wrong_backward
    assert (b36.replay_tested, b40.replay_tested) == (True, False)


def test_sm90_head_dim_table_change_is_followed(monkeypatch):
    row = _releases.RELEASES["4.0.0b36"]
    changed = dataclasses.replace(row, sm90_head_dims=frozenset({40}), sm90_wrong_backward=set())
    monkeypatch.setitem(_releases.RELEASES, "4.0.0b36", changed)
    gqa40 = verdicts(explain(dense(128, d=40), "sm_90"))["flash_attn_cute:sm90"]
    assert gqa40.reasons == ()
    gqa128 = verdicts(explain(dense(128, d=128), "sm_90"))["flash_attn_cute:sm90"]
    assert gqa128.status == "rejected"


DEFECT = (
    "FA4 {version}'s sm_90 backward returns wrong dQ (and dK/dV with GQA) at head_dim={d}: its "
    "dQ accumulator is rounded to 32 while the kernel rounds the head dim to 16; admitted for "
    "{kind} (D = Dv): {admitted}"
)
B36_ADMITTED = "24, 32, 64, 96, 128, 160, 192, 256"
B40_ADMITTED = "24, 32, 56, 64, 88, 96, 120, " + ", ".join(map(str, range(128, 257, 8)))
ADMITTED = "admitted for {kind} (D = Dv): " + B36_ADMITTED


@pytest.mark.parametrize(
    ("version", "admitted"), [("4.0.0b36", B36_ADMITTED), ("4.0.0b40", B40_ADMITTED)]
)
@pytest.mark.parametrize("d", [8, 16, 40, 48, 72, 80, 104, 112])
@pytest.mark.parametrize("hkv", [8, 64])
def test_sm90_wrong_backward_head_dims_rejected_naming_the_defect(
    installed, version, admitted, d, hkv
):
    installed(version)
    kind = "GQA" if hkv != 64 else "MHA"
    for args in (dense(256, d=d, hkv=hkv), dense(256, d=d, hkv=hkv)[:3]):
        cand = verdicts(explain(args, "sm_90"))["flash_attn_cute:sm90"]
        assert cand.status == "rejected"
        want = DEFECT.format(version=version, d=d, kind=kind, admitted=admitted)
        assert cand.reasons == (want,)


def test_sm90_head_dims_unscanned_on_b40_are_refused_as_unproven(installed):
    installed("4.0.0b40")  # a head dim that is no multiple of 8 was not scanned
    cand = verdicts(explain(dense(256, d=100), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.status == "rejected", cand.reasons
    assert any("not proven correct" in reason for reason in cand.reasons), cand.reasons


@pytest.mark.parametrize(
    ("d", "dv", "hkv", "reason"),
    [
        (
            32,
            128,
            8,
            "head_dim=32 != head_dim_v=128 with GQA: FA4 4.0.0b36's sm_90 backward asserts "
            "equal head dims; " + ADMITTED.format(kind="GQA"),
        ),
        (
            8,
            64,
            64,
            DEFECT.format(version="4.0.0b36", d=8, kind="MHA", admitted=B36_ADMITTED),
        ),
        (
            24,
            64,
            64,
            "(head_dim, head_dim_v)=(24, 64) with MHA: not proven correct on sm_90 with FA4 "
            "4.0.0b36 by the head-dim GPU test; " + ADMITTED.format(kind="MHA"),
        ),
        (
            56,
            56,
            8,
            "(head_dim, head_dim_v)=(56, 56) with GQA: not proven correct on sm_90 with FA4 "
            "4.0.0b36 by the head-dim GPU test; " + ADMITTED.format(kind="GQA"),
        ),
    ],
)
def test_sm90_unproven_head_dims_rejected(installed, d, dv, hkv, reason):
    installed("4.0.0b36")
    cand = verdicts(explain(dense(256, d=d, dv=dv, hkv=hkv), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.status == "rejected"
    assert cand.reasons == (reason,)


def test_sm90_head_dims_outside_fa4_are_the_cores_reasons():
    cand = verdicts(explain(dense(256, d=264), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.reasons[0] == "head_dim=264: needs a multiple of 8 in 8..256"


def test_sm90_d8_below_dv_names_the_forward_crash():
    """D = 8 < Dv is refused for its forward crash even if D = 8's backward were fixed."""
    row = dataclasses.replace(_releases.RELEASES["4.0.0b36"], sm90_wrong_backward=frozenset())
    assert _support.sm90_head_dim_problem(8, 64, False, row) == (
        "head_dim=8 < head_dim_v=64: FA4 4.0.0b36's sm_90 forward makes an illegal memory "
        "access; " + ADMITTED.format(kind="MHA")
    )


@pytest.mark.parametrize(("d", "dv"), [(8, 8), (64, 128), (128, 40), (192, 128), (256, 256)])
def test_sm100_head_dims_accepted(d, dv):
    report = explain(dense(256, d=d, dv=dv), "sm_100")
    assert verdicts(report)["flash_attn_cute:sm100"].reasons == ()


@pytest.mark.parametrize(("d", "dv"), [(192, 192), (256, 128), (128, 256), (192, 64)])
def test_sm100_large_head_dim_pairs_rejected(d, dv):
    cand = verdicts(explain(dense(256, d=d, dv=dv), "sm_100"))["flash_attn_cute:sm100"]
    assert cand.reasons == (
        f"(head_dim, head_dim_v)=({d}, {dv}): on Blackwell FA4 runs both <= 128, "
        "or (192, 128) or (256, 256)",
    )


@pytest.mark.parametrize(("d", "dv"), [(160, 160), (136, 128), (120, 96 + 4)])
def test_sm100_head_dims_outside_the_declared_set(d, dv):
    cand = verdicts(explain(dense(256, d=d, dv=dv), "sm_100"))["flash_attn_cute:sm100"]
    assert cand.status == "rejected"
    assert any("needs one of 8, 16," in r for r in cand.reasons), cand.reasons


# ----------------------------------------------------------------------------------------------
# GQA, varlen, causal alignments, determinism


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
@pytest.mark.parametrize(("h", "hkv"), [(64, 8), (8, 1), (8, 8)])
def test_gqa_mqa_mha_native(arch, h, hkv):
    report = explain(dense(2048, h=h, hkv=hkv), arch, causal=True, execution="graph")
    assert report.selected is not None and report.selected.startswith("flash_attn_cute:")


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("sq", "sk"), [(200, 300), (300, 200), (256, 256)])
def test_dense_both_alignments_accepted(align, sq, sk):
    report = explain(dense(sq, sk, h=8, hkv=8, d=64), "sm_90", causal=True, causal_align=align)
    assert verdicts(report)["flash_attn_cute:sm90"].reasons == ()


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_varlen_same_offsets_accepted(align):
    args, flags = varlen(same_offsets=True)
    report = explain(args, "sm_90", causal=True, causal_align=align, **flags)
    assert verdicts(report)["flash_attn_cute:sm90"].reasons == ()


def test_varlen_bottom_right_with_distinct_offsets_accepted():
    args, flags = varlen(same_offsets=False)
    report = explain(args, "sm_100", causal=True, causal_align="bottom_right", **flags)
    assert verdicts(report)["flash_attn_cute:sm100"].reasons == ()


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_varlen_top_left_with_distinct_offsets_rejected(arch):
    args, flags = varlen(same_offsets=False)
    report = explain(args, arch, causal=True, causal_align="top_left", **flags)
    name = "flash_attn_cute:sm90" if arch == "sm_90" else "flash_attn_cute:sm100"
    (reason,) = verdicts(report)[name].reasons
    assert reason.startswith("causal_align='top_left' with a causal mask or window, varlen")
    # a window on the top-left diagonal is shifted the same way: rejected too
    report = explain(args, arch, causal=False, causal_align="top_left", window=(3, 3), **flags)
    assert len(verdicts(report)[name].reasons) == 1
    # the call without a band on the same tensors is fine
    report = explain(args, arch, causal=False, **flags)
    assert verdicts(report)[name].reasons == ()


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_window_and_softcap_accepted(arch):
    report = explain(dense(2048), arch, causal=True, window=(511, 0), softcap=30.0)
    assert report.selected in NAMES


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_deterministic_request_accepted(arch):
    report = explain(dense(2048), arch, causal=True, deterministic=True)
    assert report.selected in NAMES


# ----------------------------------------------------------------------------------------------
# Priorities per input on sm_90


@pytest.mark.parametrize(
    "shape",
    [dict(sq=1024), dict(sq=4096, h=8, hkv=8), dict(sq=16384), dict(sq=512, h=16, hkv=2, b=4)],
)
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_plain_dense_calls_keep_the_arch_priority_in_every_mode(shape, causal):
    """No shape rule: where FA4 is faster or slower is the cost table's to say (its rows rank
    the measured implementations by time whatever their priorities)."""
    args = dense(**shape)
    for execution in ("eager", "graph"):
        report = explain(args, "sm_90", causal=causal, execution=execution)
        assert verdicts(report)["flash_attn_cute:sm90"].priority == 60, execution


def test_sm90_short_backward_whose_host_code_runs_every_call_ranks_low_eager(monkeypatch):
    """Varlen calls are not replayed (nor any with the replay off): a short eager backward
    ranks below every other GPU implementation; under graphs the kernels decide."""
    args, flags = varlen(True, h=2, hkv=2)  # 3 sequences: B*H = 6
    eager = explain(args, "sm_90", causal=True, execution="eager", **flags)
    assert verdicts(eager)["flash_attn_cute:sm90"].priority == 42
    graph = explain(args, "sm_90", causal=True, execution="graph", **flags)
    assert verdicts(graph)["flash_attn_cute:sm90"].priority == 60
    forward = explain(args[:3], "sm_90", causal=True, execution="eager", **flags)
    assert verdicts(forward)["flash_attn_cute:sm90"].priority == 60
    monkeypatch.setenv("ATTN_DISPATCH_FA4_REPLAY", "0")
    ad.reload()
    dense_eager = explain(dense(1024, h=8, hkv=8), "sm_90", causal=True, execution="eager")
    assert verdicts(dense_eager)["flash_attn_cute:sm90"].priority == 42


def test_sm90_short_eager_backward_with_sinks_ranks_low_only_where_the_replay_is_off(
    monkeypatch,
):
    """Dense calls with sinks are replayed as other dense calls are: a short eager backward
    keeps the rank of sink calls outside a cost table (44); with the replay off it pays FA4's
    host code every call and ranks host-bound (42)."""
    sinks = {"sinks": torch.empty(8, dtype=torch.float32, device="meta")}
    args = dense(1024, h=8, hkv=8)
    eager = explain(args, "sm_90", causal=True, execution="eager", **sinks)
    assert verdicts(eager)["flash_attn_cute:sm90"].priority == plugin.VARIANT_PRIORITY
    monkeypatch.setenv("ATTN_DISPATCH_FA4_REPLAY", "0")
    ad.reload()
    eager = explain(args, "sm_90", causal=True, execution="eager", **sinks)
    assert verdicts(eager)["flash_attn_cute:sm90"].priority == plugin.EAGER_HOST_BOUND_PRIORITY


@pytest.mark.parametrize("value", ["maybe", "", "2"])
def test_a_bad_replay_setting_is_an_error_never_another_backend(monkeypatch, value):
    """FA4's priority reads the setting: a bad value must reach the caller rather than mark FA4
    failed and let cuDNN run."""
    monkeypatch.setenv("ATTN_DISPATCH_FA4_REPLAY", value)
    message = f"ATTN_DISPATCH_FA4_REPLAY={value!r} is not a boolean"
    with pytest.raises(ad.SettingError, match=message):
        ad.reload()
    args = dense(1024, h=8, hkv=8)
    with pytest.raises(ad.SettingError, match=message):
        explain(args, "sm_90", causal=True, execution="eager")


@pytest.mark.parametrize("release", ["4.0.0b40", None])
def test_a_bad_replay_setting_is_an_error_whatever_fa4_is_installed(monkeypatch, release):
    """Read when the plugins load: on a release the replay is off for, or with no FA4 (where
    the setting is never used), a bad value is still the caller's error, never ignored."""
    monkeypatch.setattr(_support, "installed_version", lambda: release)
    monkeypatch.setenv("ATTN_DISPATCH_FA4_REPLAY", "maybe")
    q = torch.empty(1, 16, 2, 64, device="meta")
    for call in (ad.reload, lambda: ad.explain(q, q, q, arch="sm_80")):  # at load, then on calls
        with pytest.raises(ad.SettingError, match="ATTN_DISPATCH_FA4_REPLAY='maybe'"):
            call()


def test_sm90_forward_keeps_the_arch_priority_at_small_shapes():
    q, k, v, *_ = dense(1024)
    report = ad.explain(q, k, v, arch="sm_90")
    assert verdicts(report)["flash_attn_cute:sm90"].priority == 60


def test_sm100_priority_is_not_lowered_by_the_sm90_measurements():
    report = explain(dense(1024), "sm_100")
    assert verdicts(report)["flash_attn_cute:sm100"].priority == 60


# ----------------------------------------------------------------------------------------------
# The installation gate


@pytest.mark.parametrize("version", ["4.0.0b37", "4.0.0b41", "4.0.0", "4.0.0b35"])
def test_a_release_without_a_row_is_refused_naming_the_tested_ones(installed, version):
    """The gate is the table: a release between two tested ones is refused as well as a newer
    or an older one."""
    installed(version)
    cand = verdicts(explain(dense(), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.status == "rejected"
    assert cand.reasons == (
        f"flash-attn-4 {version} is installed; tested releases: 4.0.0b36, 4.0.0b40: the backend "
        "stays off on another FA4 release until the head-dim GPU test "
        "(tests/test_flash_attn_cute_head_dims_gpu.py) and the GPU suite pass on it",
    )


@pytest.mark.parametrize("version", ["4.0.0b36", "4.0.0b40", "4.0.0-beta40"])
def test_a_tested_release_passes_the_gate(installed, version):
    installed(version)
    cand = verdicts(explain(dense(), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.reasons == (), cand.reasons


def test_a_new_row_admits_its_release(installed, monkeypatch):
    row = dataclasses.replace(_releases.RELEASES["4.0.0b40"], version="4.0.0b41")
    monkeypatch.setitem(_releases.RELEASES, "4.0.0b41", row)
    installed("4.0.0b41")
    cand = verdicts(explain(dense(), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.reasons == ()


def test_absent_distribution_is_a_reason(monkeypatch):
    monkeypatch.setattr(_support, "installed_version", lambda: None)
    cand = verdicts(explain(dense(), "sm_90"))["flash_attn_cute:sm90"]
    assert cand.reasons == ("flash-attn-4 is not installed (tested releases: 4.0.0b36, 4.0.0b40)",)


def _fake_distribution(root, name: str, content: bytes, recorded: bytes) -> None:
    """A distribution ``name`` whose RECORD lists flash_attn/cute/interface.py with the hash of
    ``recorded`` while the file holds ``content``."""
    import base64
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
    info = root / f"{name.replace('-', '_')}-4.0.0b36.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 4.0.0b36\n")
    (info / "RECORD").write_text(f"flash_attn/cute/interface.py,sha256={digest},{len(content)}\n")
    (root / "flash_attn" / "cute").mkdir(parents=True)
    (root / "flash_attn" / "cute" / "interface.py").write_bytes(content)


def test_replaced_interface_file_is_a_reason(tmp_path, monkeypatch):
    """flash-attn 2 installed after FA4 overwrites flash_attn/cute/*.py: the RECORD hash of
    interface.py no longer matches the file."""
    name = "fa4-replaced-test"
    _fake_distribution(tmp_path, name, content=b"older copy\n", recorded=b"fa4's copy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = _support._interface_replaced.__wrapped__(name)
    assert reason is not None and "is not fa4-replaced-test's own file" in reason


def test_intact_interface_file_passes(tmp_path, monkeypatch):
    name = "fa4-intact-test"
    _fake_distribution(tmp_path, name, content=b"fa4's copy\n", recorded=b"fa4's copy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _support._interface_replaced.__wrapped__(name) is None


# ----------------------------------------------------------------------------------------------
# The causal mask mapping


def fa4_visible(args: MaskArgs, sq: int, sk: int) -> torch.Tensor:
    """The keys FA4 lets each query row see for these arguments, by FA4's own rule
    (mask.py / block_info.py): ``i + off - left <= j <= i + off + right``, ``off = Sk - Sq``;
    ``causal`` is right = 0; ``None`` is unbounded."""
    off = sk - sq
    right = 0 if args.causal else args.window_right
    rows = torch.arange(sq)[:, None]
    cols = torch.arange(sk)[None, :]
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if right is not None:
        seen &= cols <= rows + off + right
    if args.window_left is not None:
        seen &= cols >= rows + off - args.window_left
    return seen


def forward_inputs(sq: int, sk: int, causal: bool, align: str, window=None) -> adb.ForwardInputs:
    q = torch.empty(1, sq, 2, 16, device="meta")
    k = torch.empty(1, sk, 2, 16, device="meta")
    return make_inputs(q, k, k, causal=causal, causal_align=align, window=window)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [(1, 1), (7, 7), (5, 13), (13, 5), (1, 9), (9, 1), (64, 3)])
def test_mask_args_give_exactly_our_mask(align, causal, sq, sk):
    inp = forward_inputs(sq, sk, causal, align)
    args = mask_args(inp)
    assert torch.equal(fa4_visible(args, sq, sk), visible_mask(sq, sk, causal, align))


WINDOWS = [(0, 0), (2, None), (None, 3), (1, 4), (6, 0), (0, 5), (20, 20)]


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [(7, 7), (5, 13), (13, 5), (1, 9), (9, 1)])
@pytest.mark.parametrize("window", WINDOWS)
def test_mask_args_give_exactly_our_window(align, causal, sq, sk, window):
    """Every sliding window, with or without causal, both alignments and Sq != Sk: FA4's
    window arguments see exactly the contract's keys (the top-left diagonal shifted onto FA4's
    bottom-right one, one side possibly negative, never both)."""
    args = mask_args(forward_inputs(sq, sk, causal, align, window))
    wanted = visible_mask(sq, sk, causal, align, window=window)
    assert torch.equal(fa4_visible(args, sq, sk), wanted)
    sides = (args.window_left, args.window_right)
    assert not all(side is not None and side < 0 for side in sides)


def test_mask_args_use_fa4_causal_where_the_alignments_agree():
    assert mask_args(forward_inputs(8, 8, True, "top_left")) == MaskArgs(True, None, None)
    assert mask_args(forward_inputs(5, 9, True, "bottom_right")) == MaskArgs(True, None, None)
    assert mask_args(forward_inputs(5, 9, True, "top_left")) == MaskArgs(False, None, -4)
    assert mask_args(forward_inputs(9, 5, False, "top_left")) == MaskArgs(False, None, None)


def test_mask_args_refuse_top_left_varlen_with_distinct_offsets():
    q = torch.empty(12, 2, 16, device="meta")
    cu_q = torch.zeros(3, dtype=torch.int32, device="meta")
    cu_k = torch.zeros(3, dtype=torch.int32, device="meta")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=6, max_seqlen_k=6)
    inp = make_inputs(q, q, q, causal=True, causal_align="top_left", **varlen)
    with pytest.raises(ValueError, match="distinct cu_seqlens_q / cu_seqlens_k"):
        mask_args(inp)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("variant", ["softcap", "sinks"])
def test_softcap_and_sinks_rank_below_triton_outside_the_cost_table(backward, variant):
    """FA4 measured slower than triton with a soft cap and was timed with sinks only on
    GPT-OSS's shapes: its priority for such calls is below triton:fused's (45) both ways, so a
    shape no table covers does not go to it; a plain call keeps the arch's priority."""
    q, k, v, out, lse, do = dense(16384)
    grads = (out, lse, do) if backward else ()
    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    extra = (
        {"softcap": 30.0}
        if variant == "softcap"
        else {"sinks": torch.empty(64, dtype=torch.float32, device="meta")}
    )
    varied = make_inputs(q, k, v, *grads, **flags, **extra)
    plain = make_inputs(q, k, v, *grads, **flags)
    arch = ad.Arch.parse("sm_90")
    assert plugin.Sm90().priority_for_inputs(varied, arch) == plugin.VARIANT_PRIORITY < 45
    assert plugin.Sm90().priority_for_inputs(plain, arch) == plugin.PRIORITY


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("sq", "sk"), [(7, 7), (5, 13), (13, 5)])
@pytest.mark.parametrize(
    ("huge", "bounded"),
    [((0, 2**63 - 1), (0, None)), ((2**63 - 1, 3), (None, 3)), ((2**64, 2**70), None)],
)
def test_mask_args_take_sides_near_int64_as_unbounded(align, sq, sk, huge, bounded):
    """FA4's window arguments are 32-bit in its kernels: a side near or beyond the int64 limit
    reaches every key and must arrive as the unbounded side, never as a wrapped number."""
    args = mask_args(forward_inputs(sq, sk, False, align, huge))
    assert args == mask_args(forward_inputs(sq, sk, False, align, bounded))
    assert all(side is None or abs(side) < 2**31 for side in args[1:])
    assert torch.equal(fa4_visible(args, sq, sk), visible_mask(sq, sk, False, align, window=huge))


def test_sm90_short_dense_backward_ranks_low_eager_where_the_replay_is_refused(installed):
    """On a release the replay was not proven on, a dense call pays FA4's host code every time,
    as a varlen call does: the eager host-bound rule applies to it."""
    installed("4.0.0b40")
    eager = explain(dense(1024, h=8, hkv=8), "sm_90", causal=True, execution="eager")
    assert verdicts(eager)["flash_attn_cute:sm90"].priority == 42
    installed("4.0.0b36")
    eager = explain(dense(1024, h=8, hkv=8), "sm_90", causal=True, execution="eager")
    assert verdicts(eager)["flash_attn_cute:sm90"].priority == 60
