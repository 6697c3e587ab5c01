"""Kernel configurations per arch and shape class, with an on-disk cache of tuned choices.

A configuration is ``{BLOCK_M, BLOCK_N, num_warps, num_stages}`` (plus optional keys:
``SPLIT``, ``SPLIT_ADD``, ``TAIL_SLICES``, ``WIDE_STORE``, ``TMA``, ``HEAVY_FIRST``,
``WINDOW``, ``LOAD_TMA``, ``CONCURRENT_MAX_SK``, ``DP_FIRST``, ``GLUON``; ``_launch_policy``
reads the launch-order ones) per kernel (``fwd``, ``pre``, ``dkdv``, ``dq``; for the fused-atomic
backward ``dkdvq``, the dK/dV kernel with atomic dQ, and ``cvt``, the dQ convert pass). A
lookup starts from a generic default and merges, each over the one before and each from the
general key to the specific (:func:`lookup_keys`):

1. the built-in table below (sm_90 measured on an NVIDIA H200, see docs/backends/triton.md; sm_80,
   gfx942 and gfx950 are untuned defaults);
2. the on-disk cache written by :func:`save_tuned` (``$ATTN_DISPATCH_TRITON_CACHE`` or
   ``~/.cache/attn_dispatch_triton/``, one JSON per arch and triton version, keyed by shape
   class);
3. the configurations of an active :func:`trial` (for timing candidates).

Lookups are memoised per process, so after the first call the hot path is a dict lookup. Nothing
tunes implicitly: candidates are measured only when asked (e.g. by
``benchmarks/triton/bench_kernels.py``, which writes the cache).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch

Config = dict[str, int]


def _cfg(bm: int, bn: int, warps: int, stages: int) -> Config:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}


def _tma(bm: int, bn: int, warps: int, stages: int) -> Config:
    return {**_cfg(bm, bn, warps, stages), "LOAD_TMA": 1}


def _dp_first(c: Config) -> Config:
    return {**c, "DP_FIRST": 1}


def _gluon_atomic(**extra: int) -> Config:
    """dK/dV with dQ (``dkdvq``) by the Gluon kernel where it applies; elsewhere the tl kernel
    at these tiles, adding dQ by TMA reductions (``TMA``).

    ``WIDE_STORE`` (Gluon only): the dQ tiles stored to shared memory 16 bytes per thread,
    free of bank conflicts, in a column order the convert pass undoes: fewer shared-memory
    wavefronts in a kernel bound by shared-memory bandwidth (docs/experiments.md)."""
    return {**_cfg(64, 128, 8, 3), "TMA": 1, "GLUON": 1, "WIDE_STORE": 1, **extra}


def _gluon(c: Config) -> Config:
    """dK/dV by the warp-specialised Gluon kernel where it applies (sm_90, D = 128, 64 x 128
    tiles; ``_bwd_dkdv_sm90``); ``c`` stays the ``tl`` kernel's config elsewhere."""
    return {**c, "GLUON": 1}


_PRE = _cfg(64, 0, 4, 1)

# shape class: (head-dim bucket: padded D <= 64 / <= 128 / <= 256, causal, gqa)
_GENERIC = {
    "fwd": _cfg(64, 64, 4, 2),
    "pre": _PRE,
    "dkdv": _cfg(32, 64, 4, 2),
    "dq": _cfg(64, 32, 4, 2),
    "dkdvq": _cfg(32, 64, 4, 2),
    "cvt": _PRE,
}

