"""``attn-dispatch bench``: time every installed implementation of the backward on a shape sweep.

For each shape the harness

1. draws fresh random inputs (several sets, rotated, so their total exceeds twice the L2 cache)
   and gets ``out``/``lse`` from ``ad.forward`` (automatic choice);
2. checks every implementation that accepts the shape against the reference backend run in
   higher precision (float32 math on bf16/f16 inputs, float64 for float32 inputs or small
   problems): ``max|x-ref|/max|ref|`` and ``||x-ref||/||ref||`` within the dtype's bounds from
   ``attn_dispatch.testing.tolerances`` (bf16: 2e-2 / 1e-2);
3. times each one forced (``ad.backward(..., backend=name)``), the automatic choice
   (``ad.backward(...)``) and a direct call of the chosen implementation's ``.backward(inputs)``
   on the inputs ``ad.decide`` says it receives (host overhead = automatic vs direct), with
   CUDA events around every call (warm-up first, median of the repeats; all variants' calls
   run back to back in one shuffled order, so drift hits them alike; ``time.perf_counter`` on
   the CPU), and the host time of each call. With ``--cuda-graphs`` every call is captured
   once per input set in a CUDA graph and the replays are timed instead: the GPU's time
   alone, without the host's cost of a call (the view of a training step that runs under
   CUDA graphs; at small shapes the eager calls are bound by the host);
4. prints µs, TFLOP/s (backward FLOPs = 10·B·H·Sq·Sk·D, halved when causal) and the ratio to
   the fastest, and writes JSON / CSV / a PNG plot on request (matplotlib is optional).

It also measures the bf16 matmul ceiling (8192³) in the same run on a GPU. Progress goes to
stderr, the table to stdout. Only torch, the standard library and ``attn_dispatch`` are used.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import fnmatch
import json
import math
import platform
import random
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence

import torch

import attn_dispatch as ad
from attn_dispatch import _measure, _settings
from attn_dispatch._tolerances import error_metrics, tolerance_for

from ._args import (
    PROG,
    Parser,
    check_output_path,
    cpu_or_cuda,
    nonnegative_int,
    plain,
    positive_int,
    random_tensor,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_SEQLENS = "1024,2048,4096,8192,16384"
# The sizes an option not given takes: the seed grid on a GPU; on the CPU, where the reference
# backend is the only candidate and the seed grid would take hours, a sweep of seconds.
SIZE_DEFAULTS = {
    "cuda": {"seqlens": DEFAULT_SEQLENS, "heads": "64,8", "head_dim": "128", "dtype": "bf16"},
    "cpu": {"seqlens": "128,256", "heads": "4", "head_dim": "64", "dtype": "fp32"},
}
L2_FALLBACK_BYTES = 60 * 2**20
AUTO, DIRECT = "auto", "direct"
# Whose versions the results record (when installed).
DISTRIBUTIONS = (
    "triton",
    "attn-dispatch-torch-sdpa",
    "attn-dispatch-triton",
    "attn-dispatch-reference",
)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark problem (dense, Sq == Sk)."""

    batch: int
    seqlen: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    dtype: str

    @property
    def label(self) -> str:
        kind = "MHA" if self.heads == self.kv_heads else "GQA"
        heads = f"{self.heads}" if kind == "MHA" else f"{self.heads}/{self.kv_heads}"
        return (
            f"{kind} {heads} B={self.batch} S={self.seqlen} D={self.head_dim}"
            f"{' causal' if self.causal else ''}"
        )

    @property
    def flops(self) -> float:
        f = 10.0 * self.batch * self.heads * self.seqlen * self.seqlen * self.head_dim
        return f / 2 if self.causal else f


@dataclasses.dataclass(eq=False)  # identity: rows key the timing table
class Row:
    """One measured (shape, implementation) pair."""

    shape: Shape
    impl: str
    kind: str  # "forced", AUTO or DIRECT
    us: float | None = None
    host_us: float | None = None
    calls: int | None = None  # timed calls behind the median
    spread: float | None = None  # interquartile range of the calls / median
    tflops: float | None = None
    ratio: float | None = None
    max_err: float | None = None
    rel_l2: float | None = None
    status: str = "ok"
    note: str = ""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(dataclasses.asdict(self.shape))
        del d["shape"]
        d["shape"] = self.shape.label
        return d


