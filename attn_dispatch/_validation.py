"""Validation of a call's arguments, once per input signature, into ``Facts`` and inputs.

Every check raises ``TypeError``/``ValueError`` naming the argument, what was expected and what
was given. Validation reads no settings: what depends on them (checking GPU cu_seqlens values,
which waits for the device) is an argument.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import torch

from ._inputs import (
    CAUSAL_ALIGNS,
    FLOAT_ARG_RANGE,
    INT64_MAX,
    QUERY_DTYPES,
    BackwardInputs,
    Band,
    Facts,
    ForwardInputs,
    Kind,
    Window,
    lse_dtype,
)

if TYPE_CHECKING:
    from ._call import Call, OpFlags  # _call imports this module's checks


def kind_of(tensors: tuple) -> Kind:
    """``Kind.BACKWARD`` when any of out/lse/grad_out (after q, k, v in ``tensors``) is given,
    else ``Kind.FORWARD``: what a call is, for validation and the callers that need to know
    first."""
    return Kind.FORWARD if all(t is None for t in tensors[3:]) else Kind.BACKWARD


def build_inputs(
    call: Call,
    tensors: tuple,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    debug: bool = False,
    sinks=None,
) -> ForwardInputs:
    """Validate a call and wrap it: ``BackwardInputs`` when any of out/lse/grad_out is given
    (``tensors``: q, k, v[, out, lse, grad_out]), else ``ForwardInputs``; ``debug``: also
    check the values of cu_seqlens and sinks on a GPU (which waits for the device)."""
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    facts = validate(call, tensors, seqlens, debug, sinks)
    inputs = ForwardInputs if kind_of(tensors) is Kind.FORWARD else BackwardInputs
    given = tensors[:3] if inputs is ForwardInputs else tensors
    return inputs(*given, cu_seqlens_q, cu_seqlens_k, call, facts, sinks)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"argument '{name}': expected a torch.Tensor, got {type(value).__name__}")
    if value.is_nested:
        raise TypeError(
            f"argument '{name}': expected a dense tensor, got a nested tensor "
            "(pass varlen batches as THD tensors with cu_seqlens)"
        )
    if value.layout != torch.strided:
        raise TypeError(
            f"argument '{name}': expected a dense (strided) tensor, got layout {value.layout}"
        )
    return value


def _require_rank(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(
            f"argument '{name}': expected a {rank}-D tensor {layout}, got shape {_shape(t)}"
        )


def _require_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], layout: str) -> None:
    if _shape(t) != expected:
        raise ValueError(f"argument '{name}': expected shape {expected} {layout}, got {_shape(t)}")


def _int_arg(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"argument '{name}': expected a Python int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"argument '{name}': expected a non-negative int, got {value}")
    return int(value)


def float_type_arg(name: str, value) -> float:
    """``value`` as a float, checked for its type only (a real number, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"argument '{name}': expected a float, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int or Fraction beyond float's range: the value checks refuse it
        return math.inf if value > 0 else -math.inf


def _float_arg(name: str, value) -> float:
    """``value`` as a float in ``FLOAT_ARG_RANGE``."""
    value = float_type_arg(name, value)
    low, high = FLOAT_ARG_RANGE
    if not (low <= value <= high):  # also False for NaN
        raise ValueError(
            f"argument '{name}': expected a finite float > 0 within [{low:g}, {high:g}] "
            f"(beyond it float32 kernels overflow or flush to zero), got {value}"
        )
    return value


def resolve_scale(scale, head_dim: int) -> float:
    """``1/sqrt(head_dim)`` when ``scale`` is None; else ``scale`` checked positive and in
    ``FLOAT_ARG_RANGE``."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    return _float_arg("scale", scale)


def _type_name(value) -> str:
    """The type's name, module-qualified outside the builtins (``numpy.bool``, not a bare
    ``bool`` that reads like the type that was expected)."""
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"


def check_causal(causal) -> None:
    if not isinstance(causal, bool):
        raise TypeError(f"argument 'causal': expected a bool, got {_type_name(causal)}")


def check_causal_align(causal_align) -> None:
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(
            f"argument 'causal_align': expected one of {CAUSAL_ALIGNS}, got {causal_align!r}"
        )


def check_deterministic(deterministic) -> None:
    """A resolved ``deterministic`` (``None`` became the torch setting before this check)."""
    if not isinstance(deterministic, bool):
        raise TypeError(
            f"argument 'deterministic': expected a bool or None, got {_type_name(deterministic)}"
        )


def check_flags(flags: Call | OpFlags) -> None:
    """The boolean and alignment flags of a ``Call`` (or the operators' ``OpFlags``)."""
    check_causal(flags.causal)
    check_causal_align(flags.causal_align)
    check_deterministic(flags.deterministic)


def check_window(window, ints: tuple[type, ...] = (numbers.Integral,)) -> Window | None:
    """``window`` as a ``(left, right)`` tuple of Python ints or ``None`` (``(None, None)``
    bounds nothing and becomes ``None``). Each side: an int >= 0 (one of ``ints``, never a bool)
    or ``None`` (unbounded). A list of two is accepted like the tuple."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(
            f"argument 'window': expected None or a (left, right) tuple, got {window!r}"
        )
    sides = []
    for name, side in zip(("left", "right"), window):
        if side is None:
            sides.append(None)
            continue
        if isinstance(side, bool) or not isinstance(side, ints):
            raise TypeError(
                f"argument 'window': expected each side an int >= 0 or None, got {name}={side!r} "
                f"({type(side).__name__})"
            )
        if side < 0:
            raise ValueError(
                f"argument 'window': expected each side an int >= 0 or None, got {name}={side}"
            )
        if isinstance(side, torch.SymInt):
            sides.append(side)
        else:
            side = int(side)
            sides.append(None if side > INT64_MAX else side)
    return None if sides == [None, None] else (sides[0], sides[1])


def effective_window(call: Call, seqlen_q: int, seqlen_k: int) -> Window | None:
    """``call.window`` (validated) with every side that excludes no key at these lengths set to
    ``None`` (unbounded); ``None`` when neither side bounds anything.

    Row ``i`` (``0 <= i < Sq``) sees key ``j`` (``0 <= j < Sk``) from ``d_i - left`` to
    ``d_i + right``, where the diagonal ``d_i`` is ``i`` (top-left) or ``i + Sk - Sq``
    (bottom-right). ``left`` excludes a key only if some row has ``d_i - left > 0``: it reaches
    every key once ``left >= Sq - 1`` (top-left) or ``>= Sk - 1`` (bottom-right), the largest
    diagonal. ``right`` excludes one only if some row has ``d_i + right < Sk - 1``: it reaches
    every key once ``right >= Sk - 1`` (top-left) or ``>= Sq - 1`` (bottom-right). A ``causal``
    call's mask already stops at the diagonal, so its right side (>= 0) excludes nothing more.
    With varlen inputs the lengths are the longest sequences, which bound every sequence's
    reach. Kernels thus never see a side of a sequence length or more (no int32/int64 overflow
    in their band arithmetic).
    """
    if call.window is None:
        return None
    last_q, last_k = seqlen_q - 1, seqlen_k - 1
    reach = (last_k, last_q) if call.causal_align == "bottom_right" else (last_q, last_k)
    left, right = (None if s is None or s >= r else s for s, r in zip(call.window, reach))
    if call.causal:
        right = None
    return None if left is None and right is None else (left, right)


def band_sides(window: Window | None, causal: bool) -> tuple[int | None, int | None]:
    """``(left, right)`` of the band a call computes: the (validated) ``window``'s sides with
    ``causal`` folded in (``right`` capped at 0); ``(None, None)`` when every key is visible."""
    left, right = (None, None) if window is None else window
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def check_softcap(softcap) -> float | None:
    """``None``, or ``softcap`` as a float checked in ``FLOAT_ARG_RANGE``."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(
            f"argument 'softcap': expected None or a float, got {type(softcap).__name__}"
        )
    return _float_arg("softcap", softcap)