_TABLES: dict[str, dict[str, dict[str, Config]]] = {
    # Interpreter on the CPU: small tiles so tests cross several tiles and the diagonal.
    "cpu": {
        "*": {
            "fwd": _cfg(16, 16, 4, 1),
            "pre": _cfg(16, 0, 4, 1),
            "dkdv": _cfg(16, 16, 4, 1),
            "dq": _cfg(16, 16, 4, 1),
            "dkdvq": _cfg(16, 16, 4, 1),
            "cvt": _cfg(16, 0, 4, 1),
        }
    },
    # sm_90: measured on an NVIDIA H200; the figures behind each entry are in
    # docs/backends/triton.md and docs/experiments.md. LOAD_TMA: the tl loops' tiles by TMA copies
    # (pays for dK/dV; for dQ only at GQA causal short).
    "sm_90": {
        # GLUON: the warp-specialised Gluon kernels (ring of 2) win from 2K keys up; with few
        # programs (MHA 1K-2K) they lose, so those classes keep the tl kernels (but for dK/dV
        # at MHA 2K causal).
        "*": {
            "fwd": _cfg(128, 64, 8, 3),
            "pre": _PRE,
            "dkdv": _gluon(_tma(64, 128, 8, 3)),
            "dq": _gluon(_cfg(128, 64, 8, 3)),
            "dkdvq": _gluon_atomic(),
        },
        # DP_FIRST (tl dK/dV): faster without a causal mask and at MHA 1K causal; slower with
        # the 64x128 causal tiles (Sk > 2048), which keep the other order.
        "d128-full-gqa": {"dkdv": _gluon(_dp_first(_tma(64, 128, 8, 3)))},
        "d128-full-mha": {"dkdv": _gluon(_dp_first(_tma(64, 128, 8, 3)))},
        # Sk > 2048 without a mask: a 4-stage tl dQ; fused-atomic: the units past the last
        # whole wave in at most 16 slices (TAIL_SLICES; the launcher's 64-step minimum keeps
        # MHA's short units whole). Unmeasured at 2K < Sk <= 4K, so off there.
        "d128-full-gqa-long": {
            "dq": _gluon(_cfg(128, 64, 8, 4)),
            "dkdvq": _gluon_atomic(TAIL_SLICES=16),
        },
        "d128-full-gqa-long-4k": {"dkdvq": _gluon_atomic(TAIL_SLICES=0)},
        "d128-full-mha-long": {"dq": _gluon(_cfg(128, 64, 8, 4))},
        # Sk <= 2048: the tile sizes bench_kernels.py --shapes short picked per class
        "d128-full-mha-short": {"dkdv": _dp_first(_cfg(32, 64, 4, 3)), "dq": _cfg(128, 64, 8, 3)},
        # MHA 2K: 16 key blocks of 128 per head fill the SMs (8 at 1K do not); the Gluon dK/dV
        # is not faster here
        "d128-full-mha-short-2k": {"dkdv": _dp_first(_tma(64, 128, 8, 3))},
        "d128-full-gqa-short": {"dq": {**_gluon(_cfg(128, 64, 8, 3)), "CONCURRENT_MAX_SK": 1024}},
        "d128-causal-gqa-short": {
            "dkdv": _gluon(_tma(64, 128, 8, 3)),
            "dq": {**_gluon(_cfg(128, 64, 8, 3)), "CONCURRENT_MAX_SK": 2048},
        },
        "d128-causal-mha-short": {
            "dkdv": _dp_first(_tma(32, 64, 4, 4)),
            "dq": {**_cfg(64, 64, 4, 3), "CONCURRENT_MAX_SK": 2048},
        },
        "d128-causal-mha-short-2k": {"dkdv": _gluon(_dp_first(_tma(64, 128, 8, 3)))},
        # MHA 1K causal is host-bound: TMA descriptors cost more host time than they save on
        # the GPU, so pointer loads.
        "d128-causal-mha-short-1k": {"dkdv": _dp_first(_cfg(32, 64, 4, 4))},
        # dQ beside dK/dV on a side stream (CONCURRENT_MAX_SK)
        "d128-causal-gqa-long": {"dq": {**_gluon(_cfg(128, 64, 8, 3)), "CONCURRENT_MAX_SK": 8192}},
        # GQA 4K and 8K causal, fused-atomic: split 4, launched in windows of one kv head
        # (its 4 slices' programs together, key block by key block), so the heavy programs of
        # the last heads do not start last; 16K keeps the natural order.
        "d128-causal-gqa-long-4k": {"dkdvq": _gluon_atomic(SPLIT=4, WINDOW=1)},
        # at 8K the 4 slices also add dK / dV into one fp32 buffer (SPLIT_ADD), so the sum
        # launch reads one buffer, not 4 (it pays only with windows, whose slices run together)
        "d128-causal-gqa-long-8k": {"dkdvq": _gluon_atomic(SPLIT=4, WINDOW=1, SPLIT_ADD=1)},
        # MHA causal, long: few heads, so the heaviest programs first balance the SMs
        "d128-causal-mha-long": {
            "dkdv": _gluon({**_tma(64, 128, 8, 3), "HEAVY_FIRST": 1}),
            "dq": _gluon({**_cfg(128, 64, 8, 3), "HEAVY_FIRST": 1}),
            "dkdvq": _gluon_atomic(HEAVY_FIRST=1),
        },
        # dkdvq (triton:fused_atomic): GQA slices per program and launch order per class:
        # causal GQA split 4 (heaviest first at 1K-2K), GQA 1K split 2
        "d128-full-gqa-short-1k": {
            "dkdv": _dp_first(_tma(64, 128, 8, 3)),
            "dkdvq": _gluon_atomic(SPLIT=2),
        },
        "d128-causal-gqa": {"dkdvq": _gluon_atomic(SPLIT=4)},
        "d128-causal-gqa-short-2k": {"dkdvq": _gluon_atomic(SPLIT=4, HEAVY_FIRST=1)},
        "d128-causal-gqa-short-1k": {"dkdvq": _gluon_atomic(SPLIT=4, HEAVY_FIRST=1)},
    },
    "sm_80": {
        "*": {
            "fwd": _cfg(128, 64, 4, 3),
            "pre": _PRE,
            "dkdv": _cfg(32, 128, 8, 2),
            "dq": _cfg(128, 32, 8, 2),
            "dkdvq": _cfg(32, 128, 8, 2),
        },
    },
    "gfx942": {
        "*": {
            "fwd": _cfg(128, 64, 4, 1),
            "pre": _PRE,
            "dkdv": _cfg(32, 128, 4, 1),
            "dq": _cfg(128, 32, 4, 1),
            "dkdvq": _cfg(32, 128, 4, 1),
        },
    },
    "gfx950": {
        "*": {
            "fwd": _cfg(128, 64, 4, 1),
            "pre": _PRE,
            "dkdv": _cfg(64, 128, 8, 1),
            "dq": _cfg(128, 64, 8, 1),
            "dkdvq": _cfg(64, 128, 8, 1),
        },
    },
}


