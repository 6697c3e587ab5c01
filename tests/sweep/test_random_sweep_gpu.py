"""Every installed implementation, forced, and the automatic choice on random shapes against
the float64 oracle, on the GPU (attn_dispatch.testing.sweep).

A new seed each run (``ATTN_DISPATCH_SWEEP_SEED`` replays one); every case is one test, so
``pytest -n`` spreads them, keeping the cases of one compile group (``SweepCase.compile_group``)
in one worker so that each kernel variant compiles once (the root conftest turns xdist's
``load`` distribution into ``loadgroup``). The default run draws 300 cases; ``-m slow`` adds
cases up to 3000; ``ATTN_DISPATCH_SWEEP_SHARD=i/n`` runs every n-th of them from the i-th (and
the reported shapes in shard 0 only).
With ``ATTN_DISPATCH_SWEEP_LOG=<dir>`` each case's counts are appended to ``<dir>`` (one JSON
line per case), and ``python -m attn_dispatch.testing.sweep --merge <dir>/*.jsonl`` prints the
table per implementation; a process that crashes leaves ``<dir>/<worker>-<pid>.running``
naming the implementation and case it was running.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import sys
import time
import zlib
from collections import Counter

import pytest
import torch

from attn_dispatch.testing import Case, sweep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]
DEFAULT_CASES, SLOW_CASES = 300, 3000


def _seed() -> int:
    """One seed per run, the same in every xdist worker of the run."""
    if "ATTN_DISPATCH_SWEEP_SEED" in os.environ:
        return int(os.environ["ATTN_DISPATCH_SWEEP_SEED"])
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return zlib.crc32(run.encode()) if run else random.SystemRandom().randrange(1 << 31)


SEED = _seed()


DRAWN = sweep.draw_cases(SLOW_CASES, SEED)


def _shard() -> tuple[int, int]:
    """``ATTN_DISPATCH_SWEEP_SHARD=i/n``: this run takes the cases whose index is i modulo n
    (as ``python -m attn_dispatch.testing.sweep --shard i/n`` does), so that a long run can be
    split across processes or machines and merged from its logs."""
    text = os.environ.get("ATTN_DISPATCH_SWEEP_SHARD", "0/1")
    try:
        return sweep._shard(text)
    except argparse.ArgumentTypeError as exc:  # the CLI's parser: say which variable it was
        raise ValueError(f"ATTN_DISPATCH_SWEEP_SHARD: {exc}") from None


SHARD, SHARDS = _shard()


def _indices(cases: range) -> list:
    """This shard's cases, the largest compile groups first: xdist hands groups to workers in
    collection order, so a large group collected last would run alone at the end of the run."""
    mine = [i for i in cases if i % SHARDS == SHARD]
    sizes = Counter(DRAWN[i].compile_group for i in mine)
    mine.sort(key=lambda i: (-sizes[DRAWN[i].compile_group], DRAWN[i].compile_group, i))
    return [
        pytest.param(i, marks=pytest.mark.xdist_group(DRAWN[i].compile_group), id=str(i))
        for i in mine
    ]


@pytest.fixture(scope="module")
def names() -> list[str]:
    return [*sweep.implementations(), sweep.AUTO]


def _record(report: sweep.Report) -> None:
    log = os.environ.get("ATTN_DISPATCH_SWEEP_LOG")
    if log:
        os.makedirs(log, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(log, f"{worker}.jsonl"), "a") as f:
            f.write(json.dumps(report.to_dict()) + "\n")


def _running_file() -> str | None:
    """``<log>/<worker>-<pid>.running``: what this process runs now. Removed at a normal exit,
    so one left behind names the implementation and case a crashed process was running."""
    log = os.environ.get("ATTN_DISPATCH_SWEEP_LOG")
    if not log:
        return None
    os.makedirs(log, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = os.path.join(log, f"{worker}-{os.getpid()}.running")
    atexit.register(lambda: os.path.exists(path) and os.remove(path))
    return path


RUNNING = _running_file()


def _starting(what: str) -> None:
    if RUNNING:
        with open(RUNNING, "w") as f:
            f.write(what + "\n")
            f.flush()
            os.fsync(f.fileno())


def _check(one: sweep.SweepCase, names: list[str]) -> None:
    report = sweep.Report(seed=one.seed, cases=1)
    start = time.perf_counter()
    chosen = sweep.check_all(one, names, torch.device("cuda"), report, _starting)
    report.seconds = time.perf_counter() - start
    report.chosen[chosen] = 1
    _record(report)
    if report.crashed:
        _stop_after_fault("\n\n".join(report.wrong))
    assert not report.wrong, "\n\n".join(report.wrong)


def _stop_after_fault(what: str) -> None:
    """A device fault leaves this process's device unusable: every later case here would fail
    for it. Under xdist the worker exits (the case counts as failed, and a fresh worker takes the
    cases left); in a single process the session stops. Either way the fault is named first."""
    message = f"sweep: device fault, stopping this process (seed {SEED}):\n{what}"
    print(message, file=sys.__stderr__, flush=True)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os._exit(3)
    pytest.exit(message, returncode=1)


@pytest.mark.parametrize("index", _indices(range(DEFAULT_CASES)))
def test_random_case_matches_oracle(index: int, names) -> None:
    _check(DRAWN[index], names)


@pytest.mark.slow
@pytest.mark.parametrize("index", _indices(range(DEFAULT_CASES, SLOW_CASES)))
def test_random_case_matches_oracle_slow(index: int, names) -> None:
    _check(DRAWN[index], names)


# Shapes a randomized run once found wrong through triton:fused_atomic (a configured GQA split
# that did not divide the group): (batch, length, heads, kv heads, head dim, flags).
REPORTED = [
    (1, 512, 28, 4, 128, dict(causal=True)),
    (1, 512, 28, 4, 128, {}),
    (2, 512, 24, 8, 128, dict(causal=True)),
    (2, 512, 24, 8, 128, {}),
    (1, 512, 40, 8, 128, {}),
    (1, 1024, 20, 4, 128, {}),
    (1, 257, 8, 4, 128, dict(causal=True, window=(31, 0))),
    (2, 63, 5, 1, 128, {}),
    (2, 512, 16, 8, 96, dict(causal=True)),
    (1, 512, 8, 4, 96, dict(causal=True, softcap=30.0)),
    (1, 512, 8, 4, 80, dict(causal=True)),
]


# in the first shard only, so that merged shards count each once
@pytest.mark.parametrize(
    "shape", REPORTED if SHARD == 0 else [], ids=lambda s: "-".join(map(str, s[:5]))
)
def test_reported_shape_matches_oracle(shape, names) -> None:
    b, s, h, hkv, d, flags = shape
    case = Case((s,) * b, (s,) * b, heads=h, kv_heads=hkv, head_dim=d, seed=s + h, **flags)
    _check(sweep.SweepCase(case, torch.bfloat16, None, 0, 0), names)


def test_a_case_leaves_no_cached_memory_behind(names) -> None:
    """Parallel sweep processes share the GPU: a case's memory goes back to the driver."""
    big = sweep.SweepCase(
        Case((2048,), (2048,), heads=8, kv_heads=2, head_dim=128, causal=True, seed=1),
        torch.bfloat16,
        None,
        0,
        SEED,
    )
    report = sweep.Report(seed=SEED, cases=1)
    sweep.check_all(big, ["reference:chunked"], torch.device("cuda"), report)
    assert not report.wrong, report.wrong
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < 64 << 20
