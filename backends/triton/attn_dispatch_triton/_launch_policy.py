"""Launch policy of the backward kernels: grids, GQA splits, tail slices, orders and windows.

Pure functions from a problem's shape, a kernel's tuning config and the GPU's SM count to a
frozen launch plan; no tensors, no triton, so every rule is unit-tested on the CPU
(``tests/test_triton_launch_policy.py``). ``_launcher.BackwardLaunch`` allocates what a plan
names and launches it.

The dK/dV kernels run one program per (key block, kv head, slice of the GQA group). How those
programs are laid out on the grid is one :class:`GridLayout`; the Gluon sm_90 kernel reads it as
its ``GRID_LAYOUT`` constexpr, the ``tl`` kernels know ``NATURAL`` and ``HEAVY_FIRST`` (their
``HEAVY_FIRST`` flag).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

SUM_BLOCK = 1024  # elements per program of the split-partial sum launch
SUM_WARPS = 8  # one 16-byte load per thread and partial at SUM_BLOCK elements
MAX_GRID_YZ = 65535  # CUDA's limit on grid axes 1 and 2 (axis 0 allows 2**31 - 1)
# TAIL_SLICES: each slice loads K / V and adds dK / dV, so short slices cost more than they
# save; a slice is never shorter than this many (head, query block) steps.
MIN_SLICE_STEPS = 64
SLICE_COST_STEPS = 2  # a program's own start and end (K / V load, dK / dV store), in steps
# The fp32 dK / dV buffer's fill and cast per unit (128 keys of dK and dV), in steps of one
# program: an estimate from the step's time at D = 128 (docs/benchmarks.md section 5).
BUFFER_COST_STEPS_PER_UNIT = 0.04
CAUSAL_PROGRAMS_PER_SM = 8  # causal programs differ in work: more of them balance the SMs


class GridLayout(enum.IntEnum):
    """How the dK/dV programs of ``key_blocks x (B * Hkv) x split`` sit on the grid."""

    NATURAL = 0  # (key blocks, B * Hkv, split)
    HEAVY_FIRST = 1  # (split, B * Hkv, key blocks): the kernel walks key blocks from the first,
    # which under a causal mask see the most query blocks, so the heaviest programs start first
    WINDOWED = 2  # (split * window, key blocks, B * Hkv / window): the programs of ``window``
    # kv heads launch together, key block by key block
    UNITS = 3  # (units, 1, slices): unit ``unit_offset + program`` is key block
    # ``unit % key_blocks`` of B * Hkv row ``unit // key_blocks``


class Partials(enum.Enum):
    """Where the dK / dV of a split GQA group (or of tail slices) are summed."""

    NONE = "none"  # each program stores its own rows of dK / dV
    SUM_KERNEL = "sum_kernel"  # fp32 partials in one buffer, summed and cast by one launch
    TORCH_SUM = "torch_sum"  # outputs with other strides: fp32 partials summed by torch


@dataclass(frozen=True)
class Problem:
    """What the launch policy reads of a backward call."""

    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int  # (varlen: the longest sequence)
    seqlen_k: int
    causal: bool
    varlen: bool = False
    on_gpu: bool = True  # a CUDA / ROCm device (splits need its SM count)
    has_keys: bool = True  # K holds any element (no keys: nothing to split)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class DkdvLaunch:
    """One launch of a dK/dV kernel."""

    grid: tuple[int, int, int]
    layout: GridLayout = GridLayout.NATURAL
    window: int = 0  # kv heads per window (``WINDOWED``)
    unit_offset: int = 0  # the first unit (``UNITS``)
    add_dkdv: bool = False  # programs add dK / dV into the zero-filled fp32 buffer
    step_slices: bool = False  # slices are equal shares of a group's steps (``UNITS``)


@dataclass(frozen=True)
class DkdvPlan:
    """The dK/dV launches of one call and the buffer their partial results go through."""

    split: int  # slices per GQA group
    key_blocks: int
    partials: Partials
    partial_count: int  # fp32 partial copies of dK / dV (``partials`` not ``NONE``)
    zero_partials: bool  # the partials buffer is zero-filled (programs add into it)
    launches: tuple[DkdvLaunch, ...]


@dataclass(frozen=True)
class SumLayout:
    """One fp32 buffer per partial holding dK's elements, padded to whole ``SUM_BLOCK``s, then
    dV's; the sum launch runs one program per block of either."""

    n_k: int
    n_v: int
    blocks_k: int
    row: int  # elements per partial

    @property
    def grid(self) -> tuple[int]:
        return (self.blocks_k + cdiv(self.n_v, SUM_BLOCK),)

    @property
    def v_offset(self) -> int:
        return self.blocks_k * SUM_BLOCK


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def largest_divisor(n: int, most: int) -> int:
    """The largest divisor of ``n`` that is at most ``most`` (at least 1)."""
    if most < 1:
        raise ValueError(f"config SPLIT must be >= 1, got {most}")
    return next(d for d in range(min(most, n), 0, -1) if n % d == 0)


