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
docs/design.md, "Recorded cost tables").

``evaluate``: at the 20 seed shapes and at :data:`HELD_OUT` (shapes the grid does not hold),
times every implementation forced, the default automatic choice and the autotuned choice,
eager and under CUDA graphs, and prints each one's ratio to the fastest implementation whose
answer agreed with the others.

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
import importlib.resources
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from _provenance import git_commit

import attn_dispatch as ad
from attn_dispatch import _measure
from attn_dispatch._costs import FORMAT as COST_TABLE_FORMAT

REPOSITORY = Path(__file__).resolve().parent.parent
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEADS = ((1, 8, 8), (1, 64, 8), (4, 32, 8), (4, 16, 16))  # (batch, query heads, kv heads)
HEAD_DIMS = (64, 128, 256)
WINDOW = 1024  # keys each row sees in the windowed points (causal, left side 1023)
SINK_WINDOW = 128  # GPT-OSS's sliding layers
SOFTCAP = 50.0  # Gemma-2's attention logit cap
MAX_WORK = 64 * 16384 * 16384 * 128  # B*H*S*S*D of the largest seed shape
BLOCKS = 3
TARGET_S = 0.05  # timed seconds per block
CUDA = torch.device("cuda")


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

    @property
    def label(self) -> str:
        mask = {"none": "", "causal": " causal"}.get(self.mask, f" window {self.window}")
        sinks = (" sinks" if self.sinks else "") + (" softcap" if self.softcap else "")
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
    return points


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


# ----------------------------------------------------------------------------------------------
# Calls


def make(point: Point, device: str = "cuda", seed: int = 0) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)

    b, s, d = point.batch, point.seqlen, point.head_dim
    q, dout = rand(b, s, point.heads, d), rand(b, s, point.heads, d)
    k, v = rand(b, s, point.kv_heads, d), rand(b, s, point.kv_heads, d)
    flags = point.flags()
    if point.sinks:
        flags["sinks"] = torch.randn(point.heads, generator=gen, device=device)
    out, lse = ad.forward(q, k, v, **flags)
    return dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, flags=flags)


def call(kind: str, t: dict, backend: str | None):
    f = t["flags"]
    if kind == "forward":
        return ad.forward(t["q"], t["k"], t["v"], backend=backend, **f)
    return ad.backward(t["q"], t["k"], t["v"], t["out"], t["lse"], t["dout"], backend=backend, **f)


def tensors(kind: str, t: dict) -> tuple:
    """The call's tensor arguments (forward: q, k, v; backward: also out, lse, grad_out)."""
    args = (t["q"], t["k"], t["v"])
    return args + (t["out"], t["lse"], t["dout"]) if kind == "backward" else args


def candidates(kind: str, t: dict) -> list[str]:
    """The implementations (the reference backend aside) that accept this call and have a
    priority on this arch."""
    report = ad.explain(*tensors(kind, t), **t["flags"])
    return [
        c.name
        for c in report.candidates
        if c.status in ("selected", "supported")
        and c.priority is not None
        and not c.name.startswith("reference:")
    ]


# ----------------------------------------------------------------------------------------------
# Timing


def time_eager(fn) -> float:
    """µs per call of ``fn``: one warm-up call, then the median of ``BLOCKS`` blocks of
    back-to-back calls (2 to 200, about ``TARGET_S`` each) between events."""
    fn()
    seconds = _measure.seconds_per_call(
        fn, CUDA, repeats=BLOCKS, sample_seconds=TARGET_S, min_calls=2, max_calls=200
    )
    return seconds * 1e6


def time_graph(fn) -> float:
    """µs per replay of ``fn`` captured into a CUDA graph (timed as :func:`time_eager`)."""
    return time_eager(_measure.graph_replays([fn], CUDA)[0])


def measure_point(point: Point, kinds, timed: bool, autotune: bool = False) -> list:
    """Rows of one point: per kind, every candidate's answer check and times."""
    t = make(point)
    rows = []
    for kind in kinds:
        names = candidates(kind, t)
        answers, errors = {}, {}
        for name in names:
            try:
                answers[name] = _measure.answer(call(kind, t, name))
            except Exception as exc:  # a failure is a row, not the end of the run
                errors[name] = _measure.describe_error(exc)
        disagreed = _measure.consensus(answers, kind == "forward", torch.bfloat16)
        for name in names:
            row = dict(dataclasses.asdict(point), impl=name, kind=kind)
            row["label"] = point.label
            if name in errors or name in disagreed:
                row["status"] = "error" if name in errors else "disagreed"
                row["note"] = errors.get(name) or disagreed[name]
                print(f"  !! {point.label} {kind} {name}: {row['note']}", file=sys.stderr)
            elif timed:
                row.update(timings(kind, t, name))
            rows.append(row)
        if timed and autotune:
            rows += auto_rows(point, kind, t)
        del answers
    del t
    torch.cuda.empty_cache()
    return rows


