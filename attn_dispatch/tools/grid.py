"""The cost grid: the points the recorded cost tables are measured at, measuring one point,
and turning measured rows into cost tables (the format of ``attn_dispatch._costs``).

Used by ``attn-dispatch tune --grid`` (the user's own tables, in the cache directory) and by
``benchmarks/cost_grid.py`` (the tables the backends ship). Per point, every implementation
with a priority on the arch runs forced, forward and backward, bf16; the answers are
cross-checked as autotune cross-checks them (``attn_dispatch._measure``: twice the bf16
tolerance; one that disagrees with the consensus is left out and named); then each is timed
eager (back-to-back calls: host work included) and, on CUDA, as replays of a CUDA graph (the
GPU's time); at lengths up to :data:`ATTENTION_SEQLEN` each that runs both passes is also
timed through eager ``attention`` in each layout (the attention rows). Medians of 3 blocks.

Three grids: :func:`grid`, the full one (the shipped tables' points: about 23 minutes of an
H200 by :func:`estimate`); :func:`default_grid`, ``tune --grid``'s: each class of call the seed
shapes and real models fall in, in at most 9 minutes; :func:`quick_grid`, a few tiny points for a
CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

import attn_dispatch as ad
from attn_dispatch import _costs, _measure, _settings
from attn_dispatch._inputs import LAYOUTS

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEADS = ((1, 8, 8), (1, 64, 8), (4, 32, 8), (4, 16, 16))  # (batch, query heads, kv heads)
HEAD_DIMS = (64, 128, 256)
WINDOW = 1024  # keys each row sees in the windowed points (causal, left side 1023)
SINK_WINDOW = 128  # GPT-OSS's sliding layers
SOFTCAP = 50.0  # Gemma-2's attention logit cap
MAX_WORK = 64 * 16384 * 16384 * 128  # B*H*S*S*D of the largest seed shape
KINDS = ("forward", "backward")
# What a point measures: each pass, then both through eager ``attention`` in each layout
# (``_costs.ATTENTION_KINDS``)
ROW_KINDS = _costs.ROW_KINDS
ATTENTION_LAYOUTS = {_costs.attention_kind(layout): layout for layout in LAYOUTS}
# The longest length at which a point measures attention rows: beyond it the kernels' time
# outweighs the host's work per call, and the pass rows rank as the attention rows would (an
# uncovered call is ranked by its pass rows)
ATTENTION_SEQLEN = 1024
# The default grid's axes: GQA groups 1, 4 and 8, the two common head dims, short to long
# lengths a factor of 4 apart, so that every length between lies within the tables' coverage
# (a log2 distance of 1 in each of Sq and Sk: ``_costs.COVERAGE``) of a measured one
DEFAULT_HEADS = ((1, 8, 8), (4, 32, 8), (1, 64, 8))
DEFAULT_HEAD_DIMS = (64, 128)
DEFAULT_SEQLENS = (1024, 4096, 16384)
# (batch, query heads, kv heads, length) of the default grid's short points: their rows cover
# lengths 128 to 512 at these heads (a log2 distance of 1 in each of Sq and Sk)
SHORT = (1, 32, 8, 256)
# Seconds per row (one implementation's forward or backward at one point: its answer checked,
# then timed eager and under CUDA graphs), compile caches warm: 290 s for 1116 rows on an H200
# (the grid's first 105 points, commit 6384643); an H100 took 636 s for the whole grid's 1996
# rows, 0.32 s each (docs/results/2026-12-06-h100-cost-grid)
ROW_SECONDS = 0.26
# A JIT-compiled kernel's first call, per variant: FA4's took 2.5-4.6 s on an H200
# (docs/benchmarks.md, "Compile times"); a cached or precompiled kernel takes none of it
COMPILE_SECONDS = 4.0


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long each timed block lasts: ``blocks`` blocks of ``min_calls`` to ``max_calls``
    back-to-back calls, about ``target_s`` seconds each; the median counts."""

    blocks: int = 3
    target_s: float = 0.05
    min_calls: int = 2
    max_calls: int = 200

    @property
    def sampling(self) -> dict[str, float]:
        """The keyword arguments of ``_measure.seconds_per_call`` and its ``_each``."""
        return dict(
            repeats=self.blocks,
            sample_seconds=self.target_s,
            min_calls=self.min_calls,
            max_calls=self.max_calls,
        )


