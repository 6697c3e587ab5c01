"""A faster front for the decision cache on dense calls: C-level guards over tensor metadata.

The dictionary key of the hot path reads shape, stride, dtype and device of six tensors in Python
and hashes them. PyTorch's ``TensorGuards`` (the check ``torch.compile`` uses for the same
question: "are these tensors like the ones I saw?") compares sizes, strides, dtype, device,
dispatch keys and ``requires_grad`` in C++, several times faster (docs/benchmarks.md section 2
has the figures). The class is private, so it is probed once (it must reject a changed size,
stride, dtype and device) and any failure leaves the dictionary path alone. A guard is stricter
than the key, so a miss costs only the dictionary path, never a wrong decision.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

# At most this many guards per flag combination (the first signatures seen keep them): a call
# of any later signature scans them all (each fails at its first tensor) before the dictionary
# serves it. A training loop has one or two signatures per flag combination.
MAX_GUARDS_PER_FLAGS = 4


@functools.cache
def _guard_class():
    """``TensorGuards`` if this torch has it and it behaves as expected, else ``None``."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    try:
        seen = torch.zeros(2, 3)
        guard = _build(TensorGuards, (seen,))
        if guard.check(seen) is not True or guard.check(torch.zeros(2, 3)) is not True:
            return None
        for different in (
            torch.zeros(3, 2),
            torch.zeros(3, 2).t(),
            torch.zeros(2, 3, dtype=torch.float64),
            torch.zeros(2, 3, device="meta"),
        ):
            if guard.check(different) is not False:
                return None
    except Exception:  # a changed private API: use the dictionary only
        return None
    return TensorGuards


def _build(cls, tensors: Sequence[torch.Tensor]):
    # Static sizes and strides: every dimension is compared exactly.
    return cls(
        *tensors,
        dynamic_dims_sizes=[list(t.shape) for t in tensors],
        dynamic_dims_strides=[list(t.stride()) for t in tensors],
    )


def match(entries: list, tensors: Sequence[torch.Tensor]):
    """The decision of the first of ``entries`` (``[(guard, decision)]``) whose guard accepts
    ``tensors``, or ``None``.

    A nested tensor never reaches a guard (reading its strides in C++ aborts the process); a
    non-tensor argument is a miss (validation explains it on the slower path).
    """
    try:
        for t in tensors:
            if t.is_nested:
                return None
        for guard, decision in entries:
            if guard.check(*tensors):
                return decision
    except (AttributeError, TypeError):
        pass
    return None


def can_remember(table: dict, flags: tuple, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether :func:`remember` would add a guard for ``tensors`` under ``flags``: there is
    room, this torch has guards, and the tensors are plain and distinct."""
    entries = table.get(flags)
    if entries is not None and len(entries) >= MAX_GUARDS_PER_FLAGS:
        return False
    if _guard_class() is None or not all(type(t) is torch.Tensor for t in tensors):
        return False
    # a guard rejects one tensor passed twice (ad.backward(q, q, q, ...)): such calls stay on
    # the dictionary, without building a guard on every call only to discard it
    return len({id(t) for t in tensors}) == len(tensors)


def remember(table: dict, flags: tuple, tensors: Sequence[torch.Tensor], decision) -> None:
    """Add a guard for ``tensors`` answering ``decision`` under ``flags`` (if there is room)."""
    if not can_remember(table, flags, tensors):
        return
    cls = _guard_class()
    try:
        guard = _build(cls, tensors)
        if guard.check(*tensors) is not True:
            return
    except Exception:  # e.g. symbolic sizes while tracing: the dictionary serves these
        return
    table.setdefault(flags, []).append((guard, decision))
