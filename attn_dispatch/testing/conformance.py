"""Conformance checks: run a backend on a :class:`~attn_dispatch.testing.cases.Case` and compare
it with the float64 oracle.

``backend`` is a name (``"reference"``, ``"triton:fused"``) run through ``ad.backward`` /
``ad.forward`` with ``backend=`` forcing it, or a callable with the same signature as those
functions (handy for checking a kernel before it is registered). A forced implementation that
rejects the case raises :class:`Unsupported` carrying its reasons: a rejection is a legitimate
answer, a wrong number is not. Every other failure is an ``AssertionError`` whose message shows
the case, each tensor's error against its bound and the worst element.

Besides the tolerance comparison, the checks hold the contract's exact parts: shapes, dtypes and
devices of the results, no NaN/inf, ``lse == -inf`` exactly where a row sees no key (with
attention sinks: the sink's logit), zero output and zero dq on those rows, ``dsinks`` for a case
with sinks, and inputs left as they were: every input tensor (and the
memory of the buffer it is a view of) is copied before the call and compared bit for bit after
it, since the oracle's reference was computed from the inputs before the call and a training
step reuses them after it. Before the backend runs, a block of NaN-filled memory is
allocated and freed on the device, so a caching allocator (CUDA/ROCm) hands NaN-filled memory to
a kernel's ``torch.empty``: an element the kernel forgets to write shows up as NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import attn_dispatch as ad
from attn_dispatch import backend as adb

from .cases import Case, CaseInputs, place
from .oracle import OracleResult, oracle_of
from .tolerances import Tolerance, error_metrics, tolerance_for

Backend = str | Callable[..., Any]


class Unsupported(Exception):  # noqa: N818 - reads as "the backend says: unsupported"
    """The backend rejected the case; ``reasons`` are its explanations."""

    def __init__(self, backend: str, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__(f"{backend} rejects this case: " + "; ".join(reasons))


def _require_supported(backend: str, args: tuple, flags: dict) -> None:
    """Raise :class:`Unsupported` when the forced backend rejects the inputs (and
    ``AssertionError`` when its plugin or ``supports`` raised)."""
    report = ad.explain(*args, **flags, backend=backend)
    if report.selected is not None:
        return
    wanted = [c for c in report.candidates if c.name == backend or c.name.startswith(backend + ":")]
    failed = [f"{c.name}: {'; '.join(c.reasons)}" for c in wanted if c.status == "failed"]
    if failed:  # a plugin or supports() that raises is a bug, not a rejection
        raise AssertionError(f"{backend} failed while evaluating the case: {failed}")
    reasons = [f"{c.name}: {r}" for c in wanted for r in c.reasons] or [
        f"nothing selected; candidates: {[(c.name, c.status) for c in report.candidates]}"
    ]
    raise Unsupported(backend, reasons)


def _run(backend: Backend, api: Callable[..., Any], args: tuple, flags: dict) -> Any:
    """The forced ``backend`` through ``api`` (``ad.backward``/``ad.forward``), or the callable."""
    if isinstance(backend, str):
        return api(*args, **flags, backend=backend)
    return backend(*args, **flags)


def _named_inputs(args: tuple, flags: dict) -> dict[str, Tensor | None]:
    names = ("q", "k", "v", "out", "lse", "grad_out")[: len(args)]
    return dict(zip(names, args, strict=True)) | {
        name: flags.get(name) for name in ("cu_seqlens_q", "cu_seqlens_k")
    }


def _poison_allocator(device: torch.device, nbytes: int) -> None:
    """Leave NaN-filled freed memory behind for the next allocations (best effort)."""
    n = max(1, nbytes // 4)
    block = torch.empty(n, dtype=torch.float32, device=device)
    block.fill_(float("nan"))
    del block


def _nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _row_view(x: Tensor, varlen: bool) -> Tensor:
    """[B, S, H, E] -> [B, H, S, E] (dense) or [T, H, E] -> [H, T, E] (varlen), matching lse."""
    return x.transpose(0, 1) if varlen else x.transpose(1, 2)


@dataclass(frozen=True, eq=False)
class _Saved:
    """An input tensor as it was before the backend ran: its metadata, values and storage."""

    tensor: Tensor
    meta: tuple
    values: Tensor
    storage: Tensor  # the bytes of the whole buffer, padding and neighbouring views included


def _meta(t: Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device)


def _storage_bytes(t: Tensor) -> Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _snapshot(tensors: dict[str, Tensor | None]) -> dict[str, _Saved]:
    return {
        name: _Saved(t, _meta(t), t.detach().clone(), _storage_bytes(t).clone())
        for name, t in tensors.items()
        if t is not None
    }


def _modifications(saved: dict[str, _Saved]) -> list[str]:
    """One line per input the call changed: metadata, values, or memory outside its view."""
    problems = []
    for name, s in saved.items():
        t = s.tensor
        if _meta(t) != s.meta:
            problems.append(
                f"  {name}: (shape, stride, offset, dtype, device) changed from {s.meta} to "
                f"{_meta(t)}"
            )
            continue
        same = t.detach() == s.values
        if s.values.is_floating_point():
            same |= t.detach().isnan() & s.values.isnan()
        if not bool(same.all()):
            changed = int((~same).sum())
            problems.append(f"  {name}: {changed} of {t.numel()} elements changed in place")
        elif not torch.equal(_storage_bytes(t), s.storage):
            problems.append(
                f"  {name}: bytes of its buffer changed (outside its view, or a value "
                "rewritten with other bits, e.g. -0.0 for 0.0)"
            )
    return problems


def _assert_unmodified(
    saved: dict[str, _Saved], kind: str, backend: Backend, case: Case, dtype, device
) -> None:
    problems = _modifications(saved)
    if problems:
        raise AssertionError(
            f"{kind} of {_name(backend)} modified its inputs\n"
            f"{_describe(case, dtype, device)}\n" + "\n".join(problems)
        )


def _name(backend: Backend) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def _describe(case: Case, dtype: torch.dtype, device) -> str:
    return f"case {case.id} ({case!r}), dtype={dtype}, device={device}"


def _check_like(name: str, got: Any, like: Tensor, problems: list[str]) -> bool:
    if not isinstance(got, Tensor):
        problems.append(f"{name}: expected a tensor, got {type(got).__name__}")
        return False
    want = (tuple(like.shape), like.dtype, like.device)
    have = (tuple(got.shape), got.dtype, got.device)
    if have != want:
        problems.append(f"{name}: expected (shape, dtype, device) {want}, got {have}")
        return False
    return True


def _compare(
    name: str, got: Tensor, ref: Tensor, tol: Tolerance, rows: list[str], floor: float = 0.0
) -> bool:
    """Append a table row; True when within tolerance and finite."""
    finite = bool(torch.isfinite(got).all())
    max_err, rel_l2 = error_metrics(got, ref, floor)
    ok = finite and max_err <= tol.max_err and rel_l2 <= tol.rel_l2
    worst = ""
    if not ok and got.numel():
        diff = (got.detach().to(torch.float64) - ref).abs().nan_to_num(float("inf"))
        flat = int(diff.reshape(-1).argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape))
        worst = f"  worst at {idx}: got {got[idx].item():.6g}, expected {ref[idx].item():.6g}"
    rows.append(
        f"  {name:<4} max_err={max_err:.3e} (<= {tol.max_err:.0e})  rel_l2={rel_l2:.3e} "
        f"(<= {tol.rel_l2:.0e})  finite={finite}  {'ok' if ok else 'FAIL'}{worst}"
    )
    return ok


def _check_lse(got: Tensor, ref: Tensor, tol: Tolerance, rows: list[str]) -> bool:
    got64 = got.detach().to(torch.float64)
    masked = torch.isneginf(ref)
    pattern_ok = torch.equal(torch.isneginf(got64), masked)
    finite_ok = bool(torch.isfinite(got64[~masked]).all())
    err = (got64 - ref)[~masked].abs() if finite_ok else torch.tensor([float("inf")])
    bound = tol.lse_atol + tol.lse_rtol * ref[~masked].abs() if finite_ok else torch.zeros(1)
    within = bool((err <= bound).all())
    worst = err.max().item() if err.numel() else 0.0
    ok = pattern_ok and finite_ok and within
    rows.append(
        f"  lse  max_abs_err={worst:.3e} (<= {tol.lse_atol:.0e} + {tol.lse_rtol:.0e}*|lse|)  "
        f"-inf exactly where no key is visible={pattern_ok}  finite elsewhere={finite_ok}  "
        f"{'ok' if ok else 'FAIL'}"
    )
    return ok


def _check_masked_zero(
    name: str, got: Tensor, masked: Tensor, varlen: bool, rows: list[str]
) -> bool:
    if not bool(masked.any()):
        return True
    vals = _row_view(got, varlen)[masked]
    ok = bool((vals == 0).all())
    if not ok:
        worst = vals.abs().max().item()
        rows.append(
            f"  {name} on rows that see no key: expected exact zeros, got max "
            f"|x|={worst:.3e} (NaN={bool(vals.isnan().any())})"
        )
    return ok


def _unseeing_rows(ref_lse: Tensor, sinks: Tensor | None) -> Tensor:
    """Where a row sees no key: lse is -inf, or with sinks exactly the sink's logit (the
    oracle's float64 logsumexp of the sink alone is the sink)."""
    if sinks is None:
        return torch.isneginf(ref_lse)
    heads = (None, slice(None), None) if ref_lse.dim() == 3 else (slice(None), None)
    return ref_lse == sinks.to(torch.float64)[heads]


