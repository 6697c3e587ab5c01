"""Entry point of the reference backend: one implementation, ``reference:chunked``.

Lowest priority on every arch, so it runs automatically only where nothing faster accepts the
inputs. It accepts every input the core's validation lets through: any device, any float dtype,
any head dims (Dv may differ from D), GQA/MQA, both causal alignments, dense and varlen,
sliding windows, logit soft-capping and attention sinks, and arbitrary strides. Non-goals:
speed, dropout, attention bias.
"""

from __future__ import annotations

import attn_dispatch as ad
from attn_dispatch import backend as adb


class Chunked(adb.Implementation):
    """Exact attention, queries processed in chunks sized by a memory budget."""

    backend = "reference"
    name = "chunked"
    priority = {"*": 0}
    opt_in = False
    deterministic = True
    window = True
    softcap = True
    sinks = True

    #: Bytes allowed for one score-sized buffer; the backward holds about three of them (four
    #: with a soft cap).
    budget_bytes: int | None = None

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Everything the core accepts runs here."""
        return []

    def _flags(self, inp: adb.ForwardInputs) -> dict:
        """The keyword arguments of :func:`attention_forward` / :func:`attention_backward`."""
        from ._chunked import DEFAULT_BUDGET_BYTES

        budget = DEFAULT_BUDGET_BYTES if self.budget_bytes is None else self.budget_bytes
        return dict(
            scale=inp.scale,
            band=inp.band,
            softcap=inp.softcap,
            cu_seqlens_q=inp.cu_seqlens_q,
            cu_seqlens_k=inp.cu_seqlens_k,
            budget_bytes=budget,
        )

    def forward(self, inp: adb.ForwardInputs):
        """``(out, lse)`` computed exactly."""
        from ._chunked import attention_forward

        return attention_forward(inp.q, inp.k, inp.v, **self._flags(inp), sinks=inp.sinks)

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the given ``out`` and ``lse`` (and ``dsinks`` with sinks: the
        given lse includes them, so the probabilities need nothing more)."""
        from ._chunked import attention_backward, sinks_gradient

        grads = attention_backward(
            inp.q, inp.k, inp.v, inp.out, inp.lse, inp.grad_out, **self._flags(inp)
        )
        if inp.sinks is None:
            return ad.Gradients(*grads)
        dsinks = sinks_gradient(inp.out, inp.lse, inp.grad_out, inp.sinks)
        return ad.Gradients(*grads, dsinks)


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    """The reference backend's implementations."""
    return [Chunked()]
