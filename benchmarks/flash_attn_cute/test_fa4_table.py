"""``fa4_table.py``: FA4's standing and the 2 % rule per shape, from a bench JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fa4_table  # noqa: E402


def row(shape: str, impl: str, kind: str, us: float | None) -> dict:
    return {"shape": shape, "impl": impl, "kind": kind, "us": us}


def write(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"environment": {"timing": "eager"}, "rows": rows}))
    return str(path)


def test_within_and_missed_shapes(tmp_path: Path, capsys) -> None:
    rows = [
        row("A", "flash_attn_cute:sm90", "forced", 100.0),
        row("A", "triton:fused_atomic", "forced", 110.0),
        row("A", "flash_attn_cute:sm90", "auto", 101.5),  # 1.5 % behind: within
        row("B", "flash_attn_cute:sm90", "forced", 222.0),
        row("B", "triton:fused_atomic", "forced", 205.0),
        row("B", "flash_attn_cute:sm90", "auto", 221.0),  # 7.8 % behind: a miss
        row("B", "torch_sdpa:cudnn", "forced", None),  # rejected rows carry no time
        row("C", "torch_sdpa:cudnn", "forced", 50.0),  # no FA4 row, no automatic row
    ]
    lines, misses = fa4_table.summarize(write(tmp_path, rows), within=0.02)
    assert misses == 2
    by_shape = {line.split()[0]: line for line in lines[2:]}
    assert by_shape["A"].endswith("ok") and " 1.015" in by_shape["A"]
    assert "MISS (> 2%)" in by_shape["B"] and "1.083" in by_shape["B"]  # FA4 / best
    assert by_shape["C"].endswith("no automatic choice")
    assert fa4_table.main([write(tmp_path, rows)]) == 1
    assert "more than 2% behind: 2" in capsys.readouterr().out


def test_all_within_exits_zero(tmp_path: Path) -> None:
    rows = [
        row("A", "torch_sdpa:cudnn", "forced", 100.0),
        row("A", "flash_attn_cute:sm90", "forced", 101.0),
        row("A", "torch_sdpa:cudnn", "auto", 100.4),
    ]
    assert fa4_table.main([write(tmp_path, rows)]) == 0
