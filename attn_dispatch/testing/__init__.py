"""Conformance kit for attn_dispatch backends: oracle, tolerances, cases, checks, pytest suite.

A backend package tests itself against the float64 oracle with::

    from attn_dispatch.testing import make_conformance_tests
    test_conformance = make_conformance_tests("mybackend", dtypes=("bfloat16",), device="cuda")

or calls the checks directly: ``check_backward("mybackend", case, dtype=..., device=...)``.
Its ``conftest.py`` takes the ``isolated_plugins`` fixture (a clean selection environment per
test, see :mod:`attn_dispatch.testing.fixtures`). pytest is imported only by
:func:`make_conformance_tests` and by the fixtures, on first use of either.
"""

from typing import Any

from .cases import (
    LAYOUTS,
    Case,
    CaseInputs,
    place,
    random_cases,
    sink_cases,
    standard_cases,
    variant_cases,
)
from .conformance import (
    Unsupported,
    check_backward,
    check_deterministic,
    check_forward,
    default_cases,
)
from .oracle import OracleResult, oracle, visible_mask
from .suite import declared_capabilities, make_conformance_tests
from .tolerances import (
    BFLOAT16,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    TF32,
    Tolerance,
    error_metrics,
    tolerance_for,
)

__all__ = [
    "BFLOAT16",
    "FLOAT16",
    "FLOAT32",
    "FLOAT64",
    "IsolatedEnv",
    "LAYOUTS",
    "TF32",
    "Case",
    "CaseInputs",
    "OracleResult",
    "Tolerance",
    "Unsupported",
    "check_backward",
    "check_deterministic",
    "check_forward",
    "declared_capabilities",
    "add_plugin_path",
    "default_cases",
    "error_metrics",
    "isolated_plugins",
    "make_conformance_tests",
    "oracle",
    "place",
    "random_cases",
    "sink_cases",
    "standard_cases",
    "tolerance_for",
    "variant_cases",
    "visible_mask",
]

# The fixtures import pytest, which a backend's runtime use of the kit does not need.
_FIXTURES = ("IsolatedEnv", "add_plugin_path", "isolated_plugins")


def __getattr__(name: str) -> Any:
    if name in _FIXTURES:
        from . import fixtures

        return getattr(fixtures, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
