"""The cost tables the backends ship (attn_dispatch._costs) parse, name their own backend's
implementations, say what they were measured with, rank as measured at their own rows, and
rank the seed shapes under the installed versions, whichever they are."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import json
from pathlib import Path

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch import _costs

SHIPPED = {
    "attn_dispatch_triton": "triton:",
    "attn_dispatch_torch_sdpa": "torch_sdpa:",
    "attn_dispatch_flash_attn_cute": "flash_attn_cute:",
}


@pytest.mark.parametrize(("package", "prefix"), SHIPPED.items())
def test_a_shipped_table_is_well_formed(package, prefix) -> None:
    pytest.importorskip(package)
    table = _costs.load(package, "sm_90")
    assert table is not None and table.arch == "sm_90"
    assert table.rows and all(r.impl.startswith(prefix) for r in table.rows)
    # found where the implementations are, without their naming a package
    owners = {i.cost_tables for b in ad.backends() for i in b.implementations if prefix in i.name}
    assert owners == {package}
    info = table.provenance
    assert info["gpu"] and info["commit"] and info["command"] and info["requires"]
    for row in table.rows:  # at its own point a row predicts exactly its own time
        for mode in row.us:
            predicted = table.predict(row.impl, row.kind, mode, row.shape)
            assert predicted is not None and predicted.distance == 0
            same = [
                r
                for r in table.rows
                if (r.impl, r.kind, r.shape) == (row.impl, row.kind, row.shape)
            ]
            assert predicted.us == pytest.approx(sum(r.us[mode] for r in same) / len(same))


# The 20 seed shapes of docs/benchmarks.md (benchmarks/cost_grid.py ``seed_shapes``): B=1,
# D=128, GQA 64/8 and MHA 8/8, no mask and causal, 1K to 16K.
SEEDS = [
    (heads, kv_heads, seqlen, causal)
    for heads, kv_heads in ((64, 8), (8, 8))
    for causal in (False, True)
    for seqlen in (1024, 2048, 4096, 8192, 16384)
]


def fa4_installed() -> bool:
    """Whether FA4's own distribution is installed (its backend package may be, without it)."""
    return (
        importlib.import_module("attn_dispatch_flash_attn_cute._support").installed_version()
        is not None
    )


def drift_of(package: str) -> str | None:
    """The shipped table's drift, which ``explain`` notes beside its predictions, checked to
    name each distribution the table requires whose installed release differs from the
    measured one or is not installed (the wording is test_costs')."""
    table = _costs.load(package, "sm_90")
    for dist, measured in table.provenance["requires"].items():
        try:
            same = importlib.metadata.version(dist).split("+")[0] == measured.split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            same = False
        assert (f"measured with {dist} {measured}," in str(table.drift)) != same, table.drift
    return table.drift


@pytest.mark.parametrize(("heads", "kv_heads", "seqlen", "causal"), SEEDS)
def test_the_shipped_tables_rank_the_seed_shapes_under_the_installed_versions(
    heads, kv_heads, seqlen, causal
) -> None:
    """Whatever versions are installed (this environment's torch and FA4 differ from those
    the tables were measured with), the seed shapes are ranked by a table, and each prediction
    names how the versions drifted."""
    for package in SHIPPED:
        pytest.importorskip(package)
    if not fa4_installed():
        pytest.skip("flash-attn-4 is not installed: its backend refuses every call")
    q = torch.empty(1, seqlen, heads, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, seqlen, kv_heads, 128, dtype=torch.bfloat16, device="meta")
    out, dout = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(1, heads, seqlen, dtype=torch.float32, device="meta")
    report = ad.explain(q, k, k, out, lse, dout, causal=causal, arch="sm_90")
    chosen = {c.name: c for c in report.candidates}[report.selected]
    assert chosen.predicted_us is not None, str(report)
    predicted = [c for c in report.candidates if c.predicted_us is not None]
    assert {c.name.split(":")[0] for c in predicted} == {p.rstrip(":") for p in SHIPPED.values()}
    for c in predicted:
        package = next(p for p, prefix in SHIPPED.items() if c.name.startswith(prefix))
        drift = drift_of(package)
        assert c.prediction.startswith("cost table: nearest measured")
        assert c.prediction.endswith(f"; {drift}" if drift else ")"), c.prediction


REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def cost_grid(monkeypatch):
    monkeypatch.syspath_prepend(str(REPOSITORY / "benchmarks"))
    return importlib.import_module("cost_grid")


@pytest.mark.parametrize("package", SHIPPED)
def test_a_shipped_table_is_what_its_provenance_command_writes(cost_grid, package) -> None:
    """The command a table names runs from a checkout: its rows file is in the repository,
    and the table writer makes the same rows and ``requires`` (from the implementations'
    ``cost_requires``) from it."""
    pytest.importorskip(package)
    shipped = json.loads((importlib.resources.files(package) / "costs" / "sm_90.json").read_text())
    command = shipped["provenance"]["command"]
    files = command.rpartition("cost_grid.py tables ")[2].split()
    assert files and all((REPOSITORY / f).is_file() for f in files), command
    rows, run = cost_grid.read_rows([str(REPOSITORY / f) for f in files])
    command_now = cost_grid.tables_command([str(REPOSITORY / f) for f in files])
    built = cost_grid.tables(rows, run, command_now)[package]
    assert built["provenance"]["command"] == command
    assert built["provenance"]["requires"] == shipped["provenance"]["requires"]
    assert (built["format"], built["arch"]) == (shipped["format"], shipped["arch"])
    assert built["rows"] == shipped["rows"]
