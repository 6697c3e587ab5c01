"""flash_attn_cute's per-signature call plan, on the CPU: what every call of a signature passes
to FA4 is worked out once, and the first call of a new variant announces its compilation.

FA4 itself is not imported here (its kernels compile in test_flash_attn_cute_fake_compile.py
and run in test_flash_attn_cute_gpu.py); ``first_call`` is given the call to time.
"""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_flash_attn_cute import _fa4
from attn_dispatch_flash_attn_cute._support import mask_args

from attn_dispatch._inputs import build_inputs


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    monkeypatch.setattr(_fa4, "_plans", {})
    monkeypatch.setattr(_fa4, "_variants_ready", set())
    monkeypatch.setattr(_fa4, "_records", [])


def backward_inputs(sq=64, sk=96, d=64, **flags):
    q = torch.empty(2, sq, 8, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, sk, 2, d, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 8, sq, device="meta")
    flags = dict(
        dict(causal=True, causal_align="top_left", scale=None, deterministic=False), **flags
    )
    return build_inputs(q, k, k, q, lse, q, **flags)


def test_plan_is_made_once_per_signature():
    first = _fa4.plan_for("backward", backward_inputs())
    assert _fa4.plan_for("backward", backward_inputs()) is first
    assert _fa4.plan_for("backward", backward_inputs(causal=False)) is not first
    assert _fa4.plan_for("backward", backward_inputs(deterministic=True)) is not first
    assert _fa4.plan_for("forward", backward_inputs()) is not first


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [None, (16, 0), (None, 4)])
def test_plan_arguments_are_the_calls_own(align, window):
    inp = backward_inputs(causal_align=align, window=window, softcap=None, scale=0.5)
    m = mask_args(inp)
    assert _fa4.plan_for("backward", inp).kwargs == dict(
        softmax_scale=0.5,
        causal=m.causal,
        window_size_left=m.window_left,
        window_size_right=m.window_right,
        softcap=0.0,
        deterministic=False,
    )
    capped = backward_inputs(causal_align=align, window=window, softcap=30.0)
    fwd = _fa4.plan_for("forward", capped).kwargs
    assert fwd["softcap"] == 30.0 and fwd["return_lse"] is True


def test_first_call_of_a_variant_announces_compilation_once(capsys):
    plan = _fa4.plan_for("backward", backward_inputs())
    assert _fa4.first_call(plan, lambda: "result") == "result"
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "attn_dispatch: compiling FlashAttention-4 backward bfloat16 D=64 Dv=64 group=4 window "
        "dense kernels (once per variant) ..."
    )
    assert err[1].startswith("attn_dispatch: FlashAttention-4 backward bfloat16") and len(err) == 2
    assert plan.first_done
    # another signature of the same variant (other lengths): its kernels exist, no line
    other = _fa4.plan_for("backward", backward_inputs(sq=128, sk=160))
    assert other is not plan and other.variant == plan.variant
    _fa4.first_call(other, lambda: None)
    assert capsys.readouterr().err == ""
    assert _fa4.compile_log() == []  # FA4 not imported: no kernels were added


def test_failed_first_call_stays_first(capsys):
    plan = _fa4.plan_for("backward", backward_inputs())

    def fails():
        raise RuntimeError("compilation failed")

    with pytest.raises(RuntimeError, match="compilation failed"):
        _fa4.first_call(plan, fails)
    assert not plan.first_done
