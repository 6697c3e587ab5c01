"""Bad arguments to the attn-dispatch command: one line on stderr, status 2, no traceback."""

from __future__ import annotations

import json
import os

import pytest
from dispatch_helpers import run_list_command

import attn_dispatch as ad
from attn_dispatch.tools import bench, cli

EXPLAIN = ["explain", "--seqlen", "16", "--heads", "8", "--head-dim", "64"]
BENCH = ["bench", "--seqlens", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16"]
BENCH_RUN = BENCH + ["--causal", "--repeats", "2", "--warmup", "1", "--quiet", "--no-matmul"]


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("attn-dispatch"), lines[0]
    assert "error: " in lines[0]
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (EXPLAIN + ["--seqlen", "-1"], "argument --seqlen: expected an integer >= 0, got -1"),
        (EXPLAIN + ["--batch", "-2"], "argument --batch: expected an integer >= 0, got -2"),
        (EXPLAIN + ["--kv-heads", "0"], "argument --kv-heads: expected an integer >= 1, got 0"),
        (EXPLAIN + ["--seqlen-k", "-3"], "argument --seqlen-k: expected an integer >= 0, got -3"),
        (EXPLAIN + ["--softcap", "1e39"], "argument 'softcap': expected a finite float > 0"),
        (EXPLAIN + ["--scale", "1e39"], "argument 'scale': expected a finite float > 0"),
        (EXPLAIN + ["--scale", "nan"], "argument 'scale': expected a finite float > 0"),
        (
            EXPLAIN + ["--head-dim-v", "0"],
            "argument --head-dim-v: expected an integer >= 1, got 0",
        ),
        (EXPLAIN + ["--head-dim", "x"], "argument --head-dim: expected an integer, got 'x'"),
        (EXPLAIN + ["--kv-heads", "3"], "'k'"),
        (
            EXPLAIN + ["--batch", str(10**11), "--seqlen", str(10**11), "--heads", str(10**6)],
            "q of shape [100000000000, 100000000000, 1000000, 64] would take 1.28e+30 bytes",
        ),
        (["demo", "--cpu", "--repeats", "0"], "argument --repeats: expected an integer >= 1"),
        # an empty path was accepted, then skipped where the file is written
        (BENCH + ["--json", ""], "--json: expected a file path, got ''"),
        (BENCH + ["--csv", " "], "--csv: expected a file path, got ' '"),
        (["tune", "--shape", "1,8,2,2,8", "--json", ""], "--json: expected a file path, got ''"),
        (BENCH + ["--seqlens", "-5"], "argument --seqlens: expected an integer >= 1, got -5"),
        (BENCH + ["--heads", "8", "--kv-heads", "3"], "--kv-heads 3 does not divide --heads 8"),
        (BENCH + ["--heads", "12", "--kv-heads", "16"], "--kv-heads 16 does not divide"),
        (BENCH + ["--kv-heads", "1,1,1"], "--kv-heads: expected 1 or 1 values, got 3"),
        (BENCH + ["--repeats", "-1"], "argument --repeats: expected an integer >= 0, got -1"),
        (BENCH + ["--device", "bogus"], "argument --device: expected cpu or cuda[:N]"),
        (BENCH_RUN + ["--impls", "nope"], "--impls: 'nope' matches no installed implementation"),
        (BENCH_RUN + ["--json", "/nonexistent/x"], "--json: the directory '/nonexistent'"),
    ],
)
def test_bad_arguments_are_one_line_and_status_2(env, capsys, argv, expected):
    assert cli.main(argv) == 2
    assert expected in _error_line(capsys)


