"""Shared by the triton backend's tests: scratch buffers start as NaN (see the fixture)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def poisoned_scratch(monkeypatch):
    """New fp32 scratch (the fused-atomic dQ buffer, split partials) is NaN-filled instead of
    left uninitialised, so an element that no kernel zero-fills or writes shows in the results
    (``torch.empty`` may hand out zeros by chance). The interpreter worker sets the same flag."""
    try:
        from attn_dispatch_triton import backward
    except ImportError:  # (triton missing: the tests that need it skip themselves)
        yield
        return
    monkeypatch.setattr(backward, "POISON_SCRATCH", True)
    yield
