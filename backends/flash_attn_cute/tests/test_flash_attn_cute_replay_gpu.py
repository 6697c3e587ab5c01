"""The replay of FA4's host code on the GPU (test_flash_attn_cute_replay.py covers its logic).

For each variant, ``ad.forward`` / ``ad.backward`` forced to ``flash_attn_cute`` run six times
on fresh random bf16 inputs of one signature (with attention sinks, fresh sinks too, and their
gradient checked): the first call plans, the next two are recorded, the rest are replays. Every
call is compared with the float64 oracle (the allocator poisoned with NaN first, so an element
left unwritten fails), each replayed forward with FA4's own ``_flash_attn_fwd`` on the same
inputs (the same kernel: bitwise equal), and at the end the signature's forward and backward
must be replaying.

On a release whose row in ``_releases.RELEASES`` does not say the replay was proven there
(``replay_tested``), these tests switch it on for themselves: their passing is the proof that
lets the row say so. Variants whose head dim the release does not admit are skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attn_dispatch_flash_attn_cute import _fa4, _releases, _support
from attn_dispatch_flash_attn_cute._support import fa4_problem

import attn_dispatch as ad
from attn_dispatch.backend import make_inputs
from attn_dispatch.testing.oracle import oracle
from attn_dispatch.testing.tolerances import error_metrics, tolerance_for

pytestmark = pytest.mark.gpu

CALLS = 6


def _why_not_here() -> str | None:
    if not torch.cuda.is_available() or torch.version.hip:
        return "needs an NVIDIA GPU"
    if ad.detect_arch(torch.device("cuda")).name != "sm_90":
        return "FA4 is on by default (and tested here) on sm_90"
    return fa4_problem()


WHY_NOT = _why_not_here()

# (B, Sq, Sk, H, Hkv, D, flags)
VARIANTS = {
    "mha-full": (2, 512, 512, 8, 8, 128, {}),
    "gqa-causal": (2, 700, 700, 8, 2, 128, dict(causal=True)),
    "gqa-causal-deterministic": (1, 600, 600, 8, 2, 64, dict(causal=True, deterministic=True)),
    "mha-window-softcap": (1, 900, 900, 4, 4, 96, dict(window=(255, 0), softcap=30.0)),
    # GPT-OSS's attention (64/8 heads, D=64, sinks; its layers alternate a 128-token window
    # and full causal), each call with fresh sinks
    "gqa-causal-sinks": (1, 1000, 1000, 64, 8, 64, dict(causal=True, sinks=True)),
    "gqa-window-sinks": (1, 1000, 1000, 64, 8, 64, dict(causal=True, window=(127, 0), sinks=True)),
    "mqa-bottom-right-d256": (
        1,
        300,
        800,
        4,
        1,
        256,
        dict(causal=True, causal_align="bottom_right"),
    ),
}


@pytest.fixture(autouse=True)
def replay_under_test(monkeypatch):
    """The installed release's replay switched on for these tests (see the module docstring)."""
    release = _support.installed_release()
    if release is not None and not release.replay_tested:
        proving = dataclasses.replace(release, replay_tested=True)
        monkeypatch.setitem(_releases.RELEASES, release.version, proving)


def _poison_allocator(nbytes: int) -> None:
    block = torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del block


def _replaying() -> int:
    """How many of the dispatcher's cached FA4 plans (``inp.plan``) replay."""
    settings = ad._settings.current()
    decisions = list(settings.decisions.values())
    decisions += [decision for entries in settings.guarded.values() for _, decision in entries]
    plans = {id(d.plan): d.plan for d in decisions if isinstance(d.plan, _fa4.Ready)}
    return sum(r.replay is not None for r in plans.values())


def _check(name: str, got: torch.Tensor, want: torch.Tensor, call: int) -> None:
    tol = tolerance_for(torch.bfloat16)
    if name == "lse":
        err = (got.double() - want).abs().max().item()
        assert err <= tol.lse_atol + tol.lse_rtol * want.abs().max().item(), (call, name, err)
        return
    max_err, rel_l2 = error_metrics(got, want)
    assert max_err <= tol.max_err and rel_l2 <= tol.rel_l2, (call, name, max_err, rel_l2)


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_replayed_calls_match_the_oracle_and_fa4(variant):
    b, sq, sk, h, hkv, d, flags = VARIANTS[variant]
    unproven = _support.sm90_head_dim_problem(d, d, h != hkv)
    if unproven is not None:
        pytest.skip(unproven)
    before = _replaying()
    gen = torch.Generator(device="cuda").manual_seed(sorted(VARIANTS).index(variant))

    def rnd(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    flags = dict(flags)
    with_sinks = flags.pop("sinks", False)
    oracle_flags = {k: v for k, v in flags.items() if k != "deterministic"}
    for call in range(CALLS):
        q, k, v, grad_out = (
            rnd(b, sq, h, d),
            rnd(b, sk, hkv, d),
            rnd(b, sk, hkv, d),
            rnd(b, sq, h, d),
        )
        sinks = {"sinks": rnd(h)} if with_sinks else {}
        # the backward is handed the forward's bf16 out: the oracle's gradients take the same
        want = oracle(q, k, v, grad_out, **oracle_flags, **sinks, given_out_dtype=q.dtype)
        _poison_allocator(8 * q.numel() * q.element_size())
        out, lse = ad.forward(q, k, v, backend="flash_attn_cute", **flags, **sinks)
        _poison_allocator(8 * q.numel() * q.element_size())
        grads = ad.backward(
            q, k, v, out, lse, grad_out, backend="flash_attn_cute", **flags, **sinks
        )
        for name, got, ref in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), want):
            _check(name, got, ref, call)
        if with_sinks:
            _check("dsinks", grads.dsinks, want.dsinks, call)
        if call >= 3:  # a replay: the same kernel as FA4's own call on these inputs
            kwargs = _fa4.plan_for("forward", _inputs_of(q, k, v, flags, sinks)).kwargs
            kwargs = kwargs | {"learnable_sink": sinks["sinks"]} if with_sinks else kwargs
            direct, direct_lse, *_ = _fa4.interface()._flash_attn_fwd(q, k, v, **kwargs)
            assert torch.equal(out, direct) and torch.equal(lse, direct_lse), call
    assert _replaying() == before + 2, "the forward and backward of this signature replay"


def _inputs_of(q, k, v, flags, sinks):
    base = dict(causal=False, causal_align="top_left", scale=None, deterministic=False)
    return make_inputs(q, k, v, **(base | flags), **sinks)
