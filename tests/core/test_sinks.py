"""Attention sinks in the contract: validation, capabilities, the ``Gradients.dsinks`` result,
and ``ad.attention``'s gradient for ``sinks``, on the test plugins (``exact:oracle`` computes
sinks; the toys do not declare them)."""

from __future__ import annotations

import pytest
import torch
from dispatch_helpers import BOTTOM_RIGHT, EXACT, TOYS, make_inputs

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing.cases import Case
from attn_dispatch.testing.oracle import oracle


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sinks(h=4, dtype=torch.float32, device="cpu"):
    return torch.linspace(-1.0, 1.5, h, dtype=dtype, device=device)


@pytest.mark.parametrize(
    ("sinks", "error", "message"),
    [
        ([0.0, 0.0, 0.0, 0.0], TypeError, "argument 'sinks': expected a torch.Tensor, got list"),
        (torch.zeros(3), ValueError, r"argument 'sinks': expected shape \(4,\) \[H\]"),
        (torch.zeros(1, 4), ValueError, r"argument 'sinks': expected shape \(4,\) \[H\]"),
        (torch.zeros(4, dtype=torch.bfloat16), TypeError, "argument 'sinks': expected dtype"),
        (torch.zeros(4, dtype=torch.int64), TypeError, "argument 'sinks': expected dtype"),
        (torch.zeros(4, device="meta"), ValueError, "argument 'sinks': expected device cpu"),
        (torch.tensor([0.0, float("nan"), 0.0, 0.0]), ValueError, "expected finite values"),
        (torch.tensor([0.0, 0.0, float("-inf"), 0.0]), ValueError, "expected finite values"),
    ],
)
def test_malformed_sinks_are_refused_naming_the_argument(env, sinks, error, message) -> None:
    env.set(**EXACT)
    q, k, v, out, lse, do = make_inputs()
    for call in (
        lambda: ad.forward(q, k, v, sinks=sinks),
        lambda: ad.backward(q, k, v, out, lse, do, sinks=sinks),
        lambda: ad.explain(q, k, v, sinks=sinks),
        lambda: ad.decide(q, k, v, out, lse, do, sinks=sinks),
        lambda: adb.make_inputs(q, k, v, sinks=sinks),
        lambda: ad.attention(q, k, v, sinks=sinks),
    ):
        with pytest.raises(error, match=message):
            call()


def test_sinks_dtype_is_float32_or_the_queries() -> None:
    q, k, v, *_ = make_inputs(dtype=torch.bfloat16)
    for dtype in (torch.float32, torch.bfloat16):
        assert adb.make_inputs(q, k, v, sinks=_sinks(dtype=dtype)).sinks.dtype == dtype
    with pytest.raises(TypeError, match=r"expected dtype torch.float32 or torch.bfloat16 \(as q"):
        adb.make_inputs(q, k, v, sinks=_sinks(dtype=torch.float16))


def test_non_finite_sinks_are_refused_on_a_cached_signature_too(env) -> None:
    """The values are checked on every CPU call, not only where the signature is first seen."""
    env.set(**EXACT)
    q, k, v, *_ = make_inputs()
    ad.forward(q, k, v, sinks=_sinks())
    with pytest.raises(ValueError, match="argument 'sinks': expected finite values"):
        ad.forward(q, k, v, sinks=torch.tensor([0.0, 0.0, float("inf"), 0.0]))


def test_implementations_without_sinks_refuse_them_with_a_reason(env) -> None:
    env.set(**TOYS)
    q, k, v, out, lse, do = make_inputs()
    report = ad.explain(q, k, v, out, lse, do, sinks=_sinks())
    assert report.selected is None
    for c in report.candidates:
        assert any("sinks (attention sinks): not supported" in r for r in c.reasons), c
    with pytest.raises(ad.NoBackendError, match="sinks"):
        ad.backward(q, k, v, out, lse, do, sinks=_sinks(), backend="toy:fast")


def test_capability_is_listed(env) -> None:
    env.set(**EXACT)
    infos = {i.name: i for b in ad.backends() for i in b.implementations}
    assert infos["exact:oracle"].sinks is True
    assert infos["exact:oracle"].to_dict()["sinks"] is True
    env.set(**TOYS)
    infos = {i.name: i for b in ad.backends() for i in b.implementations}
    assert not any(i.sinks for i in infos.values())


def test_a_non_bool_sinks_declaration_fails_the_plugin() -> None:
    from attn_dispatch._capabilities import declaration_problems

    class Bad(adb.Implementation):
        backend, name, sinks = "bad", "impl", "yes"

    assert declaration_problems(Bad()) == ["sinks='yes' must be a bool"]


def test_gradients_unpack_into_three_and_carry_dsinks() -> None:
    dq, dk, dv, ds = (torch.full((1,), float(i)) for i in range(4))
    plain = ad.Gradients(dq, dk, dv)
    assert len(plain) == 3 and plain.dsinks is None
    with_sinks = ad.Gradients(dq, dk, dv, ds)
    a, b, c = with_sinks
    assert (a, b, c) == (dq, dk, dv) and with_sinks.dsinks is ds
    assert with_sinks._replace(dq=dk).dsinks is ds
    assert with_sinks._replace(dsinks=None).dsinks is None
    assert "dsinks=" in repr(with_sinks) and "dsinks" not in repr(plain)


