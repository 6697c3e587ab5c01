"""``attention``: the differentiable op, forward and backward both by dispatch.

Two custom operators carry the work, so ``torch.compile`` sees them as opaque nodes whose output
shapes come from fake (meta) implementations:

* ``attn_dispatch::fwd(q, k, v, ...) -> (out, lse)`` dispatches as :func:`attn_dispatch.forward`;
* ``attn_dispatch::bwd(grad_out, q, k, v, out, lse, ...) -> (dq, dk, dv)`` dispatches as
  :func:`attn_dispatch.backward`;
* ``attn_dispatch::bwd_sinks(grad_out, q, k, v, out, lse, sinks, ...) -> (dq, dk, dv, dsinks)``
  is its twin for calls with attention sinks (a separate operator, so calls without sinks
  allocate nothing for a gradient they do not have).

``attention`` checks its flags once; the operators build the dispatcher's ``Call`` from their
schema-typed flags without checking them again (``_call.of_schema``), and a signature's first
call validates their values with the tensors, as for any call.

Autograd links them: the forward saves ``q, k, v, out, lse`` (and the cu_seqlens) and the
backward of ``fwd`` calls ``bwd``. The backward decides under the scope its forward ran in
(``use_backend``, ``execution_mode``: the context variables a call reads), which the forward
records on the node: autograd runs a CUDA backward on its own device thread, whose context is
not the caller's, and a backward run outside the caller's ``with`` block would otherwise decide
by another scope than its forward. Selection happens inside the operators, in Python, cached per
input signature, so nothing in the hot path waits for the device: varlen lengths travel as
Python ints and no tensor value is read on the host (CUDA-graph capturable once warmed up).

Outputs are always fresh, contiguous tensors. The fake implementations promise exactly that,
and a compiler plans the following kernels on the promised strides.
"""

import contextlib
import functools
import numbers
import sys
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from . import _execution, _settings
from ._call import of_schema, unforced
from ._dispatch import BACKWARD, FORWARD, Mode, dispatch
from ._inputs import INT64_MAX, lse_dtype, lse_shape
from ._validation import (
    _require_tensor,
    build_inputs,
    check_flags,
    check_softcap,
    check_window,
    float_type_arg,
    resolve_scale,
)

_FLAGS = (
    "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt? max_seqlen_q, SymInt? max_seqlen_k, "
    "bool causal, str causal_align, float? scale, bool deterministic, str? backend, "
    "SymInt? window_left, SymInt? window_right, float? softcap"
)
FWD_SCHEMA = f"(Tensor q, Tensor k, Tensor v, {_FLAGS}, Tensor? sinks=None) -> (Tensor, Tensor)"
BWD_SCHEMA = (
    f"(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_FLAGS}) "
    "-> (Tensor, Tensor, Tensor)"
)
BWD_SINKS_SCHEMA = (
    "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor sinks, "
    f"{_FLAGS}) -> (Tensor, Tensor, Tensor, Tensor)"
)


# The operators are defined on a library of their own rather than with ``torch.library.custom_op``:
# its kernels import ``torch._dynamo`` on their first call, whose import creates torchinductor's
# cache directory (``$TMPDIR/torchinductor_<user>``) in every process that merely calls
# ``attention``. Here dynamo is kept out of the kernels only once something imported it.
_LIB = torch.library.Library("attn_dispatch", "DEF")


def _operator(name: str, schema: str) -> Callable[[Callable], torch._ops.OpOverloadPacket]:
    """Define ``attn_dispatch::<name>`` with the decorated function as its kernel (for every
    device); returns the operator."""

    def define(kernel: Callable) -> torch._ops.OpOverloadPacket:
        untraced: list[Callable] = []

        @functools.wraps(kernel)
        def run(*args):
            # a compiled program that runs this kernel must not trace into the dispatcher;
            # without dynamo imported nothing can be compiling
            if not untraced:
                dynamo = sys.modules.get("torch._dynamo")
                if dynamo is None:
                    return kernel(*args)
                untraced.append(dynamo.disable(kernel, recursive=True))
            return untraced[0](*args)

        _LIB.define(name + schema)
        _LIB.impl(name, run, "CompositeExplicitAutograd")
        return getattr(torch.ops.attn_dispatch, name)

    return define


