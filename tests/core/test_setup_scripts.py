"""scripts/setup.sh's helpers: what counts as installed (so a re-run skips pip), and the triton a
torch build requires (so setup pairs triton with torch without a conflict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "scripts" / "setup_installed.py"


def _dist(site: Path, name: str, version: str, requires=(), direct_url=None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def _run(site: Path, prefix: Path, *args: str) -> subprocess.CompletedProcess:
    """The helper with ``site`` first on the path and its records under ``prefix``."""
    code = (
        "import runpy, sys; from pathlib import Path; "
        f"sys.path.insert(0, {str(site)!r}); "
        f"sys.prefix = {str(prefix)!r}; sys.argv = [{str(HELPER)!r}, *{list(args)!r}]; "
        f"runpy.run_path({str(HELPER)!r}, run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )


def test_torch_triton_pairs_with_the_torch_build(tmp_path):
    cuda = tmp_path / "cuda"
    _dist(
        cuda,
        "torch",
        "2.13.0",
        [
            "filelock",
            'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
            'optree>=0.13.0; extra == "optree"',
        ],
    )
    want = "triton==3.7.1" if sys.platform == "linux" else ""
    assert _run(cuda, tmp_path, "torch-triton").stdout.strip() == want
    rocm = tmp_path / "rocm"
    _dist(rocm, "torch", "2.13.0+rocm7.0", ["pytorch-triton-rocm==3.7.1"])
    assert _run(rocm, tmp_path, "torch-triton").stdout.strip() == "pytorch-triton-rocm==3.7.1"
    cpu = tmp_path / "cpu"
    _dist(cpu, "torch", "2.13.0+cpu", ["filelock", "sympy>=1.13.3"])
    done = _run(cpu, tmp_path, "torch-triton")
    assert done.returncode == 0 and done.stdout.strip() == "", done.stderr


def test_requirements_are_installed_when_a_version_they_admit_is(tmp_path):
    site = tmp_path / "site"
    _dist(site, "flydsl", "0.5.0")
    assert _run(site, tmp_path, "check", "flydsl>=0.4.2,<0.6").returncode == 0
    assert _run(site, tmp_path, "check", "flydsl>=0.4.2,<0.6", "flydsl==0.5.0").returncode == 0
    assert _run(site, tmp_path, "check", "flydsl>=0.6").returncode == 1
    assert _run(site, tmp_path, "check", "no-such-distribution").returncode == 1


def test_a_project_is_installed_while_its_editable_install_and_pyproject_are_unchanged(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    pyproject = project / "pyproject.toml"
    pyproject.write_text('[project]\nname = "demo-proj"\nversion = "0.1.0"\n')
    site = tmp_path / "site"
    here = {"url": project.resolve().as_uri(), "dir_info": {"editable": True}}
    _dist(site, "demo-proj", "0.1.0", direct_url=here)
    assert _run(site, tmp_path, "check", str(project)).returncode == 1  # never recorded
    assert _run(site, tmp_path, "record", str(project)).returncode == 0
    assert _run(site, tmp_path, "check", str(project)).returncode == 0
    pyproject.write_text(pyproject.read_text() + 'dependencies = ["numpy"]\n')
    assert _run(site, tmp_path, "check", str(project)).returncode == 1  # metadata changed
    assert _run(site, tmp_path, "record", str(project)).returncode == 0
    elsewhere = tmp_path / "site2"
    other = {"url": (tmp_path / "other").as_uri(), "dir_info": {"editable": True}}
    _dist(elsewhere, "demo-proj", "0.1.0", direct_url=other)
    assert _run(elsewhere, tmp_path, "check", str(project)).returncode == 1  # another checkout


def test_setup_refuses_a_python_older_than_the_package_requires(tmp_path):
    """The packages need Python 3.11 (``enum.StrEnum``): setup says so up front, exit 2, before
    it builds a virtual environment whose import would then fail."""
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\nexec " + sys.executable + ' -c "import sys; sys.exit(1)"\n')
    old.chmod(0o755)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHON": str(old)},
    )
    assert done.returncode == 2, done.stderr
    assert "not Python 3.11 or newer" in done.stderr
    requires = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in requires
