"""PyTorch's fused attention kernels (cuDNN, FlashAttention-2, memory-efficient) for attn_dispatch.

The backward of each runs directly on the caller's ``out`` and ``lse`` (no forward is
recomputed); the forwards return ``(out, lse)`` in the library's layout. The entry points are
private ATen ops (``torch.ops.aten._*_attention_*``): each implementation checks the installed
torch version and the op's schema and says why it declines when they do not match.
"""

__version__ = "0.1.0"
