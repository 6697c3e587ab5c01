"""torch_sdpa on the CPU: what each implementation accepts and why it declines.

Tensors live on the ``meta`` device and ``arch=`` names a hypothetical chip, so these run
without a GPU. The numerics are in test_sdpa_gpu.py.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from attn_dispatch_torch_sdpa import _ops
from attn_dispatch_torch_sdpa.cudnn import Cudnn
from attn_dispatch_torch_sdpa.efficient import Efficient
from attn_dispatch_torch_sdpa.flash import Flash

import attn_dispatch as ad
from attn_dispatch.testing import Case

NAMES = ("torch_sdpa:cudnn", "torch_sdpa:flash", "torch_sdpa:efficient")


@pytest.fixture(autouse=True)
def only_sdpa_and_reference(isolated_plugins):
    """Selection among this backend and the reference alone (other backends may be installed)."""
    isolated_plugins.set(ATTN_DISPATCH_PLUGINS="torch_sdpa,reference")
    return isolated_plugins


def _dense(sq=1024, sk=None, h=64, hkv=8, d=128, dv=None, dtype=torch.bfloat16, device="meta"):
    sk = sq if sk is None else sk
    dv = d if dv is None else dv
    q = torch.empty(1, sq, h, d, dtype=dtype, device=device)
    k = torch.empty(1, sk, hkv, d, dtype=dtype, device=device)
    v = torch.empty(1, sk, hkv, dv, dtype=dtype, device=device)
    out = torch.empty(1, sq, h, dv, dtype=dtype, device=device)
    lse = torch.empty(1, h, sq, dtype=torch.float32, device=device)
    return q, k, v, out, lse, out


def _varlen(same_offsets: bool):
    tq, h, d = 96, 8, 64
    q = torch.empty(tq, h, d, dtype=torch.float16, device="meta")
    k = torch.empty(tq, 2, d, dtype=torch.float16, device="meta")
    out = torch.empty_like(q)
    lse = torch.empty(h, tq, device="meta")
    cu_q = torch.empty(4, dtype=torch.int32, device="meta")
    cu_k = cu_q if same_offsets else torch.empty(4, dtype=torch.int32, device="meta")
    flags = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=40, max_seqlen_k=40)
    return (q, k, k, out, lse, out), flags


def _status(report: ad.Report) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {c.name: (c.status, c.reasons) for c in report.candidates if c.name in NAMES}


def _reasons(report: ad.Report, name: str) -> str:
    return " | ".join(_status(report)[name][1])


def test_registered_with_priorities():
    infos = {b.name: b for b in ad.backends()}
    assert set(infos) == {"torch_sdpa", "reference"}
    assert "torch_sdpa" in infos
    names = [i.name for i in infos["torch_sdpa"].implementations]
    assert names == list(NAMES)
    assert (
        Cudnn().priority_for(ad.Arch.parse("sm_90"))
        > Flash().priority_for(ad.Arch.parse("sm_90"))
        > Efficient().priority_for(ad.Arch.parse("sm_90"))
        > 0
    )


def test_sm90_seed_shape_picks_cudnn():
    report = ad.explain(*_dense(), causal=True, arch="sm_90")
    assert report.selected == "torch_sdpa:cudnn"
    assert all(s[0] in ("selected", "supported") for s in _status(report).values())


def test_gfx942_has_no_cudnn_but_flash_and_efficient():
    report = ad.explain(*_dense(), arch="gfx942")
    st = _status(report)
    assert st["torch_sdpa:cudnn"][0] == "rejected"
    assert "NVIDIA" in _reasons(report, "torch_sdpa:cudnn")
    assert st["torch_sdpa:flash"][0] in ("selected", "supported")
    assert st["torch_sdpa:efficient"][0] in ("selected", "supported")


@pytest.mark.parametrize("device_arch", [("meta", "cpu"), ("cpu", None)])
def test_cpu_is_rejected_with_a_reason(device_arch):
    device, arch = device_arch
    args = _dense(sq=16, h=2, hkv=2, d=64, dtype=torch.float32, device=device)
    report = ad.explain(*args, arch=arch)
    for name in NAMES:
        status, reasons = _status(report)[name]
        assert status == "rejected"
        assert any("GPU" in r and "'cpu'" in r for r in reasons), reasons
    assert report.selected == "reference:chunked"


def test_old_gpu_arch_rejected():
    report = ad.explain(*_dense(), arch="sm_75")
    assert "sm_80" in _reasons(report, "torch_sdpa:cudnn")
    assert "sm_80" in _reasons(report, "torch_sdpa:flash")
    assert "bfloat16" in _reasons(report, "torch_sdpa:efficient")


def test_bottom_right_causal_with_sq_ne_sk():
    args = _dense(sq=256, sk=512)
    br = ad.explain(*args, causal=True, causal_align="bottom_right", arch="sm_90")
    assert "top_left only" in _reasons(br, "torch_sdpa:cudnn")
    assert _status(br)["torch_sdpa:flash"][0] in ("selected", "supported")
    assert _status(br)["torch_sdpa:efficient"][0] in ("selected", "supported")
    tl = ad.explain(*args, causal=True, causal_align="top_left", arch="sm_90")
    assert "bottom_right" in _reasons(tl, "torch_sdpa:flash")
    assert tl.selected == "torch_sdpa:cudnn"
    # Sq == Sk: the two alignments agree, so every kernel takes both.
    sq = ad.explain(*_dense(sq=256), causal=True, causal_align="bottom_right", arch="sm_90")
    assert all(status in ("selected", "supported") for status, _ in _status(sq).values())


def test_varlen_support():
    args, flags = _varlen(same_offsets=False)
    report = ad.explain(*args, **flags, arch="sm_90")
    assert "varlen" in _reasons(report, "torch_sdpa:cudnn")
    assert report.selected == "torch_sdpa:flash"
    causal = ad.explain(*args, **flags, causal=True, arch="sm_90")
    assert "bottom_right" in _reasons(causal, "torch_sdpa:flash")
    assert "distinct cu_seqlens_q" in _reasons(causal, "torch_sdpa:efficient")
    args, flags = _varlen(same_offsets=True)
    same = ad.explain(*args, **flags, causal=True, arch="sm_90")
    assert same.selected == "torch_sdpa:flash"
    rocm = ad.explain(*args, **flags, arch="gfx942")
    assert "ROCm" in _reasons(rocm, "torch_sdpa:flash")


def test_efficient_takes_varlen_only_with_shared_offsets():
    """Distinct offsets may pair empty query sequences with keys (or the reverse), where the
    kernel read out of bounds; shared offsets cannot."""
    args, flags = _varlen(same_offsets=False)
    distinct = _status(ad.explain(*args, **flags, arch="sm_90"))["torch_sdpa:efficient"]
    assert distinct[0] == "rejected" and "illegal memory access" in " ".join(distinct[1])
    args, flags = _varlen(same_offsets=True)
    shared = _status(ad.explain(*args, **flags, arch="sm_90"))["torch_sdpa:efficient"]
    assert shared[0] in ("selected", "supported"), shared


def test_the_kits_equal_length_varlen_cases_reach_efficient():
    """The testing kit passes one cu_seqlens tensor as both where the lengths are equal, so
    conformance and the sweep run efficient's varlen path; unequal lengths it refuses."""
    shared = Case((19, 0, 40), (19, 0, 40), heads=4, kv_heads=4, head_dim=64, varlen=True)
    apart = dataclasses.replace(shared, seqlens_k=(19, 3, 40))
    for case, taken in ((shared, True), (apart, False)):
        inp = case.make_inputs(torch.float16, "meta")
        report = ad.explain(inp.q, inp.k, inp.v, **inp.flags(), arch="sm_90")
        status, reasons = _status(report)["torch_sdpa:efficient"]
        assert (status in ("selected", "supported")) == taken, (case.id, status, reasons)


