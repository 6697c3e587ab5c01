"""Recorded cost tables (attn_dispatch._costs): the model, and automatic selection ranking the
measured implementations by predicted time, on plugins written for each test."""

from __future__ import annotations

import importlib.metadata
import json
import math
import sys
import textwrap

import pytest
import torch
from dispatch_helpers import make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import _costs
from attn_dispatch import backend as adb

GRID = dict(batch=1, heads=8, kv_heads=8, seqlen_q=512, seqlen_k=512, head_dim=64)


def shape(**changes) -> _costs.Shape:
    fields = dict(GRID, mask="causal") | changes
    return _costs.Shape(**fields)


def row(impl, eager, graph=None, kind="backward", **changes) -> dict:
    data = dict(GRID, mask="causal", impl=impl, kind=kind, eager_us=eager)
    return data | ({"graph_us": graph} if graph else {}) | changes


# quick: fastest eager at the measured points; steady: fastest under graphs; plain: no rows.
# They name no ``cost_tables``: their own package's costs/ folder is where tables are by default.
COSTED = """
class Quick(Tagged):
    name, tag, priority = "quick", 1.0, {"*": 50}


class Steady(Tagged):
    name, tag, priority = "steady", 2.0, {"*": 40}


class Plain(Tagged):
    name, tag, priority = "plain", 3.0, {"*": PLAIN_PRIORITY}
"""


@pytest.fixture
def costed(plugins, env, tmp_path):
    """A backend ``costed`` whose table (arch ``cpu``) is ``write(rows)``'s; ``plain``'s
    priority is ``write``'s ``plain`` argument."""
    from dispatch_helpers import TAGGED

    def write(rows, plain=10, arch="cpu", text=None):
        package = tmp_path / "rel_costed"
        (package / "costs").mkdir(parents=True, exist_ok=True)
        body = TAGGED.format(backend="costed") + textwrap.dedent(COSTED)
        body = body.replace("PLAIN_PRIORITY", str(plain))
        hook = "\n\n@adb.hookimpl\ndef attn_dispatch_implementations():\n"
        body += hook + "    return [Quick(), Steady(), Plain(), Fallback()]\n"
        (package / "__init__.py").write_text(body)
        table = {"format": _costs.FORMAT, "arch": arch, "rows": rows}
        table = text if text is not None else json.dumps(table)
        path = package / "costs" / f"{arch}.json"
        path.write_bytes(table if isinstance(table, bytes) else table.encode())
        _costs.load.cache_clear()
        sys.modules.pop("rel_costed", None)  # written anew: import it anew
        plugins.modules.append("rel_costed")
        if not (tmp_path / "rel-costed-0.1.dist-info").exists():
            plugins.add("rel-costed", {"costed": "rel_costed"}, {})
        env.set(ATTN_DISPATCH_PLUGINS="costed,reference")

    yield write
    _costs.load.cache_clear()


def run(**flags) -> float:
    return tag_of(ad.backward(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True, **flags))


def test_the_measured_faster_implementation_wins_over_a_higher_priority(costed) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    assert run() == 2.0  # steady: priority 40 < quick's 50, but predicted faster
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    assert report.selected == "costed:steady"
    predicted = {c.name: c.predicted_us for c in report.candidates}
    assert predicted["costed:quick"] == pytest.approx(90.0)
    assert predicted["costed:plain"] is None
    text = str(report)
    assert "the fastest the recorded cost table predicts" in text
    assert "nearest measured B=1 H=8/8 S=512 D=64 causal (distance 0.00)" in text


def test_the_text_report_shows_predictions_in_their_own_column(costed) -> None:
    """A prediction's source (or why a table was not used) is no reason: the selected row's
    reasons cell stays empty."""
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    header, *lines = str(report).split("implementation", 1)[1].splitlines()
    assert header.split() == ["priority", "predicted", "status", "prediction", "reasons"]
    selected = next(line for line in lines if line.startswith("costed:steady"))
    source = {c.name: c.prediction for c in report.candidates}["costed:steady"]
    assert selected.endswith(source), selected  # the prediction column, the reasons empty
    assert selected.index(source) == ("implementation" + header).index("prediction")