FULL = Timing()
# The quick grid's tiny calls: short blocks (what they rank is a smoke test, not a GPU's times)
QUICK = Timing(blocks=3, target_s=0.002, min_calls=1, max_calls=20)


@dataclasses.dataclass(frozen=True)
class Point:
    batch: int
    heads: int
    kv_heads: int
    seqlen: int
    head_dim: int
    mask: str  # none, causal, window
    window: int | None = None
    sinks: bool = False
    softcap: bool = False
    # packed documents (THD): ``batch`` sequences of ``seqlen`` tokens each, in one row
    varlen: bool = False

    @property
    def label(self) -> str:
        mask = {"none": "", "causal": " causal"}.get(self.mask, f" window {self.window}")
        sinks = (" sinks" if self.sinks else "") + (" softcap" if self.softcap else "")
        sinks += " varlen" if self.varlen else ""
        return (
            f"B={self.batch} H={self.heads}/{self.kv_heads} S={self.seqlen} "
            f"D={self.head_dim}{mask}{sinks}"
        )

    def flags(self) -> dict:
        flags: dict = {"causal": self.mask != "none"}
        if self.mask == "window":
            flags["window"] = (self.window - 1, 0)
        if self.softcap:
            flags["softcap"] = SOFTCAP
        return flags


def grid() -> list[Point]:
    """The full grid: batch x heads x GQA group x length x head dim x mask, capped at
    :data:`MAX_WORK`, with attention sinks and soft-capped points, then packed documents, a
    tensor-parallel shard's layout and the default grid's short points (:data:`SHORT`, where
    the attention rows rank an eager call by its host's work); the points a run added are
    appended, so that ``--skip`` measures them alone."""
    points = []
    for b, h, hkv in HEADS:
        for d in HEAD_DIMS:
            for s in SEQLENS:
                if b * h * s * s * d > MAX_WORK:
                    continue
                points += [Point(b, h, hkv, s, d, "none"), Point(b, h, hkv, s, d, "causal")]
                if s > WINDOW:
                    points.append(Point(b, h, hkv, s, d, "window", WINDOW))
    for s in (1024, 2048, 4096, 16384):
        points.append(Point(1, 64, 8, s, 64, "causal", None, True))
        points.append(Point(1, 64, 8, s, 64, "window", SINK_WINDOW, True))
    for (b, h, hkv, d), s in itertools.product(((1, 64, 8, 128), (2, 16, 8, 256)), (2048, 8192)):
        points.append(Point(b, h, hkv, s, d, "causal", softcap=True))
        points.append(Point(b, h, hkv, s, d, "window", 4096 if s > 4096 else WINDOW, softcap=True))
    return points + packed_points() + shard_points() + short_points()


def shard_points() -> list[Point]:
    """A tensor-parallel shard's few heads (16 query heads over 2 KV heads, D 128: Llama-3-70B
    or Qwen2.5-72B at 4 ranks), every length and mask: the layouts above hold 8 or more KV
    heads, so a shard of 1 or 2 KV heads lies outside their coverage. Last in the grid,
    so that a run can measure them alone (``--skip``)."""
    return [
        Point(1, 16, 2, s, 128, mask, WINDOW if mask == "window" else None)
        for s in SEQLENS
        for mask in ("none", "causal", "window")
        if mask != "window" or s > WINDOW
    ]


def short_points() -> list[Point]:
    """Llama-3-8B's attention (32/8 heads) at length :data:`SHORT`'s, D 64 and 128, no mask and
    causal: where a call's host work outweighs its kernels (both grids end with them)."""
    return [Point(*SHORT, d, mask) for d in DEFAULT_HEAD_DIMS for mask in ("none", "causal")]


def packed_points() -> list[Point]:
    """Packed documents, causal: 16K tokens as 32 sequences of 512, 8 of 2K or 4 of 4K, in the
    layouts of Llama-3 8B (32/8, D 128) and GPT-OSS (64/8, D 64)."""
    return [
        Point(docs, h, hkv, s, d, "causal", varlen=True)
        for h, hkv, d in ((32, 8, 128), (64, 8, 64))
        for docs, s in ((32, 512), (8, 2048), (4, 4096))
    ]


