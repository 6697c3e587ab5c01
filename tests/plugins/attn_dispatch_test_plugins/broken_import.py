"""A plugin whose import fails (when the test plugins are active)."""

from . import active

if active():
    raise ImportError("broken_import: this plugin's kernel runtime is missing (on purpose)")

from attn_dispatch import backend as adb  # noqa: E402


@adb.hookimpl
def attn_dispatch_implementations():
    return []
