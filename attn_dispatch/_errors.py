"""The library's exception types: ``ValueError`` subclasses, so callers catch them plainly."""

from __future__ import annotations


class NoBackendError(ValueError):
    """No implementation can run these inputs (or the forced one rejects them)."""


class UnknownBackendError(ValueError):
    """A backend or implementation name that no installed plugin provides."""