def timings(kind: str, t: dict, backend: str | None) -> dict:
    try:
        eager = time_eager(lambda: call(kind, t, backend))
        graph = time_graph(lambda: call(kind, t, backend))
        return dict(status="ok", eager_us=round(eager, 2), graph_us=round(graph, 2))
    except Exception as exc:
        return dict(status="error", note=_measure.describe_error(exc))


def auto_rows(point: Point, kind: str, t: dict) -> list[dict]:
    """The default choice and the autotuned choice, timed as the forced rows are (autotune
    measures on the first call of each execution mode)."""
    args = tensors(kind, t)
    rows = []
    for label, tune in (("auto", False), ("autotune", True)):
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
                    row.update(status="error", note=_measure.describe_error(exc))
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


def tables(rows: list[dict], run: dict, command: str) -> dict[str, dict]:
    """Each backend's cost table (the format of ``attn_dispatch._costs``) by the package that
    ships it (``ad.backends()``'s ``cost_tables``); ``run`` is the measuring run's provenance
    (its GPU, commit and versions). ``requires`` records the versions of the distributions the
    backend's implementations name in ``cost_requires``."""
    arch = run["arch"]
    packages: dict[str, tuple[list[dict], set[str]]] = {}
    for impl in (i for b in ad.backends() if b.error is None for i in b.implementations):
        if impl.cost_tables:
            owned, requires = packages.setdefault(impl.cost_tables, ([], set()))
            owned += [r for r in rows if r["impl"] == impl.name and r.get("status") == "ok"]
            requires.update(impl.cost_requires)
    built = {}
    for package, (owned, requires) in packages.items():
        if not owned:
            continue
        keep = ("impl", "kind", "batch", "heads", "kv_heads", "head_dim", "mask", "window")
        table = []
        for r in owned:
            entry = {k: r[k] for k in keep}
            entry.update(seqlen_q=r["seqlen"], seqlen_k=r["seqlen"])
            entry.update(sinks=r["sinks"], softcap=r["softcap"])
            entry.update(eager_us=r["eager_us"], graph_us=r["graph_us"])
            table.append(entry)
        info = dict(run, command=command)
        info["requires"] = {d: run["versions"][d] for d in sorted(requires)}
        built[package] = {"format": COST_TABLE_FORMAT, "arch": arch, "provenance": info}
        built[package]["rows"] = table
    return built


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


def tables_command(files: list[str]) -> str:
    """The commands that measured ``files`` and turn them into tables, repository-relative."""
    names = [in_repository(f) for f in files]
    measure = [f"python benchmarks/cost_grid.py measure --out {name}" for name in names]
    return "; ".join(measure + ["python benchmarks/cost_grid.py tables " + " ".join(names)])


def ratio_table(rows: list[dict], labels: dict[str, str]) -> str:
    """Per shape and kind: the fastest agreeing forced time, auto's and autotune's ratios."""
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
                ratio = r[f"{mode}_us"] / best[f"{mode}_us"]
                cells.append(f"{ratio:.3f} ({r.get('chosen_' + mode, '?')})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Main


def parse_shard(text: str) -> tuple[int, int]:
    i, n = (int(x) for x in text.split("/"))
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected i/n with 0 <= i < n")
    return i, n


def read_rows(paths: list[str]) -> tuple[list[dict], dict]:
    """The rows of JSON-lines files, and the provenance line a run writes first."""
    rows, run = [], {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line) if line else None
            if entry and "provenance" in entry:
                run = entry["provenance"]
            elif entry:
                rows.append(entry)
    return rows, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("step", choices=("measure", "evaluate", "tables", "report"))
    p.add_argument("files", nargs="*", help="tables / report: the JSON-lines files of rows")
    p.add_argument("--warm", action="store_true", help="run each call once, time nothing")
    p.add_argument("--shard", type=parse_shard, default=(0, 1), metavar="I/N")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N points")
    p.add_argument("--out", metavar="PATH", help="append the rows here, one JSON line each")
    args = p.parse_args(argv)
    command = "python benchmarks/cost_grid.py " + " ".join(argv or sys.argv[1:])
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
    points = grid() if args.step == "measure" else seed_shapes() + list(held)
    i, n = args.shard
    points = points[i::n][args.skip :]
    os.environ.setdefault("ATTN_DISPATCH_CACHE_DIR", tempfile.mkdtemp(prefix="autotune_"))
    if args.out and not args.warm:
        with open(args.out, "a") as f:
            run = dict(provenance(command), arch=ad.detect_arch().name)
            f.write(json.dumps({"provenance": run}) + "\n")
    start = time.perf_counter()
    for number, point in enumerate(points, 1):
        rows = measure_point(
            point,
            ("forward", "backward") if args.step == "measure" else ("backward",),
            timed=not args.warm,
            autotune=args.step == "evaluate" and not args.warm,
        )
        if args.out and not args.warm:
            with open(args.out, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        took = time.perf_counter() - start
        print(f"[{number}/{len(points)}] {point.label}: {took:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
