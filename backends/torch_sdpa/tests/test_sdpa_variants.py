"""torch_sdpa and the attention variants (sliding window, logit soft-cap), on the CPU.

What PyTorch's ops offer: ``aten::_flash_attention_forward``/``_backward`` take
``window_size_left``/``window_size_right`` (bottom-right aligned); the cuDNN ops take no window
and the memory-efficient ops only a one-sided ``window_size``; none takes a soft cap. So
``torch_sdpa:flash`` declares ``window`` and the others nothing. Inputs are the core's
validated inputs (``adb.make_inputs``: a window side that excludes no key is already
unbounded); tensors live on ``meta``. Through ``ad.explain``: test_sdpa_supports.py. Numerics
on a GPU: the conformance kit's window cases in test_sdpa_gpu.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from attn_dispatch_torch_sdpa import _ops
from attn_dispatch_torch_sdpa._common import may_have_empty_rows
from attn_dispatch_torch_sdpa.cudnn import Cudnn
from attn_dispatch_torch_sdpa.efficient import Efficient
from attn_dispatch_torch_sdpa.flash import Flash, _window_kwargs

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing import declared_capabilities, make_conformance_tests
from attn_dispatch.tools import cli

SM90 = ad.Arch.parse("sm_90")


def _inputs(sq=256, sk=256, *, causal=False, align="bottom_right", window=None, varlen=None):
    """Backward inputs on meta; ``varlen``: "same" or "distinct" cu_seqlens offsets."""
    h, hkv, d = 8, 2, 64
    if varlen:
        q = torch.empty(sq, h, d, dtype=torch.bfloat16, device="meta")
        k = torch.empty(sk, hkv, d, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(h, sq, device="meta")
        cu_q = torch.empty(3, dtype=torch.int32, device="meta")
        cu_k = cu_q if varlen == "same" else torch.empty(3, dtype=torch.int32, device="meta")
        extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=sq, max_seqlen_k=sk)
    else:
        q = torch.empty(1, sq, h, d, dtype=torch.bfloat16, device="meta")
        k = torch.empty(1, sk, hkv, d, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(1, h, sq, device="meta")
        extra = {}
    return adb.make_inputs(
        q, k, k, q, lse, q, causal=causal, causal_align=align, window=window, **extra
    )


def test_declared_capabilities():
    assert Flash.window and not Flash.softcap
    for impl in (Cudnn, Efficient):
        assert not impl.window and not impl.softcap


def test_installed_flash_ops_take_the_window_keywords():
    assert _ops.op_problem(_ops.FLASH_FWD_WINDOW) is None
    assert _ops.op_problem(_ops.FLASH_BWD_WINDOW) is None


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(window=(64, 16)), {"window_size_left": 64, "window_size_right": 16}),
        (dict(window=(None, 16)), {"window_size_left": -1, "window_size_right": 16}),
        (dict(window=(8, None)), {"window_size_left": 8, "window_size_right": -1}),
        (dict(window=(8, 5), causal=True), {"window_size_left": 8, "window_size_right": 0}),
        # no window at all (validation drops one bounding neither side): the ops' is_causal
        (dict(window=(None, None), causal=True), {}),
        (dict(window=None, causal=True), {}),
    ],
)
def test_window_keywords_passed_to_the_ops(kwargs, expected):
    assert _window_kwargs(_inputs(**kwargs)) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(window=(64, 16)),
        dict(sq=128, sk=512, window=(64, 16)),
        dict(sq=128, sk=512, window=(64, 3), causal=True),
        dict(sq=301, sk=300, window=(10, None)),  # Sk >= Sq - 1: the clamp is exact
        dict(sq=400, sk=300, window=(10, 5)),  # a bounded right side below Sk is exact
        dict(window=(3, 3), align="top_left"),  # Sq == Sk: the alignments agree
        dict(sq=96, sk=128, window=(5, 1), varlen="distinct"),
        dict(sq=96, sk=96, window=(5, 1), align="top_left", varlen="same"),
    ],
)
def test_flash_accepts_windows_it_computes_exactly(kwargs):
    inp = _inputs(**kwargs)
    assert Flash().supports(inp, SM90) == []
    assert may_have_empty_rows(inp)  # a window may leave rows without keys


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sq=400, sk=300, window=(None, 399)),  # 399 >= Sq - 1 reaches every key
        dict(sq=128, sk=512, window=(None, 3), causal=True),  # causal hides more already
        dict(sq=256, sk=256, window=(255, 0), causal=True),  # Sk - 1: plain causal
    ],
)
def test_a_window_that_hides_no_key_reaches_flash_as_none(kwargs):
    inp = _inputs(**kwargs)
    assert inp.window is None
    assert Flash().supports(inp, SM90) == [] and _window_kwargs(inp) == {}


@pytest.mark.parametrize(
    ("kwargs", "arch", "needle"),
    [
        (dict(sq=128, sk=512, window=(4, 4), align="top_left"), "sm_90", "bottom_right aligned"),
        (
            dict(sq=96, sk=128, window=(4, 4), align="top_left", varlen="distinct"),
            "sm_90",
            "top_left",
        ),
        (dict(sq=400, sk=300, window=(10, None)), "sm_90", "right side at 300 instead"),
        (dict(sq=400, sk=300, window=(None, 300)), "sm_90", "leaves the right side unbounded"),
        (dict(sq=400, sk=300, window=(10, 350)), "sm_90", "right side at 300 instead"),
        # row 0 (diagonal -100) reaches key 299 with 399 but only key 200 with the kernel's 300
        (dict(sq=400, sk=300, window=(10, 399)), "sm_90", "right side at 300 instead"),
        (dict(window=(16, 16)), "gfx942", "ROCm"),
    ],
)
def test_flash_rejects_windows_with_a_reason(kwargs, arch, needle):
    reasons = Flash().supports(_inputs(**kwargs), ad.Arch.parse(arch))
    assert any(needle in r for r in reasons), reasons


def test_window_keywords_missing_from_the_schema_are_a_reason(monkeypatch):
    missing = _ops.FLASH_FWD._replace(keywords=("scale", "window_size_middle"))
    monkeypatch.setattr("attn_dispatch_torch_sdpa.flash.FLASH_FWD_WINDOW", missing)
    reasons = Flash().supports(_inputs(window=(8, 8)), SM90)
    assert any("lacks keyword(s) window_size_middle" in r for r in reasons), reasons
    assert Flash().supports(_inputs(), SM90) == []  # without a window the keywords are not needed


# ----------------------------------------------------------------------------------------------
# through the public API: selection, forcing, the CLI and the conformance kit on meta tensors


def _meta_args(sq=256, h=8, d=128, dtype=torch.bfloat16):
    """Backward arguments (q, k, v, out, lse, grad_out) on meta, BSHD, MHA."""
    bshd = [torch.empty(1, sq, h, d, dtype=dtype, device="meta") for _ in range(5)]
    lse = torch.empty(1, h, sq, dtype=torch.float32, device="meta")
    return [*bshd[:4], lse, bshd[4]]


def _reasons(report: ad.Report, name: str) -> tuple[str, ...]:
    return next(c.reasons for c in report.candidates if c.name == name)


def test_cached_decision_is_not_reused_for_a_window_the_choice_rejects(isolated_plugins):
    """A decision made for plain inputs (cuDNN on sm_90) must not run a windowed call."""
    # flash and efficient disabled: cuDNN, which takes no window, decides the plain call
    isolated_plugins.set(
        ATTN_DISPATCH_ARCH="sm_90",
        ATTN_DISPATCH_PLUGINS="torch_sdpa,reference",
        ATTN_DISPATCH_DISABLE="torch_sdpa:flash,torch_sdpa:efficient",
    )
    tensors = _meta_args(d=128)
    assert ad.explain(*tensors).selected == "torch_sdpa:cudnn"
    ad.backward(*tensors)
    ad.backward(*tensors)
    report = ad.explain(*tensors, window=(128, 0))
    assert report.selected != "torch_sdpa:cudnn"
    with pytest.raises(ad.NoBackendError, match=r"window=\(128, 0\): not supported"):
        ad.backward(*tensors, window=(128, 0), backend="torch_sdpa:cudnn")
    ad.backward(*tensors, window=(128, 0))  # selects a backend that declares it


def test_cudnn_rejects_with_the_standard_reasons(isolated_plugins):
    report = ad.explain(*_meta_args(), window=(64, 0), softcap=30.0, arch="sm_90")
    reasons = _reasons(report, "torch_sdpa:cudnn")
    assert "window=(64, 0): not supported by this implementation" in reasons
    assert "softcap=30.0: not supported by this implementation" in reasons
    flash = _reasons(report, "torch_sdpa:flash")
    assert "softcap=30.0: not supported by this implementation" in flash
    assert not any(r.startswith("window=(64, 0): not supported") for r in flash)


def test_forced_backend_that_cannot_raises_listing_the_reason(isolated_plugins):
    isolated_plugins.set(ATTN_DISPATCH_ARCH="sm_90")
    tensors = _meta_args()
    for backend in ("torch_sdpa:cudnn", "torch_sdpa:efficient"):
        with pytest.raises(ad.NoBackendError, match=r"softcap=2.0: not supported"):
            ad.backward(*tensors, softcap=2.0, backend=backend)
        with ad.use_backend(backend), pytest.raises(ad.NoBackendError, match="window="):
            ad.forward(*tensors[:3], window=(8, 8))


def test_cli_explain_shows_window_and_softcap(isolated_plugins, capsys):
    argv = ["explain", "--seqlen", "2048", "--heads", "8", "--head-dim", "128", "--arch", "sm_90"]
    assert cli.main([*argv, "--window", "256,0", "--softcap", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("window=(256, 0) softcap=30.0" in line for line in data["inputs"])
    cudnn = next(c for c in data["candidates"] if c["name"] == "torch_sdpa:cudnn")
    assert "window=(256, 0): not supported by this implementation" in cudnn["reasons"]
    assert cli.main([*argv, "--window=-,64"]) == 0
    assert "window=(None, 64)" in capsys.readouterr().out
    assert cli.main([*argv, "--window", "none,0", "--backend", "torch_sdpa:cudnn"]) == 0
    assert "window=(None, 0): not supported" in capsys.readouterr().out


def test_cli_list_shows_the_capabilities(isolated_plugins, capsys):
    assert cli.main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "reference:chunked" in x)
    assert "window" in line and "softcap" in line
    assert cli.main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    impls = {i["name"]: i for b in data["backends"] for i in b["implementations"]}
    assert impls["torch_sdpa:flash"]["window"] and not impls["torch_sdpa:flash"]["softcap"]


def test_declared_capabilities_are_listed(isolated_plugins):
    infos = {i.name: i for b in ad.backends() for i in b.implementations}
    assert infos["torch_sdpa:flash"].window and not infos["torch_sdpa:flash"].softcap
    assert not infos["torch_sdpa:cudnn"].window and not infos["torch_sdpa:cudnn"].softcap
    assert declared_capabilities("torch_sdpa") == {"window"}
    assert declared_capabilities("torch_sdpa:cudnn") == set()


def _conformance_cases(backend: str) -> list:
    fn = make_conformance_tests(backend, checks=("backward",))
    (mark,) = [m for m in fn.pytestmark if m.name == "parametrize"]
    return [p.values[2] for p in mark.args[1]]


def test_conformance_suite_collects_variant_cases_only_where_declared():
    cudnn, flash = _conformance_cases("torch_sdpa:cudnn"), _conformance_cases("torch_sdpa:flash")
    assert not any(c.needs for c in cudnn)
    assert any("window" in c.needs for c in flash)
    assert not any("softcap" in c.needs for c in flash)
    assert len(cudnn) < len(_conformance_cases("reference"))


def _memory(shape: tuple, order: str) -> torch.Tensor:
    """A [B, S, H, D] tensor of ``shape`` whose memory runs in ``order`` (e.g. "bhsd")."""
    dims = ["bshd".index(c) for c in order]
    t = torch.randn([shape[d] for d in dims])
    return t.permute([order.index(c) for c in "bshd"])


def _cudnn_backward_layouts(recorded_ops, q, out, grad_out) -> tuple:
    """The strides of O and dO as ``torch_sdpa:cudnn``'s backward hands them to the op (the op
    needs a CUDA GPU: recorded instead), checking their values, with and without the
    signature's plan."""
    from attn_dispatch_torch_sdpa import cudnn

    ops = recorded_ops(cudnn, lambda args: tuple(t.clone() for t in args[1:4]))
    k = v = q[:, :, :2]
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
    inp = adb.make_inputs(q, k, v, out, lse, grad_out)
    Cudnn().backward(inp)  # without a plan, as outside dispatch
    inp.plan = Cudnn().prepare(inp)  # with the one a cached decision hands it
    Cudnn().backward(inp)
    seen = []
    for _, args, _ in ops.calls:
        grad, given_out = args[0].transpose(1, 2), args[4].transpose(1, 2)
        assert torch.equal(grad, grad_out) and torch.equal(given_out, out)
        seen.append((grad.stride(), given_out.stride()))
    assert seen[0] == seen[1]
    return seen[0]


@pytest.mark.parametrize("q_order", ["bshd", "bhsd", "sbhd"])
@pytest.mark.parametrize("seqlen", [7, 1])
def test_cudnn_hands_the_backward_o_and_do_laid_out_as_q_alone_decides(
    q_order, seqlen, recorded_ops
):
    # by its source, PyTorch caches cuDNN's backward graph under q, k and v's layouts alone
    shape = (2, seqlen, 4, 8)
    q = _memory(shape, q_order)
    given = [
        (_memory(shape, o), _memory(shape, g))
        for o, g in (("bshd", "bshd"), ("bhsd", "bshd"), ("bshd", "bhsd"), ("sbhd", "hbsd"))
    ]
    given.append((_memory(shape, "bshd"), torch.randn(1, 1, 1, 8).expand(shape)))  # broadcast
    given.append((torch.randn(2, seqlen, 6, 8)[:, :, :4], _memory(shape, "bhsd")))  # sliced
    layouts = {_cudnn_backward_layouts(recorded_ops, q, o, g) for o, g in given}
    assert len(layouts) == 1, layouts
