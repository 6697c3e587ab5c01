"""The attn-dispatch command: list, explain (JSON contracts), demo."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from attn_dispatch.testing import sweep
from attn_dispatch.tools import bench, cli, tune


def test_list_json_contract(toys, capsys):
    assert cli.main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"backends", "failed"}
    toy = next(b for b in data["backends"] if b["name"] == "toy")
    assert {"name", "distribution", "version", "implementations"} <= set(toy)
    fast = next(i for i in toy["implementations"] if i["name"] == "toy:fast")
    assert fast["priority"] == {"cpu": 50, "sm_90": 50}
    assert {"name", "opt_in", "deterministic", "priority"} <= set(fast)
    assert {f["name"] for f in data["failed"]} == {"broken_import", "broken_hook"}
    assert all(f["error"] for f in data["failed"])


def test_list_text(env, capsys):
    assert cli.main(["list"]) == 0
    assert "reference:chunked" in capsys.readouterr().out


def test_list_prints_the_per_arch_priority_table(toys, capsys):
    """Patterns resolve to one value per arch: 'sm_*' gives sm_80/sm_90/sm_100 the same value."""
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("priority per arch") :].splitlines()
    header = table[1].split()
    assert header == ["implementation", "opt-in", "deterministic", *cli.TABLE_ARCHS]
    rows = {line.split()[0]: line.split()[1:] for line in table[2:]}
    assert rows["toy:slow"] == ["no", "yes", "10", "10", "10", "10", "-", "-"]
    assert rows["toy:gpu_only"][2:] == ["-", "-", "80", "-", "-", "-"]
    assert rows["toy:experimental"][2:] == ["100"] * 6


def test_explain_json_contract_on_any_arch(toys, capsys):
    argv = [
        "explain",
        "--arch",
        "sm_90",
        "--seqlen",
        "1024",
        "--heads",
        "8",
        "--kv-heads",
        "2",
        "--head-dim",
        "128",
        "--causal",
        "--json",
    ]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arch"] == "sm_90" and data["selected"] == "toy:gpu_only"
    statuses = {c["name"]: c["status"] for c in data["candidates"]}
    assert statuses["toy:fast"] == "rejected" and statuses["broken_hook"] == "failed"
    assert set(statuses.values()) <= {
        "selected",
        "supported",
        "rejected",
        "opt-in",
        "blocked",
        "failed",
    }


def test_explain_cuda_graphs_asks_for_the_graph_decision(toys, capsys):
    argv = ["explain", "--arch", "sm_90", "--seqlen", "64", "--heads", "4", "--kv-heads", "2"]
    argv += ["--head-dim", "16", "--json"]
    assert cli.main(argv) == 0
    eager = json.loads(capsys.readouterr().out)
    assert eager["execution"] == "eager" and eager["selected"] == "toy:gpu_only"
    assert cli.main(argv + ["--cuda-graphs"]) == 0
    graph = json.loads(capsys.readouterr().out)
    assert graph["execution"] == "graph" and graph["selected"] == "toy:graph_only"


def test_explain_bad_arguments_are_clear_errors(env, capsys):
    argv = ["explain", "--seqlen", "16", "--heads", "6", "--kv-heads", "4", "--head-dim", "64"]
    assert cli.main(argv) == 2
    assert "'k'" in capsys.readouterr().err


def test_demo_runs_verifies_and_reports(env):
    done = subprocess.run(
        [sys.executable, "-m", "attn_dispatch", "demo", "--cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "selected: reference:chunked" in done.stdout
    assert "PASS" in done.stdout and "median" in done.stdout


def test_explain_accepts_zero_length_sequences(env, capsys):
    """Zero-length and zero-batch inputs are valid in the API, so the command explains them."""
    base = ["explain", "--arch", "cpu", "--heads", "2", "--head-dim", "16", "--json"]
    for lengths, shapes in (
        (["--seqlen", "0"], ("q: shape=(1, 0, 2, 16)", "k: shape=(1, 0, 2, 16)")),
        (
            ["--seqlen", "4", "--seqlen-k", "0"],
            ("q: shape=(1, 4, 2, 16)", "k: shape=(1, 0, 2, 16)"),
        ),
        (["--seqlen", "4", "--batch", "0"], ("q: shape=(0, 4, 2, 16)", "k: shape=(0, 4, 2, 16)")),
    ):
        assert cli.main(base + lengths) == 0
        data = json.loads(capsys.readouterr().out)
        inputs = "\n".join(data["inputs"])
        assert all(s in inputs for s in shapes), inputs
        assert data["selected"] == "reference:chunked"


def test_explain_window_side_beyond_int64_is_unbounded(env, capsys):
    argv = ["explain", "--arch", "cpu", "--seqlen", "8", "--heads", "2", "--head-dim", "16"]
    assert cli.main(argv + ["--window", f"0,{2**64}", "--json"]) == 0
    assert "window=(0, None)" in "\n".join(json.loads(capsys.readouterr().out)["inputs"])


def test_output_cut_short_by_the_reader_ends_quietly(env):
    """`attn-dispatch list | head -1`: a reader that closes the pipe early gets no traceback."""
    run_env = dict(os.environ, ATTN_DISPATCH_PLUGINS="reference")
    proc = subprocess.Popen(
        [sys.executable, "-m", "attn_dispatch", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=run_env,
    )
    proc.stdout.close()  # before the command writes anything: its first write meets a closed pipe
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err.decode()
    assert err.decode() == ""


def test_explain_help_shows_the_defaults(env, capsys):
    assert cli.main(["explain", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--arch ARCH e.g. sm_90, gfx942, gfx950, cpu (default: this machine's" in text
    assert "--batch BATCH batch size (default: 1)" in text
    assert "--dtype {bf16,f16,f32,f64,fp16,fp32} inputs' dtype (default: bf16)" in text
    assert "--seqlen SEQLEN query sequence length (required)" in text


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of the command line tools, by the command that reaches it."""
    found = {"attn-dispatch": cli.build_parser()}
    (subparsers,) = (a for a in found["attn-dispatch"]._actions if a.choices)
    for name, parser in subparsers.choices.items():
        if name not in ("bench", "tune"):  # their own parsers, below
            found[f"attn-dispatch {name}"] = parser
    found["attn-dispatch bench"] = bench.build_parser()
    found["attn-dispatch tune"] = tune.build_parser()
    found["sweep"] = _sweep_parser()
    return found


def _sweep_parser() -> argparse.ArgumentParser:
    """The parser the sweep's ``main`` builds (it makes it inside ``main``)."""
    built: list[argparse.ArgumentParser] = []

    class Stop(Exception):
        pass

    def capture(self, argv=None, namespace=None):
        built.append(self)
        raise Stop

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        sweep.main([])
    except Stop:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    return built[0]


@pytest.mark.parametrize("command", list(_parsers()))
def test_every_option_has_help_that_shows_its_default(command):
    parser = _parsers()[command]
    assert "``" not in parser.format_help(), "reStructuredText markup in --help"
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.default == argparse.SUPPRESS:
            continue  # positionals, --help
        assert action.help, f"{command} {action.option_strings[0]} has no help text"
        shown = formatter._expand_help(action)
        assert "default" in shown or "(required)" in shown, (command, action.option_strings, shown)
