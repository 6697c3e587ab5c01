"""The library's exception types: ``ValueError`` subclasses, so callers catch them plainly."""

from __future__ import annotations


class NoBackendError(ValueError):
    """No implementation can run these inputs (or the forced one rejects them)."""


class UnknownBackendError(ValueError):
    """A backend or implementation name that no installed plugin provides."""


class SettingError(ValueError):
    """An ``ATTN_DISPATCH_*`` variable holds a value it cannot have. Raised where the value is
    read, a backend's hook included, and always reaches the caller: a bad setting never counts
    as a broken plugin, whose implementations selection would skip for another one."""
