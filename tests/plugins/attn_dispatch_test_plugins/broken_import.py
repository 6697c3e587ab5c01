"""A plugin whose import fails (when the test plugins are active)."""

from . import active

if active():
    raise ImportError("broken_import: this plugin's kernel runtime is missing (on purpose)")

import attn_dispatch as ad  # noqa: E402


@ad.hookimpl
def attn_dispatch_implementations():
    return []