def test_each_execution_mode_ranks_by_its_own_times(costed) -> None:
    costed([row("costed:quick", 50.0, graph=80.0), row("costed:steady", 60.0, graph=40.0)])
    args = make_inputs(b=1, sq=512, h=8, hkv=8, d=64)
    assert ad.explain(*args, causal=True, execution="eager").selected == "costed:quick"
    assert ad.explain(*args, causal=True, execution="graph").selected == "costed:steady"


def test_outside_the_measured_region_priority_decides(costed) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    assert run() == 2.0
    # not causal: no row of that mask class
    q, k, v, out, lse, dout = make_inputs(b=1, sq=512, h=8, hkv=8, d=64)
    assert tag_of(ad.backward(q, k, v, out, lse, dout)) == 1.0
    # 16x shorter and 4x the head dim: a distance of 6, beyond the coverage
    report = ad.explain(*make_inputs(b=1, sq=32, h=8, hkv=8, d=256), causal=True)
    assert report.selected == "costed:quick"
    assert all(c.predicted_us is None for c in report.candidates)


def test_an_unmeasured_implementation_keeps_its_place_by_priority(costed) -> None:
    rows = [row("costed:quick", 90.0), row("costed:steady", 60.0)]
    costed(rows, plain=45)  # between the two measured ones: below their slot (50)
    assert run() == 2.0
    costed(rows, plain=55)  # above every measured one
    assert run() == 3.0


def test_the_nearest_rows_predict_scaled_by_work_and_ties_average(costed) -> None:
    table = _costs.parse(
        json.dumps(
            {
                "format": 1,
                "arch": "cpu",
                "rows": [
                    row("x:y", 100.0, seqlen_q=1024, seqlen_k=1024),
                    row("x:y", 500.0, seqlen_q=4096, seqlen_k=4096),
                ],
            }
        ),
        "test",
    )
    # exactly between the two (distance 2 from each in log2 length): their times per unit of
    # work averaged, times this call's work
    call = shape(seqlen_q=2048, seqlen_k=2048)
    p = table.predict("x:y", "backward", "eager", call)
    per_work = (100.0 / _costs.work(shape(seqlen_q=1024, seqlen_k=1024))) + (
        500.0 / _costs.work(shape(seqlen_q=4096, seqlen_k=4096))
    )
    assert p.us == pytest.approx(per_work / 2 * _costs.work(call))
    assert p.distance == pytest.approx(2.0) and len(p.nearest) == 2
    assert table.predict("x:y", "forward", "eager", call) is None
    assert table.predict("x:y", "backward", "graph", call) is None
    assert table.predict("x:y", "backward", "eager", shape(seqlen_q=8192, seqlen_k=256)) is None


def test_distance_matches_mask_sinks_and_softcap_exactly() -> None:
    a = shape()
    assert _costs.distance(a, a) == 0
    assert _costs.distance(a, shape(heads=16, kv_heads=16)) == pytest.approx(1.0)
    assert _costs.distance(a, shape(heads=8, kv_heads=1)) == pytest.approx(3.0)
    for other in (shape(mask="none"), shape(sinks=True), shape(softcap=True), shape(varlen=True)):
        assert _costs.distance(a, other) == math.inf
    w = shape(mask="window", window=128)
    assert _costs.distance(w, shape(mask="window", window=512)) == pytest.approx(2.0)
    assert _costs.distance(w, a) == math.inf


def test_rows_of_a_quarter_of_the_heads_do_not_cover_a_call() -> None:
    # 8/8-head rows said nothing of a 32/32-head call at D=96 (their fastest kernel was 2.9x
    # slower there): 4x the heads alone is at the coverage's edge, and any other difference
    # takes the call outside it
    table = _costs.parse(
        json.dumps({"format": 1, "arch": "cpu", "rows": [row("x:y", 100.0, head_dim=128)]}),
        "test",
    )
    near = shape(heads=32, kv_heads=32, head_dim=128)
    assert table.predict("x:y", "backward", "eager", near).distance == pytest.approx(2.0)
    assert (
        table.predict("x:y", "backward", "eager", shape(heads=32, kv_heads=32, head_dim=96)) is None
    )


