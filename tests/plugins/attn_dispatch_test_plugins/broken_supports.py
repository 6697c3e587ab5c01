"""A plugin whose ``supports`` raises: it must cost only itself."""

from ._explodes import exploding_hook

attn_dispatch_implementations = exploding_hook(
    "broken_supports",
    "supports",
    ZeroDivisionError,
    "broken_supports: bug in supports (on purpose)",
)