def _fail(kind: str, backend: Backend, case: Case, dtype, device, rows: list[str]) -> None:
    raise AssertionError(
        f"{kind} of {_name(backend)} does not match the float64 oracle\n"
        f"{_describe(case, dtype, device)}\n" + "\n".join(rows)
    )


def check_backward(
    backend: Backend,
    case: Case,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tol: Tolerance | None = None,
    deterministic: bool | None = None,
    reference: OracleResult | None = None,
    inputs: CaseInputs | None = None,
) -> dict[str, tuple[float, float]]:
    """Run ``backend``'s backward on ``case`` and compare (dq, dk, dv) with the oracle (and
    ``dsinks`` for a case with sinks, named as the result's attribute).

    ``out`` and ``lse`` given to the backend are the oracle's (rounded to ``dtype`` / float32,
    laid out like the case's other tensors). ``inputs`` / ``reference``: the case's inputs
    (``case.make_inputs(dtype, device)``) and the oracle's result on them when the caller
    already has them (they are made otherwise). Returns
    ``{name: (max_err, rel_l2)}``; raises :class:`Unsupported` if the backend rejects the case,
    ``AssertionError`` on a mismatch.
    """
    device = torch.device(device)
    tol = tol or tolerance_for(dtype)
    inputs = inputs or case.make_inputs(dtype, device)
    ref = reference or oracle_of(inputs, inputs.grad_out)
    out = place(ref.out, case.layout, dtype, device)
    lse = place(ref.lse, case.layout, adb.lse_dtype(dtype), device)
    args = (inputs.q, inputs.k, inputs.v, out, lse, inputs.grad_out)
    flags = inputs.flags() | {"deterministic": deterministic}
    if isinstance(backend, str):
        _require_supported(backend, args, flags)
    saved = _snapshot(_named_inputs(args, flags))  # before the poison: copies stay out of it
    _poison_allocator(device, 2 * _nbytes(inputs.q, inputs.k, inputs.v))
    grads = _run(backend, ad.backward, args, flags)
    _assert_unmodified(saved, "backward", backend, case, dtype, device)

    rows: list[str] = []
    ok = isinstance(grads, tuple) and len(grads) == 3
    if not ok:
        rows.append(f"  expected a tuple (dq, dk, dv), got {type(grads).__name__}")
        _fail("backward", backend, case, dtype, device, rows)
    like = {"dq": inputs.q, "dk": inputs.k, "dv": inputs.v}
    refs = {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    floor = 0.1 * max(r.abs().max().item() if r.numel() else 0.0 for r in refs.values())
    metrics: dict[str, tuple[float, float]] = {}
    for name, got in zip(like, grads, strict=True):
        if _check_like(name, got, like[name], rows):
            ok = _compare(name, got, refs[name], tol, rows, floor) and ok
            metrics[name] = error_metrics(got, refs[name], floor)
        else:
            ok = False
    if inputs.sinks is not None:
        dsinks = getattr(grads, "dsinks", None)
        if _check_like("dsinks", dsinks, inputs.sinks, rows):
            ok = _compare("dsinks", dsinks, ref.dsinks, tol, rows) and ok
            metrics["dsinks"] = error_metrics(dsinks, ref.dsinks)
        else:
            ok = False
    if ok:
        unseeing = _unseeing_rows(ref.lse, inputs.sinks)
        ok = _check_masked_zero("dq", grads[0], unseeing, case.varlen, rows)
    if not ok:
        _fail("backward", backend, case, dtype, device, rows)
    return metrics


def check_forward(
    backend: Backend,
    case: Case,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tol: Tolerance | None = None,
    reference: OracleResult | None = None,
    inputs: CaseInputs | None = None,
) -> dict[str, tuple[float, float]]:
    """Run ``backend``'s forward on ``case`` and compare (out, lse) with the oracle
    (``inputs`` / ``reference`` as in :func:`check_backward`).

    Returns ``{"out": (max_err, rel_l2)}``; raises :class:`Unsupported` or ``AssertionError``.
    """
    device = torch.device(device)
    tol = tol or tolerance_for(dtype)
    inputs = inputs or case.make_inputs(dtype, device)
    ref = reference or oracle_of(inputs, inputs.grad_out)
    args = (inputs.q, inputs.k, inputs.v)
    flags = inputs.flags()
    if isinstance(backend, str):
        _require_supported(backend, args, flags)
    saved = _snapshot(_named_inputs(args, flags))  # before the poison: copies stay out of it
    _poison_allocator(device, 2 * _nbytes(inputs.q, inputs.grad_out))
    result = _run(backend, ad.forward, args, flags)
    _assert_unmodified(saved, "forward", backend, case, dtype, device)

    rows: list[str] = []
    if not (isinstance(result, tuple) and len(result) == 2):
        rows.append(f"  expected a tuple (out, lse), got {type(result).__name__}")
        _fail("forward", backend, case, dtype, device, rows)
    out, lse = result
    lse_like = torch.empty(ref.lse.shape, dtype=adb.lse_dtype(dtype), device=device)
    ok = _check_like("out", out, inputs.grad_out, rows)
    ok = _check_like("lse", lse, lse_like, rows) and ok
    if ok:
        ok = _compare("out", out, ref.out, tol, rows)
        ok = _check_lse(lse, ref.lse, tol, rows) and ok
        unseeing = _unseeing_rows(ref.lse, inputs.sinks)
        ok = ok and _check_masked_zero("out", out, unseeing, case.varlen, rows)
    if not ok:
        _fail("forward", backend, case, dtype, device, rows)
    return {"out": error_metrics(out, ref.out)}


def check_deterministic(
    backend: str,
    case: Case,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    repeats: int = 2,
) -> None:
    """With ``deterministic=True``, repeated backward calls must agree bit for bit."""
    device = torch.device(device)
    inputs = case.make_inputs(dtype, device)
    ref = oracle_of(inputs, inputs.grad_out)
    out = place(ref.out, case.layout, dtype, device)
    lse = place(ref.lse, case.layout, adb.lse_dtype(dtype), device)
    args = (inputs.q, inputs.k, inputs.v, out, lse, inputs.grad_out)
    flags = inputs.flags() | {"deterministic": True}
    _require_supported(backend, args, flags)
    saved = _snapshot(_named_inputs(args, flags))

    def call() -> Any:
        grads = ad.backward(*args, **flags, backend=backend)
        _assert_unmodified(saved, "backward", backend, case, dtype, device)
        return grads

    first = call()
    for i in range(1, repeats):
        again = call()
        pairs = zip(("dq", "dk", "dv"), first, again, strict=True)
        if inputs.sinks is not None:
            pairs = [*pairs, ("dsinks", first.dsinks, again.dsinks)]
        for name, a, b in pairs:
            if not torch.equal(a, b):
                diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
                raise AssertionError(
                    f"{backend} with deterministic=True gave different {name} on call {i + 1} "
                    f"(max |diff| {diff:.3e})\n{_describe(case, dtype, device)}"
                )


def default_cases() -> list[Case]:
    """The cases :func:`make_conformance_tests` uses unless given others (the window, soft
    cap and sink ones run only for backends that declare those capabilities)."""
    from .cases import random_cases, sink_cases, standard_cases, variant_cases

    return (
        standard_cases()
        + variant_cases()
        + sink_cases()
        + random_cases(16, seed=1)
        + random_cases(8, seed=5, variants=True)
        + random_cases(8, seed=9, variants=True, sinks=True)
    )
