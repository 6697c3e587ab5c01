"""The core's version is written once per source of truth and every backend admits it: the root
``pyproject.toml`` version is ``attn_dispatch.__version__``, and each backend's requirement on
``attn-dispatch`` (the plugin API it was written against) contains that version."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import attn_dispatch as ad

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = sorted(ROOT.glob("backends/*/pyproject.toml"))


def project(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text())["project"]


def test_root_version_is_the_packages_version():
    assert project(ROOT / "pyproject.toml")["version"] == ad.__version__


@pytest.mark.parametrize("pyproject", BACKENDS, ids=[p.parent.name for p in BACKENDS])
def test_every_backend_pins_a_core_range_that_admits_this_core(pyproject):
    (core,) = [
        Requirement(line)
        for line in project(pyproject)["dependencies"]
        if canonicalize_name(Requirement(line).name) == "attn-dispatch"
    ]
    assert core.specifier, f"{pyproject}: attn-dispatch without a version range"
    assert core.specifier.contains(ad.__version__), (str(core.specifier), ad.__version__)
    # bounded above: a later core's plugin API may change
    assert not core.specifier.contains("999.0"), str(core.specifier)
