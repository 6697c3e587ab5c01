"""The project's pytest configuration: skips report their reasons without extra options, the
test plugins' deliberate failures stay out of the summary, caches stay in the clone."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pytest_with_project_config(tmp_path, *options: str) -> subprocess.CompletedProcess:
    """pytest on the tests in ``tmp_path`` with this project's configuration alone: neither
    the options of the run around it (``PYTEST_ADDOPTS``) nor the pytest plugins installed
    beside it (one warns under ``-W error`` where xdist runs, pytest-benchmark)."""
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), *options]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *config, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )


def test_skip_reasons_are_in_the_summary_by_default(tmp_path):
    (tmp_path / "test_gpu_only.py").write_text(
        "import pytest\n\n\ndef test_needs_gpu():\n    pytest.skip('no CUDA GPU present')\n"
    )
    done = _pytest_with_project_config(tmp_path)
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
    done = _pytest_with_project_config(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 warnings" in done.stdout and "broken_hook" not in done.stdout, done.stdout
    assert "'mine' failed to load" in done.stdout and "something else" in done.stdout, done.stdout


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_caches_go_under_the_clone_unless_the_user_chose_a_place(tmp_path):
    module = _root_conftest()
    environ = {"TRITON_CACHE_DIR": str(tmp_path / "mine"), "XDG_CACHE_HOME": ""}
    routed = module.route_caches(environ)
    assert (
        environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine") and "TRITON_CACHE_DIR" not in routed
    )
    # Every cache the tests were seen to leave outside the clone: Triton's (~/.triton), the
    # CUTLASS DSL's (<tmp>/<user>/cutlass_python_cache), pytest's (<tmp>/pytest-of-<user>),
    # torch.compile's, the backends' own (~/.cache/attn_dispatch_*).
    for name in (
        "TRITON_HOME",
        "CUTE_DSL_CACHE_DIR",
        "CUTE_EXPERIMENTAL_DSL_CACHE_DIR",
        "PYTEST_DEBUG_TEMPROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "ATTN_DISPATCH_FLYDSL_CACHE",
        "ATTN_DISPATCH_TRITON_CACHE",
        "XDG_CACHE_HOME",
    ):
        path = Path(routed[name])
        assert path.is_dir() and path.is_relative_to(ROOT / ".cache"), (name, path)
    assert "/.cache/" in (ROOT / ".gitignore").read_text().splitlines()


def test_this_session_writes_its_temporary_files_in_the_clone(tmp_path):
    if os.environ["PYTEST_DEBUG_TEMPROOT"] != str(ROOT / ".cache" / "pytest"):
        pytest.skip("PYTEST_DEBUG_TEMPROOT was set outside the test session")
    assert tmp_path.is_relative_to(ROOT / ".cache" / "pytest")


def test_triton_reads_the_routed_cache_directory():
    knobs = pytest.importorskip("triton.knobs")
    assert Path(knobs.cache.dir) == Path(os.environ["TRITON_CACHE_DIR"])


def test_importing_the_cutlass_dsl_writes_nothing_in_the_temp_directory(tmp_path):
    # FA4's CUTLASS DSL creates <tmp>/<user>/cutlass_python_cache for each DSL it defines
    # (CUTE_DSL and CUTE_EXPERIMENTAL_DSL) unless that DSL's cache variable is set.
    if importlib.util.find_spec("cutlass") is None:  # not imported here: its LLVM and
        pytest.skip("the CUTLASS DSL is not installed")  # FlyDSL's must not meet in one process
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", "import cutlass"], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_the_xdist_group_marker_is_known_without_xdist(tmp_path):
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n\n\n@pytest.mark.xdist_group('one')\ndef test_grouped():\n    pass\n"
    )
    done = _pytest_with_project_config(tmp_path, "-p", "no:xdist", "-W", "error")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PytestUnknownMarkWarning" not in done.stdout, done.stdout
