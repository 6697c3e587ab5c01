"""``attn-dispatch bench`` on the CPU with tiny shapes: sweep, check, table, JSON/CSV."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest
import torch
from dispatch_helpers import TAGGED, tag_of

from attn_dispatch.tools import bench


def _default_shapes(argv: list[str], device: str) -> list[bench.Shape]:
    args = bench.build_parser().parse_args(argv)
    bench.apply_size_defaults(args, torch.device(device))
    return bench.shapes_from(args)


def test_default_sweep_is_the_seed_grid():
    shapes = _default_shapes([], "cuda")
    assert len(shapes) == 20
    assert {(s.heads, s.kv_heads) for s in shapes} == {(64, 8), (8, 8)}
    assert sorted({s.seqlen for s in shapes}) == [1024, 2048, 4096, 8192, 16384]
    assert {s.causal for s in shapes} == {True, False}
    assert all(s.batch == 1 and s.head_dim == 128 and s.dtype == "bf16" for s in shapes)
    only = _default_shapes(["--causal", "--heads", "4"], "cuda")
    assert all(s.causal and s.heads == 4 and s.kv_heads == 4 for s in only)


def test_default_sweep_on_the_cpu_is_cpu_sized():
    """The reference backend alone on a CPU: the seed grid (S up to 16384) would take hours."""
    shapes = _default_shapes([], "cpu")
    assert sorted({s.seqlen for s in shapes}) == [128, 256]
    assert {(s.heads, s.kv_heads, s.head_dim, s.dtype) for s in shapes} == {(4, 4, 64, "fp32")}
    assert len(shapes) == 4
    given = _default_shapes(["--seqlens", "2048", "--dtype", "bf16"], "cpu")
    assert {(s.seqlen, s.dtype, s.heads) for s in given} == {(2048, "bf16", 4)}


def test_cpu_defaults_are_announced_in_one_line(capsys):
    argv = ["--device", "cpu", "--seqlens", "16", "--causal", "--repeats", "2", "--warmup", "1"]
    assert bench.main(argv + ["--no-matmul", "--no-check"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "CPU-sized" in line]
    assert len(notes) == 1, notes
    assert "--heads 4 --head-dim 64 --dtype fp32 " in notes[0] and "--seqlens 16" not in notes[0]
    assert "--seqlens 128,256" not in notes[0]  # the length was given


def test_flops_formula():
    s = bench.Shape(2, 1024, 8, 8, 128, False, "bf16")
    assert s.flops == 10 * 2 * 8 * 1024 * 1024 * 128
    assert bench.Shape(2, 1024, 8, 8, 128, True, "bf16").flops == s.flops / 2


def test_compare_flags_wrong_and_nan():
    ref = tuple(torch.randn(4, 8, dtype=torch.float64) for _ in range(3))
    good = tuple(r.float() for r in ref)
    assert bench.compare(good, ref)[1] < 1e-6
    bad = (ref[0] * 1.1, ref[1], ref[2])
    assert bench.compare(bad, ref)[1] > 0.05
    nan = (ref[0].clone().fill_(float("nan")), ref[1], ref[2])
    assert bench.compare(nan, ref)[0] == float("inf")


def test_tiny_cpu_run_writes_json_and_csv(tmp_path, capsys):
    js, cs = tmp_path / "b.json", tmp_path / "b.csv"
    rc = bench.main(
        [
            "--seqlens",
            "32",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "16",
            "--dtype",
            "fp32",
            "--causal",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--device",
            "cpu",
            "--json",
            str(js),
            "--csv",
            str(cs),
        ]
    )
    assert rc == 0
    out = capsys.readouterr()
    assert "GQA 4/2 B=1 S=32 D=16 causal" in out.out
    assert "[1/1]" in out.err  # progress on stderr
    # one line per implementation as soon as it is checked and warmed up, before the timing
    err = out.err.splitlines()
    ready = [i for i, line in enumerate(err) if "reference:chunked: checked" in line]
    timing = [i for i, line in enumerate(err) if "timing" in line and "variants" in line]
    assert ready and timing and ready[0] < timing[0], out.err
    data = json.loads(js.read_text())
    kinds = {r["kind"] for r in data["rows"]}
    assert {"forced", "auto", "direct"} <= kinds
    forced = [r for r in data["rows"] if r["kind"] == "forced" and r["status"] == "ok"]
    assert forced and all(r["rel_l2"] < 1e-6 and r["us"] > 0 for r in forced)
    assert data["environment"]["device"] == "cpu"
    with open(cs) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["rows"])


def test_bench_table_renders_the_committed_sweep() -> None:
    """benchmarks/bench_table.py turns the committed H200 results into the docs' table: one
    row per shape, the fastest forced implementation in bold, ratios from the same rows."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "bench_table", root / "benchmarks" / "bench_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = root / "docs" / "results" / "2026-12-01-h200"
    rows = json.loads((results / "bench.json").read_text())["rows"]
    lines = module.table(rows).splitlines()
    body = lines[2:]
    assert len(body) == len({module.shape_name(r) for r in rows}) == 20
    for line in body:
        assert line.count("**") == 2, line  # exactly one fastest cell
    mha_2k = next(line for line in body if line.startswith("| MHA 8 2K |"))
    forced = {
        r["impl"]: r["us"]
        for r in rows
        if r["kind"] == "forced" and r["heads"] == 8 and r["seqlen"] == 2048 and not r["causal"]
    }
    name, ours = min(
        ((impl, us) for impl, us in forced.items() if impl.startswith("triton:")),
        key=lambda x: x[1],
    )  # the faster triton implementation
    want = forced["torch_sdpa:flash"] / ours
    assert mha_2k.split(" | ")[-2] == f"{want:.2f}× ({name.split(':')[1]})"
    # the docs hold both committed sweeps' tables as rendered: eager and under CUDA graphs
    docs = (root / "docs" / "benchmarks.md").read_text()
    assert "\n".join(lines) in docs
    graphs = json.loads((results / "bench_graphs.json").read_text())
    assert graphs["environment"]["timing"] == "cuda-graphs"
    assert module.table(graphs["rows"]) in docs


