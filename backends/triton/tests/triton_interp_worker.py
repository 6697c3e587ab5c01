"""Runs the Triton kernels under ``TRITON_INTERPRET=1`` against a float64 oracle.

Started as a subprocess by ``test_triton_numerics.py`` (the interpreter must be chosen before
the kernels are defined, and must not leak into other tests): reads a JSON list of cases on
stdin, prints a JSON list of measured errors on stdout.

Triton 3.6's interpreter has four gaps that this module patches (test-only, process-local):
loop bounds that are scalar tensors fail ``__index__`` under NumPy 2; ``tl.dot`` on bf16
multiplies the raw uint16 bit patterns; fp32 -> bf16 casts truncate instead of rounding to
nearest even (what the GPU does); tensor-descriptor reductions (``desc.atomic_add``, the TMA
reduce) are missing (emulated as a masked per-element atomic add over the descriptor's box).
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402


def patch_interpreter() -> None:
    """Fix the interpreter gaps named in the module docstring."""
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir

    patch_tensor = interp._patch_lang_tensor

    def patched_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched_tensor

    def to_f32(x):
        if x.dtype.scalar == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(x.data).view(np.int16)).view(torch.bfloat16)
            return interp.TensorHandle(t.float().numpy(), tl.float32)
        return x

    dot = interp.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, to_f32(a), to_f32(b), d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot
    cast = interp.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return interp.TensorHandle(t.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    interp.InterpreterBuilder.cast_impl = cast_impl

    def create_descriptor_reduce(self, kind, desc, value, indices):
        assert kind == ir.DESCRIPTOR_REDUCE_KIND.ADD, kind
        ptrs, mask = desc.materialize_pointers(indices)
        return self.create_atomic_rmw(
            ir.ATOMIC_OP.FADD, ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED, ir.MEM_SYNC_SCOPE.GPU
        )

    interp.InterpreterBuilder.create_descriptor_reduce = create_descriptor_reduce


# ------------------------------------------------------------------------------------ oracle


def oracle_one(q, k, v, causal, bottom_right, scale):
    """Plain attention on one sequence [S,H,D] in float64; returns (out, lse[H,S])."""
    sq, sk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("ihd,jhd->hij", q, kk) * scale
    if causal:
        off = sk - sq if bottom_right else 0
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + off, float("-inf"))
    lse = (
        torch.logsumexp(s, -1) if sk else torch.full((q.shape[1], sq), float("-inf"), dtype=q.dtype)
    )
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with lse = -inf: p = 0
    return torch.einsum("hij,jhd->ihd", p, vv), lse


def oracle(q, k, v, case):
    """Dense [B,S,H,D] or varlen [T,H,D] oracle; returns (out, lse) in our layout."""
    args = (case["causal"], case["bottom_right"], case["scale"])
    if case.get("seqlens_q") is None:
        outs, lses = zip(*(oracle_one(q[b], k[b], v[b], *args) for b in range(q.shape[0])))
        return torch.stack(outs), torch.stack(lses)
    cq = np.cumsum([0, *case["seqlens_q"]])
    ck = np.cumsum([0, *case["seqlens_k"]])
    outs, lses = zip(
        *(
            oracle_one(q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]], *args)
            for b in range(len(cq) - 1)
        )
    )
    return torch.cat(outs), torch.cat(lses, dim=1)


# ------------------------------------------------------------------------------------- cases


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (NaN if a has NaN; 0 for two empty tensors)."""
    a = a.double()
    if torch.isnan(a).any():
        return float("nan")
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def run_case(case: dict) -> dict:
    from attn_dispatch_triton.backward import attention_backward
    from attn_dispatch_triton.forward import attention_forward

    torch.manual_seed(case["seed"])
    dt = getattr(torch, case["dtype"])
    h, hk, d, dv = (
        case["heads"],
        case["kv_heads"],
        case["head_dim"],
        case.get("head_dim_v", case["head_dim"]),
    )
    varlen = case.get("seqlens_q") is not None
    if varlen:
        lead_q, lead_k = (sum(case["seqlens_q"]),), (sum(case["seqlens_k"]),)
    else:
        lead_q = (case["batch"], case["seqlen_q"])
        lead_k = (case["batch"], case["seqlen_k"])

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64).to(dt)

    if case.get("strided"):  # views into packed buffers: non-contiguous head/seq strides
        q = rand(*lead_q, h + 2, d)[..., 1 : h + 1, :]
        kv = rand(*lead_k, 2, hk, max(d, dv))
        k, v = kv[..., 0, :, :d], kv[..., 1, :, :dv]
    else:
        q, k, v = rand(*lead_q, h, d), rand(*lead_k, hk, d), rand(*lead_k, hk, dv)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out64, lse64 = oracle(q64, k64, v64, case)
    do = rand(*out64.shape)
    dq64, dk64, dv64 = torch.autograd.grad(out64, (q64, k64, v64), do.double())

    flags = dict(causal=case["causal"], bottom_right=case["bottom_right"], scale=case["scale"])
    if varlen:
        cu_q = torch.tensor(np.cumsum([0, *case["seqlens_q"]]), dtype=torch.int32)
        cu_k = torch.tensor(np.cumsum([0, *case["seqlens_k"]]), dtype=torch.int32)
        flags.update(
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=max(case["seqlens_q"]),
            max_seqlen_k=max(case["seqlens_k"]),
        )
    cfg = case.get("config")
    res: dict = {"id": case["id"]}

    out = torch.full(out64.shape, float("nan"), dtype=dt)
    lse = torch.full(lse64.shape, float("nan"), dtype=torch.float32)
    attention_forward(q, k, v, **flags, out=out, lse=lse, config=cfg and cfg.get("fwd"))
    res["out"] = rel(out, out64.detach())
    finite = torch.isfinite(lse64)
    res["lse_inf_match"] = bool(torch.equal(torch.isneginf(lse), ~finite))
    res["lse_abs"] = (lse.double() - lse64)[finite].abs().max().item() if finite.any() else 0.0
    res["lse_nan"] = bool(torch.isnan(lse).any())

    grads = [torch.full(t.shape, float("nan"), dtype=dt) for t in (q, k, v)]
    o_in, lse_in = out64.detach().to(dt), lse64.float()
    atomic = bool(case.get("atomic"))  # the fused design: dQ through fp32 atomics
    attention_backward(
        q,
        k,
        v,
        o_in,
        lse_in,
        do,
        **flags,
        config=cfg,
        dq=grads[0],
        dk=grads[1],
        dv=grads[2],
        atomic_dq=atomic,
    )
    for name, got, want in zip(("dq", "dk", "dv"), grads, (dq64, dk64, dv64)):
        res[name] = rel(got, want)
    # Rows that see no key must get exactly zero gradient.
    empty = ~finite  # [B,H,S] or [H,T]: query rows that see no key
    if empty.any():
        per_row = empty.t() if varlen else empty.transpose(1, 2)  # dq's [T,H] / [B,S,H]
        res["dq_empty_rows_zero"] = bool((grads[0][per_row] == 0).all())
    if case.get("repeat"):  # the backward is atomic-free: a second run is bitwise identical
        again = attention_backward(q, k, v, o_in, lse_in, do, **flags, config=cfg, atomic_dq=atomic)
        res["bitwise_repeat"] = all(torch.equal(a, b) for a, b in zip(again, grads))
    return res


def main() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    patch_interpreter()
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        try:
            results.append(run_case(case))
        except Exception as exc:  # reported per case, so one failure does not hide the others
            results.append({"id": case["id"], "error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
