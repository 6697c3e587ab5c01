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

from attn_dispatch import backend as adb  # noqa: E402
from attn_dispatch.testing import visible_mask  # noqa: E402


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


def visible(sq, sk, causal, bottom_right, window=None):
    """[Sq, Sk] bool: key j visible to row i (the kit's mask, whose agreement with the contract
    ``tests/core/test_testing.py`` checks element by element)."""
    align = "bottom_right" if bottom_right else "top_left"
    return visible_mask(sq, sk, causal, align, window=window)


def oracle_one(q, k, v, causal, bottom_right, scale, window=None, softcap=None):
    """Attention on one sequence [S,H,D] in float64 as an explicit masked softmax (band and
    soft cap applied to the full score matrix); returns (out, lse[H,S])."""
    sq, sk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("ihd,jhd->hij", q, kk) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if causal or window is not None:
        s = s.masked_fill(~visible(sq, sk, causal, bottom_right, window), float("-inf"))
    lse = (
        torch.logsumexp(s, -1) if sk else torch.full((q.shape[1], sq), float("-inf"), dtype=q.dtype)
    )
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with lse = -inf: p = 0
    return torch.einsum("hij,jhd->ihd", p, vv), lse


def oracle(q, k, v, case):
    """Dense [B,S,H,D] or varlen [T,H,D] oracle; returns (out, lse) in our layout."""
    args = (
        case["causal"],
        case["bottom_right"],
        case["scale"],
        _window(case),
        case.get("softcap"),
    )
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


def _window(case):
    w = case.get("window")
    return None if w is None else tuple(w)


def unseen_keys(case):
    """Per key row of k ([B, Sk] dense / [T] varlen): True where no query row sees it."""
    args = (case["causal"], case["bottom_right"], _window(case))
    if case.get("seqlens_q") is None:
        one = ~visible(case["seqlen_q"], case["seqlen_k"], *args).any(0)
        return one.expand(case["batch"], -1)
    return torch.cat(
        [~visible(a, b, *args).any(0) for a, b in zip(case["seqlens_q"], case["seqlens_k"])]
    )


# ------------------------------------------------------------------------------------- cases


def kernel_flags(case: dict, q, k, v) -> dict:
    """The kernels' keywords for ``case``, read from the inputs dispatch builds (as the plugin
    does): the band with causal folded in and sides that exclude no key unbounded."""
    lengths = {}
    if case.get("seqlens_q") is not None:
        lengths = dict(
            cu_seqlens_q=torch.tensor(np.cumsum([0, *case["seqlens_q"]]), dtype=torch.int32),
            cu_seqlens_k=torch.tensor(np.cumsum([0, *case["seqlens_k"]]), dtype=torch.int32),
            max_seqlen_q=max(case["seqlens_q"]),
            max_seqlen_k=max(case["seqlens_k"]),
        )
    inp = adb.make_inputs(
        q,
        k,
        v,
        causal=case["causal"],
        causal_align="bottom_right" if case["bottom_right"] else "top_left",
        scale=case["scale"],
        window=_window(case),
        softcap=case.get("softcap"),
        **lengths,
    )
    return dict(band=inp.band, scale=inp.scale, softcap=inp.softcap, **lengths)


def call_band(sq: int, sk: int, causal: bool, bottom_right: bool, window) -> adb.Band:
    """The band of a dense call with these lengths and flags, as validation builds it."""
    q = torch.empty(1, sq, 1, 8, dtype=torch.float16, device="meta")
    k = torch.empty(1, sk, 1, 8, dtype=torch.float16, device="meta")
    align = "bottom_right" if bottom_right else "top_left"
    return adb.make_inputs(q, k, k, causal=causal, causal_align=align, window=window).band


def every_other(x: torch.Tensor, filler: float) -> torch.Tensor:
    """``x`` as a view of stride 2 (its elements interleaved with ``filler``), as
    ``t[::2]`` of a caller's larger tensor would be."""
    buf = torch.full((x.numel(), 2), filler, dtype=x.dtype)
    buf[:, 0] = x
    return buf[:, 0]


