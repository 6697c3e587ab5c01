"""Entry point of the reference backend: one implementation, ``reference:chunked``.

Lowest priority on every arch, so it runs automatically only where nothing faster accepts the
inputs. It accepts every input the core's validation lets through: any device, any float dtype,
any head dims (Dv may differ from D), GQA/MQA, both causal alignments, dense and varlen, and
arbitrary strides. Non-goals: speed, dropout, attention bias.
"""

from __future__ import annotations

import attn_dispatch as ad


class Chunked(ad.Implementation):
    """Exact attention, queries processed in chunks sized by a memory budget."""

    backend = "reference"
    name = "chunked"
    priority = {"*": 0}
    opt_in = False
    deterministic = True

    #: Bytes allowed for one score-sized buffer; the backward holds about three of them.
    budget_bytes: int | None = None

    def supports(self, inp: ad.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Everything the core accepts runs here."""
        return []

    def _budget(self) -> int:
        from ._chunked import DEFAULT_BUDGET_BYTES

        return self.budget_bytes if self.budget_bytes is not None else DEFAULT_BUDGET_BYTES

    def forward(self, inp: ad.ForwardInputs):
        """``(out, lse)`` computed exactly."""
        from ._chunked import attention_forward

        return attention_forward(
            inp.q,
            inp.k,
            inp.v,
            scale=inp.scale,
            causal=inp.causal,
            causal_align=inp.causal_align,
            cu_seqlens_q=inp.cu_seqlens_q,
            cu_seqlens_k=inp.cu_seqlens_k,
            budget_bytes=self._budget(),
        )

    def backward(self, inp: ad.BackwardInputs) -> ad.Gradients:
        """``(dq, dk, dv)`` from the given ``out`` and ``lse``."""
        from ._chunked import attention_backward

        return ad.Gradients(
            *attention_backward(
                inp.q,
                inp.k,
                inp.v,
                inp.out,
                inp.lse,
                inp.grad_out,
                scale=inp.scale,
                causal=inp.causal,
                causal_align=inp.causal_align,
                cu_seqlens_q=inp.cu_seqlens_q,
                cu_seqlens_k=inp.cu_seqlens_k,
                budget_bytes=self._budget(),
            )
        )


@ad.hookimpl
def attn_dispatch_implementations() -> list[ad.Implementation]:
    """The reference backend's implementations."""
    return [Chunked()]
