"""``attn-dispatch tune --grid``: the user's own cost tables, measured on this device with the
installed versions, written into the cache directory, resumed, and ranking in the place of
the shipped ones (attn_dispatch._costs)."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
from dispatch_helpers import COSTED, TAGGED, make_inputs

import attn_dispatch as ad
from attn_dispatch import _costs, _settings
from attn_dispatch.tools import cli, grid

GRID = ["tune", "--grid", "--device", "cpu", "--quick"]
# A backend whose answers are its tag: it disagrees with the exact ones and is left out.
LIAR = TAGGED.format(backend="liar") + textwrap.dedent(
    """
    class Liar(Tagged):
        name, tag, priority = "tagged", 1.0, {"*": 5}
        window = True


    @adb.hookimpl
    def attn_dispatch_implementations():
        return [Liar()]
    """
)


# A backend whose forward reports a device fault, as a kernel's illegal memory access does.
FAULTING = TAGGED.format(backend="faulting") + textwrap.dedent(
    """
    class Faulting(Tagged):
        name, tag, priority = "faulting", 1.0, {"*": 5}
        window = True

        def forward(self, inp):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


    @adb.hookimpl
    def attn_dispatch_implementations():
        return [Faulting()]
    """
)


@pytest.fixture
def measured(env, plugins, tmp_path):
    """The exact oracle, the reference backend and a liar, with the cache in ``tmp_path``."""
    plugins.add("liar-backend", {"liar": "liar_backend"}, {"liar_backend": LIAR})
    env.set(
        ATTN_DISPATCH_TEST_PLUGINS="1",
        ATTN_DISPATCH_PLUGINS="exact,reference,liar",
        ATTN_DISPATCH_CACHE_DIR=str(tmp_path / "cache"),
    )
    yield tmp_path / "cache"
    _costs.clear()


def user_path(package: str) -> Path:
    """Where ``tune --grid`` writes the user's table of ``package`` on the CPU."""
    return _costs.user_path(_settings.costs_directory(), package, "cpu")


def progress(capsys) -> list[str]:
    return progress_of(capsys.readouterr().err.splitlines())


def progress_of(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("[")]


def test_tune_grid_writes_a_table_per_backend_package_with_provenance(measured, capsys) -> None:
    assert cli.main(GRID) == 0
    lines = progress(capsys)
    points = grid.quick_grid()
    assert len(lines) == len(points)
    assert lines[0].startswith(f"[1/{len(points)}] {points[0].label}: forward fastest ")
    assert "µs" in lines[0]
    exact = user_path("attn_dispatch_test_plugins")
    assert exact.parent == measured / "costs" / "cpu"
    table = _costs.parse(exact.read_bytes(), str(exact))
    assert {r.impl for r in table.rows} == {"exact:oracle"}
    assert {r.kind for r in table.rows} == set(_costs.ROW_KINDS)
    assert all(set(r.us) == {"eager"} for r in table.rows)  # no CUDA graphs on a CPU
    assert "; attention_bhsd fastest " in lines[0]
    info = table.provenance
    assert info["command"] == "attn-dispatch tune --grid --device cpu --quick"
    assert info["device"] and info["versions"]["torch"] and info["arch"] == "cpu"
    assert user_path("attn_dispatch_reference").is_file()
    # the liar's answers disagree with the others: measured, excluded, in no table
    (run,) = (measured / "costs" / "runs").iterdir()
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    assert {r["status"] for r in rows if r["impl"] == "liar:tagged"} == {"disagreed"}
    assert not user_path("liar_backend").exists()


