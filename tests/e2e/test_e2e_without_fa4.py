"""The end-to-end tests that expect FA4 to win or to be ranked skip, rather than fail, where the
flash_attn_cute backend package is installed without FA4's own distribution (``flash-attn-4``):
a GPU run of part of the suite before FA4's wheels are in, or a user's ``--no-deps`` install.
The run hides the distribution from ``importlib.metadata`` in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("attn_dispatch_flash_attn_cute")

HERE = Path(__file__).resolve().parent
MODULES = ("test_intended_winners.py", "test_shipped_cost_tables.py")
WITHOUT_FA4 = """
import importlib.metadata as md
import sys

import pytest

def hidden(real):
    def look_up(name):
        if name == "flash-attn-4":
            raise md.PackageNotFoundError(name)
        return real(name)
    return look_up

md.version, md.distribution = hidden(md.version), hidden(md.distribution)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", *sys.argv[1:]]))
"""


def test_the_tests_expecting_fa4_skip_without_its_distribution():
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_FA4, *(str(HERE / m) for m in MODULES)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "flash-attn-4 is not installed" in run.stdout, run.stdout[-4000:]
