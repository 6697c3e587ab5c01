"""benchmarks/cost_grid.py on the CPU: the grid, the held-out shapes, reading rows, the table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from attn_dispatch import _costs
from attn_dispatch.tools import grid

spec = importlib.util.spec_from_file_location("cost_grid", Path(__file__).with_name("cost_grid.py"))
cost_grid = importlib.util.module_from_spec(spec)
sys.modules["cost_grid"] = cost_grid  # dataclasses look their module up
spec.loader.exec_module(cost_grid)


def test_the_grid_is_capped_and_the_held_out_shapes_are_not_in_it() -> None:
    points = cost_grid.grid()
    assert len(points) == len(set(points)) > 150
    assert all(p.batch * p.heads * p.seqlen**2 * p.head_dim <= cost_grid.MAX_WORK for p in points)
    assert all(p.window is None or p.window < p.seqlen for p in points)
    labels = {p.label for p in points}
    held = [p for p, _ in cost_grid.HELD_OUT]
    assert len(held) >= 20 and not labels & {p.label for p in held}
    assert len(cost_grid.seed_shapes()) == 20


def test_rows_read_back_and_the_ratio_table_names_the_choice(tmp_path) -> None:
    point = cost_grid.Point(1, 8, 8, 1024, 128, "causal")
    base = dict(label=point.label, kind="backward", status="ok")
    rows = [
        {"provenance": {"gpu": "X", "arch": "sm_90", "versions": {}}},
        dict(base, impl="a:x", eager_us=100.0, graph_us=80.0),
        dict(base, impl="b:y", eager_us=120.0, graph_us=60.0),
        dict(base, impl="c:z", status="disagreed", note="agreed with 0 of 2 others"),
        dict(base, impl="auto", eager_us=101.0, graph_us=66.0, chosen_eager="a:x"),
        dict(base, impl="autotune", eager_us=95.0, graph_us=84.0, chosen_graph="a:x"),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read, run = cost_grid.read_rows([str(path)])
    assert run["arch"] == "sm_90" and len(read) == 5
    table = cost_grid.ratio_table(read, {})
    cells = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    assert cells[3] == "100 µs (a:x)" and cells[6] == "60 µs (b:y)"
    assert cells[4] == "1.000 (a:x; as timed 1.010)"  # auto, eager: the fastest itself
    # autotune under graphs chose a:x, whose own forced time is 80 / 60 of the fastest
    assert cells[8] == "1.333 (a:x; as timed 1.400)"
    assert cells[7] == "- (?; as timed 1.100)"  # auto under graphs named no choice


def test_rows_of_two_runs_name_both_and_must_share_one_stack(tmp_path) -> None:
    run = {"gpu": "A", "commit": "1", "arch": "sm_90", "versions": {"torch": "2.11.0"}}
    row = {"label": "x", "impl": "a:x", "kind": "backward", "status": "ok", "eager_us": 1.0}
    files = []
    for number, changes in enumerate(({}, {"gpu": "B", "commit": "2"}, {"commit": "3"})):
        path = tmp_path / f"{number}.jsonl"
        path.write_text(json.dumps({"provenance": run | changes}) + "\n" + json.dumps(row) + "\n")
        files.append(str(path))
    rows, merged = cost_grid.read_rows(files)
    assert len(rows) == 3 and merged["gpu"] == "A; B" and merged["commit"] == "1; 2; 3"
    assert merged["versions"] == {"torch": "2.11.0"} and merged["arch"] == "sm_90"
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"provenance": run | {"versions": {"torch": "2.13.0"}}}) + "\n")
    with pytest.raises(ValueError, match="differ in versions"):
        cost_grid.read_rows([files[0], str(other)])


def shape(point) -> _costs.Shape:
    s = point.seqlen
    return _costs.Shape(
        point.batch,
        point.heads,
        point.kv_heads,
        s,
        s,
        point.head_dim,
        point.mask,
        point.window,
        point.sinks,
        point.softcap,
    )


def test_the_default_grid_covers_every_seed_shape() -> None:
    measured = [shape(p) for p in grid.default_grid()]
    for seed in cost_grid.seed_shapes():
        nearest = min(_costs.distance(shape(seed), m) for m in measured)
        assert nearest <= _costs.COVERAGE, seed.label


def test_a_tensor_parallel_shard_lies_within_the_grid_s_coverage() -> None:
    # Llama-3-70B at 8 ranks: one KV head per rank, a layout no 8-KV-head point covers; the
    # shard layout (1, 16/2) is 2.0 away (batch 1, heads 1), at the coverage's limit
    shard = shape(cost_grid.Point(2, 8, 1, 4096, 128, "causal"))
    without = [shape(p) for p in cost_grid.grid() if p not in grid.shard_points()]
    assert min(_costs.distance(shard, m) for m in without) > _costs.COVERAGE
    nearest = min(_costs.distance(shard, shape(p)) for p in grid.shard_points())
    assert nearest <= _costs.COVERAGE


def test_a_run_skips_its_first_points_before_taking_its_shard() -> None:
    points = cost_grid.grid()
    rest = points[180:]
    shards = [cost_grid.selected(points, i, 3, 180) for i in range(3)]
    assert sorted(map(points.index, sum(shards, []))) == list(range(180, len(points)))
    assert shards[0][:2] == [rest[0], rest[3]]
    assert cost_grid.selected(points, 0, 1, 0) == points


@pytest.mark.parametrize("tuned", [True, False])
def test_the_evaluation_times_the_autotuned_choice_unless_told_not_to(monkeypatch, tuned) -> None:
    """``evaluate --without-autotune``: the default choice's rows alone (a run that must not
    start autotune's measurements still times the default at every shape)."""
    timed = []

    def timer(fn):
        fn()
        timed.append(fn)
        return 1.0

    monkeypatch.setattr(cost_grid, "time_eager", timer)
    monkeypatch.setattr(cost_grid, "time_graph", timer)
    point = grid.quick_grid()[0]
    rows = cost_grid.auto_rows(point, "backward", grid.make(point, "cpu"), tuned=tuned)
    assert [r["impl"] for r in rows] == (["auto", "autotune"] if tuned else ["auto"])
    assert all(r["status"] == "ok" and r["eager_us"] == r["graph_us"] == 1.0 for r in rows)
    assert len(timed) == 2 * len(rows)


def test_a_tables_command_repeats_each_run_s_own_measure_arguments(tmp_path) -> None:
    recorded = "python benchmarks/cost_grid.py measure --shard 1/2 --skip 196 --out /tmp/x.jsonl"
    ran = tmp_path / "ran.jsonl"
    ran.write_text(json.dumps({"provenance": {"command": recorded}}) + "\n")
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"label": "x"}) + "\n")
    joined = tmp_path / "joined.jsonl"
    recorded = "python benchmarks/cost_grid.py measure --out=/tmp/x.jsonl --skip 3"
    joined.write_text(json.dumps({"provenance": {"command": recorded}}) + "\n")
    command = cost_grid.tables_command([str(ran), str(bare), str(joined)])
    ran_name, bare_name, joined_name = (
        cost_grid.in_repository(str(p)) for p in (ran, bare, joined)
    )
    assert command.split("; ") == [
        f"python benchmarks/cost_grid.py measure --shard 1/2 --skip 196 --out {ran_name}",
        f"python benchmarks/cost_grid.py measure --out {bare_name}",
        f"python benchmarks/cost_grid.py measure --skip 3 --out {joined_name}",
        f"python benchmarks/cost_grid.py tables {ran_name} {bare_name} {joined_name}",
    ]
