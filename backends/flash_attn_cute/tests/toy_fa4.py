"""A CPU stand-in for ``flash_attn.cute.interface``, shaped like FA4's host code.

Each entry point works out a compile key, allocates its outputs and scratch buffers, looks its
"kernels" up in per-function compile caches (dictionaries, as FA4's in-memory ``JITCache``) and
launches them with tensors, views and plain constants. The kernels compute with the float64
oracle and write into the buffers they are given; the backward accumulates dQ into a zeroed
float32 buffer and converts it in a third kernel, as FA4's does. Every host call and every launch
is counted, so a test can tell FA4's Python from a replay of it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from attn_dispatch.testing.oracle import oracle


class Aux(NamedTuple):
    """Like FA4's ``AuxData``: a constant container argument."""

    tensors: tuple | None = None
    scalars: tuple | None = None


class SinkGrad(NamedTuple):
    """Like FA4's ``LearnableSinkBwdTensors``: one kernel argument holding tensors."""

    dpsum: torch.Tensor
    lse: torch.Tensor
    sink: torch.Tensor
    dsink: torch.Tensor


def _no_grad_arguments(kernel):
    """A kernel that refuses tensors requiring grad, as a DLPack export does: FA4 detaches
    what it hands its kernels."""

    def launch(*args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                raise RuntimeError("Can't export tensors that require gradient")
        return kernel(*args)

    return launch


class ToyFA4:
    """``_flash_attn_fwd`` / ``_flash_attn_bwd`` (and ``_bwd_preprocess``'s cache) on the CPU."""

    def __init__(self, lookup: str = "index"):
        # "index": kernels looked up as cache[key] (4.0.0b36); "get": cache.get(key) (4.0.0b40)
        self.lookup = lookup
        self.host_calls: list[str] = []
        self.launches: list[str] = []
        self._flash_attn_fwd = self._entry(self._forward)
        self._flash_attn_bwd = self._entry(self._backward)
        self._bwd_preprocess = self._entry(None)

    @staticmethod
    def _entry(body):
        def entry(*args, **kwargs):
            return body(*args, **kwargs)

        entry.compile_cache = {}
        return entry

    def _kernel(self, owner, key, make):
        if self.lookup == "get":
            kernel = owner.compile_cache.get(key)
            if kernel is None:
                kernel = owner.compile_cache[key] = _no_grad_arguments(make())
            return kernel
        if key not in owner.compile_cache:
            owner.compile_cache[key] = _no_grad_arguments(make())
        return owner.compile_cache[key]

    def _forward(self, q, k, v, softmax_scale=None, causal=False, learnable_sink=None, **_):
        self.host_calls.append("fwd")
        b, s, h, _d = q.shape
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        lse = torch.empty(b, h, s, dtype=torch.float32)
        key = ("fwd", q.dtype, causal, learnable_sink is not None)
        kernel = self._kernel(self._flash_attn_fwd, key, lambda: self._fwd(causal))
        sinks = None if learnable_sink is None else learnable_sink.detach()
        kernel(q.detach(), k.detach(), v.detach(), out.detach(), lse, softmax_scale, sinks, Aux())
        return out, lse, None, None, None

    def _fwd(self, causal):
        def kernel(q, k, v, out, lse, scale, sinks, _aux):
            self.launches.append("fwd")
            ref = oracle(
                q, k, v, causal=causal, causal_align="bottom_right", scale=scale, sinks=sinks
            )
            out.copy_(ref.out)
            lse.copy_(ref.lse)

        return kernel

    def _backward(
        self, q, k, v, out, dout, lse, softmax_scale=None, causal=False, learnable_sink=None, **_
    ):
        self.host_calls.append("bwd")
        b, s, h, d = q.shape
        dpsum = torch.empty(b, h, s, dtype=torch.float32)
        dq_accum = torch.zeros(b, h, s * d, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dsink = None if learnable_sink is None else torch.empty_like(learnable_sink)
        pre = self._kernel(self._bwd_preprocess, ("pre",), self._pre)
        pre(out.detach(), dout.detach(), dpsum.transpose(1, 2))
        main = self._kernel(self._flash_attn_bwd, ("bwd", causal), lambda: self._main(causal))
        main(
            q.detach(),
            k.detach(),
            v.detach(),
            dout.detach(),
            lse.detach(),
            dpsum,
            dq_accum,
            dk,
            dv,
            softmax_scale,
            None if learnable_sink is None else learnable_sink.detach(),
        )
        # as FA4 4.0.0b36: the sinks' gradient comes from dQ's conversion kernel, handed the
        # tensors it reads and writes in one named tuple
        sink_grad = None if dsink is None else SinkGrad(dpsum, lse, learnable_sink, dsink)
        post = self._kernel(self._flash_attn_bwd, ("post",), self._post)
        post(dq_accum, dq, sink_grad)
        return (dq, dk, dv) if learnable_sink is None else (dq, dk, dv, dsink)

    def _pre(self):
        def kernel(out, dout, dpsum_bsh):
            self.launches.append("pre")
            dpsum_bsh.copy_((out.float() * dout.float()).sum(-1))

        return kernel

    def _main(self, causal):
        def kernel(q, k, v, dout, lse, dpsum, dq_accum, dk, dv, scale, sinks):
            self.launches.append("bwd")
            ref = oracle(
                q, k, v, dout, causal=causal, causal_align="bottom_right", scale=scale, sinks=sinks
            )
            # the accumulator must arrive zeroed: the kernel adds to it
            dq_accum.add_(ref.dq.transpose(1, 2).reshape(dq_accum.shape).float())
            dk.copy_(ref.dk)
            dv.copy_(ref.dv)

        return kernel

    def _post(self):
        def kernel(dq_accum, dq, sink_grad):
            self.launches.append("post")
            b, s, h, d = dq.shape
            dq.copy_(dq_accum.view(b, h, s, d).transpose(1, 2))
            if sink_grad is not None:
                # each row's sink probability times the row's sum of dO * O, negated
                dpsum, lse, sink, dsink = sink_grad
                p_sink = torch.exp(sink.double()[None, :, None] - lse.double())
                dsink.copy_(-(p_sink * dpsum.double()).sum(dim=(0, 2)))

        return kernel