def test_deterministic_requests():
    report = ad.explain(*_dense(), deterministic=True, arch="sm_90")
    st = _status(report)
    assert st["torch_sdpa:cudnn"][0] == "rejected"
    assert st["torch_sdpa:flash"][0] == "rejected"  # torch's deterministic mode is off
    assert report.selected == "torch_sdpa:efficient"
    assert not Flash().deterministic
    torch.use_deterministic_algorithms(True)
    try:
        assert Flash().deterministic
        report = ad.explain(*_dense(), arch="sm_90")
        assert report.selected == "torch_sdpa:flash"
    finally:
        torch.use_deterministic_algorithms(False)
    rocm = ad.explain(*_dense(), deterministic=True, arch="gfx942")
    assert "deterministic" in _reasons(rocm, "torch_sdpa:efficient")


def test_dtype_and_head_dim_limits():
    f32 = ad.explain(*_dense(sq=64, h=4, hkv=4, d=64, dtype=torch.float32), arch="sm_90")
    assert "dtype=float32" in _reasons(f32, "torch_sdpa:cudnn")
    assert "dtype=float32" in _reasons(f32, "torch_sdpa:flash")
    assert f32.selected == "torch_sdpa:efficient"
    big = ad.explain(*_dense(sq=64, h=4, hkv=4, d=192), arch="sm_90")
    assert "head_dim=192" in _reasons(big, "torch_sdpa:cudnn")
    assert big.selected == "torch_sdpa:flash"
    odd = ad.explain(*_dense(sq=64, h=4, hkv=4, d=60), arch="sm_90")
    for name in NAMES:
        assert "multiple of 8" in _reasons(odd, name)
    dv = ad.explain(*_dense(sq=64, h=4, hkv=4, d=64, dv=32), arch="sm_90")
    assert "head_dim_v=32" in _reasons(dv, "torch_sdpa:flash")


