"""``Call``: the flags of one forward or backward call, as one frozen value.

The dispatcher builds it on every call from the arguments (cheap checks only: see
``_dispatch.dispatch``), keys its decision caches on it (with the tensors' metadata), and
validates it with the tensors on the first call of a signature (``_validation``). Every layer
passes the ``Call`` rather than its fields, so a flag added to the contract is added here once.
"""

from __future__ import annotations

from typing import NamedTuple

from ._inputs import Window


class Call(NamedTuple):
    """Every flag of a call; tensors, cu_seqlens and max_seqlen travel beside it."""

    kind: str  # "forward" or "backward"
    causal: bool
    causal_align: str
    scale: float | None  # None: 1/sqrt(head_dim), resolved by validation
    deterministic: bool
    backend: str | None  # the forced name (argument, use_backend, env), checked on first call
    window: Window | None
    softcap: float | None
    execution: str  # "eager" or "graph" (see _execution)


# The hot path builds a Call from a tuple without NamedTuple's Python-level __new__.
new_call = Call._make
