"""Fixtures of this backend's tests: ``isolated_plugins``, a clean selection environment; the
interpreter workers of test_triton_numerics.py started as soon as the run is known to need them.
"""

from __future__ import annotations

import pytest

from attn_dispatch.testing.fixtures import isolated_plugins

__all__ = ["isolated_plugins"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """Start each interpreter worker that a selected test reads (minutes of one core): it runs
    beside the tests collected before its own, instead of after them."""
    for item in items:
        workers = getattr(getattr(item, "module", None), "WORKERS", None)
        if not workers or config.option.collectonly:
            continue
        for name in set(item.fixturenames) & set(workers):
            workers[name].start()
            _started.append(workers[name])


_started: list = []


def pytest_sessionfinish(session, exitstatus) -> None:
    """A run stopped early (``-x``, Ctrl-C) leaves no worker computing for nobody."""
    for worker in _started:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.kill()
