"""Tile choices and static resource budgets of the kernels (plain Python, no flydsl import)."""

from __future__ import annotations

from dataclasses import dataclass

LDS_BUDGET = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
WAVES = 4
BLOCK_M = 32


@dataclass(frozen=True)
class MainTiles:
    """Tiling of the fused dQ/dK/dV kernel for one variant."""

    variant: str  # "gfx950_fused" | "gfx942_mfma"
    mfma: tuple[int, int, int]  # (M, N, K) of the MFMA instruction
    block_m: int  # query rows per step of the query loop
    block_n: int  # keys per program (one MFMA width per wave)
    transpose_reads: bool  # ds_read_b64_tr_b16 for column operands (gfx950 only)

    def lds_bytes(self, head_dim: int) -> int:
        """Q tile + dO tile + dS tile, all 16-bit."""
        return 2 * (2 * self.block_m * head_dim + self.block_m * self.block_n)


def main_tiles(variant: str) -> MainTiles:
    if variant == "gfx950_fused":
        return MainTiles(variant, (16, 16, 32), BLOCK_M, 16 * WAVES, True)
    if variant == "gfx942_mfma":
        return MainTiles(variant, (32, 32, 8), BLOCK_M, 32 * WAVES, False)
    raise ValueError(f"unknown variant {variant!r}")


def rows_per_block(head_dim: int) -> int:
    """Rows handled by one 256-thread block of the preprocess/convert kernels (8 elems/lane)."""
    return 256 // (head_dim // 8)