def default_grid() -> list[Point]:
    """``tune --grid``'s points: batch x heads (GQA groups 1, 4, 8) x head dim (64, 128) x length
    (1K, 4K, 16K) x mask (none, causal), capped at :data:`MAX_WORK`, then one windowed point,
    GPT-OSS's two sink layers (causal, sliding window 128), Gemma-2's two soft-capped ones
    (causal, window): a model with sinks or a soft cap has both kinds of layer, and a table
    ranks only the mask class it measured; one of packed documents (8 of 2K, causal); and
    Llama-3-8B's attention (32/8 heads) at a length of 256, where the host's work per call
    outweighs the kernels' (:data:`SHORT`)."""
    points = [
        Point(b, h, hkv, s, d, mask)
        for b, h, hkv in DEFAULT_HEADS
        for d in DEFAULT_HEAD_DIMS
        for s in DEFAULT_SEQLENS
        for mask in ("none", "causal")
        if b * h * s * s * d <= MAX_WORK
    ]
    return points + [
        Point(1, 64, 8, 4096, 128, "window", WINDOW),
        Point(1, 64, 8, 4096, 64, "causal", sinks=True),
        Point(1, 64, 8, 4096, 64, "window", SINK_WINDOW, sinks=True),
        Point(1, 64, 8, 4096, 128, "causal", softcap=True),
        Point(1, 64, 8, 4096, 128, "window", WINDOW, softcap=True),
        Point(8, 32, 8, 2048, 128, "causal", varlen=True),
        *short_points(),
    ]


def quick_grid() -> list[Point]:
    """A few tiny points (each mask class, GQA), for a CPU or a smoke test."""
    return [
        Point(1, 4, 2, 64, 32, "none"),
        Point(1, 4, 2, 64, 32, "causal"),
        Point(1, 4, 4, 128, 32, "window", 32),
    ]


# --- calls ------------------------------------------------------------------------------------


def make(point: Point, device: str | torch.device = "cuda", seed: int = 0) -> dict:
    """Random bf16 inputs of ``point`` on ``device``, with the forward's out and lse."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)

    rows = _rows(point)
    q, dout = rand(*rows, point.heads, point.head_dim), rand(*rows, point.heads, point.head_dim)
    k, v = (rand(*rows, point.kv_heads, point.head_dim) for _ in range(2))
    flags = point.flags()
    if point.sinks:
        flags["sinks"] = torch.randn(point.heads, generator=gen, device=device)
    if point.varlen:
        _pack(point, flags, torch.arange(0, q.shape[0] + 1, point.seqlen, device=device))
    out, lse = ad.forward(q, k, v, **flags)
    return dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, flags=flags)


def _rows(point: Point) -> tuple[int, ...]:
    """The leading dims of ``point``'s q, k and v: (batch, seqlen), or (tokens,) packed."""
    if point.varlen:
        return (point.batch * point.seqlen,)
    return (point.batch, point.seqlen)


def _pack(point: Point, flags: dict, offsets: torch.Tensor) -> None:
    """Add to ``flags`` the varlen arguments of ``point``'s packed documents (``offsets``:
    their cu_seqlens, any dtype; one tensor for queries and keys)."""
    cu, s = offsets.to(torch.int32), point.seqlen
    flags.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)


def call(kind: str, t: dict, backend: str | None) -> Any:
    f = t["flags"]
    if kind == "forward":
        return ad.forward(t["q"], t["k"], t["v"], backend=backend, **f)
    if kind in ATTENTION_LAYOUTS:
        return attention_step(t, backend, ATTENTION_LAYOUTS[kind])
    return ad.backward(t["q"], t["k"], t["v"], t["out"], t["lse"], t["dout"], backend=backend, **f)


