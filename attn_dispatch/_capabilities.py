"""Capabilities as data: an implementation's declared limits, checked once at load, and the
standard reasons the core writes from them.

``Implementation`` declares what it can run as class attributes (see its docstring); this module
holds the two sides of that contract. :func:`declaration_problems` runs when a plugin loads (a
wrong type fails that plugin, with the reason), :func:`where_reasons` and :func:`input_reasons`
when an input signature is first seen. Every reason names the offending value, like those of
``supports``. A plugin that declares nothing keeps every default, which allows everything.
"""

from __future__ import annotations

import fnmatch
import numbers
from collections.abc import Callable, Collection

import torch

from ._arch import Arch
from ._inputs import CAUSAL_ALIGNS, BackwardInputs, ForwardInputs
from ._priorities import rules_problem

_BOOLS = (
    "opt_in",
    "deterministic",
    "same_head_dims",
    "dense",
    "varlen",
    "gqa",
    "window",
    "softcap",
    "sinks",
)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _collection_of(value: object, accept: Callable[[object], bool]) -> bool:
    """A collection (not a str) whose every item passes ``accept``."""
    return (
        isinstance(value, Collection)
        and not isinstance(value, (str, bytes))
        and all(accept(item) for item in value)
    )


# ----------------------------------------------------------------------------------------------
# Validation of the declarations (once per plugin load)

_COLLECTIONS: dict[str, tuple[Callable[[object], bool], str]] = {
    "dtypes": (lambda x: isinstance(x, torch.dtype), "a collection of torch.dtype"),
    "head_dims": (_is_int, "a collection of int (a range, a set, a tuple)"),
    "vendors": (lambda x: isinstance(x, str) and bool(x), "a collection of vendor names (str)"),
    "archs": (lambda x: isinstance(x, str) and bool(x), "a collection of fnmatch patterns (str)"),
    "causal_aligns": (lambda x: x in CAUSAL_ALIGNS, f"a collection drawn from {CAUSAL_ALIGNS}"),
    "cost_requires": (
        lambda x: isinstance(x, str) and bool(x),
        "a collection of distribution names (str)",
    ),
}
_REQUIRED_COLLECTIONS = ("causal_aligns", "cost_requires")


def declaration_problems(impl: object) -> list[str]:
    """What is wrong with ``impl``'s declared capabilities (``[]``: nothing)."""
    problems = []
    for name in _BOOLS:
        value = getattr(impl, name)
        if not isinstance(value, bool):
            problems.append(f"{name}={value!r} must be a bool")
    for name, (accept, wanted) in _COLLECTIONS.items():
        value = getattr(impl, name)
        optional = name not in _REQUIRED_COLLECTIONS
        if not (optional and value is None) and not _collection_of(value, accept):
            problems.append(f"{name}={value!r} must be {'None or ' if optional else ''}{wanted}")
    for name in ("opt_in_reason", "cost_tables"):
        value = getattr(impl, name, None)
        if value is not None and not (isinstance(value, str) and value):
            problems.append(f"{name}={value!r} must be None or a non-empty str")
    for name in ("min_sm", "alignment"):
        value = getattr(impl, name)
        if value is not None and not (_is_int(value) and value > 0):
            problems.append(f"{name}={value!r} must be None or a positive int")
    priority = impl.priority
    if not isinstance(priority, dict) or not all(
        isinstance(p, str) and _is_int(v) for p, v in priority.items()
    ):
        problems.append(f"priority={priority!r} must be a dict of fnmatch pattern (str) -> int")
    rules = rules_problem(impl.priority_rules)
    if rules:
        problems.append(rules)
    return problems


# ----------------------------------------------------------------------------------------------
# The standard reasons (once per input signature)

_VENDOR_WORDS = {"cuda": "an NVIDIA (CUDA) GPU", "rocm": "an AMD (ROCm) GPU", "cpu": "the CPU"}


def where_reasons(impl, inp: ForwardInputs, arch: Arch) -> list[str]:
    """Device vendor, arch patterns and minimum sm; the first that fails is the reason.

    When there is one, selection asks nothing more (``supports`` may assume a device it
    declared)."""
    if impl.vendors is not None:
        vendor = inp.device_vendor(arch)
        if vendor not in impl.vendors:
            wanted = " or ".join(_VENDOR_WORDS.get(v, repr(v)) for v in impl.vendors)
            return [f"device vendor {vendor!r} (tensors on {inp.device.type}): needs {wanted}"]
        if vendor != arch.vendor:
            return [
                f"tensors are on a {vendor} device but arch={arch.name} is a {arch.vendor} arch"
            ]
    if impl.archs is not None and not any(fnmatch.fnmatchcase(arch.name, p) for p in impl.archs):
        return [f"arch={arch.name}: runs on {', '.join(impl.archs)} only"]
    if impl.min_sm is not None and arch.vendor == "cuda" and (arch.sm or 0) < impl.min_sm:
        return [f"arch={arch.name}: needs sm_{impl.min_sm} or newer"]
    return []


