"""A plugin whose ``priority_for_inputs`` raises: it must cost only itself."""

from attn_dispatch import backend as adb

from . import active


class ExplodesInPriority(adb.Implementation):
    backend, name = "broken_priority", "explodes"
    priority = {"*": 1000}

    def priority_for_inputs(self, inp, arch):
        raise KeyError("broken_priority: bug in priority_for_inputs (on purpose)")


@adb.hookimpl
def attn_dispatch_implementations():
    return [ExplodesInPriority()] if active() else []
