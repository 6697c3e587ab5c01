"""Measure the recorded cost tables on a GPU, and check the automatic choice against them.

``measure``: every implementation with a priority on this GPU's arch (the reference backend
aside) runs forced, forward and backward, at every point of :data:`GRID` (batch x heads x GQA
group x length x head dim x mask, and GPT-OSS-style attention sinks), bf16. Per point, the
answers are cross-checked as autotune cross-checks them (``attn_dispatch._measure``: twice the
bf16 tolerance; an implementation that disagrees with the consensus is left out and named);
then each is timed eager (``n`` calls back to back, events around them: host work included)
and as replays of a CUDA graph (the GPU's time). Medians of 3 blocks.
The rows go to each backend's ``<package>/costs/<arch>.json`` (its ``cost_tables`` package:
by default its own) with the commit, the versions of what its implementations name in
``cost_requires`` and the repository-relative commands (step ``tables``; the format:
docs/design.md, "Recorded cost tables"). The grid, the measuring of a point and the table
writer are ``attn_dispatch.tools.grid``'s, which ``attn-dispatch tune --grid`` shares.

``evaluate``: at the 20 seed shapes and at :data:`HELD_OUT` (shapes the grid does not hold),
times every implementation forced, the default automatic choice and the autotuned choice,
eager and under CUDA graphs, and prints each one's ratio to the fastest implementation whose
answer agreed with the others (``--without-autotune``: the default choice alone). A device
fault stops a run at its point, naming it (the rows of the points before are written).

``--warm --shard i/n`` runs each call once, to fill the compile caches (Triton's, FA4's disk
cache) from several processes at once before a timing run.

    python benchmarks/cost_grid.py measure --out grid.jsonl     # rows, one JSON line each
    python benchmarks/cost_grid.py tables grid.jsonl            # into the backends' costs/
    python benchmarks/cost_grid.py evaluate --out evaluate.jsonl
    python benchmarks/cost_grid.py report evaluate.jsonl        # the ratio table
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.resources
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
from _provenance import git_commit

import attn_dispatch as ad
from attn_dispatch import _measure
from attn_dispatch.tools import grid as _grid
from attn_dispatch.tools.grid import MAX_WORK, Point, call, grid, tables, tensors

__all__ = ["MAX_WORK", "Point", "grid", "tables"]

REPOSITORY = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")


def seed_shapes() -> list[Point]:
    return [
        Point(1, h, hkv, s, 128, mask)
        for h, hkv in ((64, 8), (8, 8))
        for mask in ("none", "causal")
        for s in (1024, 2048, 4096, 8192, 16384)
    ]


# Shapes of real models the grid does not hold (other batch, heads, group, head dim, length,
# window), each with the model it comes from.
HELD_OUT = [
    (Point(2, 32, 8, 4096, 128, "causal"), "Llama-3-8B, B=2"),
    (Point(1, 32, 8, 32768, 128, "causal"), "Llama-3-8B, 32K"),
    (Point(8, 32, 8, 1024, 128, "causal"), "Llama-3-8B, B=8 1K"),
    (Point(1, 28, 4, 8192, 128, "causal"), "Qwen2-7B"),
    (Point(2, 40, 8, 4096, 128, "causal"), "Llama-2-13B-GQA-like"),
    (Point(1, 32, 8, 16384, 128, "window", 4096), "Mistral-7B, window 4096"),
    (Point(4, 32, 8, 8192, 128, "window", 4096), "Mistral-7B, B=4 8K"),
    (Point(2, 16, 8, 8192, 256, "causal"), "Gemma-2-9B global"),
    (Point(2, 16, 8, 6144, 256, "window", 4096, softcap=True), "Gemma-2-9B local, soft cap"),
    (Point(1, 32, 32, 4096, 96, "causal"), "Phi-3-mini"),
    (Point(2, 16, 16, 2048, 256, "causal"), "GPT-J-6B"),
    (Point(4, 12, 12, 1024, 64, "none"), "BERT-base"),
    (Point(8, 16, 16, 512, 64, "none"), "BERT-large"),
    (Point(1, 71, 1, 2048, 64, "causal"), "Falcon-7B (MQA)"),
    (Point(1, 48, 8, 8192, 128, "causal"), "Llama-3-70B TP=2"),
    (Point(2, 8, 1, 4096, 128, "causal"), "Llama-3-70B TP=8"),
    (Point(1, 64, 8, 3000, 128, "causal"), "odd length 3000"),
    (Point(1, 64, 8, 8192, 64, "causal", None, True), "GPT-OSS-20B full"),
    (Point(1, 64, 8, 8192, 64, "window", 128, True), "GPT-OSS-20B sliding"),
    (Point(2, 24, 8, 6144, 80, "causal"), "head dim 80"),
    (Point(1, 16, 2, 12288, 192, "causal"), "head dim 192"),
    (Point(4, 8, 8, 2048, 128, "none"), "small MHA, B=4"),
]


def evaluated_shapes() -> list[Point]:
    """The shapes ``evaluate`` times: the seed shapes, then :data:`HELD_OUT`'s."""
    return seed_shapes() + [point for point, _ in HELD_OUT]


