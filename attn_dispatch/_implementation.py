"""What a backend provides: the ``Implementation`` base class and the ``Gradients`` result."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Collection
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from ._arch import Arch
from ._inputs import BackwardInputs, ForwardInputs
from ._priorities import PriorityRule, rule_priority


class FastPath(NamedTuple):
    """An optional speed-up of an implementation and whether this installation runs it: ``name``
    (e.g. "launch-plan replay"), ``on``, and ``reason``, a sentence saying why (the version
    gate it passed or failed, a setting that turned it off)."""

    name: str
    on: bool
    reason: str


def lookup_priority(table: dict[str, int], arch: Arch) -> int | None:
    """The entry of ``table`` for ``arch.name``: an exact key wins, else the first fnmatch
    pattern in order; ``None`` when nothing matches."""
    if arch.name in table:
        return table[arch.name]
    for pattern, value in table.items():
        if fnmatch.fnmatchcase(arch.name, pattern):
            return value
    return None


class _GradientTuple(NamedTuple):
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


class Gradients(_GradientTuple):
    """``(dq, dk, dv)`` with the shapes, dtypes and devices of ``(q, k, v)``, and ``dsinks``.

    ``dsinks`` is the gradient of the call's ``sinks`` (its shape ``[heads]``, dtype and
    device), ``None`` for a call without sinks. It is an attribute, not a fourth item, so the
    result still unpacks as ``dq, dk, dv = ...``.
    """

    # the default of results built without one (``_make``)
    dsinks: torch.Tensor | None = None

    def __new__(cls, dq, dk, dv, dsinks=None):
        # one Python frame, as NamedTuple's generated constructor (the hot path counts them)
        self = tuple.__new__(cls, (dq, dk, dv))
        if dsinks is not None:
            self.dsinks = dsinks
        return self

    def _replace(self, **changes) -> Gradients:
        dsinks = changes.pop("dsinks", self.dsinks)
        return Gradients(*super()._replace(**changes), dsinks)

    def __repr__(self) -> str:
        base = super().__repr__()
        return base if self.dsinks is None else f"{base[:-1]}, dsinks={self.dsinks!r})"


class Implementation:
    """One kernel (or kernel family) of a backend. Capabilities are class attributes.

    Subclasses set ``backend`` (the entry-point name), ``name``, ``priority`` (fnmatch pattern on
    ``arch.name`` -> int; an exact name beats patterns, else the first matching pattern in order;
    no match: never chosen automatically there), optionally ``priority_rules`` (a tuple of
    :class:`PriorityRule`: the kinds of calls that rank differently from the arch's entry, see
    ``attn_dispatch._priorities``) and ``opt_in`` (with ``opt_in_reason``, a
    sentence saying why, shown by ``explain`` and ``list``), declare what they can run with
    the capability attributes below, and implement ``backward`` (and optionally ``forward``)
    and, for what the declarations cannot say, ``supports``.

    Capabilities (checked when the plugin loads; the core writes the reasons from them, each
    naming the offending value; the defaults allow everything):

    * ``deterministic``: the backward gives bit-identical results run to run; a call asking for
      determinism rejects an implementation that is not.
    * ``dtypes``: query dtypes it runs (``None``: every dtype the core accepts).
    * ``head_dims``: head dims it runs, for both D and Dv: a ``range`` (``range(8, 257, 8)``:
      multiples of 8 up to 256) or a set (``None``: any). ``same_head_dims``: Dv must equal D.
    * ``vendors``: where the tensors must live (``"cuda"``, ``"rocm"``, ``"cpu"``; ``None``:
      anywhere). When declared, the arch's vendor must match the tensors' too.
    * ``archs``: fnmatch patterns on ``arch.name`` it runs on (``None``: any).
      ``min_sm``: the oldest CUDA compute capability as one number (80 for sm_80); it applies
      to CUDA archs only. A device or arch outside these is the one reason given, and
      ``supports`` is not asked.
    * ``dense`` / ``varlen``: whether it runs dense (BSHD) and varlen (THD + cu_seqlens) inputs.
    * ``gqa``: whether it runs ``heads != kv_heads`` (GQA/MQA).
    * ``causal_aligns``: the causal mask alignments it computes (``()``: no causal mask). A
      call with the other alignment is still accepted where the two agree (Sq == Sk, or varlen
      with ``cu_seqlens_q is cu_seqlens_k``).
    * ``alignment``: when set (bytes, e.g. 16), q, k, v (and out, grad_out) need a contiguous
      last dim, every other stride a multiple of it and data pointers aligned to it.
    * ``window`` / ``softcap``: whether it runs sliding-window attention (``inp.window``) and
      logit soft-capping (``inp.softcap``). An implementation that does not declare one is never
      chosen for a call that uses it. A window's diagonal is aligned by ``causal_align``, so
      ``causal_aligns`` applies to windowed calls too.
    * ``sinks``: whether it runs attention sinks (``inp.sinks``, one logit per query head in
      every row's softmax; ``lse`` includes it and ``backward`` returns ``Gradients`` with
      ``dsinks``).
    """

    backend: ClassVar[str] = ""
    name: ClassVar[str] = ""
    priority: ClassVar[dict[str, int]] = {}
    # the calls ranked otherwise than by ``priority`` (first match wins; per-mode rules first)
    priority_rules: ClassVar[tuple[PriorityRule, ...]] = ()
    opt_in: ClassVar[bool] = False
    # why it is opt-in (shown by explain and list), e.g. "not yet run on this hardware"
    opt_in_reason: ClassVar[str | None] = None
    deterministic: ClassVar[bool] = True
    dtypes: ClassVar[Collection[torch.dtype] | None] = None
    head_dims: ClassVar[Collection[int] | None] = None
    same_head_dims: ClassVar[bool] = False
    vendors: ClassVar[Collection[str] | None] = None
    archs: ClassVar[Collection[str] | None] = None
    min_sm: ClassVar[int | None] = None
    dense: ClassVar[bool] = True
    varlen: ClassVar[bool] = True
    gqa: ClassVar[bool] = True
    causal_aligns: ClassVar[Collection[str]] = ("top_left", "bottom_right")
    alignment: ClassVar[int | None] = None
    window: ClassVar[bool] = False
    softcap: ClassVar[bool] = False
    sinks: ClassVar[bool] = False
    # The package holding this implementation's measured cost tables, ``costs/<arch>.json``
    # (see ``attn_dispatch._costs``; ``None``: its own top-level package, when that has a
    # ``costs/`` folder): where a table covers a call, automatic selection ranks the measured
    # implementations by predicted time instead of by priority.
    cost_tables: ClassVar[str | None] = None
    # The distributions its kernels come from: a cost table records their versions
    # (``requires``), and ``explain`` names any drift from them.
    cost_requires: ClassVar[Collection[str]] = ()

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

        Default: the first of ``priority_rules`` without an execution mode that matches, else
        :meth:`priority_for`. Declare a rule to rank a kernel differently at inputs where it was
        measured faster or slower than the arch's usual order; override this only for what a
        rule cannot say. It runs once per input signature, must be cheap and return an ``int``
        or ``None``.
        """
        declared = rule_priority(self.priority_rules, inp, arch, None)
        return declared if declared is not None else self.priority_for(arch)

    def priority_for_execution(self, inp: ForwardInputs, arch: Arch, execution: str) -> int | None:
        """The priority for ``inp`` on ``arch`` when the call runs as ``execution``
        (``"eager"``: every call pays its host cost, torch.compile'd calls included; ``"graph"``:
        captured into a CUDA graph, see ``attn_dispatch._execution``) (optional hook).

        Default: the first of ``priority_rules`` naming ``execution`` that matches, else
        :meth:`priority_for_inputs`. Declare such a rule where a kernel's host cost makes it
        slower end to end in eager mode than under graphs. Runs once per input signature and
        mode; the decision is cached per mode.
        """
        declared = rule_priority(self.priority_rules, inp, arch, execution)
        return declared if declared is not None else self.priority_for_inputs(inp, arch)

    def supports(self, inp: ForwardInputs, arch: Arch) -> list[str]:
        """Reasons this implementation cannot run ``inp`` on ``arch``; ``[]`` means it can.

        Only what the capability attributes cannot declare: the core has already written the
        reasons for those (and asks this only on a device and arch the declarations allow).
        Must be cheap and import nothing heavy. ``inp`` is a ``BackwardInputs`` for backward
        dispatch and a ``ForwardInputs`` for forward dispatch.
        """
        return []

    def fast_paths(self) -> list[FastPath]:
        """This implementation's optional speed-ups and whether this installation runs them
        (optional hook; default none): those gated on a dependency's version or a setting, so
        that ``attn-dispatch doctor`` can name what is off on the installed stack and why. Reads
        versions and settings only (no device, no compile); an exception it raises is reported
        as this implementation's, the others' still shown."""
        return []

    def prepare(self, inp: ForwardInputs) -> object:
        """This implementation's plan for ``inp``'s signature (optional hook; default ``None``).

        The dispatcher calls it once per cached decision: on the first call of a signature, after
        selection and before that call runs; every call of the signature then finds the result
        as ``inp.plan`` in ``forward`` / ``backward``, with no look-up of its own. ``inp`` is a
        ``BackwardInputs`` for a backward decision and a ``ForwardInputs`` for a forward one.

        A plan may hold only what the signature fixes (shapes, strides, dtypes, devices, flags,
        and what is derived from them: launch arguments, grids, compiled kernels), never data
        pointers or tensor values: the decision serves every later call with other tensors of
        the same signature. It lives as long as the decision: ``reload()``, a cleared cache and
        a new decision of the signature (autotune, other pointer alignments) drop it, and a new
        decision gets a new plan (autotune also prepares each candidate it times, for that
        measurement only). Not called on the ``meta`` device (``inp.plan`` is ``None``
        there), nor for inputs the dispatcher did not build (``make_inputs``): ``forward`` and
        ``backward`` must run with ``inp.plan`` ``None``. An exception it raises fails the call
        as one raised by ``forward`` / ``backward`` would, naming the implementation; nothing is
        cached, so the next call of the signature asks again.
        """
        return None

    def autograd_forward(
        self, inp: ForwardInputs, layout: str
    ) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
        """For ``attention``'s eager calls of ``inp``'s signature made in ``layout`` (``"bshd"``
        or ``"bhsd"``, as the caller passes q, k and v): a function of the caller's ``(q, k,
        v)`` that returns ``forward(inp)``'s output in that layout with grad recording on,
        through an operator whose own autograd node (compiled, as PyTorch's attention operators
        have) computes what ``backward`` computes (optional hook; default ``None``: not for
        this signature).

        The core asks once per eager signature (its tensors' metadata, the layout, which inputs
        require grad; plain tensors only) after its first call, with the forward
        decision's plan as ``inp.plan``, and only for dense calls without sinks, where the
        backward decisions, eager and under graphs, pick this implementation too: those calls
        then record that node instead of the library's Python one, whose host cost is several
        times a compiled node's. Every call it serves has ``inp``'s flags and tensor metadata,
        so the function may keep what ``inp`` fixes (scale, lengths, the plan), but never ``inp`` or
        its tensors: it lives as long as the signature's verdict. It must return
        ``forward``'s output values (a fresh tensor; its strides may be the operator's own),
        differentiable in q, k and v.
        """
        return None

    def backward(self, inp: BackwardInputs) -> Gradients:
        """Compute ``(dq, dk, dv)`` (and ``dsinks`` when ``inp.sinks`` is given)."""
        raise NotImplementedError(f"{self.full_name} does not implement backward")

    def forward(self, inp: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute ``(out, lse)`` in the library's layout (optional)."""
        raise NotImplementedError(f"{self.full_name} does not implement forward")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.full_name}>"
