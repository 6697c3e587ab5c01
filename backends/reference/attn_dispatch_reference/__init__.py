"""The reference backend of attn_dispatch: exact attention in plain PyTorch, in query chunks."""

from ._chunked import DEFAULT_BUDGET_BYTES, attention_backward, attention_forward

__all__ = ["DEFAULT_BUDGET_BYTES", "attention_backward", "attention_forward"]
