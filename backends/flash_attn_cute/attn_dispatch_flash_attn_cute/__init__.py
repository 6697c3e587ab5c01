"""attn_dispatch's FlashAttention-4 backend: FA4's CuTe-DSL kernels for Hopper and Blackwell.

Importing this package is cheap: FA4 (``flash_attn.cute``, which pulls in CUTLASS's DSL) is
imported on the first kernel call, in ``_fa4``; the plugin lives in ``plugin``.
"""

__version__ = "0.1.0"