# ----------------------------------------------------------------------------------------------
# Arguments


def _ints(text: str) -> list[int]:
    """argparse type: a comma list of ints >= 1."""
    values = [x for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return [positive_int(x.strip()) for x in values]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"{PROG} bench", description=plain(__doc__.split("\n")[0]))
    gpu, cpu = SIZE_DEFAULTS["cuda"], SIZE_DEFAULTS["cpu"]
    p.add_argument("--batch", type=positive_int, default=1, help="batch size")
    p.add_argument(
        "--seqlens",
        type=_ints,
        default=None,
        help=f"comma list of Sq=Sk (default {gpu['seqlens']}; on the CPU {cpu['seqlens']})",
    )
    p.add_argument(
        "--heads",
        type=_ints,
        default=None,
        help=f"comma list of query head counts (default {gpu['heads']}; on the CPU {cpu['heads']})",
    )
    p.add_argument(
        "--kv-heads",
        type=_ints,
        default=None,
        help="comma list paired with --heads, or one value for all (default 8, or H when H < 8)",
    )
    p.add_argument(
        "--head-dim",
        type=positive_int,
        default=None,
        help=f"default: {gpu['head_dim']}; on the CPU {cpu['head_dim']}",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help=f"default: {gpu['dtype']}; on the CPU {cpu['dtype']}",
    )
    causal = p.add_mutually_exclusive_group()
    for flag, only, what in (("--causal", True, "causal"), ("--no-causal", False, "non-causal")):
        only_help = f"{what} only (default: both)"
        causal.add_argument(flag, dest="causal", action="store_const", const=[only], help=only_help)
    p.add_argument(
        "--impls",
        default=None,
        help="comma list of names or fnmatch patterns (e.g. 'torch_sdpa:*,triton'); each "
        "must match an installed implementation (default: all)",
    )
    p.add_argument(
        "--include-reference",
        action="store_true",
        help="also time the reference backend (always timed on the CPU)",
    )
    p.add_argument(
        "--repeats",
        type=nonnegative_int,
        default=0,
        help="timed calls per variant (default 0: enough for ~2 s of the fastest "
        "variant, 41 to 300)",
    )
    p.add_argument(
        "--warmup", type=nonnegative_int, default=3, help="untimed calls before the timed ones"
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="time CUDA-graph replays of each call (the GPU's time alone, without "
        "the host's cost of a call; CUDA only)",
    )
    p.add_argument(
        "--device", type=cpu_or_cuda, default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--no-matmul", action="store_true", help="skip the matmul ceiling")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (default: none)")
    p.add_argument("--csv", metavar="PATH", help="also write the results as CSV (default: none)")
    p.add_argument(
        "--plot",
        metavar="PATH",
        help="PNG of TFLOP/s vs seqlen (needs matplotlib; default: none)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def apply_size_defaults(args: argparse.Namespace, device: torch.device) -> list[str]:
    """Give the size options left out (``None``) their defaults for ``device``'s type; returns
    those options as command-line words (``["--heads", "8", ...]``)."""
    parse = {"seqlens": _ints, "heads": _ints, "head_dim": positive_int, "dtype": str}
    given = []
    for name, text in SIZE_DEFAULTS["cuda" if device.type == "cuda" else "cpu"].items():
        if getattr(args, name) is None:
            setattr(args, name, parse[name](text))
            given += ["--" + name.replace("_", "-"), text]
    return given


def shapes_from(args: argparse.Namespace) -> list[Shape]:
    """The sweep's shapes; ValueError when --kv-heads does not pair with --heads."""
    if args.kv_heads is None:
        kv = [min(8, h) for h in args.heads]
    elif len(args.kv_heads) == 1:
        kv = args.kv_heads * len(args.heads)
    else:
        kv = args.kv_heads
    if len(kv) != len(args.heads):
        raise ValueError(f"--kv-heads: expected 1 or {len(args.heads)} values, got {len(kv)}")
    for h, k in zip(args.heads, kv):
        if h % k:
            given = "" if args.kv_heads is not None else " (the default)"
            raise ValueError(
                f"--kv-heads {k}{given} does not divide --heads {h}: each kv head serves a "
                "whole group of query heads"
            )
    pairs = list(zip(args.heads, kv))
    causals = args.causal if args.causal is not None else [False, True]
    return [
        Shape(args.batch, s, h, k, args.head_dim, c, args.dtype)
        for h, k in pairs
        for c in causals
        for s in args.seqlens
    ]


# ----------------------------------------------------------------------------------------------
# Timing


class Timer:
    """Per-call device time (CUDA events) or wall time (CPU), plus host time of the call."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def run(self, calls: Sequence[Callable[[], object]], warmup: int, repeats: int):
        """Median µs per call and median host µs per call, rotating over ``calls``."""
        times, host = self.samples(calls, warmup, repeats)
        return statistics.median(times), statistics.median(host)

    def samples(self, calls: Sequence[Callable[[], object]], warmup: int, repeats: int):
        """µs per call and host µs per call of ``repeats`` calls, rotating over ``calls``."""
        _warm_up(calls, warmup)
        _measure.synchronize(self.device)
        spans = [_measure.timed(calls[i % len(calls)], self.device) for i in range(repeats)]
        return [s.seconds() * 1e6 for s in spans], [s.host * 1e6 for s in spans]

    def interleaved(self, variants: dict, warmup: int, repeats: int, seed: int = 0) -> dict:
        """(median µs, median host µs, calls, interquartile range / median) per variant over
        ``repeats`` calls each, interleaved call by call.

        After ``warmup`` calls of each variant, all calls run back to back in one shuffled
        order with no synchronisation between them (the GPU queue stays full, as in training).
        Clock and thermal drift, and whichever call came before, then hit every variant alike,
        so two variants that run the same kernel (forced, automatic, direct) differ only by
        what differs between them.
        """
        keys = list(variants)
        for key in keys:
            _warm_up(variants[key], warmup)
        schedule = [key for key in keys for _ in range(repeats)]
        random.Random(seed).shuffle(schedule)
        spans: dict = {key: [] for key in keys}
        _measure.synchronize(self.device)
        for key in schedule:
            calls = variants[key]
            spans[key].append(_measure.timed(calls[len(spans[key]) % len(calls)], self.device))
        _measure.synchronize(self.device)
        result = {}
        for key in keys:
            times = [s.seconds() * 1e6 for s in spans[key]]
            median = statistics.median(times)
            q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (median,) * 3
            result[key] = (
                median,
                statistics.median(s.host * 1e6 for s in spans[key]),
                len(times),
                (q3 - q1) / median if median else 0.0,
            )
        return result


def _warm_up(calls: Sequence[Callable[[], object]], warmup: int) -> None:
    """``warmup`` calls rotating over ``calls``, and at least one of each."""
    for i in range(max(warmup, len(calls))):
        calls[i % len(calls)]()


def matmul_ceiling(device: torch.device, n: int = 8192, repeats: int = 10) -> float | None:
    """bf16 n×n×n matmul TFLOP/s on random data (median of ``repeats``); None on the CPU."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    us, _ = Timer(device).run([lambda: a @ b], warmup=3, repeats=repeats)
    return 2 * n**3 / (us * 1e-6) / 1e12


# ----------------------------------------------------------------------------------------------
# Inputs, candidates, checks


def _l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return L2_FALLBACK_BYTES
    return int(
        getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or L2_FALLBACK_BYTES
    )


def make_sets(shape: Shape, device: torch.device, gen: torch.Generator) -> list[dict]:
    """Input sets (q, k, v, grad_out, out, lse) whose total exceeds twice the L2 cache."""
    dtype = DTYPES[shape.dtype]
    b, s, h, hkv, d = shape.batch, shape.seqlen, shape.heads, shape.kv_heads, shape.head_dim
    per_set = (3 * b * s * h * d + 2 * b * s * hkv * d) * torch.finfo(dtype).bits // 8
    n_sets = max(1, min(8, math.ceil(2 * _l2_bytes(device) / max(per_set, 1))))
    sets = []
    for _ in range(n_sets):

        def rnd(*size):
            return random_tensor(size, gen, device, dtype)

        q, k, v, do = rnd(b, s, h, d), rnd(b, s, hkv, d), rnd(b, s, hkv, d), rnd(b, s, h, d)
        out, lse = ad.forward(q, k, v, causal=shape.causal)
        sets.append(dict(q=q, k=k, v=v, out=out, lse=lse, grad_out=do))
    return sets


def _args(t: dict) -> tuple:
    return t["q"], t["k"], t["v"], t["out"], t["lse"], t["grad_out"]


def _matches(name: str, pattern: str) -> bool:
    """``name`` (backend:impl) matches an fnmatch ``pattern`` or is of the backend ``pattern``."""
    return fnmatch.fnmatchcase(name, pattern) or name.split(":")[0] == pattern


def unmatched_patterns(patterns: list[str], installed: list[str]) -> list[str]:
    """The patterns that name none of the ``installed`` implementations."""
    return [p for p in patterns if not any(_matches(n, p) for n in installed)]


def installed_implementations() -> list[str]:
    return [i.name for b in ad.backends() if b.error is None for i in b.implementations]


def candidates(
    shape: Shape,
    tensors: dict,
    patterns: list[str] | None,
    include_reference: bool,
    execution: str = "eager",
) -> tuple[list[str], str | None, dict[str, str]]:
    """(implementations to time, the automatic choice in ``execution`` mode, rejected name ->
    reasons). Under CUDA graphs the automatic rows are captured, so the choice they run (and
    the direct row that is compared with them) is the graph-mode one."""
    report = ad.explain(*_args(tensors), causal=shape.causal, execution=execution)
    names, rejected = [], {}
    for c in report.candidates:
        if c.status in ("selected", "supported"):
            names.append(c.name)
        elif c.status == "rejected":
            rejected[c.name] = "; ".join(c.reasons)
    if not include_reference:
        names = [n for n in names if not n.startswith("reference:")] or names
    if patterns:
        names = [n for n in names if any(_matches(n, p) for p in patterns)]
    return names, report.selected, rejected


def reference_grads(shape: Shape, t: dict) -> tuple[torch.Tensor, ...]:
    """Gradients from the reference backend in higher precision on the same inputs."""
    small = shape.batch * shape.heads * shape.seqlen**2 <= 2**24
    ref_dtype = torch.float64 if (shape.dtype == "fp32" or small) else torch.float32
    up = {k: t[k].to(ref_dtype) for k in ("q", "k", "v", "out", "grad_out")}
    lse = t["lse"].to(ref_dtype)
    return tuple(
        ad.backward(
            up["q"],
            up["k"],
            up["v"],
            up["out"],
            lse,
            up["grad_out"],
            causal=shape.causal,
            backend="reference",
        )
    )


def compare(grads, ref) -> tuple[float, float]:
    """Worst ``max|x-ref|/max|ref|`` and ``||x-ref||/||ref||`` over dq, dk, dv (the metrics of
    the tolerance table); ``inf`` for a gradient that is not finite."""
    worst_max, worst_l2 = 0.0, 0.0
    for g, r in zip(grads, ref, strict=True):
        if not bool(torch.isfinite(g).all()):
            return math.inf, math.inf
        max_err, rel_l2 = error_metrics(g, r)
        worst_max, worst_l2 = max(worst_max, max_err), max(worst_l2, rel_l2)
    return worst_max, worst_l2


def _tolerance(dtype: str) -> tuple[float, float]:
    tol = tolerance_for(DTYPES[dtype])
    return tol.max_err, tol.rel_l2


def direct_calls(name: str, sets: list[dict], causal: bool, execution: str):
    """Calls of ``name``'s ``backward`` on the inputs the dispatcher would give it, one per
    input set, as ``ad.decide`` reports them; ``None`` when ``name`` is not the automatic choice
    on every set (a choice that reads data pointers can differ between sets)."""
    choices = [ad.decide(*_args(t), causal=causal, execution=execution) for t in sets]
    if any(choice.name != name for choice in choices):
        return None
    return [lambda c=c: c.implementation.backward(c.inputs) for c in choices]


# ----------------------------------------------------------------------------------------------
# The sweep


def _repeats(requested: int, estimate_us: float) -> int:
    """``requested``, or (0) enough calls for ~2 s of the fastest variant, 41 to 300.

    (At long shapes a per-call time moves with the GPU's clock under its power limit, so a few
    calls leave medians of identical kernels apart: docs/benchmarks.md section 1.)"""
    if requested > 0:
        return requested
    if not math.isfinite(estimate_us) or estimate_us <= 0:
        return 41
    return max(41, min(300, int(2_000_000 / estimate_us)))


def bench_shape(shape: Shape, args, device, gen, log) -> list[Row]:
    # Each shape starts with no cached decisions, as a training job with one signature would
    # (the dispatcher keeps C-level guards for the first few signatures per flag combination).
    _settings.current().forget()
    sets = make_sets(shape, device, gen)
    include_ref = args.include_reference or device.type == "cpu"
    patterns = _patterns(args.impls)
    execution = "graph" if args.cuda_graphs else "eager"
    names, chosen, rejected = candidates(shape, sets[0], patterns, include_ref, execution)
    timer = Timer(device)
    rows: list[Row] = []
    ref = None if args.no_check else reference_grads(shape, sets[0])
    max_tol, l2_tol = _tolerance(shape.dtype)
    variants: dict[Row, list] = {}
    estimate = math.inf  # µs of one call of the fastest variant, from the warm-up
    for name in names:
        row = Row(shape, name, "forced")
        rows.append(row)
        try:
            if ref is not None:
                grads = ad.backward(*_args(sets[0]), causal=shape.causal, backend=name)
                row.max_err, row.rel_l2 = compare(grads, ref)
                del grads
                if not (row.max_err <= max_tol and row.rel_l2 <= l2_tol):
                    row.status = "WRONG"
                    row.note = f"outside tolerance (max_err<={max_tol:g}, rel_l2<={l2_tol:g})"
                    log(f"  {name}: WRONG max_err={row.max_err:.2e} rel_l2={row.rel_l2:.2e}")
                    continue
            calls = [
                lambda t=t, n=name: ad.backward(*_args(t), causal=shape.causal, backend=n)
                for t in sets
            ]
            first, _ = timer.samples(calls, args.warmup, 1)  # compile / first calls stay out
            estimate = min(estimate, first[0])
            variants[row] = calls
            # One line per implementation as it goes: its check and warm-up (a first compile)
            # can take seconds, and the timed rounds come only after all are ready.
            checked = "" if ref is None else f"checked (rel_l2={row.rel_l2:.1e}), "
            log(f"  {name}: {checked}warmed up, first call {first[0]:.1f} us")
        except Exception as exc:  # one broken implementation must not end the sweep
            row.status = "ERROR"
            row.note = _measure.failure(f"{name}'s backward at {shape.label}", exc)
            log(f"  {name}: {row.note}")
    if chosen is not None and not any(r.impl == chosen and r.status != "ok" for r in rows):
        auto = Row(shape, chosen, AUTO)
        rows.append(auto)
        variants[auto] = [lambda t=t: ad.backward(*_args(t), causal=shape.causal) for t in sets]
        direct = direct_calls(chosen, sets, shape.causal, execution)
        if direct is not None:
            row = Row(shape, chosen, DIRECT)
            rows.append(row)
            variants[row] = direct
    if args.cuda_graphs:
        for row in list(variants):
            try:
                variants[row] = _measure.graph_replays(variants[row], device)
            except Exception as exc:  # an implementation that cannot be captured is reported
                why = _measure.failure(
                    f"the CUDA graph capture of {row.impl} at {shape.label}", exc
                )
                del variants[row]
                row.status = "ERROR"
                row.note = f"CUDA graph capture failed: {why}"
                log(f"  {row.impl} ({row.kind}): {row.note}")
    log(f"  timing {len(variants)} variants, interleaved")
    try:
        measured = timer.interleaved(
            variants, args.warmup, _repeats(args.repeats, estimate), seed=args.seed
        )
    except Exception as exc:
        _measure.raise_fault(f"the timing at {shape.label}", exc)
        measured = {}
        log(f"  timing failed: {type(exc).__name__}: {exc}")
    for row, (us, host_us, calls, spread) in measured.items():
        row.us, row.host_us, row.calls, row.spread = us, host_us, calls, spread
        log(f"  {row.impl} ({row.kind}): {us:.1f} us")
    timed = [r for r in rows if r.us is not None]
    set_ratios(timed)
    for r in timed:
        r.tflops = shape.flops / (r.us * 1e-6) / 1e12
    for name, why in rejected.items():
        if not patterns or any(_matches(name, p) for p in patterns):
            rows.append(Row(shape, name, "forced", status="rejected", note=why))
    del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def environment(device: torch.device) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attn_dispatch": ad.__version__,
        "device": str(device),
    }
    installed = _measure.distribution_versions(DISTRIBUTIONS)
    env.update((dist, version) for dist, version in installed.items() if version is not None)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            arch=str(ad.detect_arch(device)),
            cuda=torch.version.cuda,
            hip=torch.version.hip,
            cudnn=torch.backends.cudnn.version(),
            sms=props.multi_processor_count,
            l2_bytes=_l2_bytes(device),
        )
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            out = subprocess.run(query, capture_output=True, text=True, timeout=20)
            env["driver"] = out.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    return env


