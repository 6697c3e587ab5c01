"""Which kernel variants this device and triton can run, and the ``tl`` kernels' TMA tiles."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


def interpreting() -> bool:
    """Whether kernels run under triton's CPU interpreter (``TRITON_INTERPRET``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def has_host_descriptors() -> bool:
    """Whether this triton passes host tensor descriptors to kernels (triton >= 3.4)."""
    return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None


def tma_available(device: torch.device) -> bool:
    """TMA copies exist on NVIDIA sm_90 and newer; triton's interpreter emulates them (tests).
    Configs asking for them (``LOAD_TMA``, ``TMA``) fall back to pointer loads / atomics
    elsewhere, and on a triton without host tensor descriptors."""
    if not has_host_descriptors():
        return False
    if interpreting():
        return True
    if device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def gluon_sm90(device: torch.device) -> bool:
    """Whether the Gluon sm_90 kernels can run: an NVIDIA sm_90 device (not under the
    interpreter: Gluon has none) and a triton whose Gluon API they were written and checked
    against (:data:`._tma_rows.GLUON_TRITON`)."""
    if interpreting() or torch.version.hip:
        return False
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return False
    from ._gates import triton_version
    from ._tma_rows import GLUON_TRITON

    return (
        triton_version() in GLUON_TRITON
        and importlib.util.find_spec("triton.experimental.gluon") is not None
    )


def tile_descriptor(t: torch.Tensor, varlen: bool, rows: int, cols: int):
    """A TMA descriptor over ``t`` as ``[B, S, H, D]`` (varlen ``[T, H, D]`` as ``[1, T, H, D]``)
    with ``[1, rows, 1, cols]`` blocks, or ``None`` when TMA cannot address it (empty, pointer
    or a stride not a multiple of 16 bytes)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = list(t.shape), list(t.stride())
    if varlen:
        shape, strides = [1, *shape], [strides[0], *strides]
    size = t.element_size()
    if (
        t.numel() == 0
        or t.data_ptr() % 16
        or strides[-1] != 1
        or any(s * size % 16 for s in strides[:-1])
    ):
        return None
    return TensorDescriptor(t, shape, strides, [1, rows, 1, cols])
