"""Which tensors the TMA tile loads (config ``LOAD_TMA``) can address, and how (CPU only)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.tools.tensor_descriptor")

from attn_dispatch_triton._kernel_support import tile_descriptor  # noqa: E402


def test_dense_bshd_becomes_a_4d_descriptor_with_one_head_row_blocks() -> None:
    q = torch.empty(2, 100, 8, 128, dtype=torch.bfloat16)
    desc = tile_descriptor(q, varlen=False, rows=64, cols=128)
    assert list(desc.shape) == [2, 100, 8, 128]
    assert list(desc.strides) == list(q.stride())
    assert list(desc.block_shape) == [1, 64, 1, 128]


def test_varlen_thd_gets_a_unit_batch_dim() -> None:
    k = torch.empty(77, 2, 64, dtype=torch.float16)
    desc = tile_descriptor(k, varlen=True, rows=32, cols=64)
    assert list(desc.shape) == [1, 77, 2, 64]
    assert list(desc.strides)[1:] == list(k.stride())


def test_padded_head_dim_keeps_the_true_extent() -> None:  # D=80: columns 80..127 zero-filled
    v = torch.empty(1, 40, 4, 80, dtype=torch.bfloat16)
    desc = tile_descriptor(v, varlen=False, rows=16, cols=128)
    assert list(desc.shape)[-1] == 80 and list(desc.block_shape)[-1] == 128


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(1, 40, 4, 36, dtype=torch.bfloat16),  # row stride 4*36*2 = 288 B: ok,
        # head stride 72 B: not a multiple of 16
        lambda: torch.empty(1, 40, 4, 64, dtype=torch.bfloat16)[..., 1:33],  # misaligned pointer
        lambda: torch.empty(1, 0, 4, 64, dtype=torch.bfloat16),  # nothing to address
    ],
    ids=["stride-72B", "misaligned", "empty"],
)
def test_unaddressable_tensors_fall_back_to_pointer_loads(make) -> None:
    assert tile_descriptor(make(), varlen=False, rows=16, cols=64) is None
