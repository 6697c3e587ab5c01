"""``attention``: the differentiable op, forward and backward both by dispatch, by two paths.

**Eager** (plain tensors, nothing tracing the call): one ``torch.autograd.Function``
(``_Attention``) whose forward calls the dispatcher as :func:`attn_dispatch.forward` does and
whose backward calls it as :func:`attn_dispatch.backward` does. Eager mode pays for nothing but
the dispatch and one autograd node: the custom-op layer below (binding the schema's arguments,
the wrapping of its registered autograd) costs several times the dispatch itself in host time
per layer's forward and backward (docs/benchmarks.md section 8).

**Traced**: three custom operators, which ``torch.compile`` and export see as opaque nodes whose
output shapes come from fake (meta) implementations:

* ``attn_dispatch::fwd(q, k, v, ...) -> (out, lse)`` dispatches as :func:`attn_dispatch.forward`;
* ``attn_dispatch::bwd(grad_out, q, k, v, out, lse, ...) -> (dq, dk, dv)`` dispatches as
  :func:`attn_dispatch.backward`;
* ``attn_dispatch::bwd_sinks(grad_out, q, k, v, out, lse, sinks, ...) -> (dq, dk, dv, dsinks)``
  is its twin for calls with attention sinks (a separate operator, so calls without sinks
  allocate nothing for a gradient they do not have).

A call takes them while compiling or exporting, under a dispatch mode (``FakeTensorMode``,
``make_fx``'s proxy modes) or a functorch transform, and with meta or subclass tensors
(:func:`_traced`: a few attribute checks); the eager node's backward takes ``bwd`` where
compiled autograd traces it. Autograd links the operators as it links the eager node's passes.

``attention`` checks its flags once, for both paths; the dispatcher's ``Call`` is built from
them without checking them again (``_call.of_schema``), and a signature's first call validates
their values with the tensors, as for any call. A dense eager call whose flags (as given) and
scope a call checked before skips even that: its front (``_Front``, in ``settings.fronts``)
holds that call's ``Call`` and operator flags, and a guard of the signatures it saw admits q,
k and v.

Both forwards save ``q, k, v, out, lse`` (and the cu_seqlens and sinks). The backward decides
under the scope its forward ran in (``use_backend``, ``execution_mode``: the context variables a
call reads), which the forward records on the node: autograd runs a CUDA backward on its own
device thread, whose context is not the caller's, and a backward run outside the caller's
``with`` block would otherwise decide by another scope than its forward. A compiled backward
reads the scope it runs in. Selection happens in the dispatcher, in Python, cached per input
signature, so nothing in the hot path waits for the device: varlen lengths travel as Python
ints and no tensor value is read on the host (CUDA-graph capturable once warmed up).

Outputs and gradients are always fresh, contiguous tensors (the eager node hands gradients of
``layout="bhsd"`` inputs back contiguous in that layout, as autograd stores them). The fake
implementations promise exactly that, and a compiler plans the following kernels on the
promised strides. An eager call through an implementation's own node (``_own_node``) returns
that operator's output as the operator lays it out (flash on ``layout="bhsd"``: sdpa's own
flash op, so the output is laid out as sdpa's is), from the second call of its signature on.
"""

import contextlib
import functools
import numbers
import sys
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor
from torch._C._functorch import TransformType

