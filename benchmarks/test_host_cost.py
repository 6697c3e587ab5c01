"""The host-cost breakdown's CPU smoke run: every row timed, the table and the JSON written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_cost  # noqa: E402


def test_smoke_run_times_every_layer_and_writes_json(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert (
        host_cost.main(
            ["--smoke", "--device", "cpu", "--profile", "--ops", "--top", "5", "--json", str(out)]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert data["shape"] == dict(
        zip(("batch", "heads", "kv_heads", "seqlen", "head_dim"), host_cost.CPU_SHAPE)
    )
    assert {"torch", "device", "commit"} <= set(data["versions"])
    paths = [row["path"] for row in data["rows"]]
    assert paths[0] == "sdpa" and paths[1].startswith("ad.attention (automatic: ")
    forced = [p for p in paths if p.startswith("ad.attention forced ")]
    assert f"ad.attention forced {data['chosen']['forward']}" in forced
    assert paths[-4:] == [
        "an empty Python node (computes nothing)",
        "custom ops fwd + bwd, no autograd",
        "ad.forward + ad.backward",
        "direct: implementations' forward + backward",
    ]
    assert all(row["us"] > 0 for row in data["rows"])
    assert data["chosen"]["forward"] in paths[1] and data["chosen"]["backward"] in paths[1]
    captured = capsys.readouterr().out
    assert "| path | µs per forward+backward | vs sdpa |" in captured
    assert "attn_dispatch's own layers:" in captured
    assert "cProfile of 3 ad.attention forward+backward calls" in captured
    assert "sdpa: events of 3 calls" in captured and "aten::" in captured
    assert "direct: implementations' forward + backward: events" not in captured


def test_sdpa_kernels_names_the_implementation_of_sdpa_choice_only_where_it_accepts():
    layer = host_cost.Layer(host_cost.CPU_SHAPE, torch.device("cpu"), torch.float32)
    # on a CPU sdpa picks its flash kernel (SDPBackend.FLASH_ATTENTION), which torch_sdpa:flash
    # calls on a GPU only
    assert host_cost.sdpa_kernels(layer, host_cost.forced_names(layer)) is None
    assert host_cost.sdpa_kernels(layer, ["torch_sdpa:flash"]) == "torch_sdpa:flash"
    assert host_cost.sdpa_kernels(layer, ["torch_sdpa:cudnn"]) is None


def test_the_sdpa_kernels_row_comes_before_the_direct_row(monkeypatch, tmp_path):
    """Where an implementation runs sdpa's kernel choice (on a GPU), its direct calls are timed
    too; on the CPU that choice is stood in for by the first implementation that accepts."""

    def first_accepting(layer, accepting):
        return accepting[0]

    monkeypatch.setattr(host_cost, "sdpa_kernels", first_accepting)
    out = tmp_path / "host.json"
    assert host_cost.main(["--smoke", "--device", "cpu", "--json", str(out)]) == 0
    paths = [row["path"] for row in json.loads(out.read_text())["rows"]]
    layer = host_cost.Layer(host_cost.CPU_SHAPE, torch.device("cpu"), torch.float32)
    name = host_cost.forced_names(layer)[0]
    assert paths[-2:] == [
        f"direct: sdpa's kernels ({name}) forward + backward",
        "direct: implementations' forward + backward",
    ]


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--number", "0"], ["--warmup", "-1"]])
def test_bad_counts_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        host_cost.main(["--smoke", *argv])
    assert exc.value.code == 2
    assert "at least" in capsys.readouterr().err
