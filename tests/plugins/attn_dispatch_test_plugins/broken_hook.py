"""A plugin whose hook raises (when the test plugins are active)."""

from attn_dispatch import backend as adb

from . import active


@adb.hookimpl
def attn_dispatch_implementations():
    if active():
        raise RuntimeError("broken_hook: cannot enumerate kernels (on purpose)")
    return []
