"""Replays the call sequence that faulted the device in autotune, and finds which candidate
it takes (docs/benchmarks.md section 11, "The evaluation on these tables did not run").

On an H100 (commit ``186c85f``) autotune of one forward signature in eager execution, then of
the same signature under ``ad.execution_mode("graph")`` (each candidate captured into a CUDA
graph), ended in ``CUDA error: an illegal memory access``; the forced calls captured and
replayed alone did not. This script runs such a sequence of calls of one point of
``cost_grid.py``'s evaluated shapes, synchronising after each step and printing what each one
chose; with ``--each-blocked`` it runs the sequence again in a fresh process per implementation,
that implementation disabled (``ATTN_DISPATCH_DISABLE``), and prints which runs fault.

    python benchmarks/autotune_fault.py                       # the sequence that faulted
    python benchmarks/autotune_fault.py --each-blocked        # one process per blocked candidate
    compute-sanitizer --tool memcheck python benchmarks/autotune_fault.py   # the faulting access

``--sequence`` is a comma list of steps ``<autotune 0|1>:<eager|graph>`` (default
``1:eager,1:graph``). Each process gets an empty autotune cache. Exit status 1 when a step
faulted (or, with ``--each-blocked``, when the full sequence did), else 0. Without CUDA the
sequence runs on the CPU at a small shape (a smoke run: there is no graph capture there).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cost_grid  # noqa: E402  (benchmarks/ is not a package)

import attn_dispatch as ad  # noqa: E402
from attn_dispatch import _measure  # noqa: E402
from attn_dispatch.tools import grid  # noqa: E402

SMALL = grid.Point(1, 4, 2, 64, 32, "none")  # the CPU's smoke shape


def parse_sequence(text: str) -> list[tuple[bool, str]]:
    """``"1:eager,1:graph"`` as ``[(True, "eager"), (True, "graph")]``."""
    steps = []
    for item in text.split(","):
        tune, _, execution = item.strip().partition(":")
        if tune not in ("0", "1") or execution not in ("eager", "graph"):
            raise argparse.ArgumentTypeError(
                f"a step is <autotune 0|1>:<eager|graph>, got {item!r}"
            )
        steps.append((tune == "1", execution))
    return steps


def run_sequence(point: grid.Point, kind: str, steps: list[tuple[bool, str]]) -> int:
    """The steps in this process, synchronising after each; 1 when one faulted."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = grid.make(point, device)
    print(f"{point.label} {kind} on {device}", flush=True)
    for tune, execution in steps:
        step = f"autotune {'on' if tune else 'off'}, {execution}"
        try:
            with ad.autotune(tune), ad.execution_mode(execution):
                grid.call(kind, t, None)
            fault = _measure.device_fault(torch.device(device))
        except Exception as exc:
            traceback.print_exc()  # where it surfaced (with CUDA_LAUNCH_BLOCKING=1: the launch)
            fault = _measure.describe_error(exc)
        if fault is not None:
            print(f"  {step}: FAULT {fault}", flush=True)
            return 1
        report = ad.explain(*grid.tensors(kind, t), **t["flags"], execution=execution)
        print(f"  {step}: ran {report.selected}", flush=True)
    return 0


def each_blocked(argv: list[str], names: list[str]) -> int:
    """The sequence in a fresh process as given, then once per name of ``names`` disabled.

    The processes run side by side: what is looked for is a fault, not a timing, and a fault
    stays in the process (the device context) that caused it."""
    runs = []
    for blocked in [None, *names]:
        env = dict(os.environ, ATTN_DISPATCH_CACHE_DIR=tempfile.mkdtemp(prefix="autotune_"))
        if blocked is not None:
            env["ATTN_DISPATCH_DISABLE"] = blocked
        process = subprocess.Popen(
            [sys.executable, __file__, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        runs.append((blocked, process))
    status = 0
    for blocked, process in runs:
        stdout, stderr = process.communicate()
        last = (stdout.strip().splitlines() or ["(no output)"])[-1].strip()
        if process.returncode == 0:
            verdict = f"no fault ({last})"
        elif "FAULT" in last:
            verdict = f"faulted ({last})"
        else:  # the run itself failed: its error, not a fault of the sequence
            error = (stderr.strip().splitlines() or ["(no output)"])[-1]
            verdict = f"failed, exit {process.returncode}: {error}"
        print(f"{blocked or 'nothing blocked'}: {verdict}", flush=True)
        if blocked is None and process.returncode != 0:
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--point", type=int, default=0, help="index into the evaluated shapes")
    p.add_argument("--kind", choices=grid.KINDS, default="forward")
    p.add_argument("--sequence", type=parse_sequence, default=parse_sequence("1:eager,1:graph"))
    p.add_argument(
        "--each-blocked", action="store_true", help="one process per implementation blocked"
    )
    args = p.parse_args(argv)
    shapes = cost_grid.evaluated_shapes()
    if not 0 <= args.point < len(shapes):
        p.error(f"--point: an index from 0 to {len(shapes) - 1}, got {args.point}")
    point = shapes[args.point] if torch.cuda.is_available() else SMALL
    if args.each_blocked:
        rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--each-blocked"]
        t = grid.make(point, "cuda" if torch.cuda.is_available() else "cpu")
        return each_blocked(rest, grid.candidates(args.kind, t))
    if "ATTN_DISPATCH_CACHE_DIR" not in os.environ:
        os.environ["ATTN_DISPATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune_")
    return run_sequence(point, args.kind, args.sequence)


if __name__ == "__main__":
    sys.exit(main())
