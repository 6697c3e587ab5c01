"""The end-to-end training-step benchmark's CPU smoke run: every case, both routes, checked."""

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
    assert len(names) == 5 and any("packed" in n for n in names)
    assert any("sliding window" in n for n in names) and any("padding" in n for n in names)
    for result in data["results"]:
        sdpa, ours = result["routes"]["sdpa"], result["routes"]["attn_dispatch"]
        assert sdpa["ms"] > 0 and ours["ms"] > 0
        assert ours["first_loss"] == pytest.approx(sdpa["first_loss"], rel=1e-5)
        for route in ("flash_attention_2", "kernels-community/flash-attn"):
            assert "ms" in result["routes"][route] or result["routes"][route]["skipped"]
    captured = capsys.readouterr()
    assert "| case | sdpa | attn_dispatch | speedup |" in captured.out
    assert "attention alone via attn_dispatch: forward" in captured.err  # progress goes to stderr
