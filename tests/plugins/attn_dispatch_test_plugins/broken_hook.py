"""A plugin whose hook raises (when the test plugins are active)."""

import attn_dispatch as ad

from . import active


@ad.hookimpl
def attn_dispatch_implementations():
    if active():
        raise RuntimeError("broken_hook: cannot enumerate kernels (on purpose)")
    return []
