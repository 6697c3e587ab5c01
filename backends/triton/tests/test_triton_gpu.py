"""The conformance kit on a GPU (skipped, with the reason, where none is present)."""

from __future__ import annotations

from attn_dispatch.testing import make_conformance_tests, random_cases, sink_cases

test_triton_conformance = make_conformance_tests(
    "triton",
    dtypes=("bfloat16", "float16"),
    device="cuda",
    checks=("backward", "forward", "deterministic"),
)

# Attention sinks across the randomized sweep's shapes (windows and soft caps drawn in too),
# with head dims the kernels take: q, k, v and sinks gradients against the float64 oracle.
test_triton_conformance_sinks = make_conformance_tests(
    "triton",
    dtypes=("bfloat16", "float16"),
    device="cuda",
    cases=sink_cases()
    + random_cases(24, seed=11, head_dims=(32, 64, 128), sinks=True)
    + random_cases(24, seed=12, head_dims=(32, 64, 96, 128), variants=True, sinks=True),
    checks=("backward", "forward", "deterministic"),
)
