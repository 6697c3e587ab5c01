"""``noded``: an implementation with its own autograd node, for the tests of eager
``attention`` calls that record it (``Implementation.autograd_forward``).

Active only with ``ATTN_DISPATCH_TEST_PLUGINS=noded``:

* ``noded:oracle`` — ``exact:oracle``'s forward and backward, declaring a 16-byte alignment; its
  ``autograd_forward`` computes the output with differentiable torch operators (their nodes are
  PyTorch's compiled ones), for calls without a window, soft cap or sinks;
* ``noded:backward`` — the same backward and no forward, ranked above ``noded:oracle``: where it
  is enabled, a call's backward decision differs from its forward's.

``RUNS`` records which ran, in order: ``"forward"``, ``"backward"`` (either implementation's
``backward``, with its name) and ``"node"`` (a forward through ``autograd_forward``).
"""

from __future__ import annotations

import functools
import os

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing.oracle import visible_mask

from .exact import Oracle

RUNS: list[str] = []


def active() -> bool:
    return os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") == "noded"


def _differentiable_forward(inp: adb.ForwardInputs, layout: str, q, k, v) -> torch.Tensor:
    """The output for q, k, v in ``layout`` with ``inp``'s flags, in differentiable operators
    (no transposes: ``layout`` is each einsum's own)."""
    RUNS.append("node")
    seq, heads = (2, 1) if layout == "bhsd" else (1, 2)
    group = inp.heads // inp.kv_heads
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(group, dim=heads) for t in (k, v))
    spec = "bhqd,bhkd->bhqk" if layout == "bhsd" else "bqhd,bkhd->bhqk"
    scores = torch.einsum(spec, q, k) * inp.scale
    mask = visible_mask(inp.seqlen_q, inp.seqlen_k, inp.causal, inp.causal_align, q.device)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    spec = "bhqk,bhkd->bhqd" if layout == "bhsd" else "bhqk,bkhd->bqhd"
    assert q.shape[seq] == inp.seqlen_q
    return torch.einsum(spec, probs, v).to(inp.dtype)


class NodedOracle(Oracle):
    backend, name = "noded", "oracle"
    priority = {"*": 50}
    alignment = 16  # its decisions read pointers, as a GPU kernel's do

    def autograd_forward(self, inp: adb.ForwardInputs, layout: str):
        if inp.window is not None or inp.softcap is not None or inp.sinks is not None:
            return None
        return functools.partial(_differentiable_forward, inp, layout)

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        RUNS.append("forward")
        return super().forward(inp)

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        RUNS.append(f"backward {self.full_name}")
        return super().backward(inp)


class BackwardOnly(adb.Implementation):
    backend, name = "noded", "backward"
    priority = {"*": 60}
    window = softcap = sinks = True

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        RUNS.append(f"backward {self.full_name}")
        return Oracle.backward(self, inp)


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    return [NodedOracle(), BackwardOnly()] if active() else []
