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

import pytest
import torch
from attn_dispatch_torch_sdpa import _ops
from attn_dispatch_torch_sdpa._common import may_have_empty_rows
from attn_dispatch_torch_sdpa.cudnn import Cudnn
from attn_dispatch_torch_sdpa.efficient import Efficient
from attn_dispatch_torch_sdpa.flash import Flash, _window_kwargs

import attn_dispatch as ad
from attn_dispatch import backend as adb

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
        dict(sq=128, sk=512, window=(None, 3), causal=True),
        dict(sq=301, sk=300, window=(10, None)),  # Sk >= Sq - 1: the clamp is exact
        dict(sq=400, sk=300, window=(10, 5)),  # a bounded right side below Sk is exact
        dict(sq=400, sk=300, window=(None, 399)),  # unbounded for the kernel, 399 >= Sq - 1
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
