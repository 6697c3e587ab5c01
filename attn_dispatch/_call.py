"""``Call``: the flags of one forward or backward call, as one frozen value.

The public shells (``forward``, ``backward``, ``decide``, ``explain``) build it with
:func:`parse` and the operators behind ``attention`` with :func:`of_schema` (from their
``OpFlags``); the dispatcher keys its decision caches on it (with the tensors' metadata), and
the first call of a signature validates it with the tensors (``_validation``) and checks its
forced name (``_settings.resolve_forced``, naming where the name came from). Every layer passes
the ``Call`` rather than its fields, so a flag added to the contract is added here once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _execution, _settings
from ._inputs import Kind, Window
from ._validation import check_flags, check_softcap, check_window, resolve_scale

__all__ = ["Call", "Kind", "OpFlags", "of_schema", "parse"]


class Call(NamedTuple):
    """Every flag of a call; tensors, cu_seqlens and max_seqlen travel beside it."""

    kind: Kind
    causal: bool
    causal_align: str
    scale: float | None  # None: 1/sqrt(head_dim), resolved by validation
    deterministic: bool
    # the forced name (argument, use_backend, env), checked on a signature's first call
    backend: str | None = None
    window: Window | None = None
    softcap: float | None = None
    execution: str = "eager"  # "eager" or "graph" (see _execution)
    # whether the call has attention sinks (their tensor travels beside the Call)
    sinks: bool = False
    # where ``backend`` came from, as its check names it: "backend" (the argument),
    # "use_backend" or the environment variable; None when nothing is forced
    forced_by: str | None = None


class OpFlags(NamedTuple):
    """The flags as the operators' schema passes them (a window as its two sides)."""

    causal: bool
    causal_align: str
    scale: float | None
    deterministic: bool
    backend: str | None
    window_left: int | None
    window_right: int | None
    softcap: float | None


# Builds a Call from a tuple without NamedTuple's Python-level __new__ (the hot path).
_new_call = tuple.__new__
# What torch.are_deterministic_algorithms_enabled() returns, without its Python frame.
_deterministic_default = torch._C._get_deterministic_algorithms


def parse(
    kind: Kind,
    causal,
    causal_align,
    scale,
    deterministic,
    backend,
    window,
    softcap,
    sinks,
    settings: _settings.Settings,
) -> Call:
    """The ``Call`` of a public call's flags, with the checks its cache key cannot make.

    ``(True, 1)`` and ``(1, 1)`` are equal keys, as are ``softcap=True`` and ``softcap=1.0``:
    the flags whose type decides validity are checked here on every call (cheap identity tests
    first); their values are validated with the tensors on a signature's first call.
    ``sinks``: the call's sink logits or ``None`` (the Call records whether it has them)."""
    if deterministic is None:
        deterministic = _deterministic_default()
    if causal_align.__class__ is not str:
        # the flags are a cache key: an unhashable value must fail as a bad argument first
        check_flags(False, causal_align, False)
    if (
        (causal is not True and causal is not False)
        or (deterministic is not True and deterministic is not False)
        or (scale is not None and scale.__class__ is not float)
    ):
        check_flags(causal, "top_left", deterministic)
        scale = scale if scale is None else resolve_scale(scale, 1)
    if window is not None:
        window = check_window(window)
    if softcap is not None:
        softcap = check_softcap(softcap)
    return _in_context(
        kind, causal, causal_align, scale, deterministic, backend, window, softcap, sinks, settings
    )


def of_schema(kind: Kind, flags: OpFlags, sinks, settings: _settings.Settings) -> Call:
    """The ``Call`` of the operators' flags. Their schema typed every flag and ``attention``
    checked them before the operator ran, so nothing is checked again (values still are, with
    the tensors, on a signature's first call). Both unbounded sides mean no window."""
    left, right = flags.window_left, flags.window_right
    return _in_context(
        kind,
        flags.causal,
        flags.causal_align,
        flags.scale,
        flags.deterministic,
        flags.backend,
        None if left is None and right is None else (left, right),
        flags.softcap,
        sinks,
        settings,
    )


def _in_context(
    kind, causal, causal_align, scale, deterministic, backend, window, softcap, sinks, settings
) -> Call:
    """The ``Call`` of checked flags with what the calling context adds: the forced name
    (argument, else ``use_backend``, else environment; unchecked, it goes into the decision key)
    with where it came from, and the execution mode."""
    if backend is not None:
        forced_by = "backend"
    elif (backend := _settings.forced_var.get()) is not None:
        forced_by = "use_backend"
    elif (backend := settings.forced_env) is not None:
        forced_by = _settings.BACKEND_ENV
    else:
        forced_by = None
    execution = _execution.current_execution()
    return _new_call(
        Call,
        (
            kind,
            causal,
            causal_align,
            scale,
            deterministic,
            backend,
            window,
            softcap,
            execution,
            sinks is not None,
            forced_by,
        ),
    )
