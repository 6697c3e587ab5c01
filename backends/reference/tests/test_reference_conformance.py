"""The reference backend against the float64 oracle, through ``ad.backward(backend="reference")``.

Default run: the kit's default cases (standard, window/soft-cap, sinks, random) in float64,
forward and backward; the standard, window/soft-cap and sink cases in float32 with bitwise
determinism too, and in bf16/f16 (backward; the sink cases too). ``-m slow`` adds the rest of
that product (float64 determinism, the random cases in float32) and many more random cases in
every dtype.
"""

import pytest

from attn_dispatch.testing import (
    make_conformance_tests,
    random_cases,
    sink_cases,
    standard_cases,
    variant_cases,
)

test_reference_conformance = make_conformance_tests(
    "reference", dtypes=("float64",), checks=("backward", "forward")
)

test_reference_conformance_float32 = make_conformance_tests(
    "reference", dtypes=("float32",), cases=standard_cases() + variant_cases() + sink_cases()
)

test_reference_conformance_low_precision = make_conformance_tests(
    "reference",
    dtypes=("bfloat16", "float16"),
    cases=standard_cases() + sink_cases(),
    checks=("backward",),
)

test_reference_conformance_deterministic_float64 = pytest.mark.slow(
    make_conformance_tests("reference", dtypes=("float64",), checks=("deterministic",))
)

test_reference_conformance_random_float32 = pytest.mark.slow(
    make_conformance_tests(
        "reference",
        dtypes=("float32",),
        cases=random_cases(16, seed=1) + random_cases(8, seed=5, variants=True),
    )
)

test_reference_conformance_many = pytest.mark.slow(
    make_conformance_tests(
        "reference",
        dtypes=("float64", "float32", "bfloat16", "float16"),
        cases=random_cases(150, seed=7, max_seqlen=160)
        + random_cases(50, seed=8, max_seqlen=160, variants=True, sinks=True),
        checks=("backward", "forward"),
    )
)
