"""pytest fixtures for tests that select backends: each test starts from a clean environment.

A test suite (the core's, a backend's, a plugin author's) takes them into its ``conftest.py``::

    from attn_dispatch.testing.fixtures import isolated_plugins  # noqa: F401

and a test asks for ``isolated_plugins``: the ``ATTN_DISPATCH_*`` variables are cleared, the
settings, opt-ins, plugin registry and cached decisions are rebuilt from that clean environment,
and everything is rebuilt again after the test, so no forcing, opt-in or allowlist leaks into the
next test. ``isolated_plugins.set(ATTN_DISPATCH_PLUGINS="mybackend,reference")`` sets variables
for this test and reloads. Plugins that are never installed (test doubles shipped as a directory
holding their module and a ``*.dist-info``) are made discoverable with :func:`add_plugin_path`,
called before the first selection.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from .._settings import reload

# Every variable the library reads, and the one the project's test plugins are gated on.
ENV_VARS = (
    "ATTN_DISPATCH_BACKEND",
    "ATTN_DISPATCH_ENABLE",
    "ATTN_DISPATCH_DISABLE",
    "ATTN_DISPATCH_PLUGINS",
    "ATTN_DISPATCH_ARCH",
    "ATTN_DISPATCH_DEBUG",
    "ATTN_DISPATCH_TEST_PLUGINS",
)


class IsolatedEnv:
    """The environment of one test: ``set``/``unset`` variables, each followed by a reload."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def set(self, **values: str) -> None:
        for name, value in values.items():
            self._monkeypatch.setenv(name, value)
        reload(reset_enabled=True)

    def unset(self, *names: str) -> None:
        for name in names:
            self._monkeypatch.delenv(name, raising=False)
        reload(reset_enabled=True)


@pytest.fixture
def isolated_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[IsolatedEnv]:
    """No ``ATTN_DISPATCH_*`` variable, no opt-in, fresh plugins and decisions; restored after."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    reload(reset_enabled=True)
    yield IsolatedEnv(monkeypatch)
    monkeypatch.undo()
    reload(reset_enabled=True)


def add_plugin_path(path: str | os.PathLike[str]) -> None:
    """Make the plugin distributions in ``path`` discoverable by this process and by the Python
    subprocesses it starts (first on ``sys.path`` and ``PYTHONPATH``), without installing them."""
    path = os.fspath(path)
    if path in sys.path:
        return
    sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [path, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