# ----------------------------------------------------------------------------------------------
# Measuring (the grid's points and one point's rows: attn_dispatch.tools.grid)


def time_eager(fn) -> float:
    return _grid.time_eager(fn, CUDA)


def time_graph(fn) -> float:
    return _grid.time_graph(fn, CUDA)


def measure_point(
    point: Point, kinds, timed: bool, autotune: bool = False, tuned: bool = True
) -> list:
    """Rows of one point: per kind, every candidate's answer check and times (with
    ``autotune``, also the default choice's and, with ``tuned``, the autotuned choice's)."""
    extra = functools.partial(auto_rows, tuned=tuned) if timed and autotune else None
    return _grid.measure_point(point, kinds, device=CUDA, timed=timed, extra=extra)


def auto_rows(point: Point, kind: str, t: dict, tuned: bool = True) -> list[dict]:
    """The default choice and (``tuned``) the autotuned choice, timed as the forced rows are
    (autotune measures on the first call of each execution mode)."""
    args = tensors(kind, t)
    rows = []
    choices = [("auto", False)] + ([("autotune", True)] if tuned else [])
    for label, tune in choices:
        row = dict(dataclasses.asdict(point), impl=label, kind=kind, label=point.label, status="ok")
        with ad.autotune(tune):
            for execution, timer in (("eager", time_eager), ("graph", time_graph)):
                try:
                    with ad.execution_mode(execution):
                        call(kind, t, None)
                    chosen = ad.explain(*args, **t["flags"], execution=execution).selected
                    row[f"{execution}_us"] = round(timer(lambda: call(kind, t, None)), 2)
                    row["chosen_" + execution] = chosen
                except Exception as exc:
                    what = f"the {'autotuned' if tune else 'default'} choice's {kind}, {execution}"
                    row.update(status="error", note=_measure.failure(what, exc))
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# Tables


DISTRIBUTIONS = ("torch", "triton", "flash-attn-4", "nvidia-cutlass-dsl")


