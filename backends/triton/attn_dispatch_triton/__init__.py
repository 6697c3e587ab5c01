"""attn_dispatch's Triton backend: fused FMHA forward and backward for NVIDIA and AMD GPUs.

Importing this package is cheap; the kernels live in ``forward`` / ``backward`` (which import
triton) and the plugin in ``plugin``.
"""

__version__ = "0.1.0"