SHORT_SEQ = 2048  # at or below: fewer key blocks than SMs, so smaller tiles pay
# Inside "short", entries may also be keyed per length ("-1k": Sk <= 1024, "-2k": up to 2048),
# where the best tile differs between the two (e.g. MHA 8: 8 vs 16 key blocks of 128 per head).
SHORT_SPLIT = 1024
# Above "short", entries may be keyed "-4k" (2048 < Sk <= 4096) or "-8k" (up to 8192), where a
# few waves of programs make the launch order matter more than at longer lengths.
LONG_SPLIT = 4096
LONG_SPLIT_8K = 8192
# The finer length buckets: (largest Sk, key suffix); longer sequences have none.
_FINE_BUCKETS = ((SHORT_SPLIT, "1k"), (SHORT_SEQ, "2k"), (LONG_SPLIT, "4k"), (LONG_SPLIT_8K, "8k"))


def shape_class(head_dim: int, causal: bool, group: int, seqlen_k: int | None = None) -> str:
    """The key configurations are chosen by, e.g. ``"d128-causal-gqa-long"``.

    Without ``seqlen_k`` the key stops before the length bucket (a table entry for both).
    """
    bucket = 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256
    key = f"d{bucket}-{'causal' if causal else 'full'}-{'gqa' if group > 1 else 'mha'}"
    if seqlen_k is None:
        return key
    return f"{key}-{'short' if seqlen_k <= SHORT_SEQ else 'long'}"


def lookup_keys(head_dim: int, causal: bool, group: int, seqlen_k: int) -> tuple[str, ...]:
    """The keys a lookup applies, general to specific: ``"*"``, the class, the class with its
    length bucket and, for short lengths, with the finer ``-1k``/``-2k`` bucket (long ones up
    to 8K: ``-4k``/``-8k``)."""
    cls = shape_class(head_dim, causal, group)
    bucket = shape_class(head_dim, causal, group, seqlen_k)
    for edge, suffix in _FINE_BUCKETS:
        if seqlen_k <= edge:
            return ("*", cls, bucket, f"{bucket}-{suffix}")
    return ("*", cls, bucket)


def arch_of(device: torch.device) -> str:
    """``cpu`` (the interpreter's table), else the core's arch name of the GPU (``sm_XY``, the
    base gfx name)."""
    if device.type != "cuda":
        return "cpu"
    import attn_dispatch as ad

    return ad.detect_arch(device).name


_arch_of = functools.cache(arch_of)  # per device: the hot path asks the driver once


