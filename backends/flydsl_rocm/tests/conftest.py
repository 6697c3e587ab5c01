"""Fixtures of the flydsl_rocm tests."""

from __future__ import annotations

import pytest
from attn_dispatch_flydsl_rocm._support import FLYDSL_REQUIREMENT, flydsl_test_gate

import attn_dispatch as ad


@pytest.fixture
def flydsl_installed() -> None:
    """Skips a test without a usable FlyDSL; where FlyDSL is required (CI) the test errors
    instead, which fails the run."""
    action, why = flydsl_test_gate(ad.missing_requirement(FLYDSL_REQUIREMENT))
    if action == "fail":
        pytest.fail(why, pytrace=False)
    if action == "skip":
        pytest.skip(why)
