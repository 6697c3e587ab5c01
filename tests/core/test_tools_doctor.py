"""``attn-dispatch doctor``: the installed versions against the measured stack, each backend's
fast paths with the reason for this installation, cost-table drift, and a report that survives
a backend whose ``fast_paths`` hook raises."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
import torch
from dispatch_helpers import COSTED, TAGGED

from attn_dispatch import _costs, _settings, detect_arch
from attn_dispatch.tools import cli, doctor

# the installed torch as the tables read it: its distribution's version (PyPI's CUDA wheel says
# 2.11.0 where TORCH says 2.11.0+cu130)
TORCH = importlib.metadata.version("torch")

ROOT = Path(__file__).resolve().parents[2]


def _doctor(capsys, *args: str) -> str:
    assert cli.main(["doctor", *args]) == 0
    return capsys.readouterr().out


def test_doctor_measured_stack_is_the_shipped_tables_and_constraints_nvidia_pins_it():
    pinned = {}
    for line in (ROOT / "constraints" / "nvidia.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pinned[name] = version
    versions = doctor.report().versions
    assert {"torch", "triton", "flash-attn-4", "nvidia-cutlass-dsl"} <= set(versions)
    assert {d: v["measured"] for d, v in versions.items()} == {d: pinned[d] for d in versions}


def test_doctor_prints_versions_and_triton_paths_on_for_a_checked_triton(capsys):
    gates = pytest.importorskip("attn_dispatch_triton._gates")
    version = ".".join(map(str, gates.triton_version()))
    out = _doctor(capsys)
    assert "torch" in out and "flash-attn-4" in out
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


# --- which cost table ranks each implementation --------------------------------------------------

ROW = dict(batch=1, heads=8, kv_heads=8, seqlen_q=512, seqlen_k=512, head_dim=64, mask="causal")


def cost_table(impls: list[str], provenance: dict) -> str:
    rows = [dict(ROW, impl=i, kind="backward", eager_us=50.0) for i in impls]
    return json.dumps({"format": 1, "arch": "cpu", "provenance": provenance, "rows": rows})


@pytest.fixture
def costed(env, plugins, tmp_path):
    """A backend ``costed`` whose package ships a cpu table of quick and steady, measured with
    torch 1.0.0 (a drift wherever torch is installed); the cache directory in ``tmp_path``.
    Yields the path of its user table."""
    package = tmp_path / "doc_costed"
    (package / "costs").mkdir(parents=True)
    (package / "__init__.py").write_text(TAGGED.format(backend="costed") + COSTED)
    info = {"versions": {"torch": "1.0.0", "made-up-dist": "3.2"}, "requires": {"torch": "1.0.0"}}
    (package / "costs" / "cpu.json").write_text(cost_table(["costed:quick", "costed:steady"], info))
    sys.modules.pop("doc_costed", None)
    plugins.modules.append("doc_costed")
    plugins.add("doc-costed", {"costed": "doc_costed"}, {})
    env.set(ATTN_DISPATCH_PLUGINS="costed,reference", ATTN_DISPATCH_CACHE_DIR=str(tmp_path / "c"))
    yield _costs.user_path(_settings.costs_directory(), "doc_costed", "cpu")
    _costs.clear()


def rankings(capsys) -> dict[str, dict]:
    data = json.loads(_doctor(capsys, "--json", "--arch", "cpu"))
    return {r["implementation"]: r for r in data["rankings"]}


def test_doctor_reads_the_measured_versions_from_the_shipped_tables(costed, capsys):
    data = json.loads(_doctor(capsys, "--json"))
    assert {d: v["measured"] for d, v in data["versions"].items()} == {
        "torch": "1.0.0",
        "made-up-dist": "3.2",
    }
    assert data["versions"]["torch"]["installed"] == TORCH
    assert data["versions"]["made-up-dist"]["installed"] is None
    out = _doctor(capsys)
    assert "(measured: 1.0.0)" in out and "not installed  (measured: 3.2)" in out


def test_doctor_names_the_shipped_table_ranking_each_implementation_with_its_drift(costed, capsys):
    by = rankings(capsys)
    drift = f"measured with torch 1.0.0, installed {TORCH}"
    for name in ("costed:quick", "costed:steady"):
        assert by[name]["table"] == "shipped"
        assert by[name]["source"] == "doc_costed/costs/cpu.json"
        assert by[name]["drift"] == drift and by[name]["error"] is None
    # its package ships a table, but without its rows: its priority ranks it
    assert by["costed:fallback"]["table"] is None
    assert by["reference:chunked"]["table"] is None
    out = _doctor(capsys, "--arch", "cpu")
    assert "cost table ranking each implementation on cpu:" in out
    assert f"  costed:quick: shipped doc_costed/costs/cpu.json; {drift}" in out
    assert "  reference:chunked: none (ranked by its priority)" in out


def test_doctor_names_the_user_table_where_it_holds_the_implementations_rows(costed, capsys):
    costed.parent.mkdir(parents=True)
    mine = {"requires": {"torch": TORCH}}
    costed.write_text(cost_table(["costed:quick"], mine))
    by = rankings(capsys)
    drift = f"measured with torch 1.0.0, installed {TORCH}"
    # the user table ranks the calls it covers, the shipped one (which holds quick's rows too)
    # the others
    shipped = dict(
        implementation="costed:quick",
        arch="cpu",
        table="shipped",
        source="doc_costed/costs/cpu.json",
        drift=drift,
        error=None,
        elsewhere=None,
    )
    assert by["costed:quick"] == dict(
        implementation="costed:quick",
        arch="cpu",
        table="user",
        source=str(costed),
        drift=None,
        error=None,
        elsewhere=shipped,
    )
    assert by["costed:steady"]["table"] == "shipped"  # the user table holds none of its rows
    assert by["costed:steady"]["elsewhere"] is None
    assert (
        f"  costed:quick: user {costed} where it covers the call; "
        f"elsewhere shipped doc_costed/costs/cpu.json; {drift}\n"
    ) in _doctor(capsys, "--arch", "cpu")


def test_doctor_names_the_user_table_alone_where_nothing_is_shipped_for_it(costed, capsys):
    costed.parent.mkdir(parents=True)
    costed.write_text(cost_table(["costed:fallback"], {}))
    by = rankings(capsys)
    assert by["costed:fallback"]["table"] == "user" and by["costed:fallback"]["elsewhere"] is None
    assert f"  costed:fallback: user {costed}\n" in _doctor(capsys, "--arch", "cpu")


def test_doctor_names_a_malformed_user_table_as_the_error_of_its_implementations(costed, capsys):
    costed.parent.mkdir(parents=True)
    costed.write_text("{not json")
    by = rankings(capsys)
    for name in ("costed:quick", "costed:steady"):
        assert by[name]["table"] == "user" and by[name]["source"] == str(costed)
        assert by[name]["error"].startswith(f"cost table {costed} is malformed")


def test_doctor_arch_defaults_to_this_machines(capsys):
    data = json.loads(_doctor(capsys, "--json"))
    arch = detect_arch().name
    assert data["rankings"] and {r["arch"] for r in data["rankings"]} == {arch}
    assert cli.main(["doctor", "--arch", "sm_0x"]) == 2
