"""The training client: a tiny transformer learns with ``ad.attention`` exactly as with SDPA.

Runs ``examples/train_tiny_transformer.py`` at a small size (about 15 s on a two-core CPU).
Measured at this size over seeds 0–5: the largest relative loss difference between the
``ad.attention`` and SDPA runs was 3.3e-5 (two exact float32 attentions, SDPA and the written-out
one, differ by up to 4.0e-5), and every run reached an exact-match accuracy of at least 0.97.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_transformer.py"


@pytest.fixture
def client(monkeypatch):
    spec = importlib.util.spec_from_file_location("train_tiny_transformer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_ad_attention_trains_like_sdpa(env, client, restore_threads, capsys) -> None:
    argv = ["--steps", "200", "--digits", "6", "--rtol", "1e-3", "--min-accuracy", "0.9"]
    result = client.main(argv)  # raises SystemExit(1) if either check fails
    ad_losses, sdpa_losses = result.losses["ad"], result.losses["sdpa"]
    assert len(ad_losses) == len(sdpa_losses) == 200
    assert result.max_rel_diff < 1e-3
    # The task is learned: loss falls by far more than the curves differ, accuracy is high.
    assert max(ad_losses[-10:]) < 0.1 * ad_losses[0]
    assert result.accuracy["ad"] >= 0.9 and result.accuracy["sdpa"] >= 0.9
    table = capsys.readouterr().out
    assert "max relative loss difference over 200 steps" in table


def test_disagreement_is_reported(env, client, restore_threads, monkeypatch, capsys) -> None:
    """The check can fail: an attention with a wrong scale makes the curves part."""
    import attn_dispatch as ad

    def off_scale(q, k, v):
        return ad.attention(q, k, v, causal=True, scale=0.5 * q.shape[-1] ** -0.5)

    monkeypatch.setitem(client.ATTENTION, "ad", off_scale)
    with pytest.raises(SystemExit):
        client.main(["--steps", "20", "--digits", "4", "--min-accuracy", "0"])
    assert "loss curves differ" in capsys.readouterr().err
