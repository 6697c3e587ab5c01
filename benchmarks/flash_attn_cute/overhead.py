"""The flash_attn_cute backend's per-call cost over FlashAttention-4 called directly, eager.

Usage (a Hopper GPU with flash-attn-4 installed):

    python benchmarks/flash_attn_cute/overhead.py [--rounds 41] [--calls 50] [--json PATH]

At MHA 8 1K (B=1, H=8, S=1024, D=128, bf16), causal and not, it first checks the gradients of
``ad.backward(..., backend="flash_attn_cute")`` and of FA4's ``_flash_attn_bwd`` against the
float64 oracle (and the backend's outputs against FA4's), then times, per call:

- ``fa4 fwd`` / ``fa4 bwd``: ``flash_attn.cute.interface._flash_attn_fwd`` / ``_flash_attn_bwd``
  called directly with the arguments the backend passes;
- ``forced fwd`` / ``forced bwd``: ``ad.forward`` / ``ad.backward`` with
  ``backend="flash_attn_cute"``;
- ``auto fwd`` / ``auto bwd``: the automatic choice (named in the table).

A sample is the wall time of ``--calls`` back-to-back calls between two device synchronisations,
divided by the number of calls; the variants are interleaved in a new random order in each of
``--rounds`` rounds, and the median sample is reported. The table gives each median and its
difference to the direct FA4 call in microseconds; the budget is 5 us (exit status 1 above it,
or when a gradient check fails).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

import torch

import attn_dispatch as ad
from attn_dispatch.testing.oracle import oracle
from attn_dispatch.testing.tolerances import tolerance_for

BUDGET_US = 5.0
B, S, H, D = 1, 1024, 8, 128


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return ((got.double() - want.double()).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(
        torch.randn(B, S, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(4)
    )


def check(causal: bool) -> list[str]:
    """Problems with the gradients (empty: both match the oracle and each other)."""
    from flash_attn.cute.interface import _flash_attn_bwd

    q, k, v, do = inputs(seed=1 + causal)
    out, lse = ad.forward(q, k, v, causal=causal, backend="flash_attn_cute")
    ours = ad.backward(q, k, v, out, lse, do, causal=causal, backend="flash_attn_cute")
    theirs = _flash_attn_bwd(q, k, v, out, do, lse, causal=causal)
    ref = oracle(q, k, v, do, causal=causal)
    tol = tolerance_for(torch.bfloat16).max_err
    problems = []
    for name, a, b, want in zip(("dq", "dk", "dv"), ours, theirs, (ref.dq, ref.dk, ref.dv)):
        for who, got in (("backend", a), ("FA4 direct", b)):
            err = rel_err(got, want)
            if not err <= tol:
                problems.append(f"{who} {name}: error {err:.2e} against the oracle > {tol:.0e}")
        if not rel_err(a, b) <= tol:
            problems.append(f"{name}: backend and FA4 direct differ by {rel_err(a, b):.2e}")
    return problems


def variants(causal: bool) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The timed calls, and the implementations the automatic choice ran."""
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    q, k, v, do = inputs(seed=7)
    out, lse = ad.forward(q, k, v, causal=causal, backend="flash_attn_cute")
    scale = D**-0.5
    fwd_kwargs = dict(
        softmax_scale=scale,
        causal=causal,
        window_size_left=None,
        window_size_right=None,
        softcap=None,
        return_lse=True,
    )
    bwd_kwargs = dict(
        softmax_scale=scale,
        causal=causal,
        window_size_left=None,
        window_size_right=None,
        softcap=0.0,
        deterministic=False,
    )
    calls = {
        "fa4 fwd": lambda: _flash_attn_fwd(q, k, v, **fwd_kwargs),
        "forced fwd": lambda: ad.forward(q, k, v, causal=causal, backend="flash_attn_cute"),
        "auto fwd": lambda: ad.forward(q, k, v, causal=causal),
        "fa4 bwd": lambda: _flash_attn_bwd(q, k, v, out, do, lse, **bwd_kwargs),
        "forced bwd": lambda: ad.backward(
            q, k, v, out, lse, do, causal=causal, backend="flash_attn_cute"
        ),
        "auto bwd": lambda: ad.backward(q, k, v, out, lse, do, causal=causal),
    }
    chosen = {
        "auto fwd": ad.explain(q, k, v, causal=causal).selected or "?",
        "auto bwd": ad.explain(q, k, v, out, lse, do, causal=causal).selected or "?",
    }
    return calls, chosen


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure(calls_by_name: dict, rounds: int, calls: int, seed: int) -> dict[str, float]:
    """Median per-call microseconds of each variant, interleaved in random order per round."""
    for fn in calls_by_name.values():  # warm-up: compilation and the cached decisions
        per_call_us(fn, 3)
    samples: dict[str, list[float]] = {name: [] for name in calls_by_name}
    order = list(calls_by_name)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            samples[name].append(per_call_us(calls_by_name[name], calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--calls", type=int, default=50, help="calls per sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  eager, MHA 8 1K D=128 bf16")
    failed = False
    results = []
    for causal in (False, True):
        problems = check(causal)
        label = "causal" if causal else "full"
        if problems:
            print(f"{label}: gradient check FAILED: " + "; ".join(problems))
            failed = True
            continue
        calls, chosen = variants(causal)
        medians = measure(calls, args.rounds, args.calls, args.seed)
        print(f"\n{label} (gradients match the oracle)")
        print(f"{'call':<12}{'median us':>11}{'vs FA4 us':>11}  ran")
        for name, us in medians.items():
            kind = name.split()[1]
            diff = us - medians[f"fa4 {kind}"]
            ran = chosen.get(name, "flash_attn_cute:sm90" if name.startswith("forced") else "FA4")
            print(f"{name:<12}{us:>11.1f}{diff:>+11.1f}  {ran}")
            results.append(dict(causal=causal, call=name, median_us=us, vs_fa4_us=diff, ran=ran))
            if name.startswith("forced") and diff > BUDGET_US:
                failed = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(
        f"\nbudget: forced at most {BUDGET_US:g} us per call above FA4 direct: "
        + ("EXCEEDED or check failed" if failed else "met")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
