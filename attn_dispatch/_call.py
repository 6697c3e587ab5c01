"""``Call``: the flags of one forward or backward call, as one frozen value.

The public shells (``forward``, ``backward``, ``decide``, ``explain``) build it with
:func:`parse` and the operators behind ``attention`` with :func:`of_schema`; the dispatcher keys
its decision caches on it (with the tensors' metadata), and the first call of a signature
validates it with the tensors (``_validation``). Every layer passes the ``Call`` rather than its
fields, so a flag added to the contract is added here once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _execution, _settings
from ._inputs import Window
from ._validation import check_flags, check_softcap, check_window, resolve_scale


class Call(NamedTuple):
    """Every flag of a call; tensors, cu_seqlens and max_seqlen travel beside it."""

    kind: str  # "forward" or "backward"
    causal: bool
    causal_align: str
    scale: float | None  # None: 1/sqrt(head_dim), resolved by validation
    deterministic: bool
    backend: str | None  # the forced name (argument, use_backend, env), checked on first call
    window: Window | None
    softcap: float | None
    execution: str  # "eager" or "graph" (see _execution)


# Builds a Call from a tuple without NamedTuple's Python-level __new__ (the hot path).
_new_call = tuple.__new__
# What torch.are_deterministic_algorithms_enabled() returns, without its Python frame.
_deterministic_default = torch._C._get_deterministic_algorithms


def parse(
    kind: str,
    causal,
    causal_align,
    scale,
    deterministic,
    backend,
    window,
    softcap,
    settings: _settings.Settings,
) -> Call:
    """The ``Call`` of a public call's flags, with the checks its cache key cannot make.

    ``(True, 1)`` and ``(1, 1)`` are equal keys, as are ``softcap=True`` and ``softcap=1.0``:
    the flags whose type decides validity are checked here on every call (cheap identity tests
    first); their values are validated with the tensors on a signature's first call."""
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
        kind, causal, causal_align, scale, deterministic, backend, window, softcap, settings
    )


def of_schema(
    kind: str,
    causal: bool,
    causal_align: str,
    scale: float | None,
    deterministic: bool,
    backend: str | None,
    window_left: int | None,
    window_right: int | None,
    softcap: float | None,
    settings: _settings.Settings,
) -> Call:
    """The ``Call`` of the operators' flags. Their schema typed every flag and ``attention``
    checked them before the operator ran, so nothing is checked again (values still are, with
    the tensors, on a signature's first call). Both unbounded sides mean no window."""
    window = None if window_left is None and window_right is None else (window_left, window_right)
    return _in_context(
        kind, causal, causal_align, scale, deterministic, backend, window, softcap, settings
    )


def _in_context(
    kind, causal, causal_align, scale, deterministic, backend, window, softcap, settings
) -> Call:
    """The ``Call`` of checked flags with what the calling context adds: the forced name
    (argument, else ``use_backend``, else environment; unchecked, it goes into the decision key)
    and the execution mode."""
    forced = backend if backend is not None else _settings.forced_var.get() or settings.forced_env
    execution = _execution.current_execution()
    flags = (kind, causal, causal_align, scale, deterministic, forced, window, softcap, execution)
    return _new_call(Call, flags)


def unforced(
    kind: str,
    *,
    causal,
    causal_align,
    scale,
    deterministic,
    window=None,
    softcap=None,
) -> Call:
    """A ``Call`` of flags as given, for validating inputs outside a dispatch (``make_inputs``):
    nothing forced, eager, nothing checked yet (``_validation`` checks it with the tensors)."""
    flags = (kind, causal, causal_align, scale, deterministic, None, window, softcap, "eager")
    return _new_call(Call, flags)
