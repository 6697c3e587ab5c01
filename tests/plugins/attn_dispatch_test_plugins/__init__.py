"""Backend plugins used by attn_dispatch's tests, installed like any third-party package.

They do nothing unless ``ATTN_DISPATCH_TEST_PLUGINS=1``: installed in a developer environment,
they must not change what real users of that environment get.
"""

import os


def active() -> bool:
    """Whether the test plugins should act (provide implementations, or break on purpose)."""
    return os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") == "1"
