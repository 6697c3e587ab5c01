"""The autotune fault replay's CPU smoke run: the sequence's steps, and the bisection's
processes, one per blocked candidate."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import autotune_fault  # noqa: E402

import attn_dispatch as ad  # noqa: E402


def test_the_sequence_runs_each_step_and_says_what_it_ran(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_CACHE_DIR", str(tmp_path))
    assert autotune_fault.main(["--kind", "backward", "--sequence", "0:eager,1:graph"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{autotune_fault.SMALL.label} backward on cpu"
    assert [line.split(": ran ")[0] for line in lines[1:]] == [
        "  autotune off, eager",
        "  autotune on, graph",
    ]


def test_a_step_that_faults_ends_the_sequence_with_status_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_CACHE_DIR", str(tmp_path))
    faults = iter([None, "AcceleratorError: CUDA error: an illegal memory access"])
    monkeypatch.setattr(autotune_fault._measure, "device_fault", lambda device: next(faults))
    assert autotune_fault.main(["--sequence", "1:eager,1:graph,0:eager"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        out[-1]
        == "  autotune on, graph: FAULT AcceleratorError: CUDA error: an illegal memory access"
    )
    assert len(out) == 3


@pytest.fixture
def timed_plugins(monkeypatch):
    """The timed test plugins alone, in this process and its children; the plugins found
    again once the variables are restored."""
    plugins = Path(__file__).resolve().parents[1] / "tests" / "plugins"
    with monkeypatch.context() as m:
        m.syspath_prepend(str(plugins))
        m.setenv("PYTHONPATH", os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]))
        m.setenv("ATTN_DISPATCH_TEST_PLUGINS", "timed")
        m.setenv("ATTN_DISPATCH_PLUGINS", "timed")
        ad.reload()
        yield
    ad.reload()


def test_each_blocked_runs_the_sequence_once_per_candidate_blocked(capsys, timed_plugins):
    assert autotune_fault.main(["--kind", "backward", "--each-blocked"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("nothing blocked: no fault (")
    assert [line.split(":", 2)[:2] for line in lines[1:]] == [
        ["timed", name] for name in ("slow", "wrong", "fast")
    ]


@pytest.mark.parametrize("text", ["2:eager", "1:compiled", "1"])
def test_a_bad_step_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        autotune_fault.parse_sequence(text)
