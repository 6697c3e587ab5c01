"""Capabilities as data: declarations checked at load, the standard reasons the core writes."""

from __future__ import annotations

import pytest
import torch
from dispatch_helpers import EXACT, DeclinesVariants, make_inputs

import attn_dispatch as ad
from attn_dispatch import _capabilities, _registry
from attn_dispatch import backend as adb


def _inputs(
    d=64,
    dv=None,
    h=4,
    hkv=4,
    sq=16,
    sk=16,
    dtype=torch.bfloat16,
    device="meta",
    causal=False,
    align="top_left",
    **tensors,
) -> adb.ForwardInputs:
    q = tensors.get("q", torch.empty(1, sq, h, d, dtype=dtype, device=device))
    k = torch.empty(1, sk, hkv, d, dtype=dtype, device=device)
    v = torch.empty(1, sk, hkv, dv or d, dtype=dtype, device=device)
    return adb.make_inputs(
        q, k, v, causal=causal, causal_align=align, scale=None, deterministic=False
    )


def _reasons(impl: adb.Implementation, inp: adb.ForwardInputs, arch: str) -> list[str]:
    arch = ad.Arch.parse(arch)
    return _capabilities.where_reasons(impl, inp, arch) or _capabilities.input_reasons(impl, inp)


class Declares(adb.Implementation):
    backend, name = "caps", "declares"
    vendors = ("cuda",)
    min_sm = 80
    dtypes = (torch.float16, torch.bfloat16)
    head_dims = range(8, 129, 8)
    same_head_dims = True
    varlen = False
    gqa = False
    causal_aligns = ("top_left",)
    alignment = 16


class Silent(adb.Implementation):
    backend, name = "caps", "silent"


def test_arch_sm_and_capability():
    assert ad.Arch.parse("sm_90").sm == 90
    assert ad.Arch.parse("sm_100").capability == (10, 0)
    assert ad.Arch.parse("sm86").capability == (8, 6)
    assert ad.Arch.parse("gfx950").sm is None and ad.Arch.parse("cpu").capability is None


def test_lse_dtype():
    assert adb.lse_dtype(torch.float64) == torch.float64
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert adb.lse_dtype(dtype) == torch.float32


def test_a_plugin_that_declares_nothing_allows_everything():
    assert _capabilities.declaration_problems(Silent()) == []
    odd_shapes = dict(d=7, dv=300, h=6, hkv=2, sq=4, sk=9)
    inp = _inputs(
        **odd_shapes, dtype=torch.float64, device="cpu", causal=True, align="bottom_right"
    )
    assert _reasons(Silent(), inp, "gfx950") == []


@pytest.mark.parametrize(
    ("arch", "kw", "reason"),
    [
        ("gfx942", {}, "device vendor 'rocm' (tensors on meta): needs an NVIDIA (CUDA) GPU"),
        ("sm_75", {}, "arch=sm_75: needs sm_80 or newer"),
        ("sm_90", {"dtype": torch.float32}, "dtype=float32: needs one of bfloat16, float16"),
        ("sm_90", {"d": 12}, "head_dim=12: needs a multiple of 8 in 8..128"),
        ("sm_90", {"dv": 32}, "head_dim_v=32 != head_dim=64: needs equal head dims"),
        ("sm_90", {"hkv": 2}, "heads=4 != kv_heads=2 (GQA/MQA): needs equal head counts"),
        (
            "sm_90",
            {"causal": True, "align": "bottom_right", "sk": 32},
            "causal_align='bottom_right' with Sq=16 != Sk=32 (or varlen with distinct cu_seqlens): "
            "the causal mask is top_left only",
        ),
        (
            "sm_90",
            {"q": torch.empty(1, 16, 4, 128, dtype=torch.bfloat16, device="meta")[..., ::2]},
            "q.stride()=(8192, 512, 128, 2): needs a contiguous last dim",
        ),
    ],
)
def test_declarations_give_reasons_naming_the_value(arch, kw, reason):
    assert _reasons(Declares(), _inputs(**kw), arch)[0] == reason


def test_causal_alignments_that_agree_are_accepted():
    inp = _inputs(causal=True, align="bottom_right")  # Sq == Sk: the masks agree
    assert _reasons(Declares(), inp, "sm_90") == []


def test_cpu_tensors_with_a_gpu_arch_are_rejected():
    cpu = _inputs(device="cpu")
    assert _reasons(Declares(), cpu, "sm_90") == [
        "device vendor 'cpu' (tensors on cpu): needs an NVIDIA (CUDA) GPU"
    ]


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("deterministic", "False"),
        ("opt_in", 1),
        ("opt_in_reason", ""),
        ("opt_in_reason", ["not run"]),
        ("dtypes", "bfloat16"),
        ("head_dims", [64, "128"]),
        ("vendors", "cuda"),
        ("archs", ("sm_90", 90)),
        ("min_sm", "80"),
        ("causal_aligns", ("left",)),
        ("alignment", 0),
        ("window", None),
        ("priority", {"sm_90": "high"}),
    ],
)
def test_wrong_declarations_fail_the_plugin(attribute, value):
    impl = type("Wrong", (Silent,), {attribute: value})()
    problems = _registry._declaration_problems(impl)
    assert len(problems) == 1 and problems[0].startswith(f"caps:silent: {attribute}="), problems


def test_a_capability_property_that_raises_fails_the_plugin():
    class Raises(Silent):
        @property
        def deterministic(self):  # type: ignore[override]
            raise RuntimeError("no")

    (problem,) = _registry._declaration_problems(Raises())
    assert "RuntimeError: no" in problem


def test_forced_backend_that_cannot_raises_from_attention(env):
    """Through the op (CPU tensors: a meta call would only run its fake implementation)."""
    env.set(**EXACT)
    ad._settings.current().registry.implementations["exact:plain"] = DeclinesVariants()
    q = torch.randn(1, 6, 2, 8)
    for flags in ({"softcap": 2.0}, {"window": (1, 1)}):
        with pytest.raises(ad.NoBackendError, match="not supported by this implementation"):
            ad.attention(q, q, q, backend="exact:plain", **flags)
    ad.attention(q, q, q, backend="exact:plain")


def _candidate_reasons(report: ad.Report, name: str) -> tuple[str, ...]:
    return next(c.reasons for c in report.candidates if c.name == name)


def test_the_window_diagonal_needs_a_declared_alignment(env):
    """An implementation whose mask is top-left only cannot run a bottom-right window with
    Sq != Sk (its diagonal differs), even without causal; it can where the two agree."""

    class TopLeft(adb.Implementation):
        backend, name = "exact", "top_left_band"
        priority = {"*": 1}
        causal_aligns = ("top_left",)
        window = True

    env.set(**EXACT)
    ad._settings.current().registry.implementations["exact:top_left_band"] = TopLeft()
    tensors = make_inputs(sq=6, sk=9, h=2, hkv=1, d=8)
    report = ad.explain(*tensors, window=(2, 2), causal_align="bottom_right")
    (reason,) = _candidate_reasons(report, "exact:top_left_band")
    assert "causal_align='bottom_right' with Sq=6 != Sk=9" in reason
    assert "diagonal of window=(2, 2) is top_left only" in reason
    assert not _candidate_reasons(ad.explain(*tensors, window=(2, 2)), "exact:top_left_band")
    square = make_inputs(sq=6, sk=6, h=2, hkv=1, d=8)
    assert not _candidate_reasons(
        ad.explain(*square, window=(2, 2), causal_align="bottom_right"), "exact:top_left_band"
    )
