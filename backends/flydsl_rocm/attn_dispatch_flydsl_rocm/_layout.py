"""Index math of the main kernel, shared by the kernel and the CPU layout simulator.

Plain Python (no flydsl import): every function works on Python ints (simulator) and on the
kernel's DSL integers (``//``, ``%``, ``^``, ``*``, ``+`` only), so the tests check the very
expressions the kernel is built from. Conventions (documented MFMA layouts, see
tests/test_flydsl_layouts.py for the sources): for a TxTxKT MFMA with G = 64 // T lane groups,
lane ``li + T*g`` holds A row ``li`` / B column ``li`` and the KV = KT // G contraction values
``g*KV .. g*KV+KV-1``; accumulator element ``i`` of lane ``li + T*g`` is row ``crow(i, g, T)``,
column ``li``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._tiles import WAVES, MainTiles

THREADS = 256


def crow(i: int, g, t: int):
    """Row (M index) of accumulator element ``i`` in lane group ``g`` of a TxT MFMA."""
    groups = 64 // t
    return (i // 4) * 4 * groups + g * 4 + (i % 4)


def head_dim_problems(tiles: MainTiles, head_dim: int) -> list[str]:
    """Why the kernels' index math is not exact at ``head_dim`` ([] = fine): the main kernel's
    (``Geometry.problems``) and the row kernels' (a power-of-two lane butterfly per row)."""
    out = Geometry(tiles, head_dim).problems()
    lanes = head_dim // 8
    if lanes & (lanes - 1):
        out.append(f"the row kernels' shuffle butterfly needs D/8 = {lanes} to be a power of two")
    return out


