"""Fixtures of this backend's tests: ``isolated_plugins``, a clean selection environment."""

from attn_dispatch.testing.fixtures import isolated_plugins

__all__ = ["isolated_plugins"]