def attention_step(t: dict, backend: str | None, layout: str = "bshd") -> tuple:
    """The gradients (dq, dk, dv, and dsinks with sinks) of one eager ``attention`` call and
    its backward, as a training step runs it: q, k and v (and the sinks) are leaves over the
    point's tensors, and the gradients are returned, not accumulated. ``layout="bhsd"`` calls
    on [B, H, S, D] views of the point's rows (dense points only; packed ones have no such
    layout)."""
    if "leaves" not in t:
        sinks = () if "sinks" not in t["flags"] else (t["flags"]["sinks"],)
        t["leaves"] = tuple(x.detach().requires_grad_() for x in (t["q"], t["k"], t["v"], *sinks))
    leaves = t["leaves"]
    flags = dict(t["flags"], sinks=leaves[3]) if len(leaves) > 3 else t["flags"]
    q, k, v = leaves[:3]
    if layout == "bhsd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = ad.attention(q, k, v, backend=backend, layout=layout, **flags)
    dout = t["dout"].transpose(1, 2) if layout == "bhsd" else t["dout"]
    return torch.autograd.grad(out, leaves, dout)


def tensors(kind: str, t: dict) -> tuple:
    """The call's tensor arguments (forward: q, k, v; backward: also out, lse, grad_out)."""
    args = (t["q"], t["k"], t["v"])
    return args + (t["out"], t["lse"], t["dout"]) if kind == "backward" else args


def candidates(kind: str, t: dict, reference: bool = False) -> list[str]:
    """The implementations that accept this call and have a priority on its arch; the
    reference backend only with ``reference`` (on a GPU it is slow and never the fastest).
    Through ``attention``: those that accept both passes."""
    if kind in ATTENTION_LAYOUTS:
        backward = candidates("backward", t, reference)
        return [name for name in candidates("forward", t, reference) if name in backward]
    return measured(ad.explain(*tensors(kind, t), **t["flags"]), reference)


def measured(report: ad.Report, reference: bool) -> list[str]:
    """The implementations of ``report`` that a point measures (see :func:`candidates`)."""
    return [
        c.name
        for c in report.candidates
        if c.status in ("selected", "supported")
        and c.priority is not None
        and (reference or not c.name.startswith("reference:"))
    ]


def meta_call(point: Point, kind: str) -> tuple[tuple, dict]:
    """The call of ``point`` (:func:`make`'s, bf16) on the meta device: its tensors (as
    :func:`tensors` orders them) and flags; nothing is allocated."""

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, device="meta", dtype=dtype)

    rows, d = _rows(point), point.head_dim
    q, kv = meta(*rows, point.heads, d), meta(*rows, point.kv_heads, d)
    args = (q, kv, kv)
    if kind == "backward":
        # lse: [B, H, S], or [H, tokens] packed
        lse = (point.heads, *rows) if point.varlen else (point.batch, point.heads, point.seqlen)
        args += (meta(*rows, point.heads, d), meta(*lse, dtype=torch.float32), q)
    flags = point.flags()
    if point.sinks:
        flags["sinks"] = meta(point.heads, dtype=torch.float32)
    if point.varlen:
        _pack(point, flags, torch.empty(point.batch + 1, device="meta", dtype=torch.int32))
    return args, flags


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What measuring some points costs: ``rows`` (an implementation's forward or backward at
    a point) and ``variants``, the distinct (implementation, kind, head dim, mask, sinks, soft
    cap) among them, each a kernel's first-call compile at most."""

    points: int
    rows: int
    variants: int

    @property
    def timing_s(self) -> float:
        return self.rows * ROW_SECONDS

    @property
    def compile_s(self) -> float:
        """At most: a precompiled kernel (cuDNN's, torch's own) or a cached one compiles nothing."""
        return self.variants * COMPILE_SECONDS

    @property
    def seconds(self) -> float:
        return self.timing_s + self.compile_s


def estimate(points: Iterable[Point], arch: str, reference: bool = False) -> Estimate:
    """The rows :func:`measure_point` makes of ``points`` on ``arch`` (the candidates
    :func:`candidates` finds, asked with ``explain`` on meta tensors) and their kernel
    variants; the times come from an H200's (:data:`ROW_SECONDS`, :data:`COMPILE_SECONDS`)."""
    points = list(points)
    rows, variants = 0, set()
    for point in points:
        names = {}
        for kind in KINDS:
            args, flags = meta_call(point, kind)
            names[kind] = measured(ad.explain(*args, **flags, arch=arch), reference)
            shape = (point.head_dim, point.mask, point.window, point.sinks, point.softcap)
            shape += (point.varlen,)
            variants.update((name, kind, *shape) for name in names[kind])
        # the attention rows: the implementations of both passes, their kernels compiled
        both = [name for name in names["forward"] if name in names["backward"]]
        layouts = len(kinds_of(point)) - len(KINDS)
        rows += len(names["forward"]) + len(names["backward"]) + layouts * len(both)
    return Estimate(len(points), rows, len(variants))


