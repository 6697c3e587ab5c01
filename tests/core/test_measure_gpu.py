"""The measuring module's CUDA graph replays on a GPU (test_measure.py covers the rest on the
CPU). Each case runs in a child process: a replay that reads freed memory faults the device,
and a faulted device fails every later test of the process that owns it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]


def test_a_replay_keeps_the_tensors_its_call_reads_alive():
    # the caller drops its own reference to the captured call's input; the next capture's
    # empty_cache (here called directly) would hand memory no one holds back to the driver
    script = textwrap.dedent(
        """
        import functools
        import torch
        from attn_dispatch import _measure

        device = torch.device("cuda")
        x = torch.randn(16 << 20, device=device)  # 64 MB: a memory segment of its own
        y = torch.empty_like(x)
        expected = x.cpu()
        replay = _measure.graph_replays([functools.partial(y.copy_, x)], device)[0]
        del x
        torch.cuda.empty_cache()
        other = torch.zeros(16 << 20, device=device)  # may take the memory x had, if released
        replay()
        torch.cuda.synchronize()
        print("replayed", torch.equal(y.cpu(), expected))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["replayed", "True"]
