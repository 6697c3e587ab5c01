"""The conformance kit on a GPU (skipped, with the reason, where none is present)."""

from __future__ import annotations

from attn_dispatch.testing import Case, make_conformance_tests, random_cases, sink_cases

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

# Head dims that pad to different tile widths (Dv = 32 with D = 64 or 128), on views whose rows
# are not 16-byte aligned: triton 3.6's sm_90 forward for these reads shared memory out of
# bounds (wrong outputs, illegal memory accesses) unless the operands are aligned first.
test_triton_conformance_mixed_widths_unaligned = make_conformance_tests(
    "triton",
    dtypes=("float16", "bfloat16"),
    device="cuda",
    cases=[
        Case((184,), (184,), 1, 1, 64, head_dim_v=32, causal=True, layout="sliced", seed=1),
        Case((184,), (184,), 4, 2, 32, head_dim_v=64, causal=True, layout="sliced", seed=2),
        Case((97, 97), (97, 97), 3, 3, 128, head_dim_v=32, layout="transposed", seed=3),
        Case((150,), (150,), 1, 1, 128, head_dim_v=32, layout="sliced", seed=4),
        Case((184,), (184,), 3, 1, 96, head_dim_v=40, causal=True, layout="sliced", seed=5),
    ],
    checks=("backward", "forward"),
)