def check_cap_ratio(scale: float, softcap: float | None) -> None:
    """Kernels multiply raw scores by ``scale / softcap`` in float32 (then take the tanh): the
    ratio must stay in ``FLOAT_ARG_RANGE`` too, or a zero score times an infinite ratio is NaN
    (each value alone may be in range: scale=1e30 with softcap=1e-30)."""
    if softcap is None:
        return
    low, high = FLOAT_ARG_RANGE
    ratio = scale / softcap
    if not (low <= ratio <= high):
        raise ValueError(
            f"argument 'softcap': expected scale / softcap within [{low:g}, {high:g}] (kernels "
            f"scale the scores by it in float32), got {scale:g} / {softcap:g} = {ratio:g}"
        )


def validate(call: Call, tensors: tuple, seqlens: tuple, debug: bool, sinks) -> Facts:
    """Check ``call``'s flags with its tensors (q, k, v for a forward; q, k, v, out, lse,
    grad_out for a backward, where any of the last three given makes it one), ``seqlens``
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) and ``sinks``.

    Raises ``TypeError``/``ValueError`` naming the argument, the expectation and what was given.
    """
    q, k, v, out, lse, grad_out = (*tensors, None, None, None)[:6]
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = seqlens
    backward = kind_of(tensors) is Kind.BACKWARD
    q = _require_tensor("q", q)
    k = _require_tensor("k", k)
    v = _require_tensor("v", v)
    if backward:
        out = _require_tensor("out", out)
        lse = _require_tensor("lse", lse)
        grad_out = _require_tensor("grad_out", grad_out)
    check_flags(call)
    # the operators' Call (``of_schema``) carries them unchecked where no ``attention`` ran first
    call = call._replace(window=check_window(call.window), softcap=check_softcap(call.softcap))

    if q.dtype not in QUERY_DTYPES:
        raise TypeError(
            f"argument 'q': expected dtype float16, bfloat16, float32 or float64, got {q.dtype}"
        )
    named = [("k", k), ("v", v)] + ([("out", out), ("grad_out", grad_out)] if backward else [])
    for name, t in named:
        if t.dtype != q.dtype:
            raise TypeError(
                f"argument '{name}': expected dtype {q.dtype} (same as q), got {t.dtype}"
            )
    if backward:
        want = lse_dtype(q.dtype)
        if lse.dtype != want:
            raise TypeError(f"argument 'lse': expected dtype {want}, got {lse.dtype}")
    for name, t in named + ([("lse", lse)] if backward else []):
        if t.device != q.device:
            raise ValueError(
                f"argument '{name}': expected device {q.device} (same as q), got {t.device}"
            )

    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        facts = _validate_varlen(
            q,
            k,
            v,
            out,
            lse,
            grad_out,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            backward,
            debug,
        )
    else:
        facts = _validate_dense(q, k, v, out, lse, grad_out, max_seqlen_q, max_seqlen_k, backward)
    batch, sq, sk, heads, kv_heads, d, dv, msq, msk = facts
    if heads == 0 or kv_heads == 0:
        raise ValueError(
            f"argument 'q'/'k': expected at least one head, got H={heads}, Hkv={kv_heads}"
        )
    if heads % kv_heads:
        raise ValueError(
            f"argument 'k': expected its head count Hkv to divide q's head count H (GQA/MQA), "
            f"got H={heads}, Hkv={kv_heads}"
        )
    if d == 0 or dv == 0:
        raise ValueError(f"argument 'q'/'v': expected non-empty head dims, got D={d}, Dv={dv}")
    if sinks is not None:
        check_sinks(sinks, q, heads, debug)
    scale = resolve_scale(call.scale, d)
    check_cap_ratio(scale, call.softcap)
    window = effective_window(call, msq, msk)
    return Facts(
        batch,
        sq,
        sk,
        heads,
        kv_heads,
        d,
        dv,
        q.dtype,
        q.device,
        varlen,
        scale,
        msq,
        msk,
        window,
        call.softcap,
        Band.of(window, call.causal, call.causal_align),
    )


