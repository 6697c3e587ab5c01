"""``planned``: implementations with a ``prepare`` hook, for the tests of per-signature plans.

Active only with ``ATTN_DISPATCH_TEST_PLUGINS=planned`` (the toys' tests never see them):

* ``planned:counted`` — its ``prepare`` returns a new :class:`Plan` of the signature and counts
  itself in ``PREPARED``; ``forward`` / ``backward`` record the plan they receive in ``SEEN`` and
  fill their outputs with the plan's number (0 without one);
* ``planned:broken`` — its ``prepare`` raises (no priority: it runs only when forced).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

# every plan prepare made, in order
PREPARED: list[Plan] = []
# (mode, the plan the call received) per call of forward / backward
SEEN: list[tuple[str, Plan | None]] = []
_numbers = itertools.count(1)


def active() -> bool:
    return os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") == "planned"


@dataclass(eq=False)
class Plan:
    """What one signature fixes: its mode and q's shape; ``number`` tells plans apart."""

    mode: str
    q_shape: tuple
    number: int


class Counted(adb.Implementation):
    backend, name = "planned", "counted"
    priority = {"*": 50}

    def prepare(self, inp: adb.ForwardInputs) -> Plan:
        mode = "backward" if isinstance(inp, adb.BackwardInputs) else "forward"
        plan = Plan(mode, tuple(inp.q.shape), next(_numbers))
        PREPARED.append(plan)
        return plan

    def _filled(self, inp: adb.ForwardInputs, t: torch.Tensor) -> torch.Tensor:
        return torch.full_like(t, 0.0 if inp.plan is None else float(inp.plan.number))

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        SEEN.append(("backward", inp.plan))
        return ad.Gradients(*(self._filled(inp, t) for t in (inp.q, inp.k, inp.v)))

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        SEEN.append(("forward", inp.plan))
        out = self._filled(inp, inp.q.new_empty((*inp.q.shape[:-1], inp.head_dim_v)))
        lse = (inp.heads, inp.q.shape[0]) if inp.is_varlen else (inp.batch, inp.heads, inp.seqlen_q)
        return out, torch.zeros(lse, dtype=adb.lse_dtype(inp.dtype), device=inp.q.device)


class Broken(Counted):
    name = "broken"
    priority = {}

    def prepare(self, inp: adb.ForwardInputs) -> Plan:
        raise ZeroDivisionError("planned:broken: bug in prepare (on purpose)")


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    return [Counted(), Broken()] if active() else []