def query_blocks(p: Problem, block_m: int) -> int:
    return cdiv(max(p.seqlen_q, 1), block_m)


def key_blocks(p: Problem, block_n: int) -> int:
    return cdiv(max(p.seqlen_k, 1), block_n)


def sum_layout(n_k: int, n_v: int) -> SumLayout:
    blocks_k = cdiv(n_k, SUM_BLOCK)
    return SumLayout(n_k, n_v, blocks_k, blocks_k * SUM_BLOCK + n_v)


def heavy_first(p: Problem, config: dict, blocks: int) -> bool:
    """Config ``HEAVY_FIRST``: launch the programs with the most work first. Only a causal mask
    makes programs differ in work; the reversed grid puts the ``blocks`` on an axis limited to
    65535, so beyond that the natural order is kept."""
    return bool(config.get("HEAVY_FIRST", 0)) and p.causal and blocks <= MAX_GRID_YZ


def group_split(p: Problem, config: dict, block_n: int, sms: int | None) -> int:
    """Slices of each kv head's GQA group (config ``SPLIT``, else a heuristic).

    Every slice walks ``group // split`` query heads, so the split always divides the group: a
    configured ``SPLIT`` is lowered to the largest divisor of the group it does not exceed (a
    table entry is per shape class, and one class holds every group size).

    Splitting pays when the key blocks alone leave SMs idle: the group is halved while the
    programs stay within about one per SM (``CAUSAL_PROGRAMS_PER_SM`` per SM with a causal
    mask, whose programs differ in work); docs/experiments.md has the measurements.
    """
    if "SPLIT" in config:
        return largest_divisor(p.group, int(config["SPLIT"]))
    if p.group == 1 or not p.on_gpu or not p.has_keys or sms is None:
        return 1
    programs = key_blocks(p, block_n) * p.batch * p.kv_heads
    target = sms * (CAUSAL_PROGRAMS_PER_SM if p.causal else 1)
    split = 1
    while p.group % (split * 2) == 0 and programs * split * 2 <= target:
        split *= 2
    return split


def tail_slices(p: Problem, config: dict, split: int, sms: int) -> tuple[int, int] | None:
    """Config ``TAIL_SLICES`` (0: off): ``(full, slices)``, or ``None``.

    Without a mask every (key block, kv head) unit is equally long and takes one SM, so when the
    units do not fill whole waves the last wave leaves SMs idle. The first ``full`` units (whole
    waves) then run one program each, and each of the others is cut into ``slices`` equal shares
    of its group's (head, query block) steps: the count, at most ``TAIL_SLICES``, that finishes
    the rest soonest when each program costs ``SLICE_COST_STEPS`` more than its own steps, with
    no slice under ``MIN_SLICE_STEPS``. All of dK / dV then goes through a zero-filled fp32
    buffer, so the time saved must exceed 5% of a unit's and the buffer's estimated cost
    (``BUFFER_COST_STEPS_PER_UNIT`` per unit). ``None`` where it does not apply (a causal mask,
    varlen, a split group) or does not pay.
    """
    most = int(config.get("TAIL_SLICES", 0))
    if most < 0:
        raise ValueError(f"config TAIL_SLICES must be >= 0, got {most}")
    if most < 2 or split != 1 or p.causal or p.varlen:
        return None
    units = key_blocks(p, config["BLOCK_N"]) * p.batch * p.kv_heads
    full = units // sms * sms
    rest = units - full
    steps = p.group * cdiv(p.seqlen_q, config["BLOCK_M"])
    best, slices = steps + SLICE_COST_STEPS, 1  # the rest's time, in steps
    for k in range(2, most + 1):
        if steps // k < MIN_SLICE_STEPS:
            break
        rest_time = cdiv(rest * k, sms) * (steps / k + SLICE_COST_STEPS)
        if rest_time < best:
            best, slices = rest_time, k
    saved = steps + SLICE_COST_STEPS - best
    pays = saved > max(0.05 * (steps + SLICE_COST_STEPS), units * BUFFER_COST_STEPS_PER_UNIT)
    return (full, slices) if full and rest and pays else None