def set_ratios(timed: list[Row]) -> None:
    """Each timed row's time over the fastest forced row's, for rows whose implementation was
    timed forced (an auto or direct row of an implementation outside --impls has no like-for-like
    fastest: its ratio stays None, as in the summary)."""
    forced = [r for r in timed if r.kind == "forced"]
    fastest = min((r.us for r in forced), default=None)
    compared = {r.impl for r in forced}
    for r in timed:
        r.ratio = r.us / fastest if fastest and r.impl in compared else None


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'shape':<34} {'implementation':<24} {'kind':<7} {'us':>10} {'TFLOP/s':>8} "
        f"{'xfastest':>8} {'host us':>8}  check"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.us is None:
            if r.status == "rejected":
                continue
            lines.append(
                f"{r.shape.label:<34} {r.impl:<24} {r.kind:<7} {'-':>10} {'-':>8} "
                f"{'-':>8} {'-':>8}  {r.status} {r.note}"
            )
            continue
        check = "" if r.rel_l2 is None else f"rel_l2={r.rel_l2:.1e}"
        lines.append(
            f"{r.shape.label:<34} {r.impl:<24} {r.kind:<7} {r.us:>10.1f} {r.tflops:>8.1f} "
            f"{r.ratio if r.ratio is not None else float('nan'):>8.3f} {r.host_us:>8.1f}  {check}"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """Per shape: the automatic choice vs the fastest and vs the direct call.

    "Fastest" is over the forced rows timed in the same run, and is only reported when the
    automatic choice is one of them (else a filtered row set could make it slower than auto)."""
    out = []
    by_shape: dict[Shape, list[Row]] = {}
    for r in rows:
        by_shape.setdefault(r.shape, []).append(r)
    for shape, rs in by_shape.items():
        forced = [r for r in rs if r.kind == "forced" and r.us is not None]
        auto = next((r for r in rs if r.kind == AUTO and r.us is not None), None)
        direct = next((r for r in rs if r.kind == DIRECT and r.us is not None), None)
        if not forced or auto is None:
            continue
        if not any(r.impl == auto.impl for r in forced):
            # The automatic choice was not timed forced (outside --impls, or its forced row
            # failed): the fastest of the others is no like-for-like bound on it.
            out.append(
                f"{shape.label:<34} auto {auto.impl} {auto.us:.1f} us (not compared: "
                f"{auto.impl} has no forced timing in this run)"
            )
            continue
        best = min(forced, key=lambda r: r.us)
        line = (
            f"{shape.label:<34} fastest {best.impl} {best.us:.1f} us; auto {auto.impl} "
            f"{auto.us:.1f} us ({auto.us / best.us - 1:+.1%} vs fastest"
        )
        if direct is not None:
            line += f", {auto.us / direct.us - 1:+.1%} vs direct {direct.us:.1f} us"
            same = next((r for r in forced if r.impl == direct.impl), None)
            if same is not None:  # identical work: the measurement's own noise at this shape
                line += f"; forced vs direct {same.us / direct.us - 1:+.1%}"
        out.append(line + ")")
    return "\n".join(out)


def write_csv(path: str, rows: list[Row]) -> None:
    dicts = [r.to_dict() for r in rows]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dicts[0]) if dicts else ["shape"])
        w.writeheader()
        w.writerows(dicts)


