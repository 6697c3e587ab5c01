"""How a call executes: ``"eager"`` (each call pays its host cost) or ``"graph"``.

A kernel's end-to-end latency depends on it: a kernel with a heavy Python launch path loses to
a lighter one at short problems in eager mode, yet wins once the call is captured into a CUDA
graph (the replay skips the host code). So the decision of a call is made and cached per
execution mode, and implementations may rank themselves per mode
(:meth:`Implementation.priority_for_execution`).

The mode is the one :func:`execution_mode` declares, else ``"graph"`` while the current CUDA
stream is capturing (``torch.cuda.is_current_stream_capturing()``), else ``"eager"``. The probe
costs two C calls; it touches no CUDA state when CUDA was never initialised (then nothing can be
capturing).

``torch.compile`` is no graph execution of its own: a compiled program calls ``ad.attention``'s
operators (whose bodies the compiler never traces: it sees their fake implementations) when it
runs, and it cannot trace ``ad.forward`` / ``ad.backward`` (a graph break), so every
decision is made at run time and each call pays its host cost, as an eager call does. A
compiled program captured into a CUDA graph (``mode="reduce-overhead"``) decides its captured
calls as ``"graph"``, as any capture does.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

EAGER, GRAPH = "eager", "graph"
EXECUTIONS = (EAGER, GRAPH)

# torch.cuda.is_initialized() without its Python frame: the module flag and the C check it reads
# (a child forked after CUDA was initialised must not touch CUDA).
_cuda_state = torch.cuda
_cuda_bad_fork = getattr(torch._C, "_cuda_isInBadFork", lambda: False)
_cuda_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_declared: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "attn_dispatch_execution", default=None
)


def current_execution() -> str:
    """The mode declared by :func:`execution_mode`, else ``"graph"`` when the call is being
    captured into a CUDA graph, else ``"eager"``."""
    declared = _declared.get()
    if declared is not None:
        return declared
    if (
        _cuda_capturing is not None
        and _cuda_state._initialized
        and not _cuda_bad_fork()
        and _cuda_capturing()
    ):
        return GRAPH
    return EAGER


def check_execution(execution: object, name: str = "execution") -> str:
    """``execution`` if it names a mode, else a ``ValueError`` naming the argument."""
    if execution not in EXECUTIONS:
        raise ValueError(f"{name} must be one of {EXECUTIONS}, got {execution!r}")
    return execution  # type: ignore[return-value]


@contextlib.contextmanager
def execution_mode(execution: str) -> Iterator[None]:
    """Decide the calls inside as ``execution`` (``"eager"`` or ``"graph"``).

    For the warm-up before a CUDA-graph capture: it runs eagerly, yet should compile and
    check what the captured calls will run (their decision may differ from an eager call's)::

        with ad.execution_mode("graph"):
            step()                      # warm-up: graph decisions, kernels compiled
        with torch.cuda.graph(g):
            step()                      # same decisions, nothing compiled during capture
    """
    token = _declared.set(check_execution(execution))
    try:
        yield
    finally:
        _declared.reset(token)
