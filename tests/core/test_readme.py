"""The README's generated priority table matches what the installed backends declare."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ("reference", "torch_sdpa", "triton", "flydsl_rocm")


def test_readme_priority_table_is_current(env):
    missing = [b for b in BACKENDS if importlib.util.find_spec(f"attn_dispatch_{b}") is None]
    if missing:
        pytest.skip(f"backends not installed: {missing} (the table lists all of them)")
    spec = importlib.util.spec_from_file_location(
        "priority_table", ROOT / "scripts" / "priority_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- priority-table:start -->\n") + len("<!-- priority-table:start -->\n")
    end = readme.index("<!-- priority-table:end -->")
    assert readme[start:end].strip() == module.table().strip(), (
        "README priority table is stale: run python scripts/priority_table.py and paste it"
    )
