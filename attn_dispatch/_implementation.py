"""What a backend provides: the ``Implementation`` base class and the ``Gradients`` result."""

from __future__ import annotations

import fnmatch
from typing import ClassVar, NamedTuple

import torch

from ._arch import Arch
from ._inputs import BackwardInputs, ForwardInputs


def lookup_priority(table: dict[str, int], arch: Arch) -> int | None:
    """The entry of ``table`` for ``arch.name``: an exact key wins, else the first fnmatch
    pattern in order; ``None`` when nothing matches."""
    if arch.name in table:
        return table[arch.name]
    for pattern, value in table.items():
        if fnmatch.fnmatchcase(arch.name, pattern):
            return value
    return None


class Gradients(NamedTuple):
    """``(dq, dk, dv)`` with the shapes, dtypes and devices of ``(q, k, v)``."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


class Implementation:
    """One kernel (or kernel family) of a backend. Capabilities are class attributes.

    Subclasses set ``backend`` (the entry-point name), ``name``, ``priority`` (fnmatch pattern on
    ``arch.name`` -> int; an exact name beats patterns, else the first matching pattern in order;
    no match: never chosen automatically there), ``opt_in`` and ``deterministic``, and implement
    ``supports`` and ``backward`` (and optionally ``forward``).
    """

    backend: ClassVar[str] = ""
    name: ClassVar[str] = ""
    priority: ClassVar[dict[str, int]] = {}
    opt_in: ClassVar[bool] = False
    deterministic: ClassVar[bool] = True

    @property
    def full_name(self) -> str:
        """``backend:name``."""
        return f"{self.backend}:{self.name}"

    @property
    def has_forward(self) -> bool:
        """Whether this implementation overrides ``forward``."""
        return type(self).forward is not Implementation.forward

    def priority_for(self, arch: Arch) -> int | None:
        """This implementation's priority on ``arch``, or ``None`` when no pattern matches."""
        return lookup_priority(self.priority, arch)

    def priority_for_inputs(self, inp: ForwardInputs, arch: Arch) -> int | None:
        """The priority automatic selection uses for ``inp`` on ``arch`` (optional hook).

        Default: :meth:`priority_for`. Override it to rank a kernel differently at inputs where
        it was measured faster or slower than the arch's usual order; it runs once per input
        signature, must be cheap and return an ``int`` or ``None``.
        """
        return self.priority_for(arch)

    def supports(self, inp: ForwardInputs, arch: Arch) -> list[str]:
        """Reasons this implementation cannot run ``inp`` on ``arch``; ``[]`` means it can.

        Must be cheap and import nothing heavy. ``inp`` is a ``BackwardInputs`` for backward
        dispatch and a ``ForwardInputs`` for forward dispatch.
        """
        return []

    def backward(self, inp: BackwardInputs) -> Gradients:
        """Compute ``(dq, dk, dv)``."""
        raise NotImplementedError(f"{self.full_name} does not implement backward")

    def forward(self, inp: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute ``(out, lse)`` in the library's layout (optional)."""
        raise NotImplementedError(f"{self.full_name} does not implement forward")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.full_name}>"
