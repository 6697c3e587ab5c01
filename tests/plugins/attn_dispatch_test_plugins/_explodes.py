"""The hook of a plugin whose one implementation raises in one of its methods, on purpose."""

from attn_dispatch import backend as adb

from . import active


def exploding_hook(backend: str, method: str, error: type[Exception], message: str):
    """The hook of ``backend``, giving ``backend:explodes`` (priority 1000, so that selection
    always asks it) whose ``method`` raises ``error(message)``: it must cost only itself."""

    class Explodes(adb.Implementation):
        priority = {"*": 1000}

    def explode(self, inp, arch):
        raise error(message)

    Explodes.backend, Explodes.name = backend, "explodes"
    setattr(Explodes, method, explode)

    @adb.hookimpl
    def attn_dispatch_implementations():
        return [Explodes()] if active() else []

    return attn_dispatch_implementations