TUNE = ["tune", "--device", "cpu", "--dtype", "f32", "--shape"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (BENCH_RUN + ["--device", "cpu", "--seqlens", str(10**15)], "cannot allocate a tensor"),
        (
            BENCH_RUN + ["--device", "cpu", "--batch", str(10**20)],
            "more than a tensor can hold",
        ),
        (TUNE + [f"1,{10**15},2,2,16"], "cannot allocate a tensor of shape [1, 1000000000000000"),
        (TUNE + [f"1,{10**20},2,2,16"], "more than a tensor can hold"),
    ],
)
def test_sizes_beyond_memory_are_one_line_and_status_2(env, capsys, argv, expected):
    """bench and tune allocate their inputs: a size no memory holds is a usage error."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("attn-dispatch: error: "), err
    assert expected in err[0] and "give smaller sizes" in err[0]


def test_bench_default_kv_heads_must_divide_heads(env, capsys):
    assert cli.main(BENCH[:-4] + ["--heads", "12", "--device", "cpu"]) == 2
    assert "--kv-heads 8 (the default) does not divide --heads 12" in _error_line(capsys)


def test_arch_error_lists_the_accepted_forms(env, capsys):
    assert cli.main(EXPLAIN + ["--arch", "sm9x"]) == 2
    line = _error_line(capsys)
    assert "argument --arch: arch='sm9x' is not a known arch" in line
    assert "'cpu'" in line and "sm_<major><minor>" in line and "gfx" in line


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the refusal without a GPU"
)
def test_bench_on_cuda_without_a_gpu(env, capsys):
    assert cli.main(BENCH_RUN + ["--device", "cuda"]) == 2
    assert "argument --device: 'cuda': no CUDA or ROCm GPU is available" in _error_line(capsys)


def test_explain_huge_shapes_use_meta_tensors(env, capsys):
    # --arch cpu: the answer must not depend on the GPU of the machine running the test
    argv = ["explain", "--arch", "cpu", "--batch", "100000", "--seqlen", "10000000"]
    assert cli.main(argv + ["--heads", "8", "--head-dim", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selected"] == "reference:chunked"
    assert "q: shape=(100000, 10000000, 8, 64)" in data["inputs"][0]


def test_explain_json_carries_what_the_text_shows(env, capsys):
    argv = EXPLAIN + ["--kv-heads", "2", "--causal", "--backend", "reference", "--arch", "sm_90"]
    assert cli.main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert data["mode"] == "backward" and data["forced"] == "reference"
    assert "attn_dispatch backward on arch sm_90 (forced: reference)" in text
    assert len(data["inputs"]) == 7
    for line in data["inputs"]:
        assert f"  {line}\n" in text
    assert data["inputs"][1].startswith("k: shape=(1, 16, 2, 64) dtype=bfloat16")
    assert "causal=True" in data["inputs"][-1]
    assert ad.explain(*_meta(EXPLAIN)).to_dict()["forced"] is None


def _meta(argv: list[str]) -> list:
    args = cli.build_parser().parse_args(argv)
    return list(cli._meta_inputs(args).values())


def test_forward_report_json_mode(env):
    q, k, v = _meta(EXPLAIN)[:3]
    data = ad.explain(q, k, v).to_dict()
    assert data["mode"] == "forward" and len(data["inputs"]) == 4


def test_impls_patterns_match_names_patterns_and_backends():
    installed = ["reference:chunked", "triton:fused", "triton:fused_atomic"]
    assert bench.unmatched_patterns(["triton", "reference:chunk*", "*atomic"], installed) == []
    assert bench.unmatched_patterns(["tri", "fused", "triton:fused"], installed) == ["tri", "fused"]


@pytest.mark.parametrize(
    "argv", [["demo", "--cpu"], BENCH_RUN + ["--device", "cpu"], EXPLAIN], ids=lambda a: a[0]
)
def test_library_errors_are_one_line_for_every_command(env, capsys, argv):
    env.set(ATTN_DISPATCH_BACKEND="nope")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("attn-dispatch: error: "), err
    assert "unknown backend 'nope'" in err[0]


def test_a_bad_environment_is_one_line_without_traceback(env):
    """The process contract: status 2, one line on stderr, no traceback."""
    # Only the reference plugin: another installed plugin's load warning would add lines.
    run_env = dict(os.environ, ATTN_DISPATCH_ARCH="bogus", ATTN_DISPATCH_PLUGINS="reference")
    done = run_list_command(run_env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attn-dispatch: error: "), done.stderr
    assert "'bogus'" in lines[0]
