"""The FlyDSL gate of the compile and API tests (a plain module: the name ``conftest`` is taken
by the core tests' helpers, which they import by that name)."""

from __future__ import annotations

import pytest
from attn_dispatch_flydsl_rocm._support import FLYDSL_REQUIREMENT, flydsl_test_gate

from attn_dispatch import backend as adb


def require_flydsl() -> None:
    """Skips the calling test without a usable FlyDSL; where FlyDSL is required (CI) the test
    fails instead."""
    action, why = flydsl_test_gate(adb.missing_requirement(FLYDSL_REQUIREMENT))
    if action == "fail":
        pytest.fail(why, pytrace=False)
    if action == "skip":
        pytest.skip(why)
