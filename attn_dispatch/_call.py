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
from ._validation import (
    check_causal,
    check_causal_align,
    check_deterministic,
    check_softcap,
    check_window,
    resolve_scale,
)

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
    # the layout of the eager ``attention`` call this is a pass of ("bshd" or "bhsd"; None: any
    # other call): ranked by the cost tables' attention rows of that layout, which time the
    # whole call (``_selection.evaluate``), so its decisions are its own
    attention: str | None = None


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
    settings: _settings.Settings | None,
) -> Call:
    """The ``Call`` of a public call's flags, with the checks its cache key cannot make.

    ``(True, 1)`` and ``(1, 1)`` are equal keys, as are ``softcap=True`` and ``softcap=1.0``:
    the flags whose type decides validity are checked here on every call (cheap identity tests
    first); their values are validated with the tensors on a signature's first call.
    ``sinks``: the call's sink logits or ``None`` (the Call records whether it has them);
    ``settings``: those in force, ``None`` for a call the dispatcher does not run
    (``make_inputs``). The calling context adds the execution mode and the forced name
    (:func:`_forced`)."""
    if deterministic is None:
        deterministic = _deterministic_default()
    if causal_align.__class__ is not str:
        # the flags are a cache key: an unhashable value must fail as a bad argument first
        check_causal_align(causal_align)
    if (
        (causal is not True and causal is not False)
        or (deterministic is not True and deterministic is not False)
        or (scale is not None and scale.__class__ is not float)
    ):
        check_causal(causal)
        check_deterministic(deterministic)
        scale = scale if scale is None else resolve_scale(scale, 1)
    if window is not None:
        window = check_window(window)
    if softcap is not None:
        softcap = check_softcap(softcap)
    backend, forced_by = _forced(backend, settings)
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
            _execution.current_execution(),
            sinks is not None,
            forced_by,
            None,
        ),
    )


def of_schema(
    kind: Kind,
    flags: OpFlags,
    sinks,
    settings: _settings.Settings,
    attention: str | None = None,
) -> Call:
    """The ``Call`` of the operators' flags. Their schema typed every flag and ``attention``
    checked them before the operator ran, so nothing is checked again (values still are, with
    the tensors, on a signature's first call). Both unbounded sides mean no window; the context
    adds what it adds to :func:`parse`'s. ``attention``: the layout of the eager node's call
    whose pass this is (``Call.attention``); ``None`` for the operators'."""
    left, right = flags.window_left, flags.window_right
    backend, forced_by = _forced(flags.backend, settings)
    return _new_call(
        Call,
        (
            kind,
            flags.causal,
            flags.causal_align,
            flags.scale,
            flags.deterministic,
            backend,
            None if left is None and right is None else (left, right),
            flags.softcap,
            _execution.current_execution(),
            sinks is not None,
            forced_by,
            attention,
        ),
    )


def _forced(
    backend: str | None, settings: _settings.Settings | None
) -> tuple[str | None, str | None]:
    """The forced name (the argument, else ``use_backend``'s, else the environment's as
    ``settings`` read it; unchecked, it goes into the decision key) and where it came from
    (``None``: nothing forced)."""
    if backend is not None:
        if not isinstance(backend, str):
            # the name is a cache key: an unhashable one must fail as a bad argument first
            raise TypeError(
                f"argument 'backend': expected a backend name (str), got {type(backend).__name__}"
            )
        return backend, "backend"
    if (backend := _settings.forced_var.get()) is not None:
        return backend, "use_backend"
    if settings is not None and (backend := settings.forced_env) is not None:
        return backend, _settings.BACKEND_ENV
    return None, None
