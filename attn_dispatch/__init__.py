"""attn_dispatch: one call for the attention backward pass on every accelerator.

The core discovers backends through pluggy entry points (group ``attn_dispatch.backends``), asks
each implementation ``supports(inputs, arch)``, and runs the best by per-arch priority. It never
imports a backend or a kernel runtime itself.

This namespace is the user's API. Plugin authors use ``attn_dispatch.backend``.
"""

import logging as _logging

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
from ._errors import NoBackendError, SettingError, UnknownBackendError
from ._execution import execution_mode
from ._implementation import Gradients
from ._measure import DeviceFault
from ._report import Candidate, Measurement, Report, Timing
from ._settings import autotune, enable, reload, use_backend
from ._varlen import Varlen, varlen_from_key_mask, varlen_from_mask, varlen_from_position_ids

__version__ = "0.2.0"

# A library logs to its own logger and leaves handlers to the application.
_logging.getLogger("attn_dispatch").addHandler(_logging.NullHandler())

__all__ = [
    "Arch",
    "BackendInfo",
    "Candidate",
    "Choice",
    "DeviceFault",
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
