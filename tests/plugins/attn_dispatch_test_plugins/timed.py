"""``timed``: implementations whose speed and correctness differ, for autotune's tests.

Active only with ``ATTN_DISPATCH_TEST_PLUGINS=timed`` (not with ``=1``: the toys' tests never see
them). All three compute with the float64 oracle's formulas (``exact``) and advance ``CLOCK`` by
their cost; tests time them with it (``_measure.clock = timed.CLOCK``), so the measured ratio
is the same on an idle and on a loaded machine. On the CPU:

* ``timed:slow`` — correct, highest priority, costs ``SLOW_SECONDS`` per call;
* ``timed:wrong`` — fast, second priority, returns results off by half, and scribbles into
  its input tensors (a kernel that writes where it should only read);
* ``timed:fast`` — correct and fast (``FAST_SECONDS``), lowest priority, not deterministic.

So priority alone picks ``slow``; a measurement picks ``fast`` and must exclude ``wrong``.
``CALLS`` counts each one's calls in this process.
"""

from __future__ import annotations

import collections
import os

import attn_dispatch as ad
from attn_dispatch import backend as adb

from .exact import Oracle

SLOW_SECONDS = 0.02
FAST_SECONDS = 0.001
CALLS: collections.Counter[str] = collections.Counter()


class Clock:
    """Seconds of counted work: the sum of the costs of the calls made so far."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


CLOCK = Clock()


def active() -> bool:
    return os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") == "timed"


class _Timed(adb.Implementation):
    backend = "timed"
    window = softcap = True
    cost = FAST_SECONDS

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        CALLS[self.full_name] += 1
        CLOCK.advance(self.cost)
        return Oracle().backward(inp)

    def forward(self, inp: adb.ForwardInputs):
        CALLS[self.full_name] += 1
        CLOCK.advance(self.cost)
        return Oracle().forward(inp)


class Slow(_Timed):
    name, cost = "slow", SLOW_SECONDS
    priority = {"cpu": 30}


class Wrong(_Timed):
    name = "wrong"
    priority = {"cpu": 20}

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        grads = super().backward(inp)
        inp.q.add_(1.0)
        inp.grad_out.mul_(-1.0)
        return ad.Gradients(*(g * 1.5 for g in grads))

    def forward(self, inp: adb.ForwardInputs):
        out, lse = super().forward(inp)
        inp.q.add_(1.0)
        return out * 1.5, lse


class Fast(_Timed):
    name = "fast"
    priority = {"cpu": 10}
    deterministic = False


@adb.hookimpl
def attn_dispatch_implementations():
    return [Slow(), Wrong(), Fast()] if active() else []
