"""The project's pytest configuration: skips report their reasons without extra options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_skip_reasons_are_in_the_summary_by_default(tmp_path):
    (tmp_path / "test_gpu_only.py").write_text(
        "import pytest\n\n\ndef test_needs_gpu():\n    pytest.skip('no CUDA GPU present')\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
        ]
        + ["--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED [1]" in done.stdout and "no CUDA GPU present" in done.stdout, done.stdout
