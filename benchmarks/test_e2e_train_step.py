"""The end-to-end training-step benchmark's CPU smoke run: every case, both routes, checked;
its arguments."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_train_step  # noqa: E402


def test_smoke_run_times_every_case_after_checking_losses(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    argv = ["--smoke", "--warmup", "0", "--rounds", "1", "--steps", "1", "--json", str(out)]
    assert e2e_train_step.main(argv) == 0
    data = json.loads(out.read_text())
    assert {"torch", "transformers", "device", "commit"} <= set(data["versions"])
    names = [r["case"] for r in data["results"]]
    assert len(names) == 6 and any("packed" in n for n in names)
    assert any("sliding window" in n for n in names) and any("padding" in n for n in names)
    assert names[-1].startswith("GPT-OSS-20B-shaped") and "sinks" in names[-1]
    for result in data["results"]:
        reference = result["reference"]
        assert reference == ("eager" if "GPT-OSS" in result["case"] else "sdpa")
        base, ours = result["routes"][reference], result["routes"]["attn_dispatch"]
        assert base["ms"] > 0 and ours["ms"] > 0
        assert ours["first_loss"] == pytest.approx(base["first_loss"], rel=1e-5)
        for route, entry in result["routes"].items():
            assert "ms" in entry or entry["skipped"], route
        if result["case"].startswith("dense"):
            alone = result["attention_alone"]
            assert set(alone["fwd_bwd"]) == set(alone["tiny_fwd_bwd"]) == set(e2e_train_step.PATHS)
            assert set(alone["chosen"]) == {"forward", "backward"}
    captured = capsys.readouterr()
    assert "| case | sdpa | attn_dispatch | speedup |" in captured.out
    assert "| case | eager | attn_dispatch | speedup |" in captured.out
    assert "attention alone via attn_dispatch: forward" in captured.err  # progress goes to stderr


def test_gpt_oss_case_alone_with_its_length_and_layers(tmp_path):
    out = tmp_path / "e2e.json"
    argv = ["--smoke", "--warmup", "0", "--rounds", "1", "--steps", "1", "--cases", "5"]
    argv += ["--gpt-oss-seqlen", "24", "--gpt-oss-layers", "3", "--json", str(out)]
    assert e2e_train_step.main(argv) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["case"].startswith("GPT-OSS-20B-shaped (3 layers)")
    assert result["case"].endswith("S=24")
    assert e2e_train_step.SMOKE.gpt_oss.seqlen == 48  # the defaults are left as they were


@pytest.mark.parametrize(
    "argv",
    [["--cases", "6"], ["--cases", "x"], ["--gpt-oss-seqlen", "0"], ["--gpt-oss-layers", "-1"]],
)
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        e2e_train_step.main(["--smoke", *argv])
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err
