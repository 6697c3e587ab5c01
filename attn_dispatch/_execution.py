"""How a call executes: ``"eager"`` (each call pays its host cost) or ``"graph"``.

A kernel's end-to-end latency depends on it: a kernel with a heavy Python launch path loses to
a lighter one at short problems in eager mode, yet wins once the call is captured into a CUDA
graph (the replay skips the host code). So the decision of a call is made and cached per
execution mode, and implementations may rank themselves per mode
(:meth:`Implementation.priority_for_execution`).

The mode is ``"graph"`` while the current CUDA stream is capturing
(``torch.cuda.is_current_stream_capturing()``) or while ``torch.compile`` traces the call
(``torch.compiler.is_compiling()``: the traced call's decision is the one the compiled program
keeps), else ``"eager"``. The probe costs two C calls; it touches no CUDA state when CUDA was
never initialised (then nothing can be capturing).
"""

from __future__ import annotations

import torch

EAGER, GRAPH = "eager", "graph"
EXECUTIONS = (EAGER, GRAPH)

_cuda_initialized = torch.cuda.is_initialized
_cuda_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_compiling = torch.compiler.is_compiling


def current_execution() -> str:
    """``"graph"`` when the call is being captured or compiled, else ``"eager"``."""
    if _compiling():
        return GRAPH
    if _cuda_capturing is not None and _cuda_initialized() and _cuda_capturing():
        return GRAPH
    return EAGER


def check_execution(execution: object, name: str = "execution") -> str:
    """``execution`` if it names a mode, else a ``ValueError`` naming the argument."""
    if execution not in EXECUTIONS:
        raise ValueError(f"{name} must be one of {EXECUTIONS}, got {execution!r}")
    return execution  # type: ignore[return-value]
