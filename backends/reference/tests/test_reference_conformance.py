"""The reference backend against the float64 oracle, through ``ad.backward(backend="reference")``.

Default run: the kit's standard + random cases in float64 and float32 (forward, backward,
bitwise determinism). ``-m slow`` adds many more random cases and bf16/f16.
"""

import pytest

from attn_dispatch.testing import make_conformance_tests, random_cases, standard_cases

test_reference_conformance = make_conformance_tests("reference", dtypes=("float64", "float32"))

test_reference_conformance_low_precision = make_conformance_tests(
    "reference", dtypes=("bfloat16", "float16"), cases=standard_cases(), checks=("backward",)
)

test_reference_conformance_many = pytest.mark.slow(
    make_conformance_tests(
        "reference",
        dtypes=("float64", "float32", "bfloat16", "float16"),
        cases=random_cases(150, seed=7, max_seqlen=160),
        checks=("backward", "forward"),
    )
)
