"""Fixtures of the core's tests: the test plugins on the path, a clean selection environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dispatch_helpers import TOYS, Plugins
from noded_helpers import NODED

from attn_dispatch.testing.fixtures import IsolatedEnv, add_plugin_path, isolated_plugins

# The test plugins are never installed (a user's environment must list only real backends): this
# directory holds their package and a dist-info with their entry points, put first on the path of
# this session and of the subprocesses it starts, before attn_dispatch discovers plugins.
TEST_PLUGINS_PATH = Path(__file__).resolve().parent / "plugins"
add_plugin_path(TEST_PLUGINS_PATH)

__all__ = ["env", "isolated_plugins", "noded_env", "plugins", "toys"]


@pytest.fixture
def env(isolated_plugins: IsolatedEnv) -> IsolatedEnv:
    """The core tests' name for ``isolated_plugins``: ``env.set(NAME=value, ...)`` reloads."""
    return isolated_plugins


@pytest.fixture
def toys(env: IsolatedEnv) -> IsolatedEnv:
    """The test plugins active (the toy backends, exact:oracle and four broken ones) beside the
    installed backends."""
    # An inactive earlier import of the broken module is cached; make it import afresh.
    sys.modules.pop("attn_dispatch_test_plugins.broken_import", None)
    with pytest.warns(UserWarning, match="failed to load"):
        env.set(ATTN_DISPATCH_TEST_PLUGINS="1")
    return env


@pytest.fixture
def toy_backends(env: IsolatedEnv) -> IsolatedEnv:
    """Only the toy backends active (``dispatch_helpers.TOYS``), no installed one."""
    env.set(**TOYS)
    return env


@pytest.fixture
def plugins(env, tmp_path, monkeypatch):
    """Plugin distributions written for this test only (see ``dispatch_helpers.Plugins``)."""
    made = Plugins(tmp_path, monkeypatch)
    yield made
    for module in made.modules:
        sys.modules.pop(module, None)


@pytest.fixture
def noded_env(env):
    """``noded:oracle`` alone (``noded:backward`` disabled), with an empty record."""
    from attn_dispatch_test_plugins import noded  # importable once the plugin path is set

    noded.RUNS.clear()
    env.set(**NODED, ATTN_DISPATCH_DISABLE="noded:backward")
    yield env
    noded.RUNS.clear()