@pytest.mark.parametrize(
    ("priority", "ran"),
    [
        (0, "faulting:faulting's forward"),
        # the default choice, which makes the point's out and lse
        (5, "the default choice's forward (which makes the point's out and lse)"),
    ],
    ids=["a candidate", "the default choice"],
)
def test_a_device_fault_stops_tune_grid_naming_the_point_and_implementation(
    env, plugins, tmp_path, capsys, priority, ran
) -> None:
    """After a device fault nothing more can run: the run stops (exit 1) at that point, naming
    it and the implementation, keeps the points before it and writes no table."""
    source = FAULTING.replace('{"*": 5}', f'{{"*": {priority}}}')
    plugins.add("faulting-backend", {"faulting": "faulting_backend"}, {"faulting_backend": source})
    env.set(
        ATTN_DISPATCH_TEST_PLUGINS="1",
        ATTN_DISPATCH_PLUGINS="exact,faulting",
        ATTN_DISPATCH_CACHE_DIR=str(tmp_path / "cache"),
    )
    assert cli.main(GRID) == 1
    (err,) = [line for line in capsys.readouterr().err.splitlines() if "faulted" in line]
    first = grid.quick_grid()[0].label
    assert err.startswith(
        f"attn-dispatch tune: {first}: the device faulted while {ran} ran: RuntimeError: CUDA "
        "error: an illegal memory access was encountered"
    ), err
    assert "faulting:faulting" in err.split(" ran: ")[1] or priority == 0, err
    assert "; the points before are kept in " in err
    assert not user_path("attn_dispatch_test_plugins").exists()
    _costs.clear()


def test_a_second_run_measures_nothing_new(measured, capsys) -> None:
    assert cli.main(GRID) == 0
    capsys.readouterr()
    (run,) = (measured / "costs" / "runs").iterdir()
    before = run.read_text()
    assert cli.main(GRID) == 0
    lines = progress(capsys)
    assert lines and all(line.endswith(": measured before") for line in lines)
    assert run.read_text() == before
    assert user_path("attn_dispatch_test_plugins").is_file()


def test_explain_names_the_user_table_that_ranked_the_call(measured, capsys) -> None:
    assert cli.main(GRID) == 0
    ad.reload()
    point = grid.quick_grid()[1]  # causal
    args = make_inputs(b=1, sq=point.seqlen, h=point.heads, hkv=point.kv_heads, d=point.head_dim)
    report = ad.explain(*args, causal=True)
    by = {c.name: c for c in report.candidates}
    path = user_path("attn_dispatch_test_plugins")
    assert by["exact:oracle"].prediction.startswith(f"user cost table {path}: nearest measured")
    assert by["exact:oracle"].predicted_us is not None
    assert str(path) in str(report)
    assert by["liar:tagged"].predicted_us is None  # excluded: ranked by its priority


