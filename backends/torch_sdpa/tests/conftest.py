"""Fixtures of this backend's tests: ``isolated_plugins``, a clean selection environment, and
``recorded_ops``, PyTorch's private ops recorded instead of run (they need a CUDA GPU)."""

from collections.abc import Callable

import pytest
import torch

from attn_dispatch.testing.fixtures import isolated_plugins

__all__ = ["isolated_plugins", "recorded_ops"]


class RecordedOps:
    """Stands in for a module's ``aten``: each op records its name, arguments and keywords in
    ``calls`` and returns ``results(args)``."""

    def __init__(self, results: Callable[[tuple], tuple]) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self._results = results

    def __call__(self, spec):
        def op(*args, **kwargs):
            self.calls.append((spec.name, args, kwargs))
            return self._results(args)

        return op


@pytest.fixture
def recorded_ops(monkeypatch):
    """``install(module, results)``: the module's ``aten`` replaced by a :class:`RecordedOps`
    (default results: one empty tensor like the first argument), which it returns."""

    def install(module, results: Callable[[tuple], tuple] | None = None) -> RecordedOps:
        ops = RecordedOps(results or (lambda args: (torch.empty_like(args[0]),)))
        monkeypatch.setattr(module, "aten", ops)
        return ops

    return install