def window(config: dict, grid: tuple[int, int, int]) -> int:
    """Kv heads per launch window (config ``WINDOW``; 0: off) for a natural ``grid``: halved
    until it divides ``B * Hkv``; off when the key blocks do not fit grid axis 1."""
    w = int(config.get("WINDOW", 0))
    if not w or grid[0] > MAX_GRID_YZ:
        return 0
    while grid[1] % w:
        w //= 2
    return w


def _partials(split: int, tail: bool, dense_out: bool, add: bool) -> tuple:
    """``(partials, count, zeroed)`` of a dK/dV plan."""
    if (split > 1 or tail) and dense_out:
        return Partials.SUM_KERNEL, 1 if add else split, add
    if split > 1:
        return Partials.TORCH_SUM, split, False
    return Partials.NONE, 0, False


def _ordered(
    p: Problem, config: dict, grid: tuple[int, int, int], gluon: bool, add: bool
) -> DkdvLaunch:
    """One launch over ``grid`` in the order the config asks for: a window (Gluon kernel only;
    it replaces heaviest-first), the heaviest programs first, or the natural order."""
    blocks, rows, split = grid
    w = window(config, grid) if gluon else 0
    if w:
        return DkdvLaunch(
            (split * w, blocks, rows // w), GridLayout.WINDOWED, window=w, add_dkdv=add
        )
    if heavy_first(p, config, blocks):
        return DkdvLaunch((split, rows, blocks), GridLayout.HEAVY_FIRST, add_dkdv=add)
    return DkdvLaunch(grid, add_dkdv=add)


def dkdv_plan(
    p: Problem, config: dict, *, sms: int | None, gluon: bool, atomic_dq: bool, dense_out: bool
) -> DkdvPlan:
    """The dK/dV launches of one call.

    ``gluon``: the Gluon sm_90 kernel runs (else the ``tl`` one); ``atomic_dq``: the fused-atomic
    design; ``dense_out``: dK and dV fill their memory exactly (:func:`._common.dense`), so
    partials laid out like them can share one buffer and be summed by the sum launch. With the
    Gluon fused-atomic kernel, config ``SPLIT_ADD`` (and ``TAIL_SLICES``' slices) add dK / dV
    into one zero-filled fp32 buffer by atomics, which the sum launch then only casts.
    """
    split = group_split(p, config, config["BLOCK_N"], sms)
    blocks = key_blocks(p, config["BLOCK_N"])
    tail = None
    if gluon and atomic_dq and dense_out and sms is not None:
        tail = tail_slices(p, config, split, sms)
    summed = (split > 1 or tail is not None) and dense_out
    add = summed and atomic_dq and gluon and (bool(config.get("SPLIT_ADD", 0)) or tail is not None)
    partials, count, zeroed = _partials(split, tail is not None, dense_out, add)
    rows = p.batch * p.kv_heads
    if tail is None:
        launches = (_ordered(p, config, (blocks, rows, split), gluon, add),)
    else:  # whole units in full waves (stored), then the rest in slices (added)
        full, slices = tail
        launches = (
            DkdvLaunch((full, 1, 1), GridLayout.UNITS),
            DkdvLaunch(
                (blocks * rows - full, 1, slices),
                GridLayout.UNITS,
                unit_offset=full,
                add_dkdv=True,
                step_slices=True,
            ),
        )
    return DkdvPlan(split, blocks, partials, count, zeroed, launches)


@dataclass(frozen=True)
class DqLaunch:
    """The dQ kernel's grid: ``(query blocks, B * H)``, reversed when heaviest-first."""

    grid: tuple[int, int]
    heavy_first: bool


def dq_launch(p: Problem, config: dict) -> DqLaunch:
    blocks = query_blocks(p, config["BLOCK_M"])
    first = heavy_first(p, config, blocks)
    grid = (blocks, p.batch * p.heads)
    return DqLaunch(grid[::-1] if first else grid, first)


def query_block_grid(p: Problem, config: dict) -> tuple[int, int]:
    """The preprocess and dQ convert passes: one program per query block and head."""
    return (query_blocks(p, config["BLOCK_M"]), p.batch * p.heads)


def runs_concurrently(p: Problem, dq_config: dict, streams: bool) -> bool:
    """Whether dQ runs on a side stream beside dK/dV (config ``CONCURRENT_MAX_SK`` on the dQ
    entry: the longest key length that does; ``streams``: the device has CUDA streams)."""
    return streams and p.seqlen_k <= dq_config.get("CONCURRENT_MAX_SK", -1)
