"""Backend plugins used by attn_dispatch's tests, found through entry points like any third party.

They are never installed: tests/conftest.py puts tests/plugins (this package and its
``attn_dispatch_test_plugins-0.0.1.dist-info`` with the entry points) on the test session's path.
They still do nothing unless ``ATTN_DISPATCH_TEST_PLUGINS=1``, so a test that does not ask for
them sees only the real backends.
"""

import os


def active() -> bool:
    """Whether the test plugins should act (provide implementations, or break on purpose)."""
    return os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") == "1"