# --- timing -----------------------------------------------------------------------------------


def time_eager(fn: Callable[[], Any], device: torch.device, timing: Timing = FULL) -> float:
    """µs per call of ``fn``: one warm-up call, then the median of the timed blocks."""
    fn()
    return _measure.seconds_per_call(fn, device, **timing.sampling) * 1e6


def time_graph(fn: Callable[[], Any], device: torch.device, timing: Timing = FULL) -> float:
    """µs per replay of ``fn`` captured into a CUDA graph (timed as :func:`time_eager`)."""
    return time_eager(_measure.graph_replays([fn], device)[0], device, timing)


def timed_rows(
    kind: str, t: dict, names: list[str], device: torch.device, timing: Timing = FULL
) -> dict[str, dict]:
    """Each of ``names``'s row status and times, eager and under CUDA graphs on CUDA (an
    ``attention`` row eager only: what it adds to the passes is its node's host work): one
    warm-up call each, then the candidates timed in rounds (``_measure.seconds_per_call_each``:
    a device whose speed drifts during the point moves them alike). The graphs are captured
    after the eager times, and released before the rows return. A failure is a row, not the
    end of the run."""
    rows = {name: {"status": "ok"} for name in names}
    graphs = device.type == "cuda" and kind not in ATTENTION_LAYOUTS  # the node is host work
    for key in ("eager_us", "graph_us") if graphs else ("eager_us",):
        fns = {}
        for name in [name for name in names if rows[name]["status"] == "ok"]:
            try:
                fn = functools.partial(call, kind, t, name)
                fn = _measure.graph_replays([fn], device)[0] if key == "graph_us" else fn
                fn()
                fns[name] = fn
            except Exception as exc:
                rows[name] = dict(status="error", note=_measure.failure(f"{name}'s {kind}", exc))
        times, errors = _measure.seconds_per_call_each(fns, device, **timing.sampling)
        for name, exc in errors.items():
            rows[name] = dict(status="error", note=_measure.describe_error(exc))
        for name, seconds in times.items():
            if rows[name]["status"] == "ok":
                # rounded for the table, never to zero (a zero time is no time: the table
                # refuses it)
                rows[name][key] = max(round(seconds * 1e6, 2), 0.01)
    return rows


def measure_kind(
    point: Point,
    kind: str,
    t: dict,
    *,
    timed: bool = True,
    timing: Timing = FULL,
    reference: bool = False,
) -> list[dict]:
    """Rows of one kind at one point: every candidate's answer check and times (a forward's
    also sets ``t``'s out and lse to the best agreeing forward's)."""
    device = t["q"].device
    names = candidates(kind, t, reference)
    answers, errors = {}, {}
    for name in names:
        try:
            answers[name] = _measure.answer(call(kind, t, name))
            _measure.synchronize(device)  # a fault is this call's, not a later one's
        except Exception as exc:  # a failure is a row, not the end of the run
            errors[name] = _measure.failure(f"{name}'s {kind}", exc)
    disagreed = _measure.consensus(answers, kind == "forward", torch.bfloat16)
    agreed = [name for name in answers if name not in disagreed]
    if kind == "forward" and agreed:
        # the backward's out and lse become the best agreeing forward's: the automatic choice
        # that made them may be the one that disagreed, and then every backward would differ
        t["out"], t["lse"] = answers[agreed[0]][:2]
    times = timed_rows(kind, t, agreed, device, timing) if timed else {}
    rows = []
    for name in names:
        row = dict(dataclasses.asdict(point), impl=name, kind=kind)
        row["label"] = point.label
        if name in errors or name in disagreed:
            row["status"] = "error" if name in errors else "disagreed"
            row["note"] = errors.get(name) or disagreed[name]
            print(f"  !! {point.label} {kind} {name}: {row['note']}", file=sys.stderr)
        elif timed:
            row.update(times[name])
        rows.append(row)
    return rows