from . import _execution, _guards, _own_node, _settings
from ._call import Call, Kind, OpFlags, of_schema
from ._dispatch import (
    BACKWARD,
    FORWARD,
    MAX_CACHED_DECISIONS,
    Mode,
    dispatch,
    pointer_residues,
    signature_key,
)
from ._inputs import INT64_MAX, LAYOUTS, lse_dtype, lse_shape
from ._validation import (
    _require_tensor,
    build_inputs,
    check_causal,
    check_causal_align,
    check_deterministic,
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


def _dispatched(mode: Mode, tensors: tuple, seqlens: tuple, flags: OpFlags, sinks=None):
    """Dispatch an operator's call: ``seqlens`` (cu_seqlens_q/_k, max_seqlen_q/_k) and
    ``flags`` as its schema passes them."""
    settings = _settings.installed or _settings.current()
    call = of_schema(mode.kind, flags, sinks, settings)
    return dispatch(mode, tensors, *seqlens, call, settings, sinks)


def _fresh(t: Tensor, inputs: tuple[Tensor, ...]) -> Tensor:
    """``t`` as a contiguous tensor that shares no memory with any of ``inputs``."""
    t = t.contiguous()
    storage = t.untyped_storage().data_ptr()
    for x in inputs:
        if x.untyped_storage().data_ptr() == storage:
            return t.clone()
    return t


# The operators' arguments after their tensors, in the schema's order: cu_seqlens_q/_k and
# max_seqlen_q/_k, the flags (``OpFlags``), then ``fwd``'s optional sinks.
_SEQLENS = 4
_FLAGS_END = _SEQLENS + len(OpFlags._fields)
# positional, without NamedTuple's Python-level constructor (every call builds one)
_new_flags = tuple.__new__


def _schema_args(args: tuple) -> tuple[tuple, OpFlags, Tensor | None]:
    """``(seqlens, flags, sinks)`` of the arguments an operator's kernel (or ``setup_context``)
    receives after its tensors; ``sinks`` is ``None`` where the call passed none."""
    sinks = args[_FLAGS_END] if len(args) > _FLAGS_END else None
    return args[:_SEQLENS], _new_flags(OpFlags, args[_SEQLENS:_FLAGS_END]), sinks


@_operator("fwd", FWD_SCHEMA)
def _fwd(q, k, v, *args):
    seqlens, flags, sinks = _schema_args(args)
    out, lse = _dispatched(FORWARD, (q, k, v), seqlens, flags, sinks)
    inputs = (q, k, v)
    return _fresh(out, inputs), _fresh(lse, inputs)


@torch.library.register_fake("attn_dispatch::fwd", lib=_LIB)
def _fwd_fake(q, k, v, cu_seqlens_q, *rest):  # shapes only: the flags do not matter
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(lse_shape(q.shape, cu_seqlens_q is not None), dtype=lse_dtype(q.dtype))
    return out, lse


def _op_backward(grad_out, q, k, v, out, lse, sinks, args: tuple) -> tuple:
    """The backward operators' kernel: fresh ``(dq, dk, dv)``, and ``dsinks`` with ``sinks``."""
    seqlens, flags, _ = _schema_args(args)
    grads = _dispatched(BACKWARD, (q, k, v, out, lse, grad_out), seqlens, flags, sinks)
    inputs = (grad_out, q, k, v, out, lse)
    if sinks is None:
        return tuple(_fresh(g, inputs) for g in grads)
    return tuple(_fresh(g, (*inputs, sinks)) for g in (*grads, grads.dsinks))


@_operator("bwd", BWD_SCHEMA)
def _bwd(grad_out, q, k, v, out, lse, *args):
    return _op_backward(grad_out, q, k, v, out, lse, None, args)


@torch.library.register_fake("attn_dispatch::bwd", lib=_LIB)
def _bwd_fake(grad_out, q, k, v, *rest):  # shapes only: out, lse and the flags do not matter
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
    )


@_operator("bwd_sinks", BWD_SINKS_SCHEMA)
def _bwd_sinks(grad_out, q, k, v, out, lse, sinks, *args):
    return _op_backward(grad_out, q, k, v, out, lse, sinks, args)


@torch.library.register_fake("attn_dispatch::bwd_sinks", lib=_LIB)
def _bwd_sinks_fake(grad_out, q, k, v, out, lse, sinks, *rest):  # shapes only
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
        sinks.new_empty(sinks.shape),
    )


_FWD, _BWD = Kind.FORWARD, Kind.BACKWARD
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
    q, k, v = inputs[:3]
    (cu_seqlens_q, cu_seqlens_k, *max_seqlens), flags, sinks = _schema_args(inputs[3:])
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks)
    ctx.max_seqlens = tuple(max_seqlens)
    ctx.flags = flags
    ctx.scope = scope()
    ctx.set_materialize_grads(False)


def _op_gradients(tensors: tuple, sinks, max_seqlens: tuple, flags: OpFlags) -> tuple:
    """``(dq, dk, dv, dsinks)`` by the backward operator: ``tensors`` are grad_out, q, k, v,
    out, lse and the two cu_seqlens, ``max_seqlens`` max_seqlen_q and max_seqlen_k."""
    if sinks is None:
        return (*_bwd(*tensors, *max_seqlens, *flags), None)
    return _bwd_sinks(*tensors[:6], sinks, *tensors[6:], *max_seqlens, *flags)


