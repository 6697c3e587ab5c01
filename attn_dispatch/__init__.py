"""attn_dispatch: one call for the attention backward pass on every accelerator.

The core discovers backends through pluggy entry points (group ``attn_dispatch.backends``), asks
each implementation ``supports(inputs, arch)``, and runs the best by per-arch priority. It never
imports a backend or a kernel runtime itself.

This namespace is the user's API. Plugin authors use ``attn_dispatch.backend``; the names of
theirs that were also exported here still resolve, with a ``DeprecationWarning``, for one release.
"""

import logging as _logging
import warnings as _warnings

from ._api import (
    BackendInfo,
    Choice,
    ImplementationInfo,
    backends,
    backward,
    decide,
    explain,
    forward,
)
from ._arch import Arch, detect_arch
from ._autograd import attention
from ._autotune import autotune
from ._errors import NoBackendError, SettingError, UnknownBackendError
from ._execution import execution_mode
from ._implementation import Gradients
from ._report import Candidate, Measurement, Report, Timing
from ._settings import enable, reload, use_backend
from ._varlen import Varlen, varlen_from_key_mask, varlen_from_mask, varlen_from_position_ids

__version__ = "0.2.0"

# A library logs to its own logger and leaves handlers to the application.
_logging.getLogger("attn_dispatch").addHandler(_logging.NullHandler())

__all__ = [
    "Arch",
    "BackendInfo",
    "Candidate",
    "Choice",
    "Gradients",
    "ImplementationInfo",
    "Measurement",
    "NoBackendError",
    "Report",
    "SettingError",
    "Timing",
    "UnknownBackendError",
    "Varlen",
    "attention",
    "autotune",
    "backends",
    "backward",
    "decide",
    "detect_arch",
    "enable",
    "explain",
    "forward",
    "reload",
    "use_backend",
    "execution_mode",
    "varlen_from_key_mask",
    "varlen_from_mask",
    "varlen_from_position_ids",
]

# Plugin-author names that moved to attn_dispatch.backend (or were internal helpers), with the
# module that defines them: resolved on access with a DeprecationWarning, for one release.
_MOVED = {
    "Implementation": ("attn_dispatch.backend", "Implementation"),
    "ForwardInputs": ("attn_dispatch.backend", "ForwardInputs"),
    "BackwardInputs": ("attn_dispatch.backend", "BackwardInputs"),
    "hookimpl": ("attn_dispatch.backend", "hookimpl"),
    "lse_dtype": ("attn_dispatch.backend", "lse_dtype"),
    "missing_requirement": ("attn_dispatch.backend", "missing_requirement"),
    "band_sides": ("attn_dispatch._validation", "band_sides"),
    "check_softcap": ("attn_dispatch._validation", "check_softcap"),
    "check_window": ("attn_dispatch._validation", "check_window"),
    "effective_window": ("attn_dispatch._validation", "effective_window"),
}


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module 'attn_dispatch' has no attribute {name!r}")
    import importlib

    module, attribute = _MOVED[name]
    where = "attn_dispatch.backend" if module == "attn_dispatch.backend" else "inp.band"
    _warnings.warn(
        f"attn_dispatch.{name} is deprecated and will be removed in the next release; "
        f"use {where}" + (f".{attribute}" if where == "attn_dispatch.backend" else ""),
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), attribute)