@functools.cache
def sm_count(device: torch.device) -> int:
    """Multiprocessors (NVIDIA SMs / AMD CUs) of a GPU."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def cache_path(arch: str) -> Path:
    """The JSON file holding tuned configurations for ``arch`` and this triton version."""
    import triton

    root = os.environ.get("ATTN_DISPATCH_TRITON_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "attn_dispatch_triton"
    return base / f"configs-{arch}-triton{triton.__version__}.json"


@functools.cache
def _tuned(arch: str) -> dict[str, dict[str, Config]]:
    path = cache_path(arch)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _table_for(arch: str) -> dict[str, dict[str, Config]]:
    if arch in _TABLES:
        return _TABLES[arch]
    if arch.startswith("sm_9") or arch.startswith("sm_1"):
        return _TABLES["sm_90"]
    if arch.startswith("sm_"):
        return _TABLES["sm_80"]
    return _TABLES.get(arch, {"*": _GENERIC})


@functools.cache
def lookup(
    arch: str, head_dim: int, causal: bool, group: int, seqlen_k: int = 1 << 30
) -> dict[str, Config]:
    """All four kernel configs for one arch and shape class (memoised).

    Entries override each other from general to specific (:func:`lookup_keys`) in the table,
    then the on-disk tuned entries likewise, then those of an active :func:`trial`.
    """
    keys = lookup_keys(head_dim, causal, group, seqlen_k)
    base = dict(_GENERIC)
    for source in (_table_for(arch), _tuned(arch), _TRIALS.get(arch, {})):
        for key in keys:
            base.update(source.get(key, {}))
    if arch != "cpu" and head_dim > 128:  # keep register tiles in budget for D=256
        for name in ("dkdv", "dq", "fwd", "dkdvq"):
            c = dict(base[name])
            c["BLOCK_M"], c["BLOCK_N"] = min(c["BLOCK_M"], 64), min(c["BLOCK_N"], 64)
            c["num_stages"] = min(c["num_stages"], 2)
            if name == "dkdvq":  # + the dS^T and dQ tiles: 64x64 needs 263 KB smem on sm_90
                c["BLOCK_M"] = min(c["BLOCK_M"], 32)
            base[name] = c
    return base


_TRIALS: dict[str, dict[str, dict[str, Config]]] = {}


def _forget_choices() -> None:
    """Drop memoised lookups and the launch plans recorded with them."""
    lookup.cache_clear()
    from . import _plan

    _plan.clear()


@contextlib.contextmanager
def trial(arch: str, key: str, configs: dict[str, Config]) -> Iterator[None]:
    """Within the block, ``configs`` (kernel name -> config) replace those kernels' configs for
    the class ``key`` (one of :func:`lookup_keys`), above the table and the on-disk cache; for
    timing candidate configurations. Nothing is written to disk."""
    saved = _TRIALS.get(arch, {}).get(key)
    _TRIALS.setdefault(arch, {})[key] = configs
    _forget_choices()
    try:
        yield
    finally:
        if saved is None:
            del _TRIALS[arch][key]
        else:
            _TRIALS[arch][key] = saved
        _forget_choices()


def trial_with(
    arch: str, kernel: str, head_dim: int, causal: bool, group: int, seqlen_k: int, **keys: int
) -> contextlib.AbstractContextManager[None]:
    """A :func:`trial` of one shape's ``kernel`` config as looked up now, with ``keys``
    changed, at the shape's most specific class key (for timing one change to an entry)."""
    base = lookup(arch, head_dim, causal, group, _bucket(seqlen_k))[kernel]
    return trial(
        arch, lookup_keys(head_dim, causal, group, seqlen_k)[-1], {kernel: {**base, **keys}}
    )


def _bucket(seqlen_k: int) -> int:
    """One memo entry per length bucket of :func:`lookup_keys`."""
    for edge, _ in _FINE_BUCKETS:
        if seqlen_k <= edge:
            return edge
    return 1 << 30


def configs_for(
    arch: str, head_dim: int, head_dim_v: int, causal: bool, group: int, seqlen_k: int
) -> dict[str, Config]:
    """Every kernel's configuration for a call, its tiles sized for the wider of D and Dv (the
    kernels hold tiles of both in shared memory and registers, so D = 112 with Dv = 184 needs
    the D = 256 budget)."""
    return lookup(arch, max(head_dim, head_dim_v), causal, group, _bucket(seqlen_k))


def get_backward_config(
    device: torch.device,
    head_dim: int,
    causal: bool,
    group: int,
    seqlen_k: int = 1 << 30,
    head_dim_v: int | None = None,
) -> dict[str, Config]:
    """Every kernel's configuration, the forward's (``"fwd"``) among them (``head_dim_v``: Dv,
    when it differs from D)."""
    dv = head_dim_v or head_dim
    return configs_for(_arch_of(device), head_dim, dv, causal, group, seqlen_k)


def save_tuned(arch: str, key: str, configs: dict[str, Config]) -> Path:
    """Record tuned configurations for one shape class in the on-disk cache."""
    path = cache_path(arch)
    data = dict(_tuned(arch))
    data[key] = configs
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)
    _tuned.cache_clear()
    _forget_choices()  # recorded launches hold the old configurations
    return path