def _describe_dims(dims: Collection[int]) -> str:
    if isinstance(dims, range) and len(dims) > 2:
        step = f"a multiple of {dims.step} in " if dims.step > 1 else ""
        return f"{step}{dims[0]}..{dims[-1]}"
    return "one of " + ", ".join(str(d) for d in sorted(dims))


def _shape_reasons(impl, inp: ForwardInputs) -> list[str]:
    """dtype, head dims, dense/varlen, GQA."""
    reasons = []
    if impl.dtypes is not None and inp.dtype not in impl.dtypes:
        names = ", ".join(sorted(_dtype_name(d) for d in impl.dtypes))
        reasons.append(f"dtype={_dtype_name(inp.dtype)}: needs one of {names}")
    if impl.head_dims is not None:
        for name, d in (("head_dim", inp.head_dim), ("head_dim_v", inp.head_dim_v)):
            if d not in impl.head_dims:
                reasons.append(f"{name}={d}: needs {_describe_dims(impl.head_dims)}")
    if impl.same_head_dims and inp.head_dim != inp.head_dim_v:
        reasons.append(
            f"head_dim_v={inp.head_dim_v} != head_dim={inp.head_dim}: needs equal head dims"
        )
    if inp.is_varlen and not impl.varlen:
        reasons.append("varlen (cu_seqlens given): not supported")
    if not inp.is_varlen and not impl.dense:
        reasons.append("dense inputs (no cu_seqlens): only varlen is supported")
    if inp.heads != inp.kv_heads and not impl.gqa:
        reasons.append(
            f"heads={inp.heads} != kv_heads={inp.kv_heads} (GQA/MQA): needs equal head counts"
        )
    return reasons


def aligns_agree(inp: ForwardInputs) -> bool:
    """Whether top-left and bottom-right causal masks are the same for ``inp``: dense with
    Sq == Sk, or varlen with ``cu_seqlens_q is cu_seqlens_k`` (equal lengths per sequence)."""
    if inp.is_varlen:
        return inp.cu_seqlens_q is inp.cu_seqlens_k
    return inp.seqlen_q == inp.seqlen_k


def _causal_reasons(impl, inp: ForwardInputs) -> list[str]:
    """A causal mask (or a window's diagonal, aligned the same way) the implementation cannot
    compute; another alignment counts where the two agree."""
    aligns = impl.causal_aligns
    if (not inp.causal and inp.window is None) or inp.causal_align in aligns:
        return []
    if inp.causal and not aligns:
        return ["causal=True: not supported"]
    if aligns_agree(inp):
        return []
    given = (
        f"causal_align={inp.causal_align!r} with Sq={inp.seqlen_q} != Sk={inp.seqlen_k} "
        "(or varlen with distinct cu_seqlens)"
    )
    if not aligns:
        return [f"{given}: window={inp.window} needs an alignment; none is declared"]
    what = "causal mask" if inp.causal else f"diagonal of window={inp.window}"
    return [f"{given}: the {what} is {' or '.join(aligns)} only"]


def variant_reasons(impl, inp: ForwardInputs) -> list[str]:
    """A sliding window, a soft cap or attention sinks the implementation does not declare."""
    reasons = []
    if inp.window is not None and not impl.window:
        reasons.append(f"window={inp.window}: not supported by this implementation")
    if inp.softcap is not None and not impl.softcap:
        reasons.append(f"softcap={inp.softcap!r}: not supported by this implementation")
    if inp.sinks is not None and not impl.sinks:
        reasons.append("sinks (attention sinks): not supported by this implementation")
    return reasons


def _named_tensors(inp: ForwardInputs) -> list[tuple[str, torch.Tensor]]:
    named = [("q", inp.q), ("k", inp.k), ("v", inp.v)]
    if isinstance(inp, BackwardInputs):
        named += [("out", inp.out), ("grad_out", inp.grad_out)]
    return named


def stride_reasons(inp: ForwardInputs, alignment: int) -> list[str]:
    """Each of q, k, v (and out, grad_out for backward) needs a contiguous last dim, every other
    stride a multiple of ``alignment`` bytes and its data ``alignment``-byte aligned."""
    reasons = []
    for name, t in _named_tensors(inp):
        strides, size = t.stride(), t.element_size()
        if t.shape[-1] > 1 and strides[-1] != 1:
            reasons.append(f"{name}.stride()={strides}: needs a contiguous last dim")
        elif any(s * size % alignment for s, n in zip(strides[:-1], t.shape[:-1]) if n > 1):
            reasons.append(
                f"{name}.stride()={strides}: needs strides that are multiples of {alignment} bytes"
            )
        elif t.device.type != "meta" and t.numel() and t.data_ptr() % alignment:
            reasons.append(
                f"{name}.data_ptr() % {alignment} = {t.data_ptr() % alignment}: "
                f"needs {alignment}-byte alignment"
            )
    return reasons


def input_reasons(impl, inp: ForwardInputs) -> list[str]:
    """The standard reasons ``impl``'s declarations give for ``inp`` (on a device it runs on)."""
    reasons = _shape_reasons(impl, inp) + variant_reasons(impl, inp) + _causal_reasons(impl, inp)
    if impl.alignment is not None:
        reasons += stride_reasons(inp, impl.alignment)
    return reasons
