"""``noded``: an implementation with its own autograd node, for the tests of eager
``attention`` calls that record it (``Implementation.autograd_forward``).

Active only with ``ATTN_DISPATCH_TEST_PLUGINS=noded``:

* ``noded:oracle`` — ``exact:oracle``'s forward and backward, declaring a 16-byte alignment; its
  ``autograd_forward`` computes the output with differentiable torch operators (their nodes are
  PyTorch's compiled ones), for calls without a window, soft cap or sinks;
* ``noded:backward`` — the same backward and no forward, ranked above ``noded:oracle``: where it
  is enabled, a call's backward decision differs from its forward's;
* ``noded:captured`` — the same backward and no forward, with a priority under CUDA graphs
  only, above ``noded:oracle``'s: a captured backward's decision differs from an eager one's.

``RUNS`` records which ran, in order: ``"forward"``, ``"backward"`` (either implementation's
``backward``, with its name) and ``"node"`` (a forward through ``autograd_forward``).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing.oracle import visible_mask

from .exact import Oracle

RUNS: list[str] = []


def active() -> bool:
    return os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") == "noded"


class _Signature(NamedTuple):
    """What the node's function keeps of a signature's inputs: numbers, never their tensors
    (the function lives as long as the signature's verdict)."""

    group: int
    scale: float
    seqlen_q: int
    seqlen_k: int
    causal: bool
    causal_align: str
    dtype: torch.dtype


def _differentiable_forward(sig: _Signature, layout: str, q, k, v) -> torch.Tensor:
    """The output for q, k, v in ``layout`` with ``sig``'s flags, in differentiable operators
    (no transposes: ``layout`` is each einsum's own)."""
    RUNS.append("node")
    heads = 1 if layout == "bhsd" else 2
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(sig.group, dim=heads) for t in (k, v))
    spec = "bhqd,bhkd->bhqk" if layout == "bhsd" else "bqhd,bkhd->bhqk"
    scores = torch.einsum(spec, q, k) * sig.scale
    mask = visible_mask(sig.seqlen_q, sig.seqlen_k, sig.causal, sig.causal_align, q.device)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    spec = "bhqk,bhkd->bhqd" if layout == "bhsd" else "bhqk,bkhd->bqhd"
    return torch.einsum(spec, probs, v).to(sig.dtype)


class NodedOracle(Oracle):
    backend, name = "noded", "oracle"
    priority = {"*": 50}
    alignment = 16  # its decisions read pointers, as a GPU kernel's do

    def autograd_forward(self, inp: adb.ForwardInputs, layout: str):
        if inp.window is not None or inp.softcap is not None or inp.sinks is not None:
            return None
        sig = _Signature(
            inp.heads // inp.kv_heads,
            inp.scale,
            inp.seqlen_q,
            inp.seqlen_k,
            inp.causal,
            inp.causal_align,
            inp.dtype,
        )
        return functools.partial(_differentiable_forward, sig, layout)

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


class CapturedBackward(BackwardOnly):
    name = "captured"
    priority = {}
    priority_rules = (adb.PriorityRule("*", 70, execution="graph"),)


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    return [NodedOracle(), BackwardOnly(), CapturedBackward()] if active() else []
