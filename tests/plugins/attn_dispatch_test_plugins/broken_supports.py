"""A plugin whose ``supports`` raises: it must cost only itself."""

from attn_dispatch import backend as adb

from . import active


class Explodes(adb.Implementation):
    backend, name = "broken_supports", "explodes"
    priority = {"*": 1000}

    def supports(self, inp, arch):
        raise ZeroDivisionError("broken_supports: bug in supports (on purpose)")


@adb.hookimpl
def attn_dispatch_implementations():
    return [Explodes()] if active() else []