def kinds_of(point: Point) -> tuple[str, ...]:
    """The row kinds ``point`` has: attention rows up to :data:`ATTENTION_SEQLEN` only, and a
    packed point's calls have no [B, H, S, D] layout."""
    if point.seqlen > ATTENTION_SEQLEN:
        return KINDS
    return tuple(k for k in ROW_KINDS if not (point.varlen and k == "attention_bhsd"))


def measure_point(
    point: Point,
    kinds: Iterable[str] = ROW_KINDS,
    *,
    device: str | torch.device = "cuda",
    timed: bool = True,
    timing: Timing = FULL,
    reference: bool = False,
    extra: Callable[[Point, str, dict], list[dict]] | None = None,
) -> list[dict]:
    """Rows of one point (:func:`measure_kind` per kind); ``extra(point, kind, tensors)``
    adds rows of its own after each kind's. A device fault raises
    :class:`~attn_dispatch._measure.DeviceFault` naming the point."""
    rows = []
    try:
        t = _made(point, device)
        for kind in [kind for kind in kinds if kind in kinds_of(point)]:
            rows += measure_kind(point, kind, t, timed=timed, timing=timing, reference=reference)
            if extra is not None:
                rows += extra(point, kind, t)
        del t  # the point's tensors, released before the device is asked
        fault = _measure.device_fault(torch.device(device))
        if fault is not None:
            raise _measure.DeviceFault(f"the device faulted by the end of the point: {fault}")
    except _measure.DeviceFault as exc:
        raise _measure.DeviceFault(f"{point.label}: {exc}") from exc
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _made(point: Point, device: str | torch.device) -> dict:
    """:func:`make`'s tensors; a device fault raised as a :class:`DeviceFault` naming it."""
    try:
        return make(point, device)
    except Exception as exc:
        _measure.raise_fault(
            "the default choice's forward (which makes the point's out and lse)", exc
        )
        raise


# --- tables -----------------------------------------------------------------------------------


def shipped_owners() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each implementation with shipped tables: the package they are in, its ``cost_requires``."""
    return {
        i.name: (i.cost_tables, i.cost_requires)
        for b in ad.backends()
        if b.error is None
        for i in b.implementations
        if i.cost_tables
    }


def user_owners() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each loaded implementation: the package its user table is named after
    (``_costs.owner``), its ``cost_requires``."""
    return {
        i.full_name: (_costs.owner(i), tuple(i.cost_requires))
        for b in _settings.current().registry.backends.values()
        if b.error is None
        for i in b.implementations
    }


KEEP = ("impl", "kind", "batch", "heads", "kv_heads", "head_dim", "mask", "window")


def table_row(r: dict) -> dict:
    """A measured row as a table row (``seqlen`` becomes both lengths)."""
    entry = {k: r[k] for k in KEEP}
    entry.update(seqlen_q=r["seqlen"], seqlen_k=r["seqlen"])
    entry.update(sinks=r["sinks"], softcap=r["softcap"])
    if r.get("varlen"):  # a dense row leaves it out (the rows of runs before it have none)
        entry["varlen"] = True
    entry.update({m: r[m] for m in ("eager_us", "graph_us") if m in r})
    return entry


def tables(
    rows: list[dict],
    run: dict,
    command: str,
    owners: dict[str, tuple[str, tuple[str, ...]]] | None = None,
) -> dict[str, dict]:
    """Each package's cost table (the format of ``attn_dispatch._costs``) by package:
    ``owners`` maps an implementation to its package and ``cost_requires`` (default
    :func:`shipped_owners`); ``run`` is the measuring run's provenance (its arch, device and
    ``versions``). ``requires`` records the versions of the distributions the package's
    implementations name in ``cost_requires``."""
    owners = shipped_owners() if owners is None else owners
    packages: dict[str, tuple[list[dict], set[str]]] = {}
    for name, (package, requires) in owners.items():
        owned, needed = packages.setdefault(package, ([], set()))
        owned += [r for r in rows if r["impl"] == name and r.get("status") == "ok"]
        needed.update(requires)
    versions = run.get("versions", {})
    built = {}
    for package, (owned, requires) in packages.items():
        if not owned:
            continue
        info = dict(run, command=command)
        info["requires"] = {d: versions[d] for d in sorted(requires) if versions.get(d)}
        built[package] = {
            "format": _costs.FORMAT,
            "arch": run["arch"],
            "provenance": info,
            "rows": [table_row(r) for r in owned],
        }
    return built
