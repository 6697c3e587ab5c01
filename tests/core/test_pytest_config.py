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


def test_only_the_on_purpose_plugin_failures_are_filtered(tmp_path):
    """The warnings of the test plugins that break on purpose stay out of a run's summary; any
    other warning, another plugin's failure to load included, is still shown."""
    (tmp_path / "test_warns.py").write_text(
        "import warnings\n\n\n"
        "def test_plugins_load():\n"
        "    warnings.warn(\"backend plugin 'broken_hook' failed to load: RuntimeError: \"\n"
        "                  'broken_hook: cannot enumerate kernels (on purpose) (at x.py:11)')\n"
        "    warnings.warn(\"backend plugin 'mine' failed to load: ImportError: no kernels\")\n"
        "    warnings.warn('something else')\n"
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
    assert "2 warnings" in done.stdout and "broken_hook" not in done.stdout, done.stdout
    assert "'mine' failed to load" in done.stdout and "something else" in done.stdout, done.stdout
