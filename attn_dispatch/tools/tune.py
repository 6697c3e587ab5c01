"""``attn-dispatch tune``: measure the implementations for a list of shapes ahead of a run.

Each shape is run once with autotune on, forward then backward (``--passes``), on random
tensors of the device (default: CUDA when there is one), so that its measurements land in the
autotune cache directory (``ATTN_DISPATCH_CACHE_DIR``, default ``$XDG_CACHE_HOME/attn_dispatch``)
where a later process with the same device and versions finds them: a model's shapes are then
tuned before its first training step, not during it. One progress line per shape says what was
chosen and how long the measurement took; a shape already measured is reused, not timed again.

Shapes are ``B,S,H,HKV,D`` (batch, sequence length, query heads, key/value heads, head dim),
optionally ``B,S,H,HKV,D,SK`` for another key length; give them with repeated ``--shape`` or
one per line in ``--shapes FILE`` (blank lines and ``#`` comments are skipped). The flags
(dtype, causal, window, soft cap, determinism, execution mode) apply to every shape.

``--grid`` measures a cost grid instead on this device with the installed versions: by default
44 points covering each class of call (GQA groups 1, 4, 8; head dims 64, 128; lengths 1K to 16K;
no mask and causal; a window, sinks, soft caps and packed documents; 32/8 heads at length 256),
at most 9 minutes on an H200 by its estimate; ``--full``: the full grid's 222 points (the
shipped tables': 202, 16 of a tensor-parallel shard's layout, the 4 short ones); ``--quick``: a
few tiny ones, for a CPU or a smoke test. Every implementation with a priority on the arch runs
forced, forward and backward, cross-checked (one that disagrees is left out), timed eager and on
CUDA under CUDA graphs, and at lengths up to 1024 through eager ``attention`` in each layout
(the attention rows, eager only). The run first prints its estimate (rows, minutes), then one
line per point. Each point's rows are appended to a JSON-lines file in the cache directory as it
finishes, so that a rerun with the same device, versions and table format measures only what is
missing; then one cost table per backend package is written to
``<cache directory>/costs/<arch>/<package>.json``.
Such a user table ranks the calls it covers of the implementations it holds in the place of the
shipped one (which still ranks the calls outside the user table's coverage), and ``explain``
names the table that ranked each call.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import attn_dispatch as ad
from attn_dispatch import _autotune, _costs, _measure, _settings

from . import grid as cost_grid
from ._args import (
    PROG,
    Parser,
    check_output_path,
    plain,
    positive_int,
    random_tensor,
    window_sides,
)

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
PASSES = ("forward", "backward")


def shape(text: str) -> tuple[int, ...]:
    """argparse type: ``B,S,H,HKV,D`` or ``B,S,H,HKV,D,SK``, each a positive int, H a
    multiple of HKV."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (5, 6):
        raise argparse.ArgumentTypeError(
            f"expected B,S,H,HKV,D or B,S,H,HKV,D,SK (e.g. 2,4096,32,8,128), got {text!r}"
        )
    values = tuple(positive_int(p) for p in parts)
    if values[2] % values[3]:
        raise argparse.ArgumentTypeError(
            f"{text!r}: H={values[2]} is not a multiple of HKV={values[3]}"
        )
    return values


def shapes_of_file(path: str) -> list[tuple[int, ...]]:
    """The shapes in ``path``, one per line; a bad line is an error naming it."""
    found = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"--shapes: cannot read {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            found.append(shape(text))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"--shapes {path}, line {number}: {exc}") from None
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=f"{PROG} tune", description=plain(__doc__))
    parser.add_argument(
        "--shape",
        type=shape,
        action="append",
        default=[],
        metavar="B,S,H,HKV,D[,SK]",
        help="a shape to tune (repeat for more)",
    )
    parser.add_argument(
        "--shapes", metavar="FILE", help="a file of shapes, one per line (default: none)"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="inputs' dtype")
    parser.add_argument("--causal", action="store_true", help="causal attention")
    parser.add_argument(
        "--window",
        type=window_sides,
        default=None,
        metavar="L,R",
        help="sliding window, as explain's (default: no window)",
    )
    parser.add_argument(
        "--softcap", type=float, default=None, metavar="C", help="logit soft cap (default: none)"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="tune the deterministic implementations"
    )
    parser.add_argument(
        "--passes",
        default="forward,backward",
        help="comma list of forward, backward (default: both)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="tune for calls captured into CUDA graphs: the graph-mode decision",
    )
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument(
        "--grid",
        action="store_true",
        help="measure the cost grid and write the user's own cost tables (default: tune shapes)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_true",
        help="with --grid: a few tiny points, for a CPU or a smoke test (default: 44 points)",
    )
    size.add_argument(
        "--full",
        action="store_true",
        help="with --grid: the full grid, 222 points (default: 44 points)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--json", metavar="FILE", help="also write the results as JSON here (default: none)"
    )
    return parser