def test_mask_classes_and_work() -> None:
    assert _costs.mask_of(None, None) == ("none", None)
    assert _costs.mask_of(None, 0) == ("causal", None)
    assert _costs.mask_of(127, 0) == ("window", 128)
    assert _costs.mask_of(3, None) == ("window", None)
    full = _costs.work(shape(mask="none"))
    assert _costs.work(shape()) == pytest.approx(full * (513 / 2 / 512))
    assert _costs.work(shape(mask="window", window=128)) == pytest.approx(full / 4)


def explain_packed(docs: int, length: int, device: str = "cpu", cu=None) -> ad.Report:
    """``explain`` of a causal forward of ``docs`` packed sequences of ``length`` tokens (or
    of the sequences ``cu`` delimits in as many tokens)."""
    q, k, v = (torch.randn(docs * length, 8, 64, device=device) for _ in range(3))
    longest = length
    if cu is None:
        cu = torch.arange(0, docs * length + 1, length, dtype=torch.int32, device=device)
    else:
        longest = int(cu.diff().max())
    packed = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    return ad.explain(q, k, v, causal=True, arch="cpu", **packed)


def test_only_rows_of_packed_sequences_rank_a_varlen_call(costed) -> None:
    """A varlen call is its sequences at their mean length, and only rows measured on packed
    sequences predict it (its kernels are not the dense ones): dense rows leave it to the
    priorities, and packed rows say nothing of a dense call."""
    dense = [row("costed:quick", 90.0), row("costed:steady", 60.0, kind="forward")]
    costed(dense)
    assert explain_packed(1, 512).selected == "costed:quick"  # by priority
    packed = [
        row("costed:quick", 90.0, kind="forward", batch=4, varlen=True),
        row("costed:steady", 60.0, kind="forward", batch=4, varlen=True),
    ]
    costed(packed)
    report = explain_packed(4, 512)
    assert report.selected == "costed:steady"
    steady = next(c for c in report.candidates if c.name == "costed:steady")
    assert steady.predicted_us == pytest.approx(60.0)
    assert "nearest measured B=4 H=8/8 S=512 D=64 causal varlen (distance 0.00)" in str(report)
    # twice the sequences: twice the work, within the coverage (distance 1)
    twice = next(c for c in explain_packed(8, 512).candidates if c.name == "costed:steady")
    assert twice.predicted_us == pytest.approx(120.0)
    # sequences of other lengths in as many tokens: the same mean length, the same prediction
    uneven = torch.tensor([0, 100, 612, 1500, 2048], dtype=torch.int32)
    other = next(c for c in explain_packed(4, 512, cu=uneven).candidates if c.name == steady.name)
    assert other.predicted_us == pytest.approx(60.0)
    q, k, v = make_inputs(b=4, sq=512, h=8, hkv=8, d=64)[:3]
    assert ad.explain(q, k, v, causal=True).selected == "costed:quick"  # dense: by priority
    meta = explain_packed(4, 512, device="meta")
    assert [(c.name, c.predicted_us) for c in meta.candidates] == [
        (c.name, c.predicted_us) for c in report.candidates
    ]


def test_meta_tensors_predict_what_the_same_call_on_the_device_does(costed) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    for dims in (dict(sq=512, d=64), dict(sq=700, d=48), dict(sq=32, d=256)):
        real = make_inputs(b=1, h=8, hkv=8, **dims)
        meta = [t.to("meta") for t in real]
        on_device = ad.explain(*real, causal=True)
        on_meta = ad.explain(*meta, causal=True, arch="cpu")
        assert on_meta.selected == on_device.selected, dims
        predicted = [(c.name, c.predicted_us) for c in on_device.candidates]
        assert [(c.name, c.predicted_us) for c in on_meta.candidates] == predicted


def statuses(report) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {c.name: (c.status, c.reasons) for c in report.candidates}


