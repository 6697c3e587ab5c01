"""Entry point of the torch_sdpa backend: ``torch_sdpa:cudnn``, ``:flash``, ``:efficient``.

Cheap to import: the op modules only import torch and the core. Priorities on sm_90 follow the
measurements in docs/benchmarks.md section 1 (cuDNN fastest at every seed shape, then
FlashAttention-2, then memory-efficient); the triton backend sits between cuDNN and flash.
"""

from __future__ import annotations

from attn_dispatch import backend as adb

from ._common import own_node_path
from .cudnn import Cudnn
from .efficient import Efficient
from .flash import Flash


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    """The torch_sdpa backend's implementations (its setting checked now, whatever runs)."""
    own_node_path()
    return [Cudnn(), Flash(), Efficient()]
