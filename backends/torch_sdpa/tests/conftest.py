"""Fixtures of the torch_sdpa tests."""

import pytest

import attn_dispatch as ad


@pytest.fixture
def only_sdpa_and_reference(monkeypatch):
    """Selection among this backend and the reference alone (other backends may be installed)."""
    monkeypatch.setenv("ATTN_DISPATCH_PLUGINS", "torch_sdpa,reference")
    for name in ("ATTN_DISPATCH_BACKEND", "ATTN_DISPATCH_DISABLE", "ATTN_DISPATCH_ARCH"):
        monkeypatch.delenv(name, raising=False)
    ad.reload()
    yield
    monkeypatch.undo()
    ad.reload()