def test_cuda_graphs_needs_a_cuda_device(capsys):
    try:
        bench.main(["--seqlens", "32", "--heads", "2", "--device", "cpu", "--cuda-graphs"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--cuda-graphs on the CPU must be refused")
    assert "--cuda-graphs needs a CUDA device, not 'cpu'" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_times_replays_of_every_gpu_implementation(tmp_path, capsys):
    """Every GPU implementation is captured in a CUDA graph and timed by its replays, after the
    same correctness check as the eager sweep; none may fail to capture."""
    js = tmp_path / "g.json"
    rc = bench.main(
        [
            "--seqlens",
            "512",
            "--heads",
            "8",
            "--kv-heads",
            "2",
            "--head-dim",
            "64",
            "--repeats",
            "20",
            "--warmup",
            "2",
            "--no-matmul",
            "--cuda-graphs",
            "--json",
            str(js),
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert "timing: CUDA-graph replays" in out.out
    data = json.loads(js.read_text())
    assert data["environment"]["timing"] == "cuda-graphs"
    forced = [r for r in data["rows"] if r["kind"] == "forced" and r["status"] != "rejected"]
    assert {r["impl"].split(":")[0] for r in forced} >= {"torch_sdpa", "triton"}
    assert all(r["status"] == "ok" and r["us"] > 0 for r in forced), forced


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_a_failed_capture_costs_only_its_row(tmp_path, capsys, toys):
    """An implementation that cannot be captured (it reads a value back to the host) is reported
    as an error naming the capture; the others are still captured and timed."""
    js = tmp_path / "g.json"
    rc = bench.main(
        [
            "--seqlens",
            "256",
            "--heads",
            "4",
            "--kv-heads",
            "4",
            "--head-dim",
            "64",
            "--no-causal",
            "--repeats",
            "5",
            "--warmup",
            "1",
            "--no-matmul",
            "--no-check",
            "--cuda-graphs",
            "--impls",
            "toy:host_sync,toy:fast,torch_sdpa:flash",
            "--json",
            str(js),
        ]
    )
    capsys.readouterr()
    assert rc == 1  # an ERROR row fails the run
    rows = {r["impl"]: r for r in json.loads(js.read_text())["rows"] if r["kind"] == "forced"}
    assert rows["toy:host_sync"]["status"] == "ERROR"
    assert rows["toy:host_sync"]["note"].startswith("CUDA graph capture failed")
    for name in ("toy:fast", "torch_sdpa:flash"):
        assert rows[name]["status"] == "ok" and rows[name]["us"] > 0, rows[name]


def _summary_rows(auto_impl: str, auto_us: float | None) -> list:
    shape = bench.Shape(1, 64, 2, 2, 16, True, "fp32")
    return [
        bench.Row(shape, "x:slow", "forced", us=100.0),
        bench.Row(shape, "x:mid", "forced", us=50.0),
        bench.Row(shape, auto_impl, bench.AUTO, us=auto_us),
        bench.Row(shape, auto_impl, bench.DIRECT, us=None if auto_us is None else auto_us - 1),
    ]


def test_summary_compares_auto_only_with_a_row_set_that_contains_it():
    """With --impls leaving the automatic choice out of the forced rows, the fastest of the
    others is no bound on auto: the summary must not print a "fastest" slower than auto."""
    line = bench.summary(_summary_rows("x:fast", 10.0))
    assert "fastest" not in line and "x:slow" not in line and "x:mid" not in line
    assert "auto x:fast 10.0 us" in line and "no forced timing" in line
    line = bench.summary(_summary_rows("x:mid", 52.0))
    assert "fastest x:mid 50.0 us; auto x:mid 52.0 us (+4.0% vs fastest" in line


def test_summary_skips_an_auto_row_without_a_time():
    assert bench.summary(_summary_rows("x:mid", None)) == ""


def test_ratio_column_only_for_implementations_timed_forced():
    rows = [r for r in _summary_rows("x:fast", 10.0) if r.us is not None]
    bench.set_ratios(rows)
    assert [r.ratio for r in rows] == [2.0, 1.0, None, None]
    rows = [r for r in _summary_rows("x:mid", 60.0) if r.us is not None]
    bench.set_ratios(rows)
    assert [r.ratio for r in rows] == [2.0, 1.0, 1.2, 59 / 50]


def test_automatic_choice_is_named_for_the_timed_execution_mode(toys):
    """Under --cuda-graphs the automatic rows are captured: the implementation they are named
    after (and compared with) is the graph-mode choice, not the eager one."""
    shape = bench.Shape(1, 16, 2, 2, 16, False, "fp32")
    (tensors,) = bench.make_sets(shape, torch.device("cpu"), torch.Generator().manual_seed(0))[:1]
    _, eager, _ = bench.candidates(shape, tensors, None, True, "eager")
    _, graph, _ = bench.candidates(shape, tensors, None, True, "graph")
    assert graph == "toy:graph_only"
    assert eager != "toy:graph_only"


def test_direct_calls_run_the_decided_implementation_on_its_inputs(toys):
    """The direct row calls the implementation ``ad.decide`` names, on the inputs it reports,
    in the timed execution mode; another name than the automatic choice gets no direct row."""
    shape = bench.Shape(1, 16, 2, 2, 16, False, "fp32")
    sets = bench.make_sets(shape, torch.device("cpu"), torch.Generator().manual_seed(0))
    eager = bench.direct_calls("toy:nondet", sets, False, "eager")
    assert len(eager) == len(sets)
    assert {tag_of(call()) for call in eager} == {3.0}  # toy:nondet's tag
    graph = bench.direct_calls("toy:graph_only", sets, False, "graph")
    assert {tag_of(call()) for call in graph} == {7.0}  # toy:graph_only's tag
    assert bench.direct_calls("toy:fast", sets, False, "eager") is None
    assert bench.direct_calls("toy:nondet", sets, False, "graph") is None


# A backend whose backward reports a device fault, as a kernel's illegal memory access does.
FAULTING = TAGGED.format(backend="faulting") + textwrap.dedent(
    """
    class Faulting(Tagged):
        name, tag, priority = "faulting", 1.0, {"*": 1}

        def backward(self, inp):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


    @adb.hookimpl
    def attn_dispatch_implementations():
        return [Faulting()]
    """
)


def test_a_device_fault_stops_the_sweep_naming_the_implementation_and_shape(env, plugins, capsys):
    """One broken implementation costs only its row, but after a device fault nothing can run:
    the sweep stops there (exit 1), naming it, and prints what it measured before."""
    plugins.add(
        "faulting-backend", {"faulting": "faulting_backend"}, {"faulting_backend": FAULTING}
    )
    env.set(ATTN_DISPATCH_TEST_PLUGINS="1", ATTN_DISPATCH_PLUGINS="reference,faulting")
    argv = ["--seqlens", "32,64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
    argv += ["--dtype", "fp32", "--device", "cpu", "--no-matmul", "--repeats", "2"]
    assert bench.main(argv) == 1
    out = capsys.readouterr()
    label = "GQA 4/2 B=1 S=32 D=16"
    assert (
        f"stopped: the device faulted while faulting:faulting's backward at {label} ran: "
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    ) in out.err
    assert "[2/2]" not in out.err
