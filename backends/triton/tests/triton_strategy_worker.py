"""Runs the backward's launch strategies under ``TRITON_INTERPRET=1``.

Started as a subprocess by ``test_triton_launch_strategy.py`` (the interpreter must be chosen
before the kernels are defined): reads a JSON list of cases on stdin, prints a JSON list of
findings on stdout. Per case, with inputs A and inputs B of one signature (B with another
scale):

- a recording launch and a direct launch of A: the same kernels, grids and arguments, and
  bitwise identical gradients;
- a replay of A's recording with B's values: each recorded argument replaced by B's value of
  the role the recording gave it (scratch allocated as the plan's extra says), each kernel
  launched again. Its arguments match a direct launch of B's and so do its gradients, bitwise.

A compiled plan (``_plan.Plan``) cannot run here (the interpreter compiles nothing); this
replay does with tensors what it does with pointers, from the same recording.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
from attn_dispatch_triton import _plan  # noqa: E402
from attn_dispatch_triton._common import LOG2E  # noqa: E402
from attn_dispatch_triton._launch_strategy import DirectStrategy, RecordingStrategy  # noqa: E402
from attn_dispatch_triton._launcher import BackwardLaunch  # noqa: E402
from triton_interp_worker import patch_interpreter  # noqa: E402

from attn_dispatch import backend as adb  # noqa: E402


class KeptDirect(DirectStrategy):
    """The direct strategy, also keeping each launch as it went to the kernel."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: list = []

    def launch(self, kernel, grid, args, kwargs) -> None:
        self.kept.append((kernel, tuple(grid), tuple(args), dict(kwargs)))
        DirectStrategy.launch(kernel, grid, args, kwargs)