def test_tune_grid_takes_no_shapes_and_quick_or_full_needs_grid(measured, capsys) -> None:
    assert cli.main([*GRID, "--shape", "1,64,4,2,32"]) == 2
    assert "--grid measures the grid's points" in capsys.readouterr().err
    assert cli.main(["tune", "--quick", "--shape", "1,64,4,2,32"]) == 2
    assert "--quick goes with --grid" in capsys.readouterr().err
    assert cli.main(["tune", "--full", "--shape", "1,64,4,2,32"]) == 2
    assert "--full goes with --grid" in capsys.readouterr().err
    assert cli.main([*GRID, "--full"]) == 2
    assert "not allowed with argument --quick" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    [["--json", "x.json"], ["--causal"], ["--dtype", "f32"], ["--seed", "3"], ["--cuda-graphs"]],
    ids=lambda o: o[0],
)
def test_tune_grid_refuses_the_options_it_would_not_read(measured, capsys, option) -> None:
    assert cli.main([*GRID, *option]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--grid sets its points' flags and writes no JSON: give no {option[0]}")
    assert len(err.splitlines()) == 1 and not (measured / "costs").exists()


@pytest.mark.parametrize("where", ["cache is a file", "tables' folder read-only"])
def test_tune_grid_that_cannot_write_says_so_in_one_line_before_measuring(
    measured, capsys, where
) -> None:
    if where == "cache is a file":
        measured.parent.mkdir(parents=True, exist_ok=True)
        measured.write_text("")
    else:
        tables = measured / "costs" / "cpu"
        tables.mkdir(parents=True)
        tables.chmod(0o500)
    try:
        if where != "cache is a file" and os.access(measured / "costs" / "cpu", os.W_OK):
            pytest.skip("running as a user that writes into read-only folders")
        assert cli.main(GRID) == 2
    finally:
        if where != "cache is a file":
            (measured / "costs" / "cpu").chmod(0o700)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attn-dispatch tune: error: "), err
    assert not progress_of(err)  # nothing measured and then lost


@pytest.mark.parametrize(
    "damage",
    [{"kind": None}, {"eager_us": "fast"}, {"eager_us": -1.0}, {"seqlen": None}],
    ids=["no kind", "time as text", "negative time", "no length"],
)
def test_a_damaged_row_of_the_run_file_is_measured_again_not_written(
    measured, capsys, damage
) -> None:
    assert cli.main(GRID) == 0
    (run,) = (measured / "costs" / "runs").iterdir()
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    first = next(r for r in rows if r["status"] == "ok")
    rows[rows.index(first)] = {k: v for k, v in (first | damage).items() if v is not None}
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert cli.main(GRID) == 0
    again = [line for line in progress(capsys) if not line.endswith(": measured before")]
    assert len(again) == 1 and f"] {first['label']}: " in again[0]
    exact = first["impl"].startswith("exact:")
    package = "attn_dispatch_test_plugins" if exact else "attn_dispatch_reference"
    assert _costs.parse(user_path(package).read_bytes(), "table").rows


def test_tune_grid_prints_its_estimate_first_and_the_time_so_far_per_point(
    measured, capsys
) -> None:
    assert cli.main(GRID) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("cost grid (quick): 3 points on ")
    (run,) = (measured / "costs" / "runs").iterdir()
    rows = len(run.read_text().splitlines())
    # counted on meta tensors before any point runs, it is the number of rows measured
    assert err[1] == f"estimate: 3 points to measure, {rows} rows (an implementation's " + (
        "forward, backward or attention call at a point)"
    )
    assert all(re.search(r" \[\d+ s\]$", line) for line in progress_of(err))
    assert cli.main(GRID) == 0
    assert "estimate: 0 points to measure, 0 rows" in capsys.readouterr().err


# --- the grids ----------------------------------------------------------------------------------


def test_the_default_grid_covers_each_class_in_44_points() -> None:
    points = grid.default_grid()
    assert len(points) == len({p.label for p in points}) == 44
    assert len(grid.grid()) == len({p.label for p in grid.grid()}) == 222
    assert all(p.batch * p.heads * p.seqlen**2 * p.head_dim <= grid.MAX_WORK for p in points)
    assert [p.label for p in points if p.varlen] == ["B=8 H=32/8 S=2048 D=128 causal varlen"]
    assert sum(p.varlen for p in grid.grid()) == 6
    short = [p for p in points if p.seqlen < 1024]
    assert {(p.batch, p.heads, p.kv_heads, p.seqlen) for p in short} == {grid.SHORT}
    assert {(p.head_dim, p.mask) for p in short} == {
        (d, m) for d in (64, 128) for m in ("none", "causal")
    }
    dense = [p for p in points if not (p.sinks or p.softcap or p.varlen) and p not in short]
    for mask in ("none", "causal"):
        of_mask = [p for p in dense if p.mask == mask]
        assert {p.heads // p.kv_heads for p in of_mask} == {1, 4, 8}
        assert {p.head_dim for p in of_mask} == {64, 128}
        assert {p.seqlen for p in of_mask} == {1024, 4096, 16384}
        for group in (1, 4, 8):  # short and long sequences in every GQA group
            lengths = {p.seqlen for p in of_mask if p.heads // p.kv_heads == group}
            assert min(lengths) == 1024 and max(lengths) == 16384
    assert [p.mask for p in dense if p.mask == "window"] == ["window"]
    assert sorted(p.mask for p in points if p.sinks) == ["causal", "window"]
    assert sorted(p.mask for p in points if p.softcap) == ["causal", "window"]


def test_the_default_grid_is_estimated_within_ten_minutes_of_an_h200() -> None:
    default = grid.estimate(grid.default_grid(), "sm_90")
    full = grid.estimate(grid.grid(), "sm_90")
    # the installed GPU backends accept most points: several implementations a point, each
    # measured forward, backward and through attention
    assert default.rows >= 4 * 3 * default.points
    assert default.seconds <= 600 < full.seconds
    assert default.seconds == pytest.approx(
        default.rows * grid.ROW_SECONDS + default.variants * grid.COMPILE_SECONDS
    )


# --- user tables against shipped ones ---------------------------------------------------------

SHAPE = dict(batch=1, heads=8, kv_heads=8, seqlen_q=512, seqlen_k=512, head_dim=64)


def table(*rows: tuple[str, float], **shape: int) -> str:
    """A cpu table of causal backward rows at ``SHAPE`` (``shape`` overriding its sizes)."""
    point = dict(SHAPE, **shape)
    entries = [dict(point, mask="causal", impl=i, kind="backward", eager_us=us) for i, us in rows]
    return json.dumps({"format": 1, "arch": "cpu", "rows": entries})


@pytest.fixture
def shipped(env, plugins, tmp_path):
    """A backend ``costed`` shipping a table (arch ``cpu``) where steady is the faster; the
    cache directory in ``tmp_path``."""
    package = tmp_path / "rel_costed"
    (package / "costs").mkdir(parents=True)
    (package / "__init__.py").write_text(TAGGED.format(backend="costed") + COSTED)
    (package / "costs" / "cpu.json").write_text(
        table(("costed:quick", 90.0), ("costed:steady", 60.0))
    )
    sys.modules.pop("rel_costed", None)
    plugins.modules.append("rel_costed")
    plugins.add("rel-costed", {"costed": "rel_costed"}, {})
    env.set(ATTN_DISPATCH_PLUGINS="costed,reference", ATTN_DISPATCH_CACHE_DIR=str(tmp_path / "c"))
    yield user_path("rel_costed")
    _costs.clear()


def explain(sq: int = 512, d: int = 64) -> dict:
    report = ad.explain(*make_inputs(b=1, sq=sq, h=8, hkv=8, d=d), causal=True)
    return {c.name: c for c in report.candidates} | {"selected": report.selected}


def test_a_user_table_outranks_the_shipped_one_for_its_implementations(shipped) -> None:
    assert explain()["selected"] == "costed:steady"
    shipped.parent.mkdir(parents=True)
    shipped.write_text(table(("costed:quick", 30.0)))
    assert explain()["selected"] == "costed:steady"  # read once: reload re-reads
    ad.reload()
    by = explain()
    assert by["selected"] == "costed:quick"
    assert by["costed:quick"].predicted_us == pytest.approx(30.0)
    assert by["costed:quick"].prediction.startswith(f"user cost table {shipped}:")
    # steady has no user rows: the shipped table still ranks it
    assert by["costed:steady"].predicted_us == pytest.approx(60.0)
    assert by["costed:steady"].prediction.startswith("cost table: nearest measured")


def test_the_shipped_table_ranks_the_calls_a_user_table_does_not_cover(shipped, tmp_path) -> None:
    # the shipped table measured D=256 at 2K (steady the faster); the user's, as a default
    # grid does, only D=128 at 512, too far from a D=256 2K call to predict it
    (tmp_path / "rel_costed" / "costs" / "cpu.json").write_text(
        table(
            ("costed:quick", 90.0),
            ("costed:steady", 60.0),
            seqlen_q=2048,
            seqlen_k=2048,
            head_dim=256,
        )
    )
    shipped.parent.mkdir(parents=True)
    shipped.write_text(table(("costed:quick", 30.0), head_dim=128))
    ad.reload()
    inside = explain(sq=512, d=128)
    assert inside["selected"] == "costed:quick"
    assert inside["costed:quick"].prediction.startswith(f"user cost table {shipped}:")
    outside = explain(sq=2048, d=256)
    assert outside["costed:quick"].predicted_us == pytest.approx(90.0)
    assert outside["costed:quick"].prediction.startswith(
        f"cost table (the user cost table {shipped} does not cover the call): nearest measured"
        " B=1 H=8/8 S=2048 D=256 causal"
    )
    assert outside["costed:steady"].prediction.startswith("cost table: nearest measured")
    assert outside["selected"] == "costed:steady"


def test_a_malformed_user_table_fails_only_its_implementations(shipped) -> None:
    shipped.parent.mkdir(parents=True)
    shipped.write_text("{not json")
    ad.reload()
    by = explain()
    assert by["costed:quick"].status == "failed"
    assert str(shipped) in by["costed:quick"].reasons[0]
    assert by["selected"] == "reference:chunked"
