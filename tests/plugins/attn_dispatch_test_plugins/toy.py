"""Toy implementations whose results say which one ran: every output is filled with its tag."""

from __future__ import annotations

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import active


class _Tagged(adb.Implementation):
    backend = "toy"
    tag = 0.0

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        return ad.Gradients(*(torch.full_like(t, self.tag) for t in (inp.q, inp.k, inp.v)))

    def forward(self, inp: adb.ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = inp.q.new_full(inp.q.shape[:-1] + (inp.head_dim_v,), self.tag)
        lse_shape = (
            (inp.heads, inp.q.shape[0]) if inp.is_varlen else (inp.batch, inp.heads, inp.seqlen_q)
        )
        return out, torch.full(lse_shape, self.tag, dtype=torch.float32, device=inp.q.device)


class Fast(_Tagged):
    name, tag = "fast", 1.0
    priority = {"cpu": 50, "sm_90": 50}

    def supports(self, inp, arch):
        return [] if inp.head_dim <= 64 else [f"head_dim={inp.head_dim} > 64"]


class Slow(_Tagged):
    """Low priority, except at head_dim 32, where it outranks every other toy (90)."""

    name, tag = "slow", 2.0
    priority = {"cpu": 10, "sm_*": 10}

    def priority_for_inputs(self, inp, arch):
        return 90 if inp.head_dim == 32 else self.priority_for(arch)


class NonDeterministic(_Tagged):
    name, tag = "nondet", 3.0
    priority = {"cpu": 70}
    deterministic = False


class Experimental(_Tagged):
    name, tag = "experimental", 4.0
    priority = {"*": 100}
    opt_in = True
    opt_in_reason = "it is a toy that only the opt-in tests enable"


class GpuOnly(_Tagged):
    """Accepts anything but has a priority only on sm_90: on the CPU it runs only when forced."""

    name, tag = "gpu_only", 5.0
    priority = {"sm_90": 80}


class HostSync(_Tagged):
    """Reads one value back to the host in every call: legal in an eager call, not inside a
    CUDA graph capture. No priority anywhere: it runs only when forced."""

    name, tag = "host_sync", 6.0

    def backward(self, inp: adb.BackwardInputs) -> ad.Gradients:
        grads = super().backward(inp)
        if grads.dq.numel() and float(grads.dq.flatten()[0]) != self.tag:
            raise RuntimeError("toy:host_sync wrote the wrong tag")
        return grads


class GraphOnly(_Tagged):
    """Ranked first for calls captured into a CUDA graph, and not
    ranked at all in eager calls (there it runs only when forced): a kernel whose host cost
    only a graph replay hides."""

    name, tag = "graph_only", 7.0

    def priority_for_execution(self, inp, arch, execution):
        return 200 if execution == "graph" else None


class Trivial(adb.Implementation):
    """Returns its inputs untouched: used to measure the dispatcher's own overhead."""

    backend, name = "toy", "trivial"

    def backward(self, inp):
        return ad.Gradients(inp.q, inp.k, inp.v)


TAGS = {
    cls.name: cls.tag
    for cls in (Fast, Slow, NonDeterministic, Experimental, GpuOnly, HostSync, GraphOnly)
}


@adb.hookimpl
def attn_dispatch_implementations():
    if not active():
        return []
    return [
        Fast(),
        Slow(),
        NonDeterministic(),
        Experimental(),
        GpuOnly(),
        HostSync(),
        GraphOnly(),
        Trivial(),
    ]
