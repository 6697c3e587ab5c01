"""pytest fixtures for tests that select backends: each test starts from a clean environment.

A test suite (the core's, a backend's, a plugin author's) takes them into its ``conftest.py``::

    from attn_dispatch.testing.fixtures import isolated_plugins  # noqa: F401

and a test asks for ``isolated_plugins``: the ``ATTN_DISPATCH_*`` variables are cleared, the
settings, opt-ins, plugin registry and cached decisions are dropped (rebuilt from that clean
environment on their next use), and dropped again after the test, so no forcing, opt-in,
allowlist or injected implementation leaks into the next test.
``isolated_plugins.set(ATTN_DISPATCH_PLUGINS="mybackend,reference")`` sets variables for this
test and reloads. Plugins that are never installed (test doubles shipped as a directory
holding their module and a ``*.dist-info``) are made discoverable with :func:`add_plugin_path`,
called before the first selection.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from .. import _settings
from .._requirements import missing_requirement

# Every variable the core reads (what selection sees), and the one the project's test plugins
# are gated on; a backend's own variables (its caches, its toolchain) are left as they are.
ENV_VARS = (
    "ATTN_DISPATCH_BACKEND",
    "ATTN_DISPATCH_ENABLE",
    "ATTN_DISPATCH_DISABLE",
    "ATTN_DISPATCH_PLUGINS",
    "ATTN_DISPATCH_ARCH",
    "ATTN_DISPATCH_DEBUG",
    "ATTN_DISPATCH_AUTOTUNE",
    "ATTN_DISPATCH_CACHE_DIR",
    "ATTN_DISPATCH_TEST_PLUGINS",
)


class IsolatedEnv:
    """The environment of one test: ``set``/``unset`` variables, each followed by a reload."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def set(self, **values: str) -> None:
        for name, value in values.items():
            self._monkeypatch.setenv(name, value)
        _settings.reload(reset_enabled=True)  # now: the test expects the load's warnings here

    def unset(self, *names: str) -> None:
        for name in names:
            self._monkeypatch.delenv(name, raising=False)
        _settings.reload(reset_enabled=True)


@pytest.fixture
def isolated_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[IsolatedEnv]:
    """No ``ATTN_DISPATCH_*`` variable, no opt-in or autotune switch, fresh plugins and
    decisions; restored after."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    _forget_settings()
    yield IsolatedEnv(monkeypatch)
    monkeypatch.undo()
    _forget_settings()


def _forget_settings() -> None:
    """What ``reload(reset_enabled=True)`` does, but the settings and plugins are loaded on their
    next use rather than now: discovery costs tens of milliseconds, and many tests never select
    (or set variables first, which loads them once)."""
    missing_requirement.cache_clear()
    with _settings._lock:
        _settings._programmatic_enabled.clear()
        _settings.autotune_override = None
        _settings._install(None)


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