def test_an_implementation_that_forgets_dsinks_is_named(env, monkeypatch) -> None:
    """The dispatcher checks the first result of a signature: a call with sinks needs dsinks."""
    env.set(**EXACT)
    from attn_dispatch_test_plugins import exact

    def forgets(self, inp):
        return ad.Gradients(*(torch.zeros_like(t) for t in (inp.q, inp.k, inp.v)))

    monkeypatch.setattr(exact.Oracle, "backward", forgets)
    q, k, v, out, lse, do = make_inputs()
    with pytest.raises(ValueError, match=r"exact:oracle returned dsinks as None"):
        ad.backward(q, k, v, out, lse, do, sinks=_sinks())


# a band (bottom-right, 2 keys to the left) that leaves the first rows without keys; a soft cap
NO_KEY_ROWS_CAPPED = dict(**BOTTOM_RIGHT, window=(2, 0), softcap=2.0)


@pytest.mark.parametrize(
    "case",
    [
        Case((12,), (12,), heads=4, kv_heads=2, head_dim=8, causal=True, sinks=True, seed=1),
        # rows that see no key: all their mass on the sink
        Case((14,), (6,), kv_heads=1, head_dim=8, **NO_KEY_ROWS_CAPPED, sinks=True, seed=2),
        Case((5, 0, 9), (7, 3, 2), heads=4, head_dim=8, varlen=True, sinks=True, seed=3),
    ],
    ids=lambda c: c.id,
)
def test_attention_differentiates_sinks_like_the_oracle(env, case) -> None:
    env.set(**EXACT)
    inp = case.make_inputs(torch.float64)
    q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
    sinks = inp.sinks.detach().requires_grad_()
    flags = {n: x for n, x in inp.flags().items() if n != "sinks"}
    out = ad.attention(q, k, v, sinks=sinks, **flags)
    grads = torch.autograd.grad(out, (q, k, v, sinks), inp.grad_out)
    oracle_flags = {n: x for n, x in flags.items() if not n.startswith("max_seqlen")}
    ref = oracle(q, k, v, inp.grad_out, sinks=sinks, **oracle_flags)
    for got, want in zip((out, *grads), (ref.out, ref.dq, ref.dk, ref.dv, ref.dsinks)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    if case.has_masked_rows:
        assert (ref.out.abs().sum(-1) == 0).any()


def test_gradcheck_through_attention_with_sinks(env) -> None:
    env.set(**EXACT)
    torch.manual_seed(0)
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 6, 1, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    sinks = torch.randn(2, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, sinks):
        return ad.attention(q, k, v, causal=True, causal_align="bottom_right", sinks=sinks)

    assert torch.autograd.gradcheck(f, (q, k, v, sinks))


def test_the_oracle_gives_the_sink_all_the_mass_of_an_empty_row() -> None:
    q, k, v, *_ = make_inputs(sq=6, sk=2, dtype=torch.float64)
    do = torch.randn(1, 6, 4, 16, dtype=torch.float64)
    sinks = _sinks(dtype=torch.float64)
    ref = oracle(q, k, v, do, causal=True, causal_align="bottom_right", sinks=sinks)
    empty = slice(0, 4)  # rows 0..3 see no key (their diagonal is i - 4)
    assert (ref.out[:, empty] == 0).all() and (ref.dq[:, empty] == 0).all()
    assert torch.equal(ref.lse[:, :, empty], sinks[None, :, None].expand(1, 4, 4))
    plain = oracle(q, k, v, do, causal=True, causal_align="bottom_right")
    assert torch.isneginf(plain.lse[:, :, empty]).all()
    # rows that see keys: the sink only adds to the normaliser
    torch.testing.assert_close(
        ref.lse[:, :, 4:], torch.logaddexp(plain.lse[:, :, 4:], sinks[None, :, None])
    )


def test_sinks_that_require_grad_leave_forward_without_a_graph(env) -> None:
    env.set(**EXACT)
    q, k, v, *_ = make_inputs(dtype=torch.float64)
    sinks = _sinks(dtype=torch.float64).requires_grad_()
    out, lse = ad.forward(q, k, v, sinks=sinks)
    assert not out.requires_grad and not lse.requires_grad


def test_compile_fullgraph_with_sinks_matches_eager(env) -> None:
    env.set(**EXACT)
    torch.compiler.reset()

    def attn(q, k, v, sinks):
        return ad.attention(q, k, v, causal=True, window=(3, None), sinks=sinks)

    compiled = torch.compile(attn, backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    q = torch.randn(1, 7, 4, 8, requires_grad=True)
    k, v = (torch.randn(1, 7, 2, 8, requires_grad=True) for _ in range(2))
    sinks = torch.randn(4, requires_grad=True)
    want_out = attn(q, k, v, sinks)
    want = torch.autograd.grad(want_out.sum(), (q, k, v, sinks))
    got_out = compiled(q, k, v, sinks)
    got = torch.autograd.grad(got_out.sum(), (q, k, v, sinks))
    for a, b in zip((got_out, *got), (want_out, *want)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