def padded(x: torch.Tensor, fill: float) -> torch.Tensor:
    """A copy of ``x`` as a view into a buffer with 3 more columns (``fill`` around it): every
    stride but the last differs from a contiguous tensor's."""
    buf = torch.full((*x.shape[:-1], x.shape[-1] + 3), fill, dtype=x.dtype)
    view = buf[..., 1 : x.shape[-1] + 1]
    view.copy_(x)
    return view


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (NaN if a has NaN; 0 for two empty tensors)."""
    a = a.double()
    if torch.isnan(a).any():
        return float("nan")
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def sinks_oracle(q, k, v, do, sinks, case, flags):
    """The library's float64 oracle (``attn_dispatch.testing.oracle``, which has attention
    sinks) on the case: out, lse, dq, dk, dv and dsinks."""
    from attn_dispatch.testing.oracle import oracle as library_oracle

    lengths = {n: flags[n] for n in ("cu_seqlens_q", "cu_seqlens_k") if n in flags}
    return library_oracle(
        q,
        k,
        v,
        do,
        causal=case["causal"],
        causal_align="bottom_right" if case["bottom_right"] else "top_left",
        scale=case["scale"],
        window=_window(case),
        softcap=case.get("softcap"),
        sinks=sinks,
        **lengths,
    )


def run_case(case: dict) -> dict:
    from attn_dispatch_triton._bwd_sinks import sinks_backward
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
    if case.get("heads_first"):  # [B, S, H, D] views of [B, H, S, D] memory
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    flags = kernel_flags(case, q, k, v)
    sinks = None
    if case.get("sinks"):  # [H] float32 logits of std 2: a real share of each row's mass
        sinks = (2 * torch.randn(h, dtype=torch.float64)).float()
        do = rand(*lead_q, h, dv)
        ref = sinks_oracle(q, k, v, do, sinks, case, flags)
        out64, lse64, dq64, dk64, dv64 = ref
    else:
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        out64, lse64 = oracle(q64, k64, v64, case)
        do = rand(*out64.shape)
        dq64, dk64, dv64 = torch.autograd.grad(out64, (q64, k64, v64), do.double())

    cfg = case.get("config")
    res: dict = {"id": case["id"]}

    out = torch.full(out64.shape, float("nan"), dtype=dt)
    lse = torch.full(lse64.shape, float("nan"), dtype=torch.float32)
    o_in, lse_in = out64.detach().to(dt), lse64.float()
    if case.get("strided_vectors"):  # the oracle had them dense; the kernels get views
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            if name in flags:
                flags[name] = every_other(flags[name], 99)
        sinks = None if sinks is None else every_other(sinks, 7.0)
        lse, lse_in = padded(lse, float("nan")), padded(lse_in, float("nan"))
    fwd_cfg = cfg and cfg.get("fwd")
    attention_forward(q, k, v, **flags, out=out, lse=lse, config=fwd_cfg, sinks=sinks)
    res["out"] = rel(out, out64.detach())
    finite = torch.isfinite(lse64)
    res["lse_inf_match"] = bool(torch.equal(torch.isneginf(lse), ~finite))
    res["lse_abs"] = (lse.double() - lse64)[finite].abs().max().item() if finite.any() else 0.0
    res["lse_nan"] = bool(torch.isnan(lse).any())

    # laid out like q, k, v where they fill their memory (any order of dims), else contiguous
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
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
        gluon=sinks is None,
    )
    for name, got, want in zip(("dq", "dk", "dv"), grads, (dq64, dk64, dv64)):
        res[name] = rel(got, want)
    # Rows that see no key must get exactly zero gradient.
    empty = ~finite  # [B,H,S] or [H,T]: query rows that see no key
    if sinks is not None:
        lengths = {n: flags[n] for n in ("cu_seqlens_q", "max_seqlen_q") if n in flags}
        dsinks = sinks_backward(o_in, lse_in, do, sinks, **lengths)
        res["dsinks"] = rel(dsinks, ref.dsinks)
        # with sinks such a row's lse is its sink's logit (exactly, in the oracle), out 0
        heads_axis = (slice(None), None) if varlen else (None, slice(None), None)
        empty = lse64 == sinks.double()[heads_axis]
        if empty.any():
            per_row = empty.t() if varlen else empty.transpose(1, 2)
            res["out_empty_rows_zero"] = bool((out[per_row] == 0).all())
    if empty.any():
        per_row = empty.t() if varlen else empty.transpose(1, 2)  # dq's [T,H] / [B,S,H]
        res["dq_empty_rows_zero"] = bool((grads[0][per_row] == 0).all())
    unseen = unseen_keys(case)  # keys no row sees: exactly zero dK and dV
    if unseen.any():
        res["dkdv_unseen_zero"] = bool(
            (grads[1][unseen] == 0).all() and (grads[2][unseen] == 0).all()
        )
    if case.get("repeat"):  # the backward is atomic-free: a second run is bitwise identical
        again = attention_backward(q, k, v, o_in, lse_in, do, **flags, config=cfg, atomic_dq=atomic)
        res["bitwise_repeat"] = all(torch.equal(a, b) for a, b in zip(again, grads))
    return res


# ------------------------------------------------------------------------------ loop bounds


_common = None  # attn_dispatch_triton._common, imported by _range_kernel (after main sets the path)


def _range_kernel():
    """A kernel storing the loop bounds ``_common`` gives each program (the kernels' code)."""
    global _common
    import triton
    import triton.language as tl
    from attn_dispatch_triton import _common

    @triton.jit
    def ranges(
        Out,
        q_len,
        k_len,
        win_left,
        win_right,
        WALK: tl.constexpr,
        STEP: tl.constexpr,
        LIMIT_LEFT: tl.constexpr,
        LIMIT_RIGHT: tl.constexpr,
        BOTTOM_RIGHT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        # WALK: key_block_ranges (a query block's keys: forward, dQ; STEP = BLOCK_M) or
        # query_block_ranges (a key block's query rows: dK/dV; STEP = BLOCK_N)
        pid = tl.program_id(0)
        lo_off, hi_off = _common.band_offsets(q_len, k_len, win_left, win_right, BOTTOM_RIGHT)
        r = WALK(
            pid * STEP, q_len, k_len, lo_off, hi_off, LIMIT_LEFT, LIMIT_RIGHT, BLOCK_M, BLOCK_N
        )
        for x in tl.static_range(4):
            tl.store(Out + pid * 4 + x, r[x])

    return ranges


def walk_errors(vis, own, other_len, step, ranges):
    """What is wrong with one program's walk ``ranges = (lo, full_lo, full_hi, hi)`` over the
    other side's indices in blocks of ``step``, for the (in-range) rows/cols ``own`` it owns;
    ``vis[a, b]``: own index a sees other index b. Walked blocks must each hold a visible pair,
    together cover every visible one once, and those walked without a mask must lie in range
    and be seen whole by every owned index."""
    lo, flo, fhi, hi = ranges
    errs = []
    if not lo <= flo <= fhi <= hi:
        errs.append(f"order {ranges}")
    if lo % step and lo != hi or fhi > flo and flo % step:
        errs.append(f"alignment {ranges}")
    covered = []
    for a, b, masked in ((lo, flo, True), (flo, fhi, False), (fhi, hi, True)):
        for n in range(a, b, step):
            block = [j for j in range(n, n + step) if j < other_len]
            covered += block
            seen = vis[own][:, block] if len(own) and block else torch.zeros(0, dtype=torch.bool)
            if not seen.any():
                errs.append(f"block {n} visited but outside the band {ranges}")
            if not masked:
                if not (n + step <= other_len and bool(vis[own][:, n : n + step].all())):
                    errs.append(f"unmasked block {n} not wholly visible {ranges}")
    if len(covered) != len(set(covered)):
        errs.append(f"a block walked twice {ranges}")
    needed = set(torch.nonzero(vis[own].any(0)).flatten().tolist()) if len(own) else set()
    if needed - set(covered):
        errs.append(f"visible indices {sorted(needed - set(covered))[:4]} not walked {ranges}")
    return errs


def run_ranges(case: dict) -> dict:
    """Every program's loop bounds, both sides, for many random bands, against brute force."""
    rng = np.random.default_rng(case["seed"])
    kernel = _range_kernel()
    errors, checked = [], 0

    def side():
        return None if rng.random() < 0.3 else int(rng.integers(0, 90))

    for _ in range(case["count"]):
        sq, sk = (int(x) for x in rng.integers(1, 100, 2))
        window = (side(), side())
        causal, bottom_right = bool(rng.random() < 0.3), bool(rng.random() < 0.5)
        bm, bn = (int(x) for x in rng.choice([16, 32, 64], 2))
        from attn_dispatch_triton import _band

        band = call_band(sq, sk, causal, bottom_right, window)
        vis = visible(sq, sk, causal, bottom_right, window)
        for key_side in (True, False):
            blocks = -(-sq // bm) if key_side else -(-sk // bn)
            out = torch.zeros(blocks * 4, dtype=torch.int32)
            kernel[(blocks,)](
                out,
                sq,
                sk,
                *_band.sides(band),
                WALK=_common.key_block_ranges if key_side else _common.query_block_ranges,
                STEP=bm if key_side else bn,
                **_band.constexprs(band),
                BLOCK_M=bm,
                BLOCK_N=bn,
            )
            for pid, r in enumerate(out.view(-1, 4).tolist()):
                if key_side:
                    own = torch.arange(pid * bm, min(pid * bm + bm, sq))
                    errs = walk_errors(vis, own, sk, bn, r)
                else:
                    own = torch.arange(pid * bn, min(pid * bn + bn, sk))
                    errs = walk_errors(vis.t(), own, sq, bm, r)
                checked += 1
                if errs:
                    what = "keys" if key_side else "queries"
                    errors.append(
                        f"Sq={sq} Sk={sk} window={window} causal={causal} "
                        f"br={bottom_right} {bm}x{bn} {what} of block {pid}: {errs[0]}"
                    )
    return {"id": case["id"], "errors": errors[:5], "n_errors": len(errors), "checked": checked}


def main() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    patch_interpreter()
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        try:
            results.append(run_ranges(case) if case.get("kind") == "ranges" else run_case(case))
        except Exception as exc:  # reported per case, so one failure does not hide the others
            results.append({"id": case["id"], "error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