MALFORMED_TABLES = {
    "a row naming no implementation": json.dumps(
        {"format": 1, "arch": "cpu", "rows": [{"kind": "backward"}]}
    ),
    "requires as a list": json.dumps(
        {"format": 1, "arch": "cpu", "provenance": {"requires": ["torch"]}, "rows": []}
    ),
    "requires naming no distribution": json.dumps(
        {"format": 1, "arch": "cpu", "provenance": {"requires": {"": "1"}}, "rows": []}
    ),
    "not UTF-8": b'{"format": 1, "arch": "cpu", "rows": [], "provenance": {"gpu": "\xff\xfe"}}',
    "nested too deeply": '{"format": 1, "arch": "cpu", "rows": [], "provenance": ' + "[" * 100_000,
    "not an object": "[]",
    "rows not a list": '{"format": 1, "arch": "cpu", "rows": {}}',
    "an unknown field": '{"format": 1, "arch": "cpu", "rows": [], "costs": []}',
    "no format": '{"arch": "cpu", "rows": []}',
    "a format as text": '{"format": "1", "arch": "cpu", "rows": []}',
    "a newer format": json.dumps({"format": _costs.FORMAT + 1, "arch": "cpu", "rows": []}),
}


@pytest.mark.parametrize("text", MALFORMED_TABLES.values(), ids=MALFORMED_TABLES)
def test_a_malformed_table_fails_only_its_implementations(costed, text) -> None:
    costed([], text=text)
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    status = statuses(report)
    for name in ("costed:quick", "costed:steady", "costed:plain", "costed:fallback"):
        assert status[name][0] == "failed"  # each reads its package's table
        assert "cost table rel_costed/costs/cpu.json is malformed" in status[name][1][0]
    assert report.selected == "reference:chunked"  # another backend; nothing silent


BAD_ROWS = {
    "batch 0": (dict(batch=0), "batch 0 is not a positive integer"),
    "negative head dim": (dict(head_dim=-64), "head_dim -64 is not a positive integer"),
    "no keys": (dict(seqlen_k=0), "seqlen_k 0 is not a positive integer"),
    "length as text": (dict(seqlen_q="512"), "seqlen_q '512' is not a positive integer"),
    "NaN time": (dict(eager_us=math.nan), "eager_us nan is not a positive time of at most"),
    "negative time": (dict(eager_us=-5.0), "eager_us -5.0 is not a positive time of at most"),
    "infinite time": (dict(eager_us=math.inf), "eager_us inf is not a positive time of at most"),
    # beyond float's range, or so long that a larger call's prediction would overflow
    "huge integer time": (dict(eager_us=10**400), "is not a positive time of at most 1e+09"),
    "huge time": (dict(eager_us=1e308), "eager_us 1e+308 is not a positive time of at most"),
    "no time": (dict(eager_us=None), "no time (eager_us or graph_us)"),
    "unknown kind": (dict(kind="both"), "kind 'both' is not one of"),
    "unknown mask": (dict(mask="full"), "mask 'full' is not one of"),
    "window off a window mask": (dict(window=128), "window 128 with mask 'causal'"),
    "sinks as text": (dict(sinks="no"), "sinks 'no' is not true or false"),
    "varlen as a number": (dict(varlen=1), "varlen 1 is not true or false"),
    "a misspelt field": (dict(eager_ms=3.0), "unknown fields ['eager_ms']"),
}


@pytest.mark.parametrize(("change", "reason"), BAD_ROWS.values(), ids=BAD_ROWS)
def test_a_bad_row_fails_only_its_implementation(costed, change, reason) -> None:
    # quick's bad row was measured fastest (or would rank first as a NaN or a negative time)
    costed([row("costed:quick", 20.0, **change), row("costed:steady", 60.0)])
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    status, reasons = statuses(report)["costed:quick"]
    assert status == "failed"
    assert reasons[0].startswith("cost table rel_costed/costs/cpu.json is malformed: row 0: ")
    assert reason in reasons[0]
    assert report.selected == "costed:steady"
    assert {c.name: c.predicted_us for c in report.candidates}["costed:steady"] == 60.0
    assert run() == 2.0