# Where ``backend`` stands among an operator's flags (the schema's order: causal, causal_align,
# scale, deterministic, backend, window_left, window_right, softcap).
_BACKEND_FLAG = 4


def _dispatched(mode: Mode, tensors: tuple, seqlens: tuple, flags: tuple, sinks=None):
    """Dispatch an operator's call: ``seqlens`` (cu_seqlens_q/_k, max_seqlen_q/_k) and
    ``flags`` as its schema passes them."""
    settings = _settings.installed or _settings.current()
    call = of_schema(mode.name, *flags, settings)
    return dispatch(mode, tensors, *seqlens, call, flags[_BACKEND_FLAG], settings, sinks)


def _fresh(t: Tensor, inputs: tuple[Tensor, ...]) -> Tensor:
    """``t`` as a contiguous tensor that shares no memory with any of ``inputs``."""
    t = t.contiguous()
    if any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for x in inputs):
        t = t.clone()
    return t


@_operator("fwd", FWD_SCHEMA)
def _fwd(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    causal_align,
    scale,
    deterministic,
    backend,
    window_left,
    window_right,
    softcap,
    sinks=None,
):
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    flags = (causal, causal_align, scale, deterministic, backend, window_left, window_right)
    out, lse = _dispatched(FORWARD, (q, k, v), seqlens, (*flags, softcap), sinks)
    inputs = (q, k, v)
    return _fresh(out, inputs), _fresh(lse, inputs)


@torch.library.register_fake("attn_dispatch::fwd", lib=_LIB)
def _fwd_fake(q, k, v, cu_seqlens_q, *rest):  # shapes only: the flags do not matter
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(lse_shape(q.shape, cu_seqlens_q is not None), dtype=lse_dtype(q.dtype))
    return out, lse


@_operator("bwd", BWD_SCHEMA)
def _bwd(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    causal_align,
    scale,
    deterministic,
    backend,
    window_left,
    window_right,
    softcap,
):
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    flags = (causal, causal_align, scale, deterministic, backend, window_left, window_right)
    tensors = (q, k, v, out, lse, grad_out)
    dq, dk, dv = _dispatched(BACKWARD, tensors, seqlens, (*flags, softcap))
    inputs = (grad_out, q, k, v, out, lse)
    return _fresh(dq, inputs), _fresh(dk, inputs), _fresh(dv, inputs)


@torch.library.register_fake("attn_dispatch::bwd", lib=_LIB)
def _bwd_fake(grad_out, q, k, v, *rest):  # shapes only: out, lse and the flags do not matter
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
    )


@_operator("bwd_sinks", BWD_SINKS_SCHEMA)
def _bwd_sinks(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    sinks,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    causal_align,
    scale,
    deterministic,
    backend,
    window_left,
    window_right,
    softcap,
):
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    flags = (causal, causal_align, scale, deterministic, backend, window_left, window_right)
    tensors = (q, k, v, out, lse, grad_out)
    grads = _dispatched(BACKWARD, tensors, seqlens, (*flags, softcap), sinks)
    inputs = (grad_out, q, k, v, out, lse, sinks)
    return tuple(_fresh(g, inputs) for g in (*grads, grads.dsinks))


@torch.library.register_fake("attn_dispatch::bwd_sinks", lib=_LIB)
def _bwd_sinks_fake(grad_out, q, k, v, out, lse, sinks, *rest):  # shapes only
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
        sinks.new_empty(sinks.shape),
    )


# ints as ``ad.forward`` takes them (numpy ints too), or traced ones
_INTS = (numbers.Integral, torch.SymInt)


