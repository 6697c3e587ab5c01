"""FlyDSL FMHA backward kernels for AMD gfx950 (MI350X) and gfx942 (MI300X), opt-in.

Importing this package imports neither flydsl nor any kernel: flydsl is loaded on the first
kernel build. See ``plugin`` for the implementations and ``aot`` for ahead-of-time builds.
"""

from ._spec import KernelSpec, specs_for
from ._support import FLYDSL_REQUIREMENT

__all__ = ["FLYDSL_REQUIREMENT", "KernelSpec", "specs_for"]
