"""A plugin whose ``supports`` raises: it must cost only itself."""

import attn_dispatch as ad

from . import active


class Explodes(ad.Implementation):
    backend, name = "broken_supports", "explodes"
    priority = {"*": 1000}

    def supports(self, inp, arch):
        raise ZeroDivisionError("broken_supports: bug in supports (on purpose)")


@ad.hookimpl
def attn_dispatch_implementations():
    return [Explodes()] if active() else []