def scope() -> tuple[str | None, str | None]:
    """The calling context's scope: the name ``use_backend`` forces and the mode
    ``execution_mode`` declares (``None`` where none is set). A backward records its
    forward's and decides in it (:func:`in_scope`)."""
    return _settings.forced_var.get(), _execution._declared.get()


@contextlib.contextmanager
def in_scope(recorded: tuple[str | None, str | None]) -> Iterator[None]:
    """Calls inside decide under ``recorded`` (a :func:`scope`), whatever scope encloses them."""
    forced = _settings.forced_var.set(recorded[0])
    declared = _execution._declared.set(recorded[1])
    try:
        yield
    finally:
        _execution._declared.reset(declared)
        _settings.forced_var.reset(forced)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, *flags, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks)
    ctx.flags = flags
    ctx.scope = scope()
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    # one gradient per input: q, k, v, the two cu_seqlens, the flags, sinks
    if grad_out is None:
        return (None,) * (6 + len(ctx.flags))
    # A gradient from a broadcast (``out.sum()``) or a transpose has odd strides; the kernels
    # behind the dispatcher want a plain layout, and this is a no-op when it already is one.
    grad_out = grad_out.contiguous()
    if sinks is None:
        op, tensors = _bwd, (grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    else:
        op, tensors = _bwd_sinks, (grad_out, q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k)
    if ctx.scope == scope():  # the usual case: backward in the forward's scope, nothing to set
        grads = op(*tensors, *ctx.flags)
    else:
        with in_scope(ctx.scope):
            grads = op(*tensors, *ctx.flags)
    return grads[:3] + (None,) * (2 + len(ctx.flags)) + (grads[3] if len(grads) == 4 else None,)


torch.library.register_autograd(
    "attn_dispatch::fwd", _backward, setup_context=_setup_context, lib=_LIB
)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    causal_align: str = "top_left",
    scale: float | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    deterministic: bool | None = None,
    backend: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    layout: str = "bshd",
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention output, differentiable: forward by :func:`forward`, backward by :func:`backward`.

    Layouts and flags are those of :func:`backward` (dense BSHD, or THD with ``cu_seqlens`` and
    ``max_seqlen`` as Python ints), ``window`` and ``softcap`` included. Works under autograd,
    ``torch.compile(fullgraph=True)`` and CUDA graph capture. ``backend`` forces both passes.
    The scope (``use_backend``, ``execution_mode``) is read when the forward runs, and the
    backward decides under the same scope wherever and whenever it runs (eager autograd; a
    compiled backward reads the scope it runs in). ``lse`` is not returned and carries no
    gradient. ``sinks`` (a ``[H]`` tensor of attention-sink logits, as in :func:`backward`) is
    differentiable: its gradient flows back like q's.

    ``layout="bhsd"`` takes dense q/k/v as [B, H, S, D] (Hugging Face's order) and returns the
    output as [B, H, Sq, Dv]: the tensors are used through transposed views, never copied. The
    layout is declared, never guessed from the shapes.
    """
    # The operator schema would reject a non-tensor (a numpy array, a list) with a RuntimeError
    # that prints its value: the dispatcher's TypeError instead.
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, t)
    for name, t in (
        ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", cu_seqlens_k),
        ("sinks", sinks),
    ):
        if t is not None:
            _require_tensor(name, t)
    heads_first = _heads_first(layout, cu_seqlens_q, cu_seqlens_k, (q, k, v))
    if heads_first:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    # The operator schema would coerce or reject these with its own error; say it the library's
    # way instead (the rest is validated by the dispatcher inside the operator).
    check_flags(causal, causal_align, deterministic)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, _INTS)):
            raise TypeError(f"argument '{name}': expected a Python int, got {type(value).__name__}")
    max_seqlen_q, max_seqlen_k = (
        int(m) if isinstance(m, numbers.Integral) else m for m in (max_seqlen_q, max_seqlen_k)
    )
    # No sequence is longer than its packed tensor: a larger max_seqlen (up to beyond int64,
    # which the schema cannot carry) means the same as the token count.
    if cu_seqlens_q is not None and cu_seqlens_k is not None:
        max_seqlen_q = _capped_max_seqlen(max_seqlen_q, q)
        max_seqlen_k = _capped_max_seqlen(max_seqlen_k, k)
    if any(isinstance(m, int) and m > INT64_MAX for m in (max_seqlen_q, max_seqlen_k)):
        # Dense or malformed varlen inputs: the schema cannot carry the value, so the
        # dispatcher's validation names what is wrong before the operator would.
        call = unforced(
            "forward",
            causal=causal,
            causal_align=causal_align,
            scale=scale,
            deterministic=deterministic,
        )
        build_inputs(call, (q, k, v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"argument 'backend': expected a str or None, got {type(backend).__name__}")
    if torch.compiler.is_compiling():
        scale, softcap = _traced_float("scale", scale), _traced_float("softcap", softcap)
    else:
        scale = None if scale is None else resolve_scale(scale, 1)
        softcap = check_softcap(softcap)
    window = check_window(window, (numbers.Integral, torch.SymInt))
    window_left, window_right = (None, None) if window is None else window
    # A meta tensor among real ones would send the operator to its fake implementation, which
    # returns uninitialised memory: refuse mixed devices here, as the dispatcher does.
    for name, t in (
        ("k", k),
        ("v", v),
        ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", cu_seqlens_k),
        ("sinks", sinks),
    ):
        if isinstance(t, Tensor) and isinstance(q, Tensor) and t.device != q.device:
            raise ValueError(
                f"argument '{name}': expected device {q.device} (same as q), got {t.device}"
            )
    out, _ = _fwd(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal,
        causal_align,
        scale,
        deterministic,
        backend,
        window_left,
        window_right,
        softcap,
        # passed only when given: a call without sinks keeps the operator's original arguments
        *(() if sinks is None else (sinks,)),
    )
    return out.transpose(1, 2) if heads_first else out


def _traced_float(name: str, value):
    """``value`` checked for its type only, as a float (or the ``SymFloat`` it is traced as).

    While ``torch.compile`` traces, a changing float is symbolic (no value to check) and an
    error raised in the trace is no ``ValueError`` under ``fullgraph``: the dispatcher inside
    the operator checks the value where it runs, with the same errors as in eager mode."""
    if value is None or isinstance(value, torch.SymFloat):
        return value
    return float_type_arg(name, value)


def _capped_max_seqlen(value, t: Tensor):
    """A concrete varlen ``max_seqlen`` larger than the tokens of ``t`` as that token count
    (what the dispatcher does too); anything else unchanged, for the dispatcher to check."""
    if isinstance(value, int) and isinstance(t, Tensor) and t.dim() == 3 and value > t.shape[0]:
        return t.shape[0]
    return value


_LAYOUTS = ("bshd", "bhsd")


def _heads_first(layout: object, cu_seqlens_q, cu_seqlens_k, tensors) -> bool:
    """Whether ``layout`` says [B, H, S, D]; a bad value or a layout varlen cannot take raises."""
    if not isinstance(layout, str):
        raise TypeError(f"argument 'layout': expected a str, got {type(layout).__name__}")
    if layout not in _LAYOUTS:
        raise ValueError(f"argument 'layout': expected one of {_LAYOUTS}, got {layout!r}")
    if layout == "bshd":
        return False
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        raise ValueError(
            "argument 'layout': 'bhsd' is for dense [B, H, S, D] tensors; varlen tensors are "
            "[T, H, D] with cu_seqlens (pass layout='bshd')"
        )
    for name, t in zip(("q", "k", "v"), tensors):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"argument '{name}': layout='bhsd' expects a 4-D tensor [B, H, S, D], got {shape}"
            )
    return True
