"""The cost tables the backends ship (attn_dispatch._costs) parse, name their own backend's
implementations, say what they were measured with, and rank as measured at their own rows."""

from __future__ import annotations

import pytest

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
