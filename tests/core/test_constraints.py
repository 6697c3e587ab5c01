"""The pinned stacks of constraints/ (what scripts/setup.sh installs with ``-c``) against what the
project claims about them: the NVIDIA stack is the one the shipped cost tables were measured on
and the version gates were proven on, the CPU stack tests the kernels with the same triton, and
the pins setup.sh reads out of the files are the ones pip applies."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
STACKS = {name: ROOT / "constraints" / f"{name}.txt" for name in ("nvidia", "cpu")}
TABLES = sorted(ROOT.glob("backends/*/attn_dispatch_*/costs/*.json"))


def pins(path: Path) -> dict[str, str]:
    """Distribution (canonical name) -> the version a constraints file pins with ``==``; any
    other kind of line fails: a constraint that is a range would not say what was measured."""
    found: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier  # exactly one clause
        assert spec.operator == "==" and not req.extras and req.marker is None, (path, number)
        name = canonicalize_name(req.name)
        assert name not in found, f"{path}:{number}: {name} pinned twice"
        found[name] = spec.version
    return found


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _major_minor(version: str) -> tuple[int, int]:
    return Version(version).release[:2]


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_constraints_pin_torch_and_triton(stack):
    found = pins(STACKS[stack])
    assert {"torch", "triton", "flash-attn-4", "nvidia-cutlass-dsl"} <= found.keys(), found


@pytest.mark.parametrize("table", TABLES, ids=[t.parent.parent.parent.name for t in TABLES])
def test_nvidia_stack_is_the_one_the_cost_tables_were_measured_on(table):
    provenance = json.loads(table.read_text())["provenance"]
    stack = pins(STACKS["nvidia"])
    measured = {**provenance.get("versions", {}), **provenance.get("requires", {})}
    assert measured, f"{table}: provenance names no versions"
    for dist, version in measured.items():
        assert stack.get(canonicalize_name(dist)) == _public(version), (table, dist, version)


def test_nvidia_stack_is_the_one_the_triton_gates_were_proven_on():
    tma_rows = pytest.importorskip("attn_dispatch_triton._tma_rows")
    plan = pytest.importorskip("attn_dispatch_triton._plan")
    triton = _major_minor(pins(STACKS["nvidia"])["triton"])
    assert triton in tma_rows.GLUON_TRITON
    assert triton in plan.VERIFIED_TRITON


def test_nvidia_stack_is_a_release_fa4s_replay_was_proven_on():
    releases = pytest.importorskip("attn_dispatch_flash_attn_cute._releases")
    release = releases.release_for(pins(STACKS["nvidia"])["flash-attn-4"])
    assert release is not None and release.replay_tested, release


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_pinned_fa4_is_one_the_backend_admits(stack):
    releases = pytest.importorskip("attn_dispatch_flash_attn_cute._releases")
    version = pins(STACKS[stack])["flash-attn-4"]
    assert releases.release_for(version) is not None, version
    backend = tomllib.loads((ROOT / "backends/flash_attn_cute/pyproject.toml").read_text())
    (fa4,) = [
        Requirement(line)
        for line in backend["project"]["dependencies"]
        if canonicalize_name(Requirement(line).name) == "flash-attn-4"
    ]
    assert fa4.specifier.contains(version, prereleases=True), (str(fa4.specifier), version)


def test_cpu_stack_tests_the_kernels_with_the_measured_triton():
    assert pins(STACKS["cpu"])["triton"] == pins(STACKS["nvidia"])["triton"]


def test_both_stacks_agree_outside_torch_and_the_fa4_release():
    nvidia, cpu = pins(STACKS["nvidia"]), pins(STACKS["cpu"])
    for dist in sorted(nvidia.keys() & cpu.keys() - {"torch", "flash-attn-4"}):
        assert nvidia[dist] == cpu[dist], dist


def _setup_pin_function() -> str:
    (line,) = [
        line
        for line in (ROOT / "scripts" / "setup.sh").read_text().splitlines()
        if line.startswith("pin() {")
    ]
    return line


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_setup_reads_the_pins_pip_applies(stack):
    """setup.sh's ``pin`` (the torch version it installs, the triton beside a CPU torch, the FA4
    release it checks for) reads what the file pins for each distribution."""
    path = STACKS[stack]
    names = sorted(pins(path))
    script = _setup_pin_function() + "\n" + "".join(f'pin {n} "$1"\n' for n in names)
    done = subprocess.run(
        ["bash", "-c", script, "pin", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert dict(zip(names, done.stdout.split("\n"))) == {n: pins(path)[n] for n in names}
