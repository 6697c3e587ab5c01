"""The README: its generated priority table matches what the installed backends declare, and its
usage snippet runs as written."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ("reference", "torch_sdpa", "triton", "flydsl_rocm")


def test_readme_priority_table_is_current(env):
    missing = [b for b in BACKENDS if importlib.util.find_spec(f"attn_dispatch_{b}") is None]
    if missing:
        pytest.skip(f"backends not installed: {missing} (the table lists all of them)")
    spec = importlib.util.spec_from_file_location(
        "priority_table", ROOT / "scripts" / "priority_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- priority-table:start -->\n") + len("<!-- priority-table:start -->\n")
    end = readme.index("<!-- priority-table:end -->")
    assert readme[start:end].strip() == module.table().strip(), (
        "README priority table is stale: run python scripts/priority_table.py and paste it"
    )


def _usage_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    usage = readme[readme.index("## Usage\n") :]
    return usage[usage.index("```python\n") + len("```python\n") : usage.index("\n```\n")]


def test_usage_snippet_runs_as_written():
    """On the machine at hand (a CPU: the reference backend; a GPU: its backends too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_DISPATCH_")}
    done = subprocess.run(
        [sys.executable, "-c", _usage_snippet()],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "selected: reference:chunked" in done.stdout or torch.cuda.is_available(), done.stdout