def check_sinks(sinks, q: torch.Tensor, heads: int, debug: bool) -> None:
    """``sinks``: a ``[heads]`` tensor of float32 or q's dtype on q's device; its values are
    checked finite on the CPU always, on a GPU only when ``debug`` (that check waits for the
    device)."""
    sinks = _require_tensor("sinks", sinks)
    if sinks.dtype not in (torch.float32, q.dtype):
        allowed = str(torch.float32)
        allowed += "" if q.dtype == torch.float32 else f" or {q.dtype} (as q)"
        raise TypeError(f"argument 'sinks': expected dtype {allowed}, got {sinks.dtype}")
    if sinks.device != q.device:
        raise ValueError(
            f"argument 'sinks': expected device {q.device} (same as q), got {sinks.device}"
        )
    _require_shape("sinks", sinks, (heads,), "[H] (one logit per query head)")
    check_sinks_values(sinks, debug)


def check_sinks_values(sinks: torch.Tensor, debug: bool) -> None:
    """That every sink logit is finite: on the CPU always, on a GPU only when ``debug``."""
    if sinks.device.type == "meta" or (sinks.device.type != "cpu" and not debug):
        return
    if not bool(torch.isfinite(sinks.detach()).all()):
        raise ValueError(
            f"argument 'sinks': expected finite values, got {sinks.detach().cpu().tolist()}"
        )


def _require_backward_shapes(
    out, grad_out, lse, out_shape: tuple, out_layout: str, lse_shape: tuple, lse_layout: str
) -> None:
    _require_shape("out", out, out_shape, out_layout)
    _require_shape("grad_out", grad_out, out_shape, out_layout)
    _require_shape("lse", lse, lse_shape, lse_layout)


def _check_v_like_k(k: torch.Tensor, v: torch.Tensor, d: int) -> int:
    """Check k's head dim against q's ``d`` and v's dims but the last against k's (k and v of
    one rank already); return v's head dim."""
    if k.shape[-1] != d:
        raise ValueError(f"argument 'k': expected head dim {d} (same as q), got shape {_shape(k)}")
    if v.shape[:-1] != k.shape[:-1]:
        lead = ", ".join(str(n) for n in k.shape[:-1])
        raise ValueError(f"argument 'v': expected shape ({lead}, Dv) to match k, got {_shape(v)}")
    return v.shape[-1]