# The options --grid reads; every other one tunes shapes (the grid's points carry their own
# flags, and the grid writes cost tables, not JSON).
_GRID_OPTIONS = {"help", "shape", "shapes", "device", "grid", "quick", "full"}


def _not_for_grid(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The options given that ``--grid`` would not read."""
    return [
        action.option_strings[0]
        for action in parser._actions
        if action.option_strings
        and action.dest not in _GRID_OPTIONS
        and getattr(args, action.dest) != action.default
    ]


def _passes(text: str) -> list[str]:
    passes = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in passes if p not in PASSES]
    if bad or not passes:
        raise ValueError(f"--passes: expected a comma list of forward, backward, got {text!r}")
    return passes


def _describe(dims: tuple[int, ...], args: argparse.Namespace) -> str:
    b, s, h, hkv, d = dims[:5]
    text = f"B={b} S={s}" + (f" Sk={dims[5]}" if len(dims) == 6 else "")
    text += f" H={h}/{hkv} D={d} {args.dtype}"
    flags = [
        "causal" if args.causal else "",
        f"window={args.window}" if args.window else "",
        f"softcap={args.softcap:g}" if args.softcap else "",
        "deterministic" if args.deterministic else "",
    ]
    return " ".join([text, *filter(None, flags)])


def _summary(report: ad.Report, fresh: bool) -> tuple[str, dict]:
    """One phrase and the JSON record of a pass's decision (``fresh``: measured by this run)."""
    record = {"selected": report.selected, "autotune": None, "measured_now": fresh}
    m = report.autotune
    if m is None:
        return f"{report.selected}", record
    record["autotune"] = m.to_dict()
    chosen = next((t for t in m.timings if t.name == report.selected), None)
    took = f" {chosen.seconds * 1e6:.1f} us" if chosen and chosen.seconds is not None else ""
    excluded = sum(t.excluded is not None for t in m.timings)
    detail = {
        "measured": f"{len(m.timings)} timed",
        "reused": f"{len(m.timings)} timed" if fresh else "measured before",
        "single": "only candidate",
        "pending": "not measured",
        "failed": "no candidate passed",
    }[m.status]
    if excluded:
        detail += f", {excluded} excluded"
    return f"{report.selected}{took} ({detail})", record


def _tune_one(dims: tuple[int, ...], args, passes: list[str], device: torch.device) -> dict:
    b, s, h, hkv, d = dims[:5]
    sk = dims[5] if len(dims) == 6 else s
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def rnd(*size):
        return random_tensor(size, gen, device, dtype)

    q, k, v = rnd(b, s, h, d), rnd(b, sk, hkv, d), rnd(b, sk, hkv, d)
    flags = dict(
        causal=args.causal,
        window=args.window,
        softcap=args.softcap,
        deterministic=args.deterministic or None,
    )
    results = {}
    fresh = _pending(ad.explain(q, k, v, **flags))
    out, lse = ad.forward(q, k, v, **flags)  # the backward's inputs (tunes the forward too)
    if "forward" in passes:
        results["forward"] = (ad.explain(q, k, v, **flags), fresh)
    if "backward" in passes:
        grad_out = rnd(*out.shape)
        fresh = _pending(ad.explain(q, k, v, out, lse, grad_out, **flags))
        ad.backward(q, k, v, out, lse, grad_out, **flags)
        results["backward"] = (ad.explain(q, k, v, out, lse, grad_out, **flags), fresh)
    return results


def _pending(report: ad.Report) -> bool:
    """Whether the call about to run will be measured (nothing remembered covers it)."""
    return report.autotune is not None and report.autotune.status == "pending"


def _device(text: str | None) -> torch.device:
    """``--device``: a device torch knows and this machine has (default: CUDA when present)."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device: expected a device such as cuda or cpu, got {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: no CUDA device is available here")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device {text}: expected cuda or cpu")
    return device


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_output_path(parser, "--json", args.json)
    if args.grid:
        if args.shape or args.shapes:
            parser.error("--grid measures the grid's points: give no --shape or --shapes")
        ignored = _not_for_grid(parser, args)
        if ignored:
            names = ", ".join(ignored)
            parser.error(f"--grid sets its points' flags and writes no JSON: give no {names}")
        try:
            return tune_grid(args, argv if argv is not None else sys.argv[1:])
        except OSError as exc:  # the cache directory cannot hold the run's rows or tables
            print(f"{PROG} tune: error: {exc}", file=sys.stderr)
            return 2
    if args.quick or args.full:
        parser.error(f"{'--quick' if args.quick else '--full'} goes with --grid")
    passes = _passes(args.passes)
    shapes = list(args.shape) + (shapes_of_file(args.shapes) if args.shapes else [])
    if not shapes:
        raise ValueError("no shape to tune: give --shape B,S,H,HKV,D (repeatable) or --shapes FILE")
    device = _device(args.device)
    execution = "graph" if args.cuda_graphs else "eager"
    records = []
    with ad.autotune(True), ad.execution_mode(execution):
        directory = _settings.current().autotune.directory
        print(f"tuning {len(shapes)} shape(s) on {device}, {execution} execution -> {directory}")
        for index, dims in enumerate(shapes, 1):
            start = time.perf_counter()
            results = _tune_one(dims, args, passes, device)
            seconds = time.perf_counter() - start
            phrases, record = [], {"shape": list(dims), "seconds": seconds}
            for name, (report, fresh) in results.items():
                phrase, record[name] = _summary(report, fresh)
                phrases.append(f"{name} {phrase}")
            line = f"[{index}/{len(shapes)}] {_describe(dims, args)}: " + "; ".join(phrases)
            print(f"{line} ({seconds:.1f} s)", flush=True)
            records.append(record)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:  # checked before tuning, but the disk can still fill up
            parser.error(f"--json: writing the results: {exc}")
    return 0


def _run_file(run: dict) -> Path:
    """The rows file of a grid run: one per arch, device, versions and table format (a rerun
    under the same ones resumes it; other ones start afresh: an older format's points lack
    rows of this one's kinds)."""
    key = {k: run[k] for k in ("arch", "device", "versions")}
    key = json.dumps(dict(key, format=_costs.FORMAT), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return _settings.costs_directory() / "runs" / f"{run['arch']}-{digest}.jsonl"


def _read_run(path: Path) -> list[dict]:
    """The rows measured so far. A line cut short by an interrupted run is skipped; a point
    with a row that is not one this command wrote (a field missing, a time that is no time) is
    dropped whole, so that it is measured again rather than written into a table."""
    rows, damaged = [], set()
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict):
                continue
            if _resumable(entry):
                rows.append(entry)
            elif isinstance(entry.get("label"), str):
                damaged.add(entry["label"])
    return [r for r in rows if r["label"] not in damaged]


def _resumable(entry: dict) -> bool:
    """Whether ``entry`` is a row a grid run writes (an agreeing one: with valid times)."""
    named = all(isinstance(entry.get(k), str) for k in ("impl", "label"))
    if not named or entry.get("kind") not in cost_grid.ROW_KINDS:
        return False
    if entry.get("status") != "ok":
        return True
    try:
        _costs.validated_row(cost_grid.table_row(entry), entry["impl"])
    except (KeyError, TypeError, ValueError):
        return False
    return True


def _fastest(rows: list[dict]) -> str:
    """Per kind, the fastest agreeing implementation eager (and under graphs, when timed)."""
    phrases = []
    for kind in cost_grid.ROW_KINDS:
        ok = [r for r in rows if r["kind"] == kind and r.get("status") == "ok"]
        if not ok:
            phrases.append(f"{kind}: none agreed" if any(r["kind"] == kind for r in rows) else "")
            continue
        best = min(ok, key=lambda r: r["eager_us"])
        text = f"{kind} fastest {best['impl']} ({best['eager_us']:.1f} µs"
        graphed = [r for r in ok if "graph_us" in r]
        if graphed:
            fast = min(graphed, key=lambda r: r["graph_us"])
            text += f"; graph: {fast['impl']} {fast['graph_us']:.1f} µs"
        phrases.append(text + ")")
    return "; ".join(p for p in phrases if p) or "no candidate"


def _write_table(path: Path, table: dict) -> None:
    """``table`` into ``path`` whole (written aside, then renamed: a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(table, indent=0) + "\n", encoding="utf-8")
    partial.replace(path)


def _grid_points(args: argparse.Namespace) -> tuple[str, list[cost_grid.Point]]:
    """The grid ``--quick`` / ``--full`` name (default: the default grid) and its points."""
    if args.quick:
        return "quick", cost_grid.quick_grid()
    if args.full:
        return "full", cost_grid.grid()
    return "default", cost_grid.default_grid()


def _estimate_line(estimate: cost_grid.Estimate, device: torch.device) -> str:
    """The run's size and, on a GPU, its time (from an H200's: ``cost_grid.ROW_SECONDS``)."""
    text = (
        f"estimate: {estimate.points} points to measure, {estimate.rows} rows (an "
        "implementation's forward, backward or attention call at a point)"
    )
    if device.type != "cuda":
        return text
    minutes = [round(x / 60) for x in (estimate.timing_s, estimate.compile_s, estimate.seconds)]
    return (
        f"{text}: about {minutes[0]} min of timing and up to {minutes[1]} min of kernel compiles "
        f"(none where cached): {minutes[2]} min at most on an H200"
    )


def tune_grid(args: argparse.Namespace, argv: list[str]) -> int:
    """``tune --grid``: measure the grid's missing points, then write the user's tables."""
    device = _device(args.device)
    arch = ad.detect_arch(device).name
    which, points = _grid_points(args)
    timing = cost_grid.QUICK if args.quick else cost_grid.FULL
    reference = device.type == "cpu"
    names = [
        n for b in ad.backends() if b.error is None for n in (i.name for i in b.implementations)
    ]
    run = {
        "arch": arch,
        "device": _autotune.device_name(device),
        "versions": _autotune.versions(_settings.current(), names),
    }
    path = _run_file(run)
    rows = _read_run(path)
    done = {r["label"] for r in rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    tables_dir = _settings.costs_directory() / arch
    tables_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(tables_dir, os.W_OK):  # found before the measuring, not after it
        raise PermissionError(f"cannot write the cost tables into {tables_dir}")
    print(
        f"cost grid ({which}): {len(points)} points on {run['device']} ({arch}) -> {path}",
        file=sys.stderr,
    )
    pending = [p for p in points if p.label not in done]
    print(_estimate_line(cost_grid.estimate(pending, arch, reference), device), file=sys.stderr)
    start = time.perf_counter()
    for number, point in enumerate(points, 1):
        prefix = f"[{number}/{len(points)}] {point.label}"
        if point.label in done:
            print(f"{prefix}: measured before", file=sys.stderr, flush=True)
            continue
        try:
            measured = cost_grid.measure_point(
                point, device=device, timing=timing, reference=reference
            )
        except _measure.DeviceFault as exc:
            print(
                f"{PROG} tune: {exc}; the points before are kept in {path}: a new process "
                "resumes after them",
                file=sys.stderr,
            )
            return 1
        with path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in measured)
        rows += measured
        done.add(point.label)
        took = time.perf_counter() - start
        print(f"{prefix}: {_fastest(measured)} [{took:.0f} s]", file=sys.stderr, flush=True)
    command = f"{PROG} tune " + " ".join(argv)
    info = dict(run, date=datetime.date.today().isoformat())
    built = cost_grid.tables(rows, info, command, cost_grid.user_owners())
    for package, table in built.items():
        written = _costs.user_path(_settings.costs_directory(), package, arch)
        _write_table(written, table)
        print(f"wrote {written}", file=sys.stderr)
    _costs.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
