"""torch_sdpa's own-autograd-node path on the CPU: the opt-in gate and the signatures it
covers (its numerics on the GPU are in test_sdpa_own_node_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_torch_sdpa import _common, cudnn
from attn_dispatch_torch_sdpa.cudnn import Cudnn
from attn_dispatch_torch_sdpa.efficient import Efficient
from attn_dispatch_torch_sdpa.flash import Flash

from attn_dispatch import backend as adb


def _inputs(sq=128, sk=None, **flags) -> adb.ForwardInputs:
    sk = sq if sk is None else sk
    q = torch.empty(1, sq, 8, 64, dtype=torch.bfloat16, device="meta")
    k, v = (torch.empty(1, sk, 2, 64, dtype=torch.bfloat16, device="meta") for _ in range(2))
    return adb.make_inputs(q, k, v, **flags)


@pytest.fixture
def cudnn_version(monkeypatch):
    """Sets the cuDNN version the backend reads (this CPU build has none)."""

    def set_version(version: int) -> None:
        monkeypatch.setattr(cudnn, "_cudnn_version", lambda: version)

    set_version(cudnn.OWN_GRAD_STRIDES_CUDNN)
    return set_version


@pytest.mark.parametrize("impl", [Flash(), Cudnn()], ids=["flash", "cudnn"])
def test_the_own_node_is_offered_only_when_turned_on(impl, monkeypatch, cudnn_version):
    monkeypatch.delenv(_common.OWN_NODE_VARIABLE, raising=False)
    assert impl.autograd_forward(_inputs(causal=True)) is None
    assert impl.fast_paths() == [_common.own_node_path()]
    assert not impl.fast_paths()[0].on
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "1")
    assert callable(impl.autograd_forward(_inputs(causal=True)))
    assert impl.fast_paths()[0].on


@pytest.mark.parametrize(
    "flags",
    [
        {"causal": True, "causal_align": "bottom_right", "sk": 64},
        {"causal": True, "window": (16, 0)},
        {"sk": 0},
    ],
    ids=["rows-without-keys", "window", "no-keys"],
)
def test_flash_keeps_the_library_node_where_its_forward_cleans_rows_up(flags, monkeypatch):
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "1")
    sk = flags.pop("sk", None)
    assert Flash().autograd_forward(_inputs(sk=sk, **flags)) is None


def test_efficient_offers_no_own_node(monkeypatch):
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "1")
    assert Efficient().autograd_forward(_inputs(causal=True)) is None


def test_cudnn_before_it_reads_the_gradients_own_strides_keeps_the_library_node(
    monkeypatch, cudnn_version
):
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "1")
    cudnn_version(cudnn.OWN_GRAD_STRIDES_CUDNN - 1)
    assert Cudnn().autograd_forward(_inputs(causal=True)) is None
