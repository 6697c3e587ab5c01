"""``attn-dispatch doctor``: the installed versions against the measured stack, each backend's
fast paths with the reason for this installation, cost-table drift, and a report that survives
a backend whose ``fast_paths`` hook raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attn_dispatch import _settings
from attn_dispatch.tools import cli, doctor

ROOT = Path(__file__).resolve().parents[2]


def _doctor(capsys, *args: str) -> str:
    assert cli.main(["doctor", *args]) == 0
    return capsys.readouterr().out


def test_doctor_measured_stack_is_constraints_nvidia():
    pinned = {}
    for line in (ROOT / "constraints" / "nvidia.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pinned[name] = version
    assert {d: pinned[d] for d in doctor.MEASURED} == doctor.MEASURED


def test_doctor_prints_versions_and_triton_paths_on_for_a_checked_triton(capsys):
    gates = pytest.importorskip("attn_dispatch_triton._gates")
    version = ".".join(map(str, gates.triton_version()))
    out = _doctor(capsys)
    assert "torch" in out and "flash-attn-4" in out and "transformers" in out
    for name in ("Gluon sm_90 kernels", "launch-plan replay"):
        line = next(x for x in out.splitlines() if f"triton: {name}:" in x)
        assert line.split()[0] == ("on" if version == "3.6" else "OFF"), line
        assert f"triton {version}" in line


def test_doctor_names_why_triton_paths_are_off_on_another_triton(capsys, monkeypatch):
    gates = pytest.importorskip("attn_dispatch_triton._gates")
    monkeypatch.setattr(gates, "triton_version", lambda: (3, 7))
    data = json.loads(_doctor(capsys, "--json"))
    triton = {p["name"]: p for p in data["fast_paths"] if p["backend"] == "triton"}
    for name in ("Gluon sm_90 kernels", "launch-plan replay"):
        assert triton[name]["on"] is False
        assert "triton 3.7 is installed" in triton[name]["reason"]
        assert "3.6" in triton[name]["reason"]


def test_doctor_reports_cost_table_drift_and_no_gpu(capsys):
    data = json.loads(_doctor(capsys, "--json"))
    assert data["cost_tables"], "the installed backends ship cost tables"
    for table in data["cost_tables"]:
        assert table["error"] is None, table
    import torch

    if not torch.cuda.is_available():
        assert data["notes"] == [doctor.NO_GPU]
        assert doctor.NO_GPU in _doctor(capsys)


def test_doctor_survives_a_fast_paths_hook_that_raises(capsys, monkeypatch):
    record = _settings.current().registry.backends["reference"]
    impl = record.implementations[0]

    def broken(self):
        raise RuntimeError("no version here")

    monkeypatch.setattr(type(impl), "fast_paths", broken)
    data = json.loads(_doctor(capsys, "--json"))
    assert data["errors"][impl.full_name] == "fast_paths() raised RuntimeError: no version here"
    assert [e for e in data["errors"] if e.startswith("reference")] == [impl.full_name]
    if "triton" in _settings.current().registry.backends:
        assert any(p["backend"] == "triton" for p in data["fast_paths"])
    assert f"{impl.full_name}: fast_paths() raised" in _doctor(capsys)