def plot(path: str, rows: list[Row], matmul: float | None) -> bool:
    """TFLOP/s vs seqlen, one panel per (heads, causal); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups: dict[tuple, dict[str, list[tuple[int, float]]]] = {}
    for r in rows:
        if r.tflops is None or r.kind == DIRECT:
            continue
        key = (r.shape.heads, r.shape.kv_heads, r.shape.causal)
        label = "auto" if r.kind == AUTO else r.impl
        groups.setdefault(key, {}).setdefault(label, []).append((r.shape.seqlen, r.tflops))
    n = max(1, len(groups))
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    for ax, ((h, hkv, causal), series) in zip(axes[0], sorted(groups.items())):
        for label, pts in sorted(series.items()):
            pts.sort()
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                linestyle="--" if label == "auto" else "-",
                label=label,
            )
        if matmul:
            ax.axhline(matmul, color="gray", linewidth=0.8, label="bf16 matmul")
        ax.set_xscale("log", base=2)
        ax.set_title(f"H={h} Hkv={hkv}{' causal' if causal else ''}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s (backward)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _patterns(impls: str | None) -> list[str] | None:
    return [p.strip() for p in impls.split(",") if p.strip()] if impls else None


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Shape]:
    """What argparse cannot check alone; returns the shapes. Errors go through ``parser``."""
    if args.cuda_graphs and args.device.type != "cuda":
        parser.error(f"--cuda-graphs needs a CUDA device, not {args.device.type!r}")
    try:
        shapes = shapes_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    patterns = _patterns(args.impls)
    if args.impls is not None and not patterns:
        parser.error("--impls: expected names or patterns, got nothing")
    installed = installed_implementations()
    unknown = unmatched_patterns(patterns or [], installed)
    if unknown:
        parser.error(
            f"--impls: {', '.join(map(repr, unknown))} matches no installed implementation "
            f"(installed: {', '.join(installed) or 'none'})"
        )
    for option in ("json", "csv", "plot"):
        check_output_path(parser, f"--{option}", getattr(args, option))
    return shapes


def main(argv: list[str] | None = None) -> int:
    """Entry of ``attn-dispatch bench``; returns the exit status (1 if a check failed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = args.device
    defaulted = apply_size_defaults(args, device)
    shapes = check_args(parser, args)

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    if device.type == "cpu" and defaulted:
        gpu = " ".join(
            f"--{name.replace('_', '-')} {text}" for name, text in SIZE_DEFAULTS["cuda"].items()
        )
        log(
            f"on the CPU (the reference backend only) the sizes not given are CPU-sized: "
            f"{' '.join(defaulted)} (the GPU sweep is {gpu})"
        )

    env = environment(device)
    env["timing"] = "cuda-graphs" if args.cuda_graphs else "eager"
    log("environment: " + json.dumps(env))
    matmul = None if args.no_matmul else matmul_ceiling(device)
    if matmul is not None:
        log(f"bf16 matmul 8192^3: {matmul:.0f} TFLOP/s")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    rows: list[Row] = []
    fault = None
    for i, shape in enumerate(shapes, 1):
        log(f"[{i}/{len(shapes)}] {shape.label}")
        try:
            rows += bench_shape(shape, args, device, gen, log)
        except _measure.DeviceFault as exc:  # nothing more can run: report what was measured
            fault = exc
            log(f"stopped: {exc}")
            break
    if args.cuda_graphs:
        print("timing: CUDA-graph replays, the GPU's time alone (host us: one replay's)")
    print(format_table(rows))
    print()
    print(summary(rows))
    if matmul is not None:
        print(f"\nbf16 matmul 8192^3 ceiling: {matmul:.0f} TFLOP/s")
    try:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "environment": env,
                        "matmul_tflops": matmul,
                        "argv": argv,
                        "rows": [r.to_dict() for r in rows],
                    },
                    f,
                    indent=1,
                )
        if args.csv:
            write_csv(args.csv, rows)
        if args.plot and not plot(args.plot, rows, matmul):
            log("--plot: matplotlib is not installed (pip install matplotlib); skipped")
    except OSError as exc:  # checked before the sweep, but the disk can still fill up
        parser.error(f"writing the results: {exc}")
    return 1 if fault is not None or any(r.status in ("WRONG", "ERROR") for r in rows) else 0
