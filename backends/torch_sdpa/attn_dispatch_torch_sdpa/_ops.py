"""Gating of PyTorch's private attention ops: torch version, presence and schema.

The ops live under ``torch.ops.aten`` with leading underscores; their argument lists change
between releases. Each implementation names the ops it calls with the positional argument
*types* and keyword names it relies on; :func:`op_problem` compares them with the installed
schema (names of positional arguments are ignored: they were renamed without changing meaning,
e.g. ``philox_seed`` -> ``rng_state``). Results are cached: the checks run once per process.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from packaging.version import Version

#: Oldest torch whose op schemas this package was written against (2.5 added the cuDNN
#: backward's ``attn_bias``/``cum_seq`` arguments and FlashAttention's window arguments).
MIN_TORCH = Version("2.5")


class OpSpec(NamedTuple):
    """What we call: the op name, the positional argument types we pass, keywords we use."""

    name: str
    positional: tuple[str, ...]
    keywords: tuple[str, ...] = ("scale",)


_T = "Tensor"

CUDNN_FWD = OpSpec(
    "_scaled_dot_product_cudnn_attention",
    (_T, _T, _T, "Tensor?", "bool", "float", "bool", "bool"),
)
CUDNN_BWD = OpSpec(
    "_scaled_dot_product_cudnn_attention_backward",
    (*(_T,) * 11, "SymInt", "SymInt", "float", "bool"),
)
FLASH_FWD = OpSpec(
    "_flash_attention_forward",
    (_T, _T, _T, "Tensor?", "Tensor?", "SymInt", "SymInt", "float", "bool", "bool"),
)
FLASH_BWD = OpSpec(
    "_flash_attention_backward",
    (*(_T,) * 8, "SymInt", "SymInt", "float", "bool", _T, _T),
)
#: sdpa's own FlashAttention op, on [B, H, S, D] tensors (the own node of heads-first calls).
SDPA_FLASH = OpSpec("_scaled_dot_product_flash_attention", (_T, _T, _T, "float", "bool", "bool"))
EFFICIENT_FWD = OpSpec(
    "_efficient_attention_forward",
    (_T, _T, _T, "Tensor?", "Tensor?", "Tensor?", "SymInt?", "SymInt?", "float", "int", "bool"),
)
EFFICIENT_BWD = OpSpec(
    "_efficient_attention_backward",
    (_T, _T, _T, _T, "Tensor?", _T, "Tensor?", "Tensor?", "SymInt", "SymInt", _T, "float")
    + (_T, _T, "int", "bool"),
    ("scale", "num_splits_key"),
)
#: FlashAttention's sliding-window keywords (both ops), checked only for calls with a window.
WINDOW_KEYWORDS = ("scale", "window_size_left", "window_size_right")
FLASH_FWD_WINDOW = FLASH_FWD._replace(keywords=WINDOW_KEYWORDS)
FLASH_BWD_WINDOW = FLASH_BWD._replace(keywords=WINDOW_KEYWORDS)


@functools.cache
def torch_version() -> Version:
    """The installed torch version without local suffix (``2.11.0+cu130`` -> ``2.11.0``)."""
    return Version(Version(torch.__version__).base_version)


@functools.cache
def op_problem(spec: OpSpec) -> str | None:
    """Why ``spec`` cannot be called on this torch, or ``None`` when it can."""
    version = torch_version()
    if version < MIN_TORCH:
        return f"torch {version} is older than {MIN_TORCH}, the oldest this backend supports"
    try:
        schema = getattr(torch.ops.aten, spec.name).default._schema
    except (AttributeError, RuntimeError):
        return f"torch {version} has no op aten::{spec.name}"
    positional = [a for a in schema.arguments if not a.kwarg_only]
    types = tuple(_norm(str(a.type)) for a in positional[: len(spec.positional)])
    if types != tuple(_norm(t) for t in spec.positional):
        return (
            f"aten::{spec.name} in torch {version} takes ({', '.join(types)}) where "
            f"({', '.join(spec.positional)}) was expected"
        )
    required_after = [a for a in positional[len(spec.positional) :] if a.default_value is None]
    if required_after:
        return (
            f"aten::{spec.name} in torch {version} needs more positional arguments "
            f"({', '.join(a.name for a in required_after)})"
        )
    names = {a.name for a in schema.arguments if a.kwarg_only}
    missing = [k for k in spec.keywords if k not in names]
    if missing:
        return f"aten::{spec.name} in torch {version} lacks keyword(s) {', '.join(missing)}"
    return None


def _norm(type_name: str) -> str:
    """One spelling per type: ``Optional[int]``/``SymInt?`` -> ``int?``."""
    if type_name.startswith("Optional[") and type_name.endswith("]"):
        type_name = type_name[len("Optional[") : -1] + "?"
    return type_name.replace("SymInt", "int")


def ops_problems(*specs: OpSpec) -> list[str]:
    """The problems of several ops (empty when all can be called)."""
    return [p for p in (op_problem(s) for s in specs) if p is not None]


def aten(spec: OpSpec):
    """The default overload of ``spec``'s op."""
    return getattr(torch.ops.aten, spec.name).default


@functools.cache
def empty_long(device: torch.device) -> torch.Tensor:
    """A cached empty int64 tensor: the RNG-state arguments, unused without dropout."""
    return torch.empty(0, dtype=torch.int64, device=device)
