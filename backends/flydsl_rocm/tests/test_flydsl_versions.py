"""Which FlyDSL the backend accepts, and when a missing one fails the tests instead of skipping
them (``ATTN_DISPATCH_REQUIRE_FLYDSL=1``, set by ``scripts/test.sh`` in CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from attn_dispatch_flydsl_rocm._support import (
    FLYDSL_REQUIREMENT,
    REQUIRE_FLYDSL_ENV,
    flydsl_required,
    flydsl_test_gate,
)

BACKEND = Path(__file__).resolve().parents[1]
REPO = BACKEND.parents[1]
OUT_OF_RANGE = "flydsl 0.6.0 is installed; needs flydsl>=0.4.2,<0.6"


def test_one_range_everywhere():
    spec = re.compile(r'"(flydsl[<>=!~][^"]*)"')
    assert spec.findall((BACKEND / "pyproject.toml").read_text()) == [FLYDSL_REQUIREMENT]
    assert spec.findall((BACKEND / "ci_setup.sh").read_text()) == [FLYDSL_REQUIREMENT]


@pytest.mark.parametrize("value", ["0", "false", "no", " OFF"])
def test_not_required_skips(value):
    env = {REQUIRE_FLYDSL_ENV: value}
    assert not flydsl_required(env)
    assert flydsl_test_gate(OUT_OF_RANGE, env) == (
        "skip",
        f"{OUT_OF_RANGE} (pip install '{FLYDSL_REQUIREMENT}')",
    )


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_required_fails(value):
    action, why = flydsl_test_gate("flydsl is not installed", {REQUIRE_FLYDSL_ENV: value})
    assert action == "fail"
    assert why.startswith("flydsl is not installed, and ATTN_DISPATCH_REQUIRE_FLYDSL=1 forbids")


def test_in_range_runs_either_way():
    assert flydsl_test_gate(None, {}) == ("run", "")
    assert flydsl_test_gate(None, {REQUIRE_FLYDSL_ENV: "1"}) == ("run", "")


def test_unset_is_not_required():
    assert not flydsl_required({})


@pytest.mark.parametrize("value", ["maybe", ""])
def test_bad_value_is_named(value):
    message = f"ATTN_DISPATCH_REQUIRE_FLYDSL={value!r} is not a boolean"
    with pytest.raises(ValueError, match=message):
        flydsl_required({REQUIRE_FLYDSL_ENV: value})


def _pytest_with_flydsl_060(tmp_path: Path, require: str) -> subprocess.CompletedProcess:
    """Runs one compile test in a child pytest that sees FlyDSL 0.6.0 in its metadata (a
    dist-info first on the path), so the requirement check really fails."""
    dist = tmp_path / "flydsl-0.6.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flydsl\nVersion: 0.6.0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    env[REQUIRE_FLYDSL_ENV] = require
    test = BACKEND / "tests" / "test_flydsl_compile.py"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rsf", str(test)]
        + ["-k", "compile_error_is_an_exception"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_out_of_range_flydsl_fails_the_run_when_required(tmp_path):
    res = _pytest_with_flydsl_060(tmp_path, "1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 error" in res.stdout and OUT_OF_RANGE in res.stdout, res.stdout


def test_out_of_range_flydsl_skips_on_a_users_machine(tmp_path):
    res = _pytest_with_flydsl_060(tmp_path, "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 skipped" in res.stdout and OUT_OF_RANGE in res.stdout, res.stdout
