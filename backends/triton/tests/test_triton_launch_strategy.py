"""The backward launcher's strategies (``_launch_strategy``): direct, or recording a plan.

Under the interpreter (``triton_strategy_worker.py``, one subprocess): a recording launch and a
direct launch hand the kernels the same arguments and give bitwise identical gradients, and the
recording, replayed with another call's values, hands the kernels that call's arguments and
gives its gradients. On the CPU: what each strategy keeps, and which recorded calls make a plan
(with the compiled kernel stood in for, as in ``test_triton_plan_replay_args.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
from attn_dispatch_triton import _plan  # noqa: E402
from attn_dispatch_triton._launch_strategy import (  # noqa: E402
    DIRECT,
    DirectStrategy,
    RecordingStrategy,
)
from attn_dispatch_triton._launcher import BackwardLaunch  # noqa: E402

from attn_dispatch import backend as adb  # noqa: E402

WORKER = Path(__file__).with_name("triton_strategy_worker.py")
TILES = {  # small tiles: several blocks per side at these lengths
    "pre": {"BLOCK_M": 16, "BLOCK_N": 0, "num_warps": 4, "num_stages": 1},
    "dkdv": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    "dq": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    "dkdvq": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    "cvt": {"BLOCK_M": 16, "BLOCK_N": 0, "num_warps": 4, "num_stages": 1},
}
SPLIT_TILES = dict(TILES, dkdv=dict(TILES["dkdv"], SPLIT=2))  # GQA split: a partials buffer


def _case(name: str, **kw) -> dict:
    base = dict(batch=2, seqlen=40, heads=4, kv_heads=2, head_dim=32, causal=True, scale=0.2)
    return dict(base, id=name, seed=len(name), atomic=False, config=TILES) | kw


CASES = [
    _case("split-causal"),
    _case("split-partials-window-softcap", causal=False, window=(8, 3), softcap=3.0),
    _case("atomic-window-softcap", atomic=True, window=(5, 2), softcap=1.5),
    _case("split-varlen", varlen=[17, 40, 3]),
]
CASES[1]["config"] = SPLIT_TILES


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(WORKER)],
        input=json.dumps(CASES),
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"interpreter worker failed:\n{proc.stderr[-4000:]}")
    return {r["id"]: r for r in json.loads(proc.stdout)}


@pytest.mark.parametrize("c", CASES, ids=[c["id"] for c in CASES])
def test_recording_launches_what_a_direct_launch_does(c: dict, results: dict) -> None:
    r = results[c["id"]]
    assert "error" not in r, r.get("error")
    assert r["recorded_launches"] >= 3, r  # preprocess, dK/dV, dQ or its convert pass
    assert r["same_launches"] == [], r["same_launches"]
    assert r["recording_changes_nothing"], "recording changed the gradients"


@pytest.mark.parametrize("c", CASES, ids=[c["id"] for c in CASES])
def test_a_recording_replays_to_another_call_s_arguments_and_gradients(
    c: dict, results: dict
) -> None:
    r = results[c["id"]]
    assert "error" not in r, r.get("error")
    assert r["replay_args"] == [], r["replay_args"]
    assert r["replay_grads_match"], "the replayed gradients differ from a direct launch's"
    assert r["replay_finite"], "the replay left poisoned gradients"


def _inputs(dk_contiguous: bool = True) -> tuple[tuple, dict]:
    q, k, v, do = (torch.randn(1, 40, h, 32, dtype=torch.float16) for h in (4, 2, 2, 4))
    out, lse = torch.randn_like(q), torch.randn(1, 4, 40)
    dk = torch.empty(1, 40, 2, 64, dtype=torch.float16)[..., :32]
    outputs = {} if dk_contiguous else {"dk": dk}
    band = adb.Band.of(None, True, "top_left")
    return (q, k, v, out, lse, do), dict(band=band, scale=0.2, **outputs)


def test_a_direct_launch_keeps_nothing() -> None:
    """The default strategy is the shared :data:`DIRECT`, which has no state to keep a launch
    in and makes no plan."""
    inputs, flags = _inputs()
    launch = BackwardLaunch(*inputs, **flags)
    assert launch.strategy is DIRECT
    assert DirectStrategy.__slots__ == () and not hasattr(DIRECT, "__dict__")
    assert DIRECT.plan(launch.plan_extra) is None


class _StandInCompiled:
    """What a plan reads of a compiled kernel: its launcher (``CompiledKernel.run``, kept
    as it is, as for a kernel that needs scratch memory), function and packed metadata."""

    run, function, packed_metadata = print, "function-handle", ("packed", "metadata")


def _stand_in_launch(self, kernel, grid, args, kwargs, side=None):
    """``Recorder.launch`` without running the kernel (none runs on the CPU outside the
    interpreter), its compiled kernel stood in for, as the replay-argument tests do."""
    full = list(args) + [kwargs[n] for n in kernel.arg_names[len(args) :]]
    self.launches.append((_StandInCompiled(), tuple(grid), full, side is not None))


@pytest.mark.parametrize("atomic", [False, True], ids=["split", "atomic"])
def test_a_recording_of_partials_makes_a_plan_and_a_torch_sum_none(atomic, monkeypatch) -> None:
    """A split GQA group's partials: in one buffer (contiguous dK/dV, summed by a kernel) the
    recording names the buffer and its views, so a plan is made; summed by torch (a strided
    dK) the call is no replayable launch sequence, so none is."""
    monkeypatch.setattr(_plan.Recorder, "launch", _stand_in_launch)
    config = dict(SPLIT_TILES, dkdvq=dict(TILES["dkdvq"], SPLIT=2))
    for contiguous, plannable in ((True, True), (False, False)):
        inputs, flags = _inputs(contiguous)
        strategy = RecordingStrategy(_plan.Recorder())
        launch = BackwardLaunch(*inputs, **flags, atomic_dq=atomic, strategy=strategy)
        launch.run(config)
        assert (launch.plan_extra["part_numel"] is not None) == plannable
        assert (strategy.plan(launch.plan_extra) is not None) == plannable
