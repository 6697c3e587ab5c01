"""attn_dispatch: one call for the attention backward pass on every accelerator.

The core discovers backends through pluggy entry points (group ``attn_dispatch.backends``), asks
each implementation ``supports(inputs, arch)``, and runs the best by per-arch priority. It never
imports a backend or a kernel runtime itself.
"""

import logging as _logging

from ._api import BackendInfo, ImplementationInfo, backends, backward, explain, forward
from ._arch import Arch, detect_arch
from ._autograd import attention
from ._errors import NoBackendError, UnknownBackendError
from ._execution import execution_mode
from ._hookspecs import hookimpl
from ._implementation import Gradients, Implementation
from ._inputs import (
    BackwardInputs,
    ForwardInputs,
    band_sides,
    check_softcap,
    check_window,
    effective_window,
    lse_dtype,
)
from ._report import Candidate, Report
from ._requirements import missing_requirement
from ._settings import enable, reload, use_backend
from ._varlen import Varlen, varlen_from_key_mask, varlen_from_mask, varlen_from_position_ids

__version__ = "0.1.0"

# A library logs to its own logger and leaves handlers to the application.
_logging.getLogger("attn_dispatch").addHandler(_logging.NullHandler())

__all__ = [
    "Arch",
    "BackendInfo",
    "BackwardInputs",
    "Candidate",
    "ForwardInputs",
    "Gradients",
    "Implementation",
    "ImplementationInfo",
    "NoBackendError",
    "Report",
    "UnknownBackendError",
    "Varlen",
    "attention",
    "band_sides",
    "check_softcap",
    "check_window",
    "backends",
    "backward",
    "detect_arch",
    "effective_window",
    "enable",
    "explain",
    "forward",
    "hookimpl",
    "lse_dtype",
    "missing_requirement",
    "reload",
    "use_backend",
    "execution_mode",
    "varlen_from_key_mask",
    "varlen_from_mask",
    "varlen_from_position_ids",
]