def _validate_dense(q, k, v, out, lse, grad_out, max_seqlen_q, max_seqlen_k, backward):
    layout = "[B, S, H, D] (dense BSHD layout; pass cu_seqlens_q/_k for varlen)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_rank(name, t, 4, layout)
    b, sq, h, d = q.shape
    if k.shape[0] != b:
        raise ValueError(f"argument 'k': expected batch {b} (same as q), got shape {_shape(k)}")
    _, sk, hkv, _ = k.shape
    dv = _check_v_like_k(k, v, d)
    if backward:
        _require_backward_shapes(
            out, grad_out, lse, (b, sq, h, dv), "[B, Sq, H, Dv]", (b, h, sq), "[B, H, Sq]"
        )
    for name, given, actual in (
        ("max_seqlen_q", max_seqlen_q, sq),
        ("max_seqlen_k", max_seqlen_k, sk),
    ):
        if given is not None and _int_arg(name, given) != actual:
            raise ValueError(
                f"argument '{name}': dense inputs have sequence length {actual}, got {given} "
                "(leave it None unless passing cu_seqlens)"
            )
    return b, sq, sk, h, hkv, d, dv, sq, sk


def _validate_varlen(
    q, k, v, out, lse, grad_out, cu_q, cu_k, max_seqlen_q, max_seqlen_k, backward, debug
):
    if cu_q is None or cu_k is None:
        missing = "cu_seqlens_k" if cu_q is not None else "cu_seqlens_q"
        raise ValueError(
            f"argument '{missing}': varlen needs both cu_seqlens_q and cu_seqlens_k, "
            f"got {missing}=None"
        )
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        _require_tensor(name, cu)
        if cu.dtype != torch.int32:
            raise TypeError(f"argument '{name}': expected dtype torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(
                f"argument '{name}': expected a 1-D tensor [B+1] with B >= 1, "
                f"got shape {_shape(cu)}"
            )
        if cu.device != q.device:
            raise ValueError(
                f"argument '{name}': expected device {q.device} (same as q), got {cu.device}"
            )
    if cu_k.shape[0] != cu_q.shape[0]:
        raise ValueError(
            f"argument 'cu_seqlens_k': expected shape {_shape(cu_q)} (same batch as "
            f"cu_seqlens_q), got {_shape(cu_k)}"
        )
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is None:
            raise ValueError(
                f"argument '{name}': varlen inputs need it as a Python int "
                "(the longest sequence), got None"
            )
    max_seqlen_q = _int_arg("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _int_arg("max_seqlen_k", max_seqlen_k)
    layout = "[T, H, D] (varlen layout, since cu_seqlens are given)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_rank(name, t, 3, layout)
    tq, h, d = q.shape
    tk, hkv, _ = k.shape
    # No sequence is longer than its packed tensor: a larger max_seqlen means the token count,
    # so kernels never take a grid size or int32 argument beyond the data.
    max_seqlen_q, max_seqlen_k = min(max_seqlen_q, tq), min(max_seqlen_k, tk)
    dv = _check_v_like_k(k, v, d)
    if backward:
        _require_backward_shapes(out, grad_out, lse, (tq, h, dv), "[Tq, H, Dv]", (h, tq), "[H, Tq]")
    check_cu_seqlens(cu_q, cu_k, tq, tk, max_seqlen_q, max_seqlen_k, debug)
    return cu_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, h, hkv, d, dv, max_seqlen_q, max_seqlen_k


def check_cu_seqlens(
    cu_q, cu_k, tq: int, tk: int, max_seqlen_q: int, max_seqlen_k: int, debug: bool
) -> None:
    """Check cu_seqlens values: on the CPU always; on a GPU only when ``debug`` (the dispatcher
    passes ``ATTN_DISPATCH_DEBUG=1``; that check waits for the device)."""
    if cu_q.device.type == "meta":
        return
    if cu_q.device.type != "cpu" and not debug:
        return
    for name, cu, total, max_len, max_name in (
        ("cu_seqlens_q", cu_q, tq, max_seqlen_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_k, tk, max_seqlen_k, "max_seqlen_k"),
    ):
        values = cu.tolist()
        if values[0] != 0:
            raise ValueError(f"argument '{name}': expected to start at 0, got {values[0]}")
        lengths = [b - a for a, b in zip(values, values[1:])]
        if min(lengths) < 0:
            raise ValueError(f"argument '{name}': expected non-decreasing offsets, got {values}")
        if values[-1] != total:
            raise ValueError(
                f"argument '{name}': expected to end at {total} (the token count of "
                f"the packed tensor), got {values[-1]}"
            )
        if max(lengths) > max_len:
            raise ValueError(
                f"argument '{max_name}': expected at least the longest sequence "
                f"({max(lengths)}), got {max_len}"
            )