def test_strides_rejected_with_reason():
    q, k, v, out, lse, do = _dense(sq=64, h=4, hkv=4, d=64)
    wide = torch.empty(1, 64, 4, 128, dtype=q.dtype, device="meta")
    strided_q = wide[..., ::2]  # last dim stride 2
    report = ad.explain(strided_q, k, v, out, lse, do, arch="sm_90")
    for name in NAMES:
        assert "q.stride()" in _reasons(report, name)
    odd_pitch = torch.empty(1, 64, 4, 68, dtype=q.dtype, device="meta")[..., :64]
    report = ad.explain(odd_pitch, k, v, out, lse, do, arch="sm_90")
    assert "16 bytes" in _reasons(report, "torch_sdpa:flash")
    transposed = torch.empty(1, 4, 64, 64, dtype=q.dtype, device="meta").transpose(1, 2)
    report = ad.explain(transposed, k, v, out, lse, do, arch="sm_90")
    assert report.selected == "torch_sdpa:cudnn"


def test_schema_gate_reports_mismatch(monkeypatch):
    changed = _ops.OpSpec(_ops.FLASH_BWD.name, ("Tensor",) * 3 + ("bool",))
    problem = _ops.op_problem(changed)
    assert problem is not None and "_flash_attention_backward" in problem
    absent = _ops.op_problem(_ops.OpSpec("_no_such_attention_op", ("Tensor",)))
    assert absent is not None and "has no op" in absent
    assert (
        _ops.op_problem(
            _ops.OpSpec(
                _ops.EFFICIENT_BWD.name, _ops.EFFICIENT_BWD.positional, ("scale", "no_such_kw")
            )
        )
        is not None
    )
    for spec in (
        _ops.CUDNN_FWD,
        _ops.CUDNN_BWD,
        _ops.FLASH_FWD,
        _ops.FLASH_BWD,
        _ops.EFFICIENT_FWD,
        _ops.EFFICIENT_BWD,
    ):
        assert _ops.op_problem(spec) is None, spec.name


def test_old_torch_is_rejected(monkeypatch):
    from packaging.version import Version

    monkeypatch.setattr(_ops, "torch_version", lambda: Version("2.3.1"))
    _ops.op_problem.cache_clear()
    try:
        report = ad.explain(*_dense(), arch="sm_90")
        for name in NAMES:
            assert "torch 2.3.1 is older than 2.5" in _reasons(report, name)
    finally:
        _ops.op_problem.cache_clear()


