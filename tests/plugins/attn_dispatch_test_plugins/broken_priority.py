"""A plugin whose ``priority_for_inputs`` raises: it must cost only itself."""

from ._explodes import exploding_hook

attn_dispatch_implementations = exploding_hook(
    "broken_priority",
    "priority_for_inputs",
    KeyError,
    "broken_priority: bug in priority_for_inputs (on purpose)",
)
