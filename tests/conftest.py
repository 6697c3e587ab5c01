"""Shared fixtures for the core tests: a clean selection environment per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The test plugins are never installed (a user's environment must list only real backends): this
# directory holds their package and a dist-info with their entry points, put first on the path of
# this session and of the subprocesses it starts, before attn_dispatch discovers plugins.
TEST_PLUGINS_PATH = str(Path(__file__).resolve().parent / "plugins")
if TEST_PLUGINS_PATH not in sys.path:
    sys.path.insert(0, TEST_PLUGINS_PATH)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [TEST_PLUGINS_PATH, *filter(None, [os.environ.get("PYTHONPATH")])]
    )

import attn_dispatch as ad  # noqa: E402
from attn_dispatch import backend as adb  # noqa: E402

ENV_VARS = (
    "ATTN_DISPATCH_BACKEND",
    "ATTN_DISPATCH_ENABLE",
    "ATTN_DISPATCH_DISABLE",
    "ATTN_DISPATCH_PLUGINS",
    "ATTN_DISPATCH_ARCH",
    "ATTN_DISPATCH_DEBUG",
    "ATTN_DISPATCH_TEST_PLUGINS",
)


@pytest.fixture
def env(monkeypatch):
    """Clear the ATTN_DISPATCH_* variables; ``env.set(NAME=value, ...)`` then reloads."""

    class Env:
        def set(self, **values: str) -> None:
            for name, value in values.items():
                monkeypatch.setenv(name, value)
            ad.reload(reset_enabled=True)

        def unset(self, *names: str) -> None:
            for name in names:
                monkeypatch.delenv(name, raising=False)
            ad.reload(reset_enabled=True)

    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    ad.reload(reset_enabled=True)
    yield Env()
    monkeypatch.undo()
    ad.reload(reset_enabled=True)


@pytest.fixture
def toys(env):
    """The test plugins active (toy backends plus three broken ones) and the reference."""
    # An inactive earlier import of the broken module is cached; make it import afresh.
    sys.modules.pop("attn_dispatch_test_plugins.broken_import", None)
    with pytest.warns(UserWarning, match="failed to load"):
        env.set(ATTN_DISPATCH_TEST_PLUGINS="1")
    return env


def make_inputs(b=1, sq=8, sk=None, h=4, hkv=2, d=16, dv=None, dtype=torch.float32, device="cpu"):
    """Random backward inputs (q, k, v, out, lse, grad_out) in the dense BSHD layout."""
    sk = sk or sq
    dv = dv or d
    lse_dtype = adb.lse_dtype(dtype)

    def rand(*shape, dt=dtype):
        return torch.randn(shape, dtype=dt, device=device)

    return (
        rand(b, sq, h, d),
        rand(b, sk, hkv, d),
        rand(b, sk, hkv, dv),
        rand(b, sq, h, dv),
        rand(b, h, sq, dt=lse_dtype),
        rand(b, sq, h, dv),
    )


def tag_of(grads) -> float:
    """Which toy implementation produced ``grads`` (each fills its outputs with its tag)."""
    return float(grads[0].flatten()[0])