@dataclass(frozen=True)
class Geometry:
    """Static sizes and address functions of one main-kernel build."""

    tiles: MainTiles
    head_dim: int

    @property
    def T(self) -> int:  # noqa: N802 (MFMA width, as in the ISA tables)
        return self.tiles.mfma[0]

    @property
    def G(self) -> int:  # noqa: N802
        return 64 // self.T

    @property
    def KT(self) -> int:  # noqa: N802
        return self.tiles.mfma[2]

    @property
    def KV(self) -> int:  # noqa: N802
        return self.KT // self.G

    @property
    def BM(self) -> int:  # noqa: N802
        return self.tiles.block_m

    @property
    def BN(self) -> int:  # noqa: N802
        return self.tiles.block_n

    @property
    def SUB(self) -> int:  # noqa: N802
        return self.BM // self.T

    @property
    def ACC(self) -> int:  # noqa: N802
        return self.T * self.T // 64

    @property
    def DC(self) -> int:  # noqa: N802
        return self.head_dim // self.KT

    @property
    def DT(self) -> int:  # noqa: N802
        return self.head_dim // self.T

    @property
    def DQ_COLS(self) -> int:  # noqa: N802
        """dQ columns per wave (the last waves idle when the head dim is small)."""
        return max(self.head_dim // WAVES, self.T)

    @property
    def DQ_NT(self) -> int:  # noqa: N802
        return self.DQ_COLS // self.T

    EB = 2

    @property
    def ROW_B(self) -> int:  # noqa: N802
        return self.head_dim * self.EB

    @property
    def SWZ(self) -> int:  # noqa: N802
        return min(8, self.head_dim // 8)

    @property
    def CHUNKS(self) -> int:  # noqa: N802
        return self.BM * self.head_dim // 8

    @property
    def LOADS(self) -> int:  # noqa: N802
        return max(self.CHUNKS // THREADS, 1)

    Q_LDS = 0

    @property
    def DO_LDS(self) -> int:  # noqa: N802
        return self.BM * self.ROW_B

    @property
    def DS_LDS(self) -> int:  # noqa: N802
        return 2 * self.BM * self.ROW_B

    def problems(self) -> list[str]:
        """Reasons the index math is not exact for this build ([] = fine)."""
        out = []
        chunks_per_row = self.head_dim // 8
        if chunks_per_row % self.SWZ:
            out.append(f"XOR swizzle by {self.SWZ} leaves the {chunks_per_row} chunks of a row")
        if self.CHUNKS > THREADS and self.CHUNKS % THREADS:
            out.append(f"{self.CHUNKS} tile chunks are not a multiple of {THREADS} threads")
        if self.DQ_COLS % self.T or self.head_dim % self.DQ_COLS:
            out.append(f"dQ columns per wave ({self.DQ_COLS}) do not tile the head dim by {self.T}")
        if self.tiles.transpose_reads and (self.KV != 8 or self.BM != self.KT):
            out.append("transpose-read operands assume KV == 8 and BM == KT")
        return out

    # -------------------------------------------------------------- Q / dO tile in LDS

    def swz_addr(self, row, col):
        """Byte offset of element (row, col) of a [BM, D] tile: 16-byte chunks XOR row."""
        chunk = (col // 8) ^ (row % self.SWZ)
        return row * self.ROW_B + chunk * 16 + (col % 8) * self.EB

    def stage_chunk(self, tid, j):
        """(row, 8-column chunk) of the tile that thread ``tid`` moves in load round ``j``."""
        ch = (tid + j * THREADS) % self.CHUNKS
        return ch // (self.head_dim // 8), ch % (self.head_dim // 8)

    def stage_addr(self, r, cc):
        """LDS byte offset (within a tile) where chunk ``cc`` of row ``r`` is stored."""
        return r * self.ROW_B + ((cc ^ (r % self.SWZ)) * 16)

    # -------------------------------------------------------------- S = Q Kᵀ, dP = dO Vᵀ

    def a_rowfrag(self, s, c, g, li):
        """(tile row, first column) of the KV contiguous A values of S / dP, k-step ``c``."""
        return s * self.T + li, c * self.KT + g * self.KV

    def kv_frag(self, c, g, li):
        """(key within the wave, first column) of the KV contiguous B values (K or V)."""
        return li, c * self.KT + g * self.KV

    # -------------------------------------------------------------- dV += Pᵀ dO, dK += dSᵀ Q

    def pt_steps(self) -> int:
        """k-steps (over the tile's query rows) of the dV / dK products."""
        return self.BM // self.KT

    def pt_a_elems(self, st) -> list[tuple[int, int]]:
        """(sub-tile, accumulator index) of S/dP feeding A element e (in order) at k-step st."""
        if self.tiles.transpose_reads:
            return [(s, i) for s in range(self.SUB) for i in range(4)]
        return [(0, st * 4 + i) for i in range(4)]

    def pt_b_rows(self, st, g) -> list:
        """First tile row of each 4-row group of the B operand (dO / Q columns)."""
        if self.tiles.transpose_reads:
            return [s * self.T + g * 4 for s in range(self.SUB)]
        return [st * 8 + g * 4]

    @staticmethod
    def tr_source(r0, col0, li):
        """(row, first column) lane ``li`` of a 16-lane group addresses for ds_read_b64_tr_b16."""
        return r0 + li // 4, col0 + (li % 4) * 4

    # -------------------------------------------------------------- dQ += dS K

    def ds_store_addr(self, qr, wave, li):
        """LDS byte offset of dS[query row qr, key wave*T + li] (row-major [BM, BN])."""
        return self.DS_LDS + (qr * self.BN + wave * self.T + li) * self.EB

    def dq_a_addr(self, s, st, g, li):
        """LDS byte offset of the KV contiguous dS values of A for dQ, k-step ``st``."""
        return self.DS_LDS + ((s * self.T + li) * self.BN + st * self.KT + g * self.KV) * self.EB

    def dq_col(self, wave, nt, li):
        """Head-dim column of this lane in dQ tile ``nt`` of ``wave``."""
        return wave * self.DQ_COLS + nt * self.T + li

    def kq_row(self, st, g, j):
        """Key (within the block) of B value ``j`` for dQ's k-step ``st``."""
        return st * self.KT + g * self.KV + j
