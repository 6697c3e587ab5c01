"""The conformance kit on a GPU (skipped, with the reason, where none is present)."""

from __future__ import annotations

from attn_dispatch.testing import make_conformance_tests

test_triton_conformance = make_conformance_tests(
    "triton",
    dtypes=("bfloat16", "float16"),
    device="cuda",
    checks=("backward", "forward", "deterministic"),
)