def test_an_empty_call_is_outside_every_table(costed) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    for dims in (dict(b=0), dict(sq=0)):
        args = make_inputs(**(dict(b=1, sq=512, h=8, hkv=8, d=64) | dims))
        report = ad.explain(*args, causal=True)
        assert report.selected == "costed:quick", dims  # by priority: no work to predict
        assert all(c.predicted_us is None for c in report.candidates)
    grads = ad.backward(*make_inputs(b=0, sq=512, h=8, hkv=8, d=64), causal=True)
    assert grads.dq.shape == (0, 512, 8, 64)


def test_a_newer_format_is_refused_with_a_reason(costed) -> None:
    newer = _costs.FORMAT + 1
    costed([], text=json.dumps({"format": newer, "arch": "cpu", "rows": [], "v3": {}}))
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    reason = statuses(report)["costed:quick"][1][0]
    assert f"format {newer} is newer than this attn_dispatch reads ({_costs.FORMAT})" in reason


def test_a_table_of_the_first_format_is_read() -> None:
    text = json.dumps({"format": 1, "arch": "cpu", "rows": [row("costed:quick", 90.0)]})
    assert _costs.parse(text, "t").rows[0].us == {"eager": 90.0}


def attention_step(**flags) -> float:
    """The tag of the implementation whose output one eager ``attention`` call returned, after
    its backward checked that the same one made the gradients."""
    q, k, v = (t.requires_grad_() for t in make_inputs(b=1, sq=512, h=8, hkv=8, d=64)[:3])
    if flags.get("layout") == "bhsd":
        q, k, v = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    out = ad.attention(q, k, v, causal=True, **flags)
    out.backward(torch.ones_like(out))
    assert tag_of((q.grad,)) == tag_of((out,))
    return tag_of((out,))


# quick's passes are faster, steady's call through attention is (its node costs less)
PASSES = [
    row("costed:quick", 20.0, kind="forward"),
    row("costed:quick", 50.0),
    row("costed:steady", 30.0, kind="forward"),
    row("costed:steady", 60.0),
]


def test_an_eager_attention_call_is_ranked_by_its_attention_rows(costed) -> None:
    costed(
        [*PASSES, row("costed:quick", 300.0, kind="attention_bshd")]
        + [row("costed:steady", 100.0, kind="attention_bshd")]
    )
    assert attention_step() == 2.0  # steady, both passes
    assert attention_step(layout="bhsd") == 1.0  # no rows of that layout: the pass rows
    assert run() == 1.0  # a plain backward: its pass rows
    with ad.execution_mode("graph"):  # no attention row times a captured call
        assert attention_step() == 1.0
    args = make_inputs(b=1, sq=512, h=8, hkv=8, d=64)
    assert ad.explain(*args, causal=True).selected == "costed:quick"
    report = ad.explain(*args, causal=True, attention="bshd")  # explained as the call ran
    assert report.selected == "costed:steady"
    assert "attention_bshd rows: nearest measured" in str(report)
    assert ad.explain(*args, causal=True, attention="bhsd").selected == "costed:quick"
    with pytest.raises(ValueError, match="argument 'attention': expected None or one of"):
        ad.explain(*args, causal=True, attention="thd")


def test_attention_rows_rank_only_where_they_cover_every_measured_candidate(costed) -> None:
    costed([*PASSES, row("costed:steady", 100.0, kind="attention_bshd")])
    assert attention_step() == 1.0  # quick has none: both ranked by their pass rows
    far = dict(seqlen_q=4096, seqlen_k=4096)  # steady's attention row covers no 512 call
    costed(
        [*PASSES, row("costed:steady", 100.0, kind="attention_bshd", **far)]
        + [row("costed:quick", 300.0, kind="attention_bshd", **far)]
    )
    assert attention_step() == 1.0


def test_an_attention_prediction_names_its_rows() -> None:
    rows = [row("x:y", 5.0, kind="attention_bshd")]
    text = json.dumps({"format": 2, "arch": "cpu", "rows": rows})
    found = _costs.parse(text, "t").predict("x:y", "attention_bshd", "eager", shape())
    assert found.us == 5.0
    assert found.source.startswith("cost table, attention_bshd rows: nearest measured B=1 ")
    assert _costs.parse(text, "t").predict("x:y", "attention_bhsd", "eager", shape()) is None
    assert _costs.parse(text, "t").predict("x:y", "backward", "eager", shape()) is None