def provenance(command: str) -> dict:
    """What a run measured on: the GPU, the commit, the versions, the command."""
    return {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "commit": git_commit() or None,
        "command": command,
        "versions": _measure.distribution_versions(DISTRIBUTIONS),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def write_tables(rows: list[dict], run: dict, command: str) -> list[Path]:
    """:func:`tables` into each package's ``costs/<arch>.json``."""
    written = []
    for package, table in tables(rows, run, command).items():
        path = Path(str(importlib.resources.files(package))) / "costs" / f"{table['arch']}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(table, indent=0) + "\n")
        written.append(path)
    return written


def in_repository(path: str) -> str:
    """``path`` relative to the repository when it lies inside (so that the command in a
    table's provenance reproduces it from a checkout), else its file name alone."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(REPOSITORY).as_posix()
    except ValueError:
        return resolved.name


def measure_command(path: str) -> str:
    """The command that measured the rows file ``path``, as its run recorded it (shard and
    skip included), writing to ``path`` relative to the repository."""
    name = in_repository(path)
    first = Path(path).read_text().partition("\n")[0]
    recorded = json.loads(first).get("provenance", {}).get("command", "") if first else ""
    words = shlex.split(recorded)
    if "measure" not in words:
        return f"python benchmarks/cost_grid.py measure --out {shlex.quote(name)}"
    if "--out" in words:
        del words[words.index("--out") : words.index("--out") + 2]
    words = [w for w in words if not w.startswith("--out=")]
    return shlex.join([*words, "--out", name])


def tables_command(files: list[str]) -> str:
    """The commands that measured ``files`` and turn them into tables, repository-relative."""
    measure = [measure_command(f) for f in files]
    names = [in_repository(f) for f in files]
    return "; ".join(measure + ["python benchmarks/cost_grid.py tables " + " ".join(names)])


def ratio_table(rows: list[dict], labels: dict[str, str]) -> str:
    """Per shape and kind: the fastest agreeing forced time, and for auto and autotune the
    choice's own forced time over it (what the choice costs; 1.000 when it is the fastest),
    then as timed through the dispatcher (the choice's row, timed apart from the forced rows,
    so it carries their run-to-run noise besides the dispatcher's cost)."""
    lines = [
        "| shape | model | kind | fastest eager | auto eager | autotune eager "
        "| fastest graph | auto graph | autotune graph |",
        "|" + "---|" * 9,
    ]
    keyed: dict[tuple, dict] = {}
    for r in rows:
        keyed.setdefault((r["label"], r["kind"]), {})[r["impl"]] = r
    for (label, kind), by in keyed.items():
        forced = {n: r for n, r in by.items() if ":" in n and r.get("status") == "ok"}
        cells = [label, labels.get(label, "seed"), kind]
        for mode in ("eager", "graph"):
            if not forced:
                cells += ["-", "-", "-"]
                continue
            best = min(forced.values(), key=lambda r: r[f"{mode}_us"])
            cells.append(f"{best[f'{mode}_us']:.0f} µs ({best['impl']})")
            for which in ("auto", "autotune"):
                r = by.get(which)
                if r is None or r.get("status") != "ok":
                    cells.append("-")
                    continue
                chosen = r.get("chosen_" + mode, "?")
                timed = r[f"{mode}_us"] / best[f"{mode}_us"]
                own = forced.get(chosen)
                own = "-" if own is None else f"{own[f'{mode}_us'] / best[f'{mode}_us']:.3f}"
                cells.append(f"{own} ({chosen}; as timed {timed:.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Main


def parse_shard(text: str) -> tuple[int, int]:
    i, n = (int(x) for x in text.split("/"))
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected i/n with 0 <= i < n")
    return i, n


def selected(points: list[Point], shard: int, shards: int, skip: int) -> list[Point]:
    """The points a run takes: every ``shards``-th from the ``shard``-th, of those after the
    first ``skip`` (a run that stopped resumes with ``--skip``, and the warm-up processes
    before it share out what remains)."""
    return points[skip:][shard::shards]


def read_rows(paths: list[str]) -> tuple[list[dict], dict]:
    """The rows of JSON-lines files, and the provenance of the runs that wrote them (each run
    writes one first: :func:`merged_provenance`)."""
    rows, runs = [], []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line) if line else None
            if entry and "provenance" in entry:
                runs.append(entry["provenance"])
            elif entry:
                rows.append(entry)
    return rows, merged_provenance(runs)


# What may differ between the runs whose rows make one table: where and when they ran. Their
# arch and versions may not (the rows of one table rank kernels of one stack).
PER_RUN = ("gpu", "date", "commit", "command")


def merged_provenance(runs: list[dict]) -> dict:
    """One provenance for the rows of ``runs``: what they share, and for each key of
    :data:`PER_RUN` the runs' distinct values in order, ``"; "``-joined. ``ValueError`` when
    anything else differs."""
    merged = dict(runs[0]) if runs else {}
    for key in {key for run in runs for key in run}:
        values = [run.get(key) for run in runs]
        if key in PER_RUN:
            merged[key] = "; ".join(dict.fromkeys(str(v) for v in values if v is not None))
        elif any(v != values[0] for v in values):
            raise ValueError(
                f"the runs differ in {key} ({', '.join(map(repr, values))}): one table holds "
                "the rows of one arch and stack"
            )
    return merged


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("step", choices=("measure", "evaluate", "tables", "report"))
    p.add_argument("files", nargs="*", help="tables / report: the JSON-lines files of rows")
    p.add_argument("--warm", action="store_true", help="run each call once, time nothing")
    p.add_argument("--shard", type=parse_shard, default=(0, 1), metavar="I/N")
    p.add_argument(
        "--skip", type=int, default=0, help="leave out the first N points (before --shard)"
    )
    p.add_argument("--out", metavar="PATH", help="append the rows here, one JSON line each")
    p.add_argument(
        "--without-autotune",
        action="store_true",
        help="evaluate: the default choice's rows alone, not the autotuned choice's",
    )
    args = p.parse_args(argv)
    command = "python benchmarks/cost_grid.py " + shlex.join(argv or sys.argv[1:])
    held = dict(HELD_OUT)
    labels = {pt.label: name for pt, name in held.items()}
    if args.step == "tables":
        rows, run = read_rows(args.files)
        for path in write_tables(rows, run, tables_command(args.files)):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.step == "report":
        print(ratio_table(read_rows(args.files)[0], labels))
        return 0
    if not torch.cuda.is_available():
        print("cost_grid.py measure/evaluate need a GPU", file=sys.stderr)
        return 2
    points = selected(
        grid() if args.step == "measure" else evaluated_shapes(), *args.shard, args.skip
    )
    os.environ.setdefault("ATTN_DISPATCH_CACHE_DIR", tempfile.mkdtemp(prefix="autotune_"))
    if args.out and not args.warm:
        with open(args.out, "a") as f:
            run = dict(provenance(command), arch=ad.detect_arch().name)
            f.write(json.dumps({"provenance": run}) + "\n")
    start = time.perf_counter()
    for number, point in enumerate(points, 1):
        try:
            rows = measure_point(
                point,
                _grid.ROW_KINDS if args.step == "measure" else ("backward",),
                timed=not args.warm,
                autotune=args.step == "evaluate" and not args.warm,
                tuned=not args.without_autotune,
            )
        except _measure.DeviceFault as exc:
            # the device can run nothing more: the points before are written, resume after
            print(
                f"cost_grid.py: stopped at point {number} of {len(points)}: {exc}", file=sys.stderr
            )
            return 1
        if args.out and not args.warm:
            with open(args.out, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        took = time.perf_counter() - start
        print(f"[{number}/{len(points)}] {point.label}: {took:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