class KeptRecording(RecordingStrategy):
    """A recording strategy that also keeps each launch's kernel and keyword arguments (its
    recorder keeps the compiled kernel, which the interpreter does not make)."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        super().__init__(_plan.Recorder())
        self.kept: list = []

    def launch(self, kernel, grid, args, kwargs) -> None:
        self.kept.append((kernel, tuple(grid), tuple(args), dict(kwargs)))
        super().launch(kernel, grid, args, kwargs)


def make_inputs(case: dict, seed: int) -> tuple[tuple, dict]:
    """``(q, k, v, out, lse, do)`` and the call's flags for ``case``."""
    torch.manual_seed(seed)
    b, s, h, hk, d = (case[x] for x in ("batch", "seqlen", "heads", "kv_heads", "head_dim"))
    window = case.get("window")
    band = adb.Band.of(None if window is None else tuple(window), case["causal"], "top_left")
    flags = dict(band=band, scale=case["scale"])
    if case.get("softcap") is not None:
        flags["softcap"] = case["softcap"]
    if case.get("varlen"):
        lens = case["varlen"]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        flags.update(
            cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), max_seqlen_q=max(lens), max_seqlen_k=max(lens)
        )
        lead, lse_shape = (sum(lens),), (h, sum(lens))
    else:
        lead, lse_shape = (b, s), (b, h, s)
    q, out, do = (torch.randn(*lead, h, d, dtype=torch.float16) for _ in range(3))
    k, v = (torch.randn(*lead, hk, d, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(lse_shape) + 4.0
    return (q, k, v, out, lse, do), flags


def backward(inputs: tuple, flags: dict, case: dict, strategy):
    """One backward through ``BackwardLaunch`` with ``strategy``; NaN-poisoned outputs."""
    grads = [torch.full_like(t, float("nan")) for t in inputs[:3]]
    launch = BackwardLaunch(
        *inputs, **flags, dq=grads[0], dk=grads[1], dv=grads[2], atomic_dq=case["atomic"],
        strategy=strategy,
    )  # fmt: skip
    launch.run(case["config"])
    return launch, grads


def replay(strategy, extra: dict, values: dict) -> list:
    """The recorded launches again, each argument replaced by ``values``' value of its role
    (tensors as views at the recorded offset and strides); returns the launches made."""
    rec = strategy.recorder
    values = dict(values)
    values[_plan.TMP] = torch.empty(extra["tmp_shape"], dtype=torch.float32).view(-1)
    if extra["part_numel"] is not None:
        alloc = torch.zeros if extra.get("part_zeroed") else torch.empty
        values[_plan.PART] = alloc(extra["part_numel"], dtype=torch.float32)
    if extra["acc"] is not None:
        values[_plan.ACC] = torch.zeros(extra["acc"]["shape"], dtype=torch.float32).view(-1)

    def new(arg):
        if isinstance(arg, float) and id(arg) in rec.constants:
            return arg
        if not isinstance(arg, (torch.Tensor, float)):
            return arg
        if id(arg) not in rec.slots:
            raise AssertionError(f"an argument without a plan role: {type(arg).__name__}")
        index, offset = rec.slots[id(arg)]
        value = values[index]
        if isinstance(arg, float):
            return value
        start = value.storage_offset() + offset // arg.element_size()
        return torch.as_strided(value, arg.shape, arg.stride(), start)

    made = []
    for kernel, grid, args, kwargs in strategy.kept:
        args = tuple(new(a) for a in args)
        kernel[grid](*args, **kwargs)
        made.append((kernel, grid, args, kwargs))
    return made


def where(t: torch.Tensor, caller: dict) -> tuple:
    """Which caller tensor ``t`` views (by its storage; ``"scratch"`` for any other), and
    at which element of it."""
    return caller.get(t.untyped_storage().data_ptr(), "scratch"), t.storage_offset()


def differences(got: list, want: list, got_caller: dict, want_caller: dict) -> list[str]:
    """Where two lists of launches differ: kernel, grid, keyword arguments, each argument
    (tensors by shape, strides, dtype and :func:`where` they point, given each side's caller
    tensors by storage pointer; anything else by type and value)."""
    if len(got) != len(want):
        return [f"{len(got)} launches, want {len(want)}"]
    diffs = []
    for n, ((kg, gg, ag, wg), (kw, gw, aw, ww)) in enumerate(zip(got, want)):
        if (kg, gg, wg) != (kw, gw, ww) or len(ag) != len(aw):
            diffs.append(f"launch {n}: kernel, grid or keyword arguments differ")
            continue
        for i, (a, b) in enumerate(zip(ag, aw)):
            if isinstance(b, torch.Tensor):
                same = isinstance(a, torch.Tensor) and (
                    (a.shape, a.stride(), a.dtype, where(a, got_caller))
                    == (b.shape, b.stride(), b.dtype, where(b, want_caller))
                )
            else:
                same = type(a) is type(b) and a == b
            if not same:
                diffs.append(f"launch {n} argument {i}: {a!r:.60} != {b!r:.60}")
    return diffs


def caller_tensors(inputs: tuple, grads: list, flags: dict) -> dict:
    """A call's own tensors by storage pointer -> role name."""
    named = dict(zip(("q", "k", "v", "out", "lse", "do", "dq", "dk", "dv"), (*inputs, *grads)))
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if name in flags:
            named[name] = flags[name]
    return {t.untyped_storage().data_ptr(): name for name, t in named.items()}


def run_case(case: dict) -> dict:
    res: dict = {"id": case["id"]}
    inputs_a, flags = make_inputs(case, case["seed"])
    recording = KeptRecording()
    launch_a, grads_recorded = backward(inputs_a, flags, case, recording)
    direct_a = KeptDirect()
    _, grads_direct = backward(inputs_a, flags, case, direct_a)
    res["recorded_launches"] = len(recording.recorder.launches)
    caller_a = caller_tensors(inputs_a, grads_recorded, flags)
    caller_a.update(caller_tensors(inputs_a, grads_direct, flags))  # (dq, dk, dv apart)
    res["same_launches"] = differences(recording.kept, direct_a.kept, caller_a, caller_a)
    res["recording_changes_nothing"] = all(map(torch.equal, grads_recorded, grads_direct))

    inputs_b, flags_b = make_inputs(case, case["seed"] + 1)
    flags_b["scale"] = scale_b = case["scale"] * 1.5
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if name in flags_b:
            flags_b[name] = flags_b[name].clone()  # other tensors, same lengths
    direct_b = KeptDirect()
    _, grads_b = backward(inputs_b, flags_b, case, direct_b)
    replayed = [torch.full_like(t, float("nan")) for t in inputs_b[:3]]
    values = dict(zip((_plan.Q, _plan.K, _plan.V, _plan.OUT, _plan.LSE, _plan.DO), inputs_b))
    values.update({_plan.DQ: replayed[0], _plan.DK: replayed[1], _plan.DV: replayed[2]})
    values.update({_plan.SCALE: scale_b, _plan.QK_SCALE: scale_b * LOG2E})
    values[_plan.CU_Q], values[_plan.CU_K] = (flags_b.get(f"cu_seqlens_{x}") for x in "qk")
    made = replay(recording, launch_a.plan_extra, values)
    res["replay_args"] = differences(
        made,
        direct_b.kept,
        caller_tensors(inputs_b, replayed, flags_b),
        caller_tensors(inputs_b, grads_b, flags_b),
    )
    res["replay_grads_match"] = all(map(torch.equal, replayed, grads_b))
    res["replay_finite"] = all(bool(torch.isfinite(t).all()) for t in replayed)
    return res


def main() -> None:
    patch_interpreter()
    results = []
    for case in json.load(sys.stdin):
        try:
            results.append(run_case(case))
        except Exception as exc:  # reported per case, so one failure does not hide the others
            results.append({"id": case["id"], "error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
