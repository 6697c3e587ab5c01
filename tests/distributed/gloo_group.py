"""A real gloo process group on the CPU for the context-parallel tests: spawn the ranks, run a
body on each, read back what every rank recorded."""

from __future__ import annotations

import json
import socket
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# body(rank, result, *args) fills result (a JSON-able dict) on one rank of the group
RankBody = Callable[..., None]


def message(
    fn: Callable[[], object], errors: tuple[type[Exception], ...] = (ValueError, TypeError)
) -> str:
    """What ``fn()`` raises, as ``"Type: text"``, or ``"no error"``."""
    try:
        fn()
    except errors as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_rank(rank: int, world: int, port: int, out_dir: str, body: RankBody, args: tuple) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # plugin-load warnings of the environment, not under test
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    result: dict = {}
    try:
        body(rank, result, *args)
    except Exception as e:  # reported to the parent, which fails the test with it
        result["raised"] = f"{type(e).__name__}: {e}"
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def spawn_group(body: RankBody, world: int, out_dir: Path, *args: object) -> list[dict]:
    """Run ``body`` on each rank of a fresh ``world``-rank gloo group; every rank's result, in
    rank order, after checking that none raised. ``body`` must be a module-level function (the
    ranks are spawned processes)."""
    mp.spawn(_run_rank, args=(world, _free_port(), str(out_dir), body, args), nprocs=world)
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
    for rank, res in enumerate(results):
        assert "raised" not in res, f"rank {rank}: {res['raised']}"
    return results