class Lone(adb.Implementation):
    """An implementation in a lone module (this test file): no package, so no costs/."""

    backend, name = "lone", "lone"


class Elsewhere(Lone):
    cost_tables = "rel_costed"


def test_tables_are_found_in_the_implementations_own_package(costed) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    tables = {i.name: i.cost_tables for b in ad.backends() for i in b.implementations}
    assert tables["costed:quick"] == tables["costed:plain"] == "rel_costed"
    assert tables["reference:chunked"] is None  # a package without a costs/ folder
    assert _costs.tables_of(Lone()) is None
    assert _costs.tables_of(Elsewhere()) == "rel_costed"  # named: another package's costs/
    assert run() == 2.0


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ("cost_requires = 'torch'", "cost_requires='torch' must be a collection of distribution"),
        ("cost_requires = None", "cost_requires=None must be a collection of distribution"),
        ("cost_tables = ''", "cost_tables='' must be None or a non-empty str"),
    ],
)
def test_a_bad_cost_declaration_fails_its_plugin(plugins, env, declaration, problem) -> None:
    body = f"class Bad(Tagged):\n    name, priority = 'bad', {{'*': 9}}\n    {declaration}\n"
    plugins.backend("badcost", body, "[Bad()]")
    with pytest.warns(UserWarning, match=problem):
        env.set(ATTN_DISPATCH_PLUGINS="badcost,reference")
    assert ad.explain(*make_inputs()).selected == "reference:chunked"


def test_a_table_for_another_arch_is_refused(costed) -> None:
    costed([row("costed:quick", 90.0)], text=json.dumps({"format": 1, "arch": "sm_90", "rows": []}))
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    reasons = {c.name: c.reasons for c in report.candidates}
    assert "says arch 'sm_90'" in reasons["costed:quick"][0]


def test_forcing_ignores_the_table(costed) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    assert run(backend="costed:quick") == 1.0


@pytest.mark.parametrize("measured", ["1.0.0", "99.0.0", "+cu999"])
def test_a_table_measured_with_other_versions_still_ranks_and_names_the_drift(
    costed, measured
) -> None:
    installed = importlib.metadata.version("torch")
    if measured.startswith("+"):  # the same release with another local label: no drift
        measured = installed.split("+")[0] + measured
    provenance = {"requires": {"torch": measured}}
    rows = [row("costed:quick", 90.0), row("costed:steady", 60.0)]
    costed(
        [], text=json.dumps({"format": 1, "arch": "cpu", "provenance": provenance, "rows": rows})
    )
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    assert report.selected == "costed:steady"  # ranked by the table, not by priority
    note = {c.name: c.prediction for c in report.candidates}["costed:steady"]
    assert note.startswith("cost table: nearest measured B=1 H=8/8 S=512 D=64 causal")
    drift = f"measured with torch {measured}, installed {installed}"
    assert note.endswith("; " + drift) == (not measured.endswith("+cu999")), note
    assert run() == 2.0


def test_a_table_needing_a_distribution_not_installed_still_ranks(costed) -> None:
    provenance = {"requires": {"attn-dispatch-no-such-kernels": "1.0"}}
    rows = [row("costed:quick", 90.0), row("costed:steady", 60.0)]
    costed(
        [], text=json.dumps({"format": 1, "arch": "cpu", "provenance": provenance, "rows": rows})
    )
    report = ad.explain(*make_inputs(b=1, sq=512, h=8, hkv=8, d=64), causal=True)
    assert report.selected == "costed:steady"
    assert "measured with attn-dispatch-no-such-kernels 1.0, not installed" in str(report)


def test_reload_reads_a_changed_table(costed, tmp_path) -> None:
    costed([row("costed:quick", 90.0), row("costed:steady", 60.0)])
    assert run() == 2.0
    table = {
        "format": 1,
        "arch": "cpu",
        "rows": [row("costed:quick", 50.0), row("costed:steady", 60.0)],
    }
    (tmp_path / "rel_costed" / "costs" / "cpu.json").write_text(json.dumps(table))
    ad.reload()
    assert run() == 1.0
