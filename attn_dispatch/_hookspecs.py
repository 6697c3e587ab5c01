"""The plugin hooks: what a backend package implements (the plugin author's manual)."""

from __future__ import annotations

import pluggy

PROJECT = "attn_dispatch"
ENTRY_POINT_GROUP = "attn_dispatch.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def attn_dispatch_implementations():  # type: ignore[empty-body]
    """Return a list of ``attn_dispatch.Implementation`` instances this backend provides."""