# The operator's inputs that carry no gradient between k and sinks: cu_seqlens_q/_k,
# max_seqlen_q/_k and the flags.
_NO_GRAD_INPUTS = 4 + len(OpFlags._fields)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    # one gradient per input: q, k, v, the cu_seqlens, max_seqlens and flags, sinks
    if grad_out is None:
        return (None,) * (4 + _NO_GRAD_INPUTS)
    # A gradient from a broadcast (``out.sum()``) or a transpose has odd strides; the kernels
    # behind the dispatcher want a plain layout, and this is a no-op when it already is one.
    tensors = (grad_out.contiguous(), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    if _is_compiling() or ctx.scope == scope():
        # the usual case: backward in the forward's scope, nothing to set; a compiled backward
        # reads the scope it runs in
        grads = _op_gradients(tensors, sinks, ctx.max_seqlens, ctx.flags)
    else:
        with in_scope(ctx.scope):
            grads = _op_gradients(tensors, sinks, ctx.max_seqlens, ctx.flags)
    return grads[:3] + (None,) * _NO_GRAD_INPUTS + grads[3:]


torch.library.register_autograd(
    "attn_dispatch::fwd", _backward, setup_context=_setup_context, lib=_LIB
)


def _refuse_double_backward(name: str) -> Callable:
    def backward(ctx, *grads):
        raise RuntimeError(
            f"Trying to backward through attn_dispatch.{name}: attention's gradients are not "
            "differentiable (a second differentiation is not supported)"
        )

    return backward


# The backward operators have no derivative. Registered, a second differentiation (a gradient
# penalty through ``create_graph=True``) is an error; without it, torch's fallback for an
# operator with no autograd kernel only warns and drops attention's share of that gradient.
for _name in ("bwd", "bwd_sinks"):
    torch.library.register_autograd(
        f"attn_dispatch::{_name}", _refuse_double_backward(_name), lib=_LIB
    )


# What an eager call may hand to the dispatcher directly: anything else (a fake, functional or
# distributed tensor, any subclass) takes the operators, whose dispatch keys handle it.
_PLAIN = (Tensor, torch.nn.Parameter)
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_functorch_active = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled


def _traced(*tensors) -> bool:
    """Whether a call with ``tensors`` (``None`` for an absent one) is being traced or
    transformed, rather than run: compiling or exporting, a dispatch mode (``FakeTensorMode``,
    ``make_fx``'s proxy modes, pre-dispatch tracing), a functorch transform, meta or subclass
    tensors. Cheap: the eager path asks it once per pass."""
    if _is_compiling() or _modes_active():
        return True
    for t in tensors:
        if t is not None and t.__class__ not in _PLAIN:
            return True
    return tensors[0].is_meta


def _modes_active() -> bool:
    """:func:`_traced`'s questions besides compiling that do not depend on the tensors."""
    return _dispatch_modes() or _functorch_active() or _pre_dispatch_tracing()


def _pre_dispatch_tracing() -> bool:
    # make_fx's pre-dispatch tracing keeps its modes on a stack of their own, with a torch
    # function mode on; ``torch.device(...)`` blocks also enable one, but push no dispatch mode.
    return _function_modes() and torch._ops._len_torch_dispatch_stack_pre_dispatch() > 0


def _refuse_derivative_transforms() -> None:
    """Refuse torch.func's differentiating transforms (``grad``, ``vjp``, ``jacrev``, ``jvp``,
    ``jacfwd``) with one clear error: the operators' autograd comes from ``torch.library``, which
    those transforms cannot run (reverse mode fails inside PyTorch with a message about
    ``setup_context``), and forward mode has no derivative formula here at all (``jvp`` would
    return a zero tangent). ``vmap`` alone is supported; ``torch.autograd`` differentiates."""
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

    for interpreter in retrieve_all_functorch_interpreters():
        kind = interpreter.key()
        if kind in (TransformType.Grad, TransformType.Jvp):
            mode = "forward-mode (jvp, jacfwd)" if kind == TransformType.Jvp else "reverse-mode"
            raise NotImplementedError(
                f"attn_dispatch.attention under torch.func's {mode} differentiation: not "
                "supported (torch.func.vmap is; differentiate with torch.autograd: "
                "loss.backward() or torch.autograd.grad)"
            )


def _fresh_all(outputs: tuple, like: tuple, inputs: tuple) -> tuple:
    """Each of ``outputs`` (``None`` stays) laid out as autograd takes it without a copy: as
    it is where it is contiguous or has the strides of its counterpart in ``like`` (the
    tensor it is the gradient of, as the caller passed it: a kernel that allocates its
    gradients like its inputs, as FA4 does, then hands them on uncopied; a contiguous copy
    would be copied back by autograd into the layout of a leaf), else a contiguous copy; and
    sharing no memory with any of ``inputs``, whose storages are read only when no copy
    was made."""
    storages = None
    fresh = []
    for t, x in zip(outputs, like):
        if t is not None:
            c = t if _kept_layout(t, x) else t.contiguous()
            if c is t:
                if storages is None:
                    storages = {i.untyped_storage().data_ptr() for i in inputs if i is not None}
                if t.untyped_storage().data_ptr() in storages:
                    c = t.clone()
            t = c
        fresh.append(t)
    return tuple(fresh)


def _kept_layout(t: Tensor, like: Tensor | None) -> bool:
    """Whether gradient ``t`` can go to autograd as it is: contiguous, or dense with the strides
    of ``like`` (one transpose of dims 1 and 2 away from contiguous: the [B, S, H, D] and
    [B, H, S, D] orders)."""
    if t.is_contiguous():
        return True
    return (
        like is not None
        and t.dim() == 4
        and t.stride() == like.stride()
        and t.transpose(1, 2).is_contiguous()
    )


class _Attention(torch.autograd.Function):
    """The eager path of :func:`attention`: forward and backward call the dispatcher directly.

    The operators' custom-op layer (argument binding, the autograd registration's wrapping) costs
    several times the host time of the dispatch it wraps, which eager mode need not pay. With
    ``heads_first`` the node takes q, k, v as [B, H, S, D] and transposes them itself: views made
    here record no autograd nodes of their own. The node saves q, k, v as given (an in-place
    change to one then fails the backward with autograd's own message). A backward traced by
    compiled autograd (whose ``ctx`` is not this node's own) or otherwise traced takes the
    backward operator instead, so that a compiler sees it as one opaque node."""

    @staticmethod
    def forward(
        ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, sinks, heads_first, max_seqlens, flags, call
    ):
        tensors = (
            (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) if heads_first else (q, k, v)
        )
        settings = _settings.installed or _settings.current()
        out, lse = dispatch(
            FORWARD, tensors, cu_seqlens_q, cu_seqlens_k, *max_seqlens, call, settings, sinks
        )
        out = _fresh(out, tensors)
        ctx.save_for_backward(q, k, v, out, lse.contiguous(), cu_seqlens_q, cu_seqlens_k, sinks)
        ctx.heads_first = heads_first
        ctx.max_seqlens = max_seqlens
        ctx.flags = flags
        ctx.scope = scope()
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        # one gradient per input: q, k, v, the two cu_seqlens, sinks, heads_first, max_seqlens,
        # flags, call
        if grad_out is None:
            return (None,) * 10
        if _is_compiling() or ctx.scope == scope():
            # the usual case: backward in the forward's scope; a compiled backward (compiled
            # autograd) reads the scope it runs in
            dq, dk, dv, dsinks = _eager_gradients(ctx, grad_out)
        else:
            with in_scope(ctx.scope):
                dq, dk, dv, dsinks = _eager_gradients(ctx, grad_out)
        return dq, dk, dv, None, None, dsinks, None, None, None, None


def _bshd(*tensors: Tensor) -> tuple[Tensor, ...]:
    return tuple([t.transpose(1, 2) for t in tensors])


def _plain_gradient(grad_out: Tensor, q: Tensor, heads_first: bool) -> Tensor:
    """``grad_out`` in a layout every implementation takes. A gradient from a broadcast
    (``out.sum()``) or a transpose has odd strides and is copied. With ``heads_first``, a
    gradient [B, H, S, D]-contiguous like the caller's q (``q``, as given) is read in place,
    through a transposed view as q is (a copy would cost a kernel launch per layer); where q
    is a view of [B, S, H, D] memory (Hugging Face's projections), the gradient is copied to
    that layout, which some kernels need all their row operands in (triton's sm_90 ones)."""
    if heads_first and grad_out.transpose(1, 2).is_contiguous() and q.is_contiguous():
        return grad_out
    return grad_out.contiguous()


def _eager_gradients(ctx, grad_out: Tensor) -> tuple:
    """``(dq, dk, dv, dsinks)`` of the eager node, dq, dk and dv in its inputs' layout: by the
    dispatcher, or by the backward operator where compiled autograd or another tracer runs the
    node's backward."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    heads_first, max_seqlens, flags = ctx.heads_first, ctx.max_seqlens, ctx.flags
    grad_out = _plain_gradient(grad_out, q, heads_first)
    given = (q, k, v)
    if heads_first:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    # A backward recording a graph (``create_graph=True``) takes the operator too: its result then
    # carries the operator's node, which refuses a second differentiation rather than drop it.
    if (
        ctx.__class__ is not _EAGER_NODE
        or _grad_enabled()
        or _traced(grad_out, q, k, v, out, lse, sinks)
    ):
        tensors = (grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        dq, dk, dv, dsinks = _op_gradients(tensors, sinks, max_seqlens, flags)
    else:
        tensors = (q, k, v, out, lse, grad_out)
        settings = _settings.installed or _settings.current()
        call = of_schema(_BWD, flags, sinks, settings, LAYOUTS[heads_first])
        grads = dispatch(
            BACKWARD, tensors, cu_seqlens_q, cu_seqlens_k, *max_seqlens, call, settings, sinks
        )
        dq, dk, dv = grads
        if heads_first:
            dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
        return _fresh_all((dq, dk, dv, grads.dsinks), (*given, None), (*tensors, sinks))
    if heads_first:
        dq, dk, dv = _bshd(dq, dk, dv)
    return dq, dk, dv, dsinks


# The node class of an eager call's backward; compiled autograd calls ``backward`` with a stand-in
# context of another class.
_EAGER_NODE = _Attention._backward_cls
# ``_Attention.apply`` without ``Function.apply``'s Python layer: that layer binds default
# arguments for a ``setup_context`` (this node has none), routes functorch transforms (an eager
# call has none active: ``_traced``) and unwraps tensors a finished transform left behind, which
# :func:`_unwrapped` does for the tensor arguments.
_eager_apply = super(torch.autograd.Function, _Attention).apply
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _unwrapped(*tensors) -> tuple:
    """``tensors`` (``None`` for an absent one) with any dead functorch wrapper unwrapped."""
    return tuple([t if t is None else _unwrap_if_dead(t) for t in tensors])


def _through_own_node(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    heads_first: bool,
    flags: OpFlags,
    call: Call,
    settings: _settings.Settings,
) -> Tensor | None:
    """The output (in the caller's layout) of a dense eager call through its implementation's
    own autograd node (``_own_node``), or ``None`` where the library's node runs it. The first
    call of a signature takes the library's node, which caches the forward decision; the
    verdict for the signature follows it and is kept as decisions are: under the signature's
    dictionary key, with a guard in front where the flag combination has room for one."""
    table, key = settings.own_nodes, (call, heads_first)
    entries = table.get(key)
    node = None if entries is None else _guards.match(entries, (q, k, v))
    if node is None:
        signature = _own_node_signature(q, k, v, heads_first, call)
        if signature is None:
            return None  # a tensor subclass or an unhashable key: the library's node
        node = settings.own_node_keys.get(signature)
        if node is None:
            out = _dense_library_node(q, k, v, heads_first, flags, call)
            with torch.no_grad():
                tensors = _bshd(q, k, v) if heads_first else (q, k, v)
                node = _own_node.verdict(settings, call, tensors, heads_first)
            if len(settings.own_node_keys) >= MAX_CACHED_DECISIONS:
                settings.own_node_keys.clear()  # the guards' verdicts stay, as decisions' do
            settings.own_node_keys[signature] = node
            _guards.remember(table, key, (q, k, v), node)
            return out
    return _run_own_node(node, q, k, v)


def _dense_library_node(q, k, v, heads_first: bool, flags: OpFlags, call: Call) -> Tensor:
    """The output (in the caller's layout) of a dense eager call through the library's node."""
    out = _eager_apply(q, k, v, None, None, None, heads_first, (None, None), flags, call)
    return out.transpose(1, 2) if heads_first else out


def _run_own_node(node: _own_node.OwnNode, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The output of ``node``'s function of q, k and v, or ``None`` where the library's node
    runs the call (its verdict, or q, k and v aligned otherwise than its decisions read)."""
    if node.run is None or (
        node.pointers is not None and node.pointers != pointer_residues((q, k, v), None, None)
    ):
        return None
    try:
        return node.run(q, k, v)
    except Exception as exc:
        exc.add_note(f"(raised by {node.impl.full_name} in attn_dispatch.attention)")
        raise


class _Front(NamedTuple):
    """What the dense eager calls of one flag combination, layout and scope share, once a call
    of them has checked it all: the forward ``Call``, the operators' flags, the layout and the
    guarded own-node verdicts of its signatures (``settings.own_nodes``' list for the call)."""

    call: Call
    flags: OpFlags
    heads_first: bool
    verdicts: list


def _through_front(front: _Front, q, k, v) -> Tensor | None:
    """The output of a dense eager call whose flags and scope a call checked before
    (``front``), where a guard of its verdicts accepts q, k and v (plain tensors of a signature
    that call saw, no mode or transform active; the caller is not compiling); else ``None``,
    and :func:`attention` checks it all."""
    node = _guards.match(front.verdicts, (q, k, v))
    if node is None or _modes_active():
        return None
    out = _run_own_node(node, q, k, v)
    if out is not None:
        return out
    return _dense_library_node(q, k, v, front.heads_first, front.flags, front.call)


def _remember_front(settings: _settings.Settings, key, call: Call, flags: OpFlags, heads_first):
    """Keep the :class:`_Front` of a dense eager call that passed every check (``key``: its
    flags as given and its scope), where its flag combination has guarded verdicts."""
    verdicts = settings.own_nodes.get((call, heads_first))
    if verdicts is not None:
        settings.fronts[key] = _Front(call, flags, heads_first, verdicts)


def _own_node_signature(q: Tensor, k: Tensor, v: Tensor, heads_first: bool, call: Call):
    """The dictionary key of an eager call's own-node verdict: the decisions' key, the layout
    and which inputs require grad (``None``: none, for tensor subclasses, as for the guards)."""
    if not (type(q) is type(k) is type(v) is Tensor):
        return None
    key = signature_key(call, (q, k, v))
    if key is None:
        return None
    return key, heads_first, q.requires_grad, k.requires_grad, v.requires_grad


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
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    front_key = None
    if (
        window is None
        and softcap is None
        and sinks is None
        and cu_seqlens_q is cu_seqlens_k is max_seqlen_q is max_seqlen_k is None
        # each flag of its plain type (any other gets every check), so that its value is a key
        and causal.__class__ is deterministic.__class__ is bool
        and causal_align.__class__ is layout.__class__ is str
        and (scale is None or scale.__class__ is float)
        and (backend is None or backend.__class__ is str)
        and not _is_compiling()
    ):
        # the common case: a dense call whose flags, as given, and scope a call checked before
        read_in = (_settings.forced_var.get(), _execution.current_execution())
        front_key = (causal, causal_align, scale, deterministic, backend, layout, *read_in)
        settings = _settings.installed or _settings.current()
        front = settings.fronts.get(front_key)
        if front is not None and (out := _through_front(front, q, k, v)) is not None:
            return out
    # The operator schema would reject a non-tensor (a numpy array, a list) with a RuntimeError
    # that prints its value: the dispatcher's TypeError instead.
    _require_tensor("q", q)
    _require_tensor("k", k)
    _require_tensor("v", v)
    if cu_seqlens_q is not None or cu_seqlens_k is not None or sinks is not None:
        for name, t in (
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
            ("sinks", sinks),
        ):
            if t is not None:
                _require_tensor(name, t)
    heads_first = _heads_first(layout, cu_seqlens_q, cu_seqlens_k, (q, k, v))
    # The operator schema would coerce or reject these with its own error; say it the library's
    # way instead (the rest is validated by the dispatcher, on a signature's first call).
    check_causal(causal)
    check_causal_align(causal_align)
    check_deterministic(deterministic)
    if max_seqlen_q is not None or max_seqlen_k is not None:
        max_seqlen_q, max_seqlen_k = _checked_max_seqlens(
            (q, k, v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
        )
        if any(isinstance(m, int) and m > INT64_MAX for m in (max_seqlen_q, max_seqlen_k)):
            # Dense or malformed varlen inputs: the schema cannot carry the value, so the
            # dispatcher's validation names what is wrong before the operator would.
            call = Call(Kind.FORWARD, causal, causal_align, scale, deterministic)
            dense = _bshd(q, k, v) if heads_first else (q, k, v)
            build_inputs(call, dense, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"argument 'backend': expected a str or None, got {type(backend).__name__}")
    if _is_compiling():
        scale, softcap = _traced_float("scale", scale), _traced_float("softcap", softcap)
    else:
        if scale is not None:
            scale = resolve_scale(scale, 1)
        if softcap is not None:
            softcap = check_softcap(softcap)
    if window is None:
        window_left = window_right = None
    else:
        window = check_window(window, (numbers.Integral, torch.SymInt))
        window_left, window_right = (None, None) if window is None else window
    # A meta tensor among real ones would send the operator to its fake implementation, which
    # returns uninitialised memory: refuse mixed devices here, as the dispatcher does.
    device = q.device
    if (
        k.device != device
        or v.device != device
        or (cu_seqlens_q is not None or cu_seqlens_k is not None or sinks is not None)
    ):
        _check_devices(device, k, v, cu_seqlens_q, cu_seqlens_k, sinks)
    flags = _new_flags(
        OpFlags,
        (causal, causal_align, scale, deterministic, backend, window_left, window_right, softcap),
    )
    if not _traced(q, k, v, cu_seqlens_q, cu_seqlens_k, sinks):
        settings = _settings.installed or _settings.current()
        call = of_schema(_FWD, flags, sinks, settings, LAYOUTS[heads_first])
        if cu_seqlens_q is cu_seqlens_k is sinks is max_seqlen_q is max_seqlen_k is None:
            # dense: the implementation's own compiled node where it runs both passes
            out = _through_own_node(*_unwrapped(q, k, v), heads_first, flags, call, settings)
            if front_key is not None:
                _remember_front(settings, front_key, call, flags, heads_first)
            if out is not None:
                return out
        # eager: one autograd node, dispatching directly (see _Attention)
        out = _eager_apply(
            *_unwrapped(q, k, v, cu_seqlens_q, cu_seqlens_k, sinks),
            heads_first,
            (max_seqlen_q, max_seqlen_k),
            flags,
            call,
        )
    else:
        # a functorch transform is one of the things _traced takes to the operators
        if not _is_compiling() and _functorch_active():
            _refuse_derivative_transforms()
        if heads_first:
            q, k, v = _bshd(q, k, v)
        out, _ = _fwd(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            *flags,
            # passed only when given: a call without sinks keeps the operator's original arguments
            *(() if sinks is None else (sinks,)),
        )
    return out.transpose(1, 2) if heads_first else out


def _check_devices(device: torch.device, k, v, cu_seqlens_q, cu_seqlens_k, sinks) -> None:
    """That every tensor argument (``None``: absent) is on q's ``device``."""
    for name, t in (
        ("k", k),
        ("v", v),
        ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", cu_seqlens_k),
        ("sinks", sinks),
    ):
        if t is not None and t.device != device:
            raise ValueError(
                f"argument '{name}': expected device {device} (same as q), got {t.device}"
            )


def _checked_max_seqlens(tensors, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The max_seqlens as the operators take them: ints as ``ad.forward`` takes them (numpy
    ints too) or traced ones, a varlen value beyond its packed tensor capped."""
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, _INTS)):
            raise TypeError(f"argument '{name}': expected a Python int, got {type(value).__name__}")
    max_seqlen_q, max_seqlen_k = (
        int(m) if isinstance(m, numbers.Integral) else m for m in (max_seqlen_q, max_seqlen_k)
    )
    # No sequence is longer than its packed tensor: a larger max_seqlen (up to beyond int64,
    # which the schema cannot carry) means the same as the token count.
    if cu_seqlens_q is not None and cu_seqlens_k is not None:
        max_seqlen_q = _capped_max_seqlen(max_seqlen_q, tensors[0])
        max_seqlen_k = _capped_max_seqlen(max_seqlen_k, tensors[1])
    return max_seqlen_q, max_seqlen_k


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


def _heads_first(layout: object, cu_seqlens_q, cu_seqlens_k, tensors) -> bool:
    """Whether ``layout`` says [B, H, S, D]; a bad value or a layout varlen cannot take raises."""
    if not isinstance(layout, str):
        raise TypeError(f"argument 'layout': expected a str, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"argument 'layout': expected one of {LAYOUTS}, got {layout!r}")
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