# ----------------------------------------------------------------------------------------------
# Sliding windows and soft caps through the public API, once the core takes them


def _core_takes(option: str) -> bool:
    return option in inspect.signature(ad.backward).parameters


def _explain(**kwargs) -> dict[str, tuple[str, tuple[str, ...]]]:
    q = torch.empty(1, 256, 8, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 256, 2, 64, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(1, 8, 256, device="meta")
    report = ad.explain(q, k, k, q, lse, q, arch="sm_90", **kwargs)
    return {c.name: (c.status, c.reasons) for c in report.candidates}


@pytest.mark.skipif(not _core_takes("window"), reason="ad.backward has no 'window' parameter yet")
def test_explain_window():
    st = _explain(window=(32, 0))
    assert st["torch_sdpa:flash"][0] in ("selected", "supported")
    for name in ("torch_sdpa:cudnn", "torch_sdpa:efficient"):
        status, reasons = st[name]
        assert status == "rejected" and any("window" in r for r in reasons), reasons


@pytest.mark.skipif(not _core_takes("softcap"), reason="ad.backward has no 'softcap' parameter yet")
def test_explain_softcap():
    st = _explain(softcap=30.0)
    for name in ("torch_sdpa:cudnn", "torch_sdpa:flash", "torch_sdpa:efficient"):
        status, reasons = st[name]
        assert status == "rejected" and any("softcap" in r for r in reasons), reasons
    assert st["reference:chunked"][0] == "selected"


@pytest.mark.parametrize(
    ("huge", "bounded"),
    [((0, 2**63 - 1), (0, None)), ((2**63 - 1, 0), (None, 0)), ((2**64, 5), (None, 5))],
)
def test_flash_window_sides_near_int64_are_passed_as_unbounded(huge, bounded):
    """The flash ops' window sizes are -1 for unbounded; a side that reaches every key (up to
    beyond int64) must arrive as -1, never as a number the kernel holds in 32 bits."""
    from attn_dispatch_torch_sdpa.flash import _window_kwargs

    from attn_dispatch.backend import make_inputs

    q = torch.empty(1, 9, 2, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 12, 2, 64, dtype=torch.bfloat16, device="meta")

    def kwargs(window):
        return _window_kwargs(make_inputs(q, k, k, causal_align="bottom_right", window=window))

    assert kwargs(huge) == kwargs(bounded)
    assert all(-1 <= side < 2**31 for side in kwargs(huge).values())


@pytest.mark.parametrize(
    ("tokens", "heads", "refused"), [(1, 18, True), (4, 18, False), (1, 3, False)]
)
def test_flash_refuses_single_query_varlen_gqa_with_empty_sequences(tokens, heads, refused):
    # 4 sequences, max_seqlen_q = 1: PyTorch's flash op folds the GQA group into the query rows,
    # assuming one query per sequence, and failed inside when some sequences were empty.
    q = torch.empty(tokens, heads, 32, dtype=torch.bfloat16, device="meta")
    k = torch.empty(8, 3, 32, dtype=torch.bfloat16, device="meta")
    out, lse = torch.empty_like(q), torch.empty(heads, tokens, device="meta")
    cu_q, cu_k = (torch.empty(5, dtype=torch.int32, device="meta") for _ in range(2))
    flags = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1, max_seqlen_k=5)
    report = ad.explain(q, k, k, out, lse, out, **flags, arch="sm_90")
    reasons = _reasons(report, "torch_sdpa:flash")
    assert ("one query per sequence" in reasons) == refused, reasons


def test_cudnn_refuses_one_query_with_one_key():
    # cuDNN's frontend raised "s_q = s_kv = 1 is not supported" on such a call.
    report = ad.explain(*_dense(sq=1, sk=1, h=16, hkv=4, d=32), causal=True, arch="sm_90")
    assert "Sq=Sk=1" in _reasons(report, "torch_sdpa:cudnn")
    report = ad.explain(*_dense(sq=1, sk=2, h=16, hkv=4, d=32), arch="sm_90")
    assert "Sq=Sk=1" not in _reasons(report, "torch_sdpa:cudnn")
