"""What the kernels are handed: ``_common.kernel_operands`` (CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from attn_dispatch_triton._common import dense, kernel_operands  # noqa: E402

from attn_dispatch.testing.cases import place  # noqa: E402


def _call(d: int, dv: int, layout: str, heads: int = 1) -> tuple[torch.Tensor, ...]:
    shapes = [(1, 184, heads, d), (1, 184, heads, d), (1, 184, heads, dv)]
    return tuple(place(torch.randn(s), layout, torch.float16, "cpu") for s in shapes)


def _aligned(t: torch.Tensor) -> bool:
    strides = [s for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1]
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in strides)


@pytest.mark.parametrize("d, dv", [(64, 32), (32, 64), (128, 32), (64, 16), (96, 40)])
@pytest.mark.parametrize("layout", ["sliced", "transposed", "strided"])
def test_mixed_tile_widths_get_16_byte_aligned_rows_with_the_same_values(d, dv, layout) -> None:
    given = _call(d, dv, layout, heads=3)
    handed = kernel_operands(*given)
    for before, after in zip(given, handed, strict=True):
        assert _aligned(after), after.stride()
        assert torch.equal(before, after)


@pytest.mark.parametrize("d, dv", [(64, 64), (32, 32), (64, 56), (24, 24)])
def test_equal_tile_widths_keep_their_views(d, dv) -> None:
    """Only the last dim is made contiguous where D and Dv share a tile width: no copy."""
    given = _call(d, dv, "sliced")
    assert all(a is b for a, b in zip(given, kernel_operands(*given), strict=True))
    strided = _call(d, dv, "strided")
    assert all(t.stride(-1) == 1 for t in kernel_operands(*strided))


def test_aligned_mixed_widths_are_not_copied() -> None:
    given = _call(64, 32, "contiguous", heads=2)
    assert all(a is b for a, b in zip(given, kernel_operands(*given), strict=True))


def test_dense_tensors_fill_their_memory_in_any_order_of_dims() -> None:
    """What the dK / dV partials may be laid out like: a contiguous tensor or a permuted view of
    one (size-1 dims aside), not a slice or an expanded view."""
    x = torch.empty(2, 5, 3, 4)
    assert dense(x) and dense(x.transpose(1, 2)) and dense(x.permute(3, 0, 2, 1))
    assert dense(torch.empty(1, 7, 1, 4).transpose(0, 2))
    assert not dense(x[..., :3]) and not dense(x[:, ::2])
    assert not dense(torch.empty(1, 4).expand(3, 4))
