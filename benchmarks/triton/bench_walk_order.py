"""How triton:fused_atomic's programs are laid out and walk their GQA group, against cuDNN.

The Gluon dK/dV kernel with atomic dQ has three layout keys (``tuning``): ``SPLIT`` (programs
per kv head's group of query heads; partial dK/dV summed afterwards), ``HEAVY_FIRST`` (causal:
the programs with the most query blocks launch first) and ``WINDOW`` (the programs of that many
kv heads launch together, key block by key block); with a split,
``SPLIT_ADD`` has the slices add dK/dV into one fp32 buffer by atomics instead of each storing
its own partial for the sum launch to add (``-add`` variants); without a mask, ``TAIL_SLICES``
(``-t16``: the units past the last whole wave cut into up to 16 slices of their steps). For
GQA 64/8
(B=1, D=128, bf16) this times the backward through the planned path with the table's choice and
with each variant (``tuning.trial``), and cuDNN's backward in the same process (other head
counts with ``--heads``). Rounds alternate
the order of the candidates; the table prints medians (µs, ``triton.testing.do_bench``, L2
flushed) and cuDNN's time over each. Every variant's gradients are first compared with the
split design's (relative Frobenius difference < 1e-2); the GPU tests check the kernels against
the float64 oracle.

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_walk_order.py [--grid] [--rounds 3]
        [--only s4-w1,s4-w1-add,s1-t16] [--shapes 4096c,8192c,16384c]
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys

import torch
from attn_dispatch_triton import tuning
from bench_kernels import timed_backward, timing_inputs
from triton.testing import do_bench

import attn_dispatch as ad

SHAPES = [(4096, True), (8192, True), (16384, True), (4096, False), (8192, False)]
NAMES = ("SPLIT", "HEAVY_FIRST", "WINDOW", "SPLIT_ADD", "TAIL_SLICES")
_NAME = re.compile(r"s(\d+)(-hf)?(?:-w(\d+))?(-add)?(?:-t(\d+))?")


def variant_name(split: int, heavy: int, window: int, add: int, tail: int = 0) -> str:
    """E.g. ``s4-w1-add``, ``s1-t16``."""
    return (
        f"s{split}{'-hf' if heavy else ''}{f'-w{window}' if window else ''}"
        f"{'-add' if add else ''}{f'-t{tail}' if tail else ''}"
    )


def parse_variant(name: str) -> tuple[int, ...] | None:
    """The keys (in ``NAMES``' order) of a name :func:`variant_name` makes (None if it makes
    no such name)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    keys = (int(m[1]), int(bool(m[2])), int(m[3] or 0), int(bool(m[4])), int(m[5] or 0))
    return keys if keys[0] >= 1 and variant_name(*keys) == name else None  # (not s0, s01, -w0)


# the default set; --grid times every combination instead
VARIANTS = {
    n: parse_variant(n)
    for n in (
        "s4",
        "s1-hf",
        "s4-w1",
        "s4-w2",
        "s2-w1",
        "s2-w2",
        "s1-w4",
        "s4-add",
        "s4-w1-add",
        "s1-t16",
    )
}


def grid() -> dict[str, tuple[int, ...]]:
    out = {}
    for split, heavy, window, add in itertools.product((1, 2, 4, 8), (0, 1), (0, 1, 2, 4), (0, 1)):
        if heavy and window or split == 1 and add:  # (a window replaces heaviest first)
            continue
        out[variant_name(split, heavy, window, add)] = (split, heavy, window, add, 0)
    return out


def bench_shape(
    s: int, causal: bool, variants: dict, rounds: int, heads: tuple[int, int] = (64, 8)
) -> dict[str, list[float]]:
    h, hk = heads
    inputs = timing_inputs(h, hk, s)
    q, k, v, out, lse, do = inputs

    def call(atomic: bool):
        return timed_backward(inputs, causal, atomic_dq=atomic)

    ref = [t.clone() for t in call(False)]
    configs: dict[str, dict[str, int]] = {"table": {}}  # name -> keys changed in the entry
    for name, values in variants.items():
        heavy, window = values[1], values[3]
        if causal or not (heavy or window):  # (without a mask all programs do the same work)
            configs[name] = dict(zip(NAMES, values))

    def timed(name: str) -> float:
        if name == "cudnn":

            def fn():
                return ad.backward(q, k, v, out, lse, do, causal=causal, backend="torch_sdpa:cudnn")

            return do_bench(fn, warmup=10, rep=200) * 1e3
        with in_force(name):
            return do_bench(lambda: call(True), warmup=10, rep=200) * 1e3

    def in_force(name: str):
        """The candidate's config in force ("table": the table's own)."""
        return tuning.trial_with("sm_90", "dkdvq", 128, causal, h // hk, s, **configs[name])

    for name in configs:
        with in_force(name):
            for g, r in zip(call(True), ref):
                diff = ((g.double() - r.double()).norm() / r.double().norm()).item()
                if not diff < 1e-2:
                    raise AssertionError(f"{name}: differs from the split design by {diff:.2e}")
    res: dict[str, list[float]] = {n: [] for n in ("cudnn", *configs)}
    for rnd in range(rounds):
        order = list(res) if rnd % 2 == 0 else list(res)[::-1]
        for name in order:
            res[name].append(timed(name))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--grid",
        action="store_true",
        help="every combination (70 layouts) instead of the default set",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="comma-separated variant names, e.g. s4-w1,s8-add,s1-t16")
    ap.add_argument("--shapes", help="comma-separated key lengths, 'c' for causal: 4096c,8192")
    ap.add_argument("--heads", default="64/8", help="query / kv heads (default 64/8)")
    args = ap.parse_args()
    if tuning.arch_of(torch.device("cuda")) != "sm_90":
        print("needs an sm_90 GPU (the table entries measured are sm_90's)")
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    variants = grid() if args.grid else VARIANTS
    if args.only:  # any name variant_name makes, in the set or not
        names = args.only.split(",")
        unknown = [n for n in names if parse_variant(n) is None]
        if unknown:
            ap.error(f"--only: {unknown} are not variant names (e.g. {sorted(variants)})")
        variants = {n: parse_variant(n) for n in names}
    shapes = SHAPES
    if args.shapes:
        shapes = [(int(x.rstrip("c")), x.endswith("c")) for x in args.shapes.split(",")]
    try:
        h, hk = (int(x) for x in args.heads.split("/"))
    except ValueError:
        ap.error(f"--heads: expected query / kv heads such as 64/8, got {args.heads!r}")
    if hk < 1 or h % hk:
        ap.error(f"--heads: {h} query heads are not a multiple of {hk} kv heads")
    lines = []
    for s, causal in shapes:
        res = bench_shape(s, causal, variants, args.rounds, (h, hk))
        med = {n: statistics.median(t) for n, t in res.items()}
        kind = f"GQA {h}/{hk}" if h != hk else f"MHA {h}"
        label = f"{kind} {s // 1024}K{' causal' if causal else ''}"
        lines.append(
            f"{label}: "
            + "  ".join(f"{n} {t:.0f} ({med['cudnn'] / t:.3f})" for n, t in med.items())
        )
        print(
            lines[-1]
            + "\n    rounds: "
            + "  ".join(f"{n} " + "/".join(f"{x:.0f}" for x in t) for n, t in res.items()),
            flush=True,
        )
    print("\nmedian µs (cuDNN's time over it):\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
