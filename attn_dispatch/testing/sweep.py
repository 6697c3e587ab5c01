"""Randomized conformance sweep: every installed implementation, forced, and the automatic
choice, on shapes drawn at random, against the float64 oracle.

Fixed matrices test what their authors thought of; a kernel admitted beyond them can still be
wrong on a shape nobody listed (an odd GQA group, a head dim between the usual ones). The sweep
draws realistic training shapes from :func:`draw_cases` (the distribution is documented there
and in docs/testing_kit.md), runs forward and backward of each implementation on NaN-poisoned
memory through :func:`~attn_dispatch.testing.check_forward` /
:func:`~attn_dispatch.testing.check_backward`, and counts per implementation what it ran,
refused (a legitimate answer, with its reasons) and got wrong (never legitimate). A failure names
the seed and the case, and ``draw_cases(n, seed)`` draws the same cases again.

From Python::

    from attn_dispatch.testing import sweep
    report = sweep.run(sweep.draw_cases(300, seed=7), device="cuda")
    print(report.table())

From a shell: ``python -m attn_dispatch.testing.sweep --cases 300 --device cuda`` (a fresh seed
unless ``--seed``; exit status 1 when anything was wrong).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import torch

import attn_dispatch as ad
from attn_dispatch import _settings
from attn_dispatch import backend as adb
from attn_dispatch._measure import device_fault

from ..tools._args import Parser, check_output_path, cpu_or_cuda, nonnegative_int, positive_int
from .cases import Case, CaseInputs, place
from .conformance import Unsupported, check_backward, check_forward
from .oracle import OracleResult, oracle_of

AUTO = "auto"  # the automatic choice, counted beside the forced implementations
# Head dims models use, drawn more often than others into a run's pool of head dims (below).
COMMON_HEAD_DIMS = (32, 64, 72, 80, 96, 112, 128, 256)
# Each run draws its head dims from a pool: this many of the common ones (128 always), this
# many other multiples of 8 and one value that is none. Every kernel compiles once per head
# dim, so a small pool keeps a run's compile time bounded while the seeds, run after run,
# cover every head dim.
POOL_COMMON, OTHER_HEAD_DIMS = 2, 1
# Each run draws its GQA groups (query heads per kv head) from a pool of this many: group 1
# always and others from 2 up. FlashAttention-4 compiles a variant per group size, so a small
# pool keeps a run's compile time bounded while successive seeds cover every group.
POOL_GROUPS = 3
MAX_SCORES = 1 << 25  # B * H * Sq * Sk of one case: keeps the float64 oracle small and fast
# Each pair of head dims (D, Dv) a run draws takes one dtype for the whole run, drawn from
# these: a kernel compiles a variant per dtype, and successive seeds cover both.
DTYPES = (torch.bfloat16, torch.bfloat16, torch.float16)
# Shares of the cases whose tensors are strided views (drawn from a stream of their own): q, k,
# v, out, grad_out and lse with a last-dim stride of 2, and sinks and cu_seqlens of stride 2
# (of the cases that have them).
STRIDED_LAYOUT, STRIDED_VECTORS = 0.1, 0.3
#: Share of the cases whose grad_out has a layout unlike out's, and the layouts it takes.
GRAD_LAYOUT = 0.25
GRAD_LAYOUTS = ("contiguous", "sliced", "transposed")


@dataclass(frozen=True)
class SweepCase:
    """One drawn problem: the case, its dtype and whether determinism is requested."""

    case: Case
    dtype: torch.dtype
    deterministic: bool | None
    index: int
    seed: int

    @property
    def compile_group(self) -> str:
        """The attributes a kernel compiles a variant for (head dims, dtype, mask kind, soft cap,
        sinks, varlen): cases of one group share their compiled kernels, so a parallel run that
        keeps each group in one process compiles every variant once."""
        c = self.case
        flags = [
            name
            for name, on in (
                ("causal", c.causal),
                ("window", c.window is not None),
                ("softcap", c.softcap is not None),
                ("sinks", c.sinks),
                ("varlen", c.varlen),
            )
            if on
        ]
        dtype = str(self.dtype).removeprefix("torch.")
        return "-".join([f"d{c.head_dim}x{c.dv}", dtype, *flags])

    def describe(self) -> str:
        det = "" if self.deterministic is None else f" deterministic={self.deterministic}"
        return f"seed={self.seed} case#{self.index} {self.case.id} {self.dtype}{det}"


def _length(rng: random.Random, longest: int) -> int:
    """A sequence length: 1, short, a power of two off by a little, mid or long."""
    kind, third = rng.random(), max(2, longest // 3)
    if kind < 0.06:
        return 1
    if kind < 0.3:
        return rng.randint(2, min(64, longest))
    if kind < 0.45:
        power = rng.choice([p for p in (16, 64, 128, 256, 512) if p < longest] or [longest])
        return max(1, min(longest, power + rng.choice((-1, 1, 3))))
    if kind < 0.85:
        return rng.randint(2, third)
    return rng.randint(third, longest)


def head_dim_pool(rng: random.Random, largest: int) -> tuple[int, ...]:
    """The head dims one run draws from (see :data:`OTHER_HEAD_DIMS`)."""
    common = [d for d in COMMON_HEAD_DIMS if d <= largest]
    others = [d for d in range(8, largest + 1, 8) if d not in common]
    first = [128] if 128 in common else common[:1]
    rest = [d for d in common if d not in first]
    chosen = first + rng.sample(rest, min(POOL_COMMON - 1, len(rest)))
    picked = rng.sample(others, min(OTHER_HEAD_DIMS, len(others)))
    odd = rng.choice([d for d in range(8, largest + 1) if d % 8])
    return tuple(sorted({*chosen, *picked, odd}))


def group_pool(rng: random.Random, max_group: int) -> tuple[int, ...]:
    """The GQA groups one run draws from (see :data:`POOL_GROUPS`)."""
    if max_group < 1:
        raise ValueError(f"max_group must be at least 1, got {max_group}")
    others = rng.sample(range(2, max_group + 1), min(POOL_GROUPS - 1, max_group - 1))
    return tuple(sorted({1, *others}))


def _side(rng: random.Random, longest: int) -> int | None:
    return rng.choice((None, 0, rng.randint(1, 64), rng.randint(1, longest)))


def _lengths(rng: random.Random, batch: int, varlen: bool, longest: int):
    """``(seqlens_q, seqlens_k)``: varlen with empty and length-1 sequences among the others;
    dense with Sq != Sk two times in five."""
    if varlen:
        one = (lambda: rng.choice((0, 1, _length(rng, longest)))) if rng.random() < 0.4 else None

        def draw() -> int:
            return one() if one else _length(rng, longest)

        sq = tuple(draw() for _ in range(batch))
        sk = sq if rng.random() < 0.5 else tuple(draw() for _ in range(batch))
        if not any(sq) or not any(sk):  # at least one token on each side
            sq, sk = (max(1, sq[0]), *sq[1:]), (max(1, sk[0]), *sk[1:])
        return sq, sk
    a = _length(rng, longest)
    b = a if rng.random() < 0.6 else _length(rng, longest)
    return (a,) * batch, (b,) * batch


def _fit(case_args: dict) -> dict:
    """Shrink the lengths until B * H * Sq * Sk is at most :data:`MAX_SCORES`."""
    while True:
        sq, sk = case_args["seqlens_q"], case_args["seqlens_k"]
        scores = case_args["heads"] * sum(a * b for a, b in zip(sq, sk))
        if scores <= MAX_SCORES:
            return case_args
        case_args["seqlens_q"] = tuple(max(1, a // 2) if a > 1 else a for a in sq)
        case_args["seqlens_k"] = tuple(max(1, b // 2) if b > 1 else b for b in sk)


def draw_cases(
    n: int,
    seed: int,
    *,
    longest: int = 2048,
    largest_head_dim: int = 256,
    max_group: int = 16,
) -> list[SweepCase]:
    """``n`` cases drawn from ``seed`` (the same arguments always draw the same cases).

    The distribution: batch 1-4; dense (70%) or varlen (30%, some sequences empty or of length
    1; the query and key lengths equal in half of them, one cu_seqlens tensor as both);
    lengths 1 (6%), 2-64 (24%), a power of two 16-512 off by -1/+1/+3 (15%), up to a third of
    ``longest`` (40%), from there to ``longest`` (15%), Sq != Sk in 40% of dense cases; kv
    heads 1-4 and a GQA group drawn uniformly from :func:`group_pool` (:data:`POOL_GROUPS`
    groups: 1 and others from 2-``max_group``, chosen by the seed); head dim drawn uniformly
    from :func:`head_dim_pool` (:data:`POOL_COMMON` of :data:`COMMON_HEAD_DIMS`, 128 among them,
    :data:`OTHER_HEAD_DIMS` other multiples of 8 up to ``largest_head_dim`` and one value that
    is none, chosen by the seed);
    Dv != D in 15%, one pair of the pool for the whole run (a kernel compiles a variant per pair);
    causal 50% (both alignments); a sliding window in 20% (each side unbounded, 0, up to 64 or
    up to ``longest``); a soft cap in 15%; attention sinks in 15% (from a stream of their own, so
    each case is otherwise the one drawn without them); a custom scale in 20%; a sliced or
    transposed layout in 25%; ``deterministic=True`` in 10%; bf16 (2/3) or f16, one of them per
    pair of head dims for the whole run (so a run compiles each pair's kernels once). B * H * Sq
    * Sk is capped at :data:`MAX_SCORES` by halving the lengths. From a third stream (so the rest of
    each case is unchanged): in :data:`STRIDED_LAYOUT` of the cases q, k, v, out, grad_out and
    lse have a last-dim stride of 2 (layout ``"strided"``; an implementation that needs a
    contiguous last dim refuses them), and in :data:`STRIDED_VECTORS` of the cases with sinks or
    varlen, sinks and cu_seqlens are views of stride 2. From a fourth: in :data:`GRAD_LAYOUT`
    of the cases grad_out has a layout of its own (``Case.grad_layout``), so that its strides
    differ from out's.
    """
    rng = random.Random(seed)
    sinks_rng = random.Random(seed * 1_000_003 + 7)
    views_rng = random.Random(seed * 1_000_003 + 13)
    grads_rng = random.Random(seed * 1_000_003 + 17)
    pool = head_dim_pool(rng, largest_head_dim)
    groups = group_pool(rng, max_group)
    unequal = tuple(rng.sample(pool, 2)) if len(pool) > 1 else (pool[0], pool[0])
    dtypes: dict[tuple[int, int], torch.dtype] = {}
    drawn = []
    for index in range(n):
        batch = rng.randint(1, 4)
        varlen = rng.random() < 0.3
        sq, sk = _lengths(rng, batch, varlen, longest)
        kv = rng.randint(1, 4)
        d = rng.choice(pool)
        d, dv = unequal if rng.random() < 0.15 else (d, d)
        causal = rng.random() < 0.5
        args = _fit(
            dict(
                seqlens_q=sq,
                seqlens_k=sk,
                heads=kv * rng.choice(groups),
                kv_heads=kv,
                head_dim=d,
                head_dim_v=dv,
                causal=causal,
                causal_align=rng.choice(("top_left", "bottom_right")),
                varlen=varlen,
                layout=rng.choice(("contiguous",) * 6 + ("sliced", "transposed")),
                scale=None if rng.random() < 0.8 else round(rng.uniform(0.3, 2.0) / d**0.5, 4),
                window=(_side(rng, longest), _side(rng, longest)) if rng.random() < 0.2 else None,
                softcap=round(rng.uniform(5.0, 50.0), 1) if rng.random() < 0.15 else None,
                seed=seed * 1_000_003 + index,
                tags=("sweep",),
            )
        )
        if args["window"] == (None, None):
            args["window"] = None
        args["sinks"] = sinks_rng.random() < 0.15
        if views_rng.random() < STRIDED_LAYOUT:
            args["layout"] = "strided"
        strided_vectors = views_rng.random() < STRIDED_VECTORS
        args["strided_vectors"] = strided_vectors and (args["sinks"] or varlen)
        if grads_rng.random() < GRAD_LAYOUT and args["layout"] != "strided":
            others = [lay for lay in GRAD_LAYOUTS if lay != args["layout"]]
            args["grad_layout"] = grads_rng.choice(others)
        deterministic = True if rng.random() < 0.1 else None
        dtype = dtypes.setdefault((d, dv), rng.choice(DTYPES))
        drawn.append(SweepCase(Case(**args), dtype, deterministic, index, seed))
    return drawn


def implementations() -> list[str]:
    """Every implementation of every loaded backend (``"backend:impl"``)."""
    return sorted(i.name for b in ad.backends() if b.error is None for i in b.implementations)


@dataclass
class Outcome:
    """What one implementation did on one case: ``ok``, ``refused``, ``wrong`` (an answer
    outside the tolerance, or an error raised while running a case it accepted) or ``crashed``
    (the device reported an asynchronous fault, such as an illegal memory access, by the end of
    this implementation's check: its kernels faulted, and the device is unusable after it)."""

    status: str
    detail: str = ""


@dataclass
class Report:
    """Counts per implementation, and every wrong answer with its case."""

    seed: int
    cases: int = 0
    seconds: float = 0.0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    chosen: dict[str, int] = field(default_factory=dict)  # the automatic choice's picks
    busy: dict[str, float] = field(default_factory=dict)  # seconds spent per implementation

    def add(self, name: str, outcome: Outcome, where: SweepCase) -> None:
        row = self.counts.setdefault(name, _empty_row())
        row[outcome.status] += 1
        if outcome.status in ("wrong", "crashed"):
            self.wrong.append(f"{name} {outcome.status} on {where.describe()}:\n{outcome.detail}")

    @property
    def total_wrong(self) -> int:
        """Wrong answers and crashes: each is a failure."""
        return sum(row["wrong"] + row.get("crashed", 0) for row in self.counts.values())

    @property
    def crashed(self) -> bool:
        return any(row.get("crashed", 0) for row in self.counts.values())

    def table(self) -> str:
        lines = [
            f"sweep seed={self.seed}: {self.cases} cases, {self.seconds:.0f} s of checks",
            f"{'implementation':<28} {'ran':>5} {'refused':>8} {'wrong':>6} {'crashed':>8}"
            f" {'seconds':>8}",
        ]
        for name in sorted(self.counts, key=lambda n: (n == AUTO, n)):
            row, busy = self.counts[name], self.busy.get(name, 0.0)
            crashed = row.get("crashed", 0)
            ran = row["ok"] + row["wrong"] + crashed
            lines.append(
                f"{name:<28} {ran:>5} {row['refused']:>8} {row['wrong']:>6} {crashed:>8}"
                f" {busy:>8.1f}"
            )
        if self.chosen:
            picks = ", ".join(f"{k} {v}" for k, v in sorted(self.chosen.items()))
            lines.append(f"automatic choice picked: {picks}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def _empty_row() -> dict[str, int]:
    return {"ok": 0, "refused": 0, "wrong": 0, "crashed": 0}


def _auto(api: Callable) -> Callable:
    def auto(*args, **flags):
        return api(*args, **flags)

    auto.__name__ = AUTO
    return auto


def _outcome(run: Callable[[], object]) -> Outcome:
    try:
        run()
    except Unsupported as exc:
        return Outcome("refused", "; ".join(exc.reasons))
    except AssertionError as exc:
        return Outcome("wrong", str(exc))
    except Exception as exc:  # an accepted case that raises is a failure too
        return Outcome("wrong", f"raised {type(exc).__name__}: {exc}")
    return Outcome("ok")


def check_case(
    drawn: SweepCase,
    name: str,
    device: torch.device,
    inputs: CaseInputs | None = None,
    reference: OracleResult | None = None,
) -> Outcome:
    """Backward, then forward, of ``name`` (or :data:`AUTO`) on one drawn case (``inputs`` /
    ``reference`` as :func:`~attn_dispatch.testing.check_backward` takes them). The forward is
    skipped where determinism is requested (it has no such flag) or the backward was wrong."""
    case, dtype = drawn.case, drawn.dtype
    fwd = _auto(ad.forward) if name == AUTO else name
    bwd = _auto(ad.backward) if name == AUTO else name
    kw = dict(dtype=dtype, device=device, inputs=inputs, reference=reference)
    backward = _outcome(lambda: check_backward(bwd, case, deterministic=drawn.deterministic, **kw))
    if backward.status == "wrong" or drawn.deterministic:
        return backward
    forward = _outcome(lambda: check_forward(fwd, case, **kw))
    if forward.status == "wrong" or backward.status == "refused" and forward.status == "ok":
        return forward
    return backward


def auto_choice(drawn: SweepCase, inputs: CaseInputs, reference: OracleResult) -> str:
    """The implementation the automatic choice takes for this case's backward."""
    layout, dtype, device = drawn.case.layout, drawn.dtype, inputs.q.device
    out = place(reference.out, layout, dtype, device)
    lse = place(reference.lse, layout, adb.lse_dtype(dtype), device)
    flags = inputs.flags() | {"deterministic": drawn.deterministic}
    report = ad.explain(inputs.q, inputs.k, inputs.v, out, lse, inputs.grad_out, **flags)
    return report.selected or "none"


def check_all(
    drawn: SweepCase,
    names: Sequence[str],
    device: torch.device,
    report: Report,
    starting: Callable[[str], None] | None = None,
) -> str:
    """Every name in ``names`` on one case (inputs and oracle made once), into ``report``;
    returns the automatic choice's pick. ``starting`` gets each name before it runs (a crash
    that ends the process then leaves the name and case it was running)."""
    inputs = drawn.case.make_inputs(drawn.dtype, device)
    reference = oracle_of(inputs, inputs.grad_out)
    for name in names:
        if starting is not None:
            starting(f"{name} on {drawn.describe()}")
        start = time.perf_counter()
        outcome = check_case(drawn, name, device, inputs, reference)
        fault = device_fault(device)
        if fault is not None:
            outcome = Outcome("crashed", f"the device faulted during this check: {fault}")
        report.add(name, outcome, drawn)
        report.busy[name] = report.busy.get(name, 0.0) + time.perf_counter() - start
        if fault is not None:  # nothing after a fault can be trusted: the case ends here
            return "none"
    chosen = auto_choice(drawn, inputs, reference)
    del inputs, reference
    if device.type == "cuda":
        # Parallel sweep processes share one GPU: memory the largest case's oracle left cached
        # in one process is memory another cannot allocate or load kernels into. (After a
        # device fault, above, nothing more can run on the device, so nothing is released.)
        torch.cuda.empty_cache()
    return chosen


def run(
    cases: Sequence[SweepCase],
    *,
    device: str | torch.device = "cuda",
    names: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run every implementation in ``names`` (default: all installed) and the automatic choice
    on each case; ``progress`` gets one line per case. A device fault ends the run after the
    case it happened in (the device is unusable after it); the report counts it as crashed."""
    device = torch.device(device)
    names = [*(implementations() if names is None else names), AUTO]
    report = Report(seed=cases[0].seed if cases else 0)
    start = time.perf_counter()
    for drawn in cases:
        chosen = check_all(drawn, names, device, report)
        report.chosen[chosen] = report.chosen.get(chosen, 0) + 1
        report.cases += 1
        if progress is not None:
            progress(f"[{report.cases}/{len(cases)}] {drawn.describe()} -> auto: {chosen}")
        if report.crashed:
            break
    report.seconds = time.perf_counter() - start
    return report


def merge(reports: Iterable[dict]) -> Report:
    """One report from several (``Report.to_dict`` of shards of one sweep, or of its cases);
    ``seconds`` is their sum: the time the checks took, over every process that ran them."""
    merged: Report | None = None
    for part in reports:
        if merged is None:
            merged = Report(seed=part["seed"])
        merged.cases += part["cases"]
        merged.seconds += part["seconds"]
        merged.wrong += part["wrong"]
        for name, row in part["counts"].items():
            mine = merged.counts.setdefault(name, _empty_row())
            for key, value in row.items():
                mine[key] = mine.get(key, 0) + value
        for name, count in part["chosen"].items():
            merged.chosen[name] = merged.chosen.get(name, 0) + count
        for name, busy in part.get("busy", {}).items():
            merged.busy[name] = merged.busy.get(name, 0.0) + busy
    return merged or Report(seed=0)


# What each key of a report (``Report.to_dict``) holds, checked before a merge adds them up.
# A row's "crashed" count is optional: reports written before that outcome existed lack it.
_COUNT_KEYS = ("ok", "refused", "wrong")
_OPTIONAL_COUNT_KEYS = ("crashed",)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _table(value: object, entry: Callable[[object], bool]) -> bool:
    return isinstance(value, dict) and all(entry(v) for v in value.values())


def _count_row(row: object) -> bool:
    """One implementation's counts: every outcome's key, "crashed" optional, nothing else."""
    if not isinstance(row, dict) or not _table(row, _count):
        return False
    return set(_COUNT_KEYS) <= set(row) <= set(_COUNT_KEYS + _OPTIONAL_COUNT_KEYS)


def _malformed(part: object) -> str | None:
    """What keeps ``part`` from being a sweep report, or ``None``."""
    if not isinstance(part, dict):
        return f"expected a report (a JSON object), got {type(part).__name__}"
    checks = {
        "seed": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "cases": _count,
        "seconds": _seconds,
        "wrong": lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v),
        "counts": lambda v: _table(v, _count_row),
        "chosen": lambda v: _table(v, _count),
        "busy": lambda v: _table(v, _seconds),
    }
    missing = [key for key in checks if key not in part and key != "busy"]
    if missing:
        return f"not a sweep report: no {', '.join(map(repr, missing))}"
    bad = [key for key, check in checks.items() if key in part and not check(part[key])]
    if bad:
        return f"not a sweep report: bad {', '.join(map(repr, bad))}"
    return None


def _documents(text: str) -> list[tuple[str, object]]:
    """``(where, document)`` of one JSON document, or of JSON lines (one per line)."""
    try:
        return [("", json.loads(text))]
    except json.JSONDecodeError:
        pass
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                found.append((f", line {number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number} is not JSON ({exc})") from None
    return found


def _read_reports(paths: Sequence[str]) -> list[dict]:
    """Reports from JSON files (one report each) or JSON-lines files (one per line); a file
    that cannot be read, or holds no report or something else, is a ValueError naming it."""
    found = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                documents = _documents(f.read())
        except OSError as exc:
            raise ValueError(f"--merge: cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:  # bytes not UTF-8, a bad line, deep nesting
            raise ValueError(f"--merge {path}: not JSON: {exc}") from None
        if not documents:
            raise ValueError(f"--merge {path}: holds no report")
        for where, part in documents:
            why = _malformed(part)
            if why is not None:
                raise ValueError(f"--merge {path}{where}: {why}")
            found.append(part)
    return found


def _shard(text: str) -> tuple[int, int]:
    """argparse type: ``i/n``, integers with 0 <= i < n."""
    parts = text.split("/")
    try:
        i, n = (int(part) for part in parts)
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"expected i/n with 0 <= i < n (e.g. 0/4), got {text!r}")
    return i, n


# Bounds of the command's counts and seed: a case's inputs are seeded with
# ``seed * 1_000_003 + index``, which must fit torch's 64-bit seed, and drawing is done up front.
MAX_SEED, MAX_CASES = (1 << 32) - 1, 100_000


def _bounded(text: str, high: int) -> int:
    value = nonnegative_int(text)
    if value > high:
        raise argparse.ArgumentTypeError(f"expected an integer <= {high}, got {value}")
    return value


def _seed(text: str) -> int:
    """argparse type: a seed in [0, MAX_SEED]."""
    return _bounded(text, MAX_SEED)


def _case_count(text: str) -> int:
    """argparse type: a case count or index in [0, MAX_CASES]."""
    return _bounded(text, MAX_CASES)


def _longest(text: str) -> int:
    """argparse type: the longest sequence length drawn, at least 2 (the drawn lengths
    include ones from 2 up)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m attn_dispatch.testing.sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--cases",
        type=_case_count,
        default=300,
        help=f"cases to draw, at most {MAX_CASES} (default 300)",
    )
    parser.add_argument(
        "--seed", type=_seed, default=None, help=f"0 to {MAX_SEED} (default: a fresh one)"
    )
    parser.add_argument(
        "--device",
        type=cpu_or_cuda,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="device of the cases (default: cuda when available, else cpu; here %(default)s)",
    )
    parser.add_argument(
        "--longest",
        type=_longest,
        default=2048,
        help="longest sequence drawn, at least 2 (default %(default)s)",
    )
    parser.add_argument(
        "--shard",
        type=_shard,
        default="0/1",
        help="i/n: run every n-th case from the i-th (default 0/1)",
    )
    parser.add_argument(
        "--json", default=None, help="also write the report here (default: not written)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        help="merge JSON (or JSON-lines) reports, print (default: run a sweep)",
    )
    parser.add_argument(
        "--case",
        type=_case_count,
        default=None,
        help="run only the drawn case of this index (a failure's case#), e.g. in a fresh "
        "process under compute-sanitizer (default: every case)",
    )
    parser.add_argument(
        "--implementations",
        type=_names,
        default=None,
        help="comma-separated implementations to run, besides the automatic choice "
        "(default: every installed one)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no per-case progress line (default: one per case)"
    )
    return parser


def _names(text: str) -> list[str]:
    """argparse type: a comma-separated list of implementation names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected backend:impl names, got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run or merge a sweep; returns the exit status: 1 when anything was wrong, 2 (one line
    on stderr, as argparse does) for a bad argument, input file or ``ATTN_DISPATCH_*`` value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_output_path(parser, "--json", args.json)
    if args.merge:
        try:
            report = merge(_read_reports(args.merge))
        except ValueError as exc:
            parser.error(str(exc))
    else:
        try:
            # a bad ATTN_DISPATCH_* variable (a forced name included) is a usage error, up
            # front: inside the sweep it would count as every implementation's wrong answer
            _settings.resolve_forced(_settings.current().forced_env, _settings.BACKEND_ENV)
        except (ValueError, TypeError) as exc:
            parser.error(str(exc))
        i, n = args.shard
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
        if args.case is None:
            cases = draw_cases(args.cases, seed, longest=args.longest)[i::n]
        else:  # the draw is sequential: the first K + 1 cases are those of any larger run
            cases = draw_cases(args.case + 1, seed, longest=args.longest)[args.case :]
        print(f"sweep: seed {seed}, {len(cases)} cases on {args.device}", flush=True)
        say = None if args.quiet else (lambda line: print(line, flush=True))
        unknown = sorted(set(args.implementations or ()) - set(implementations()))
        if unknown:
            parser.error(
                f"--implementations: not installed: {', '.join(unknown)} "
                f"(installed: {', '.join(implementations())})"
            )
        report = run(cases, device=args.device, names=args.implementations, progress=say)
        report.seed = seed
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(report.to_dict(), f, indent=1)
        except OSError as exc:  # checked first, but the disk can still fill up
            parser.error(f"--json: writing the report: {exc}")
    for failure in report.wrong:
        print("WRONG", failure, file=sys.stderr)
    print(report.table())
    return 1 if report.total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
