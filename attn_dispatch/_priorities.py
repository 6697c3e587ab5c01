"""Declared priority rules: where an implementation ranks differently from its arch's entry.

An implementation's ``priority`` dict gives one number per arch. Where measurements show a kernel
slower for a kind of call (a variant its tables do not cover, a short call whose host code
dominates in eager execution), it declares that as data: ``priority_rules``, a tuple of
:class:`PriorityRule`, each a priority for the calls matching all of its conditions. The core
evaluates them here and nowhere else (``Implementation.priority_for_inputs`` /
``priority_for_execution``, whose defaults read them): the first matching rule wins, and the
rules naming an execution mode are tried before the others, since they refine the mode-free
order for one mode. Where a cost table covers a call, the measured times still rank it
(``_selection``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from ._arch import Arch
from ._execution import EXECUTIONS
from ._inputs import BackwardInputs, ForwardInputs


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class PriorityRule:
    """``priority`` for the calls on an arch matching ``arch`` (fnmatch pattern) that meet every
    condition given (``None``: any call).

    Conditions on the call: ``execution`` (``"eager"`` or ``"graph"``), ``backward`` (``True``:
    backward calls, ``False``: forward calls), ``varlen``, ``sinks`` and ``softcap`` (whether the
    call is varlen, has attention sinks, has a soft cap), ``max_batch_heads`` (batch times
    query heads at most this; the sequence count stands for the batch of a varlen call) and
    ``max_seqlen_k`` (the longest key sequence at most this). ``when``: a cheap function of the
    process's state (a setting, the installed release) that must also hold; it is asked only
    once every other condition except the two bounds holds, so a bad setting it reads is
    reported for every such call, whatever its size.
    """

    arch: str
    priority: int
    execution: str | None = None
    backward: bool | None = None
    varlen: bool | None = None
    sinks: bool | None = None
    softcap: bool | None = None
    max_batch_heads: int | None = None
    max_seqlen_k: int | None = None
    when: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or not self.arch:
            raise TypeError(
                f"PriorityRule arch must be a non-empty fnmatch pattern, got {self.arch!r}"
            )
        if not _is_int(self.priority):
            raise TypeError(f"PriorityRule priority must be an int, got {self.priority!r}")
        if self.execution is not None and self.execution not in EXECUTIONS:
            raise ValueError(
                f"PriorityRule execution must be None or one of {EXECUTIONS}, "
                f"got {self.execution!r}"
            )
        for name in ("backward", "varlen", "sinks", "softcap"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"PriorityRule {name} must be None or a bool, got {value!r}")
        for name in ("max_batch_heads", "max_seqlen_k"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise TypeError(f"PriorityRule {name} must be None or an int, got {value!r}")
            if value is not None and value <= 0:
                raise ValueError(f"PriorityRule {name} must be positive, got {value!r}")
        if self.when is not None and not callable(self.when):
            raise TypeError(f"PriorityRule when must be None or callable, got {self.when!r}")

    def matches(self, inp: ForwardInputs, arch: Arch, execution: str | None) -> bool:
        """Whether this rule applies to ``inp`` on ``arch`` in ``execution`` (``None``: the
        mode-free evaluation, which no rule naming a mode matches)."""
        if self.execution != execution or not fnmatch.fnmatchcase(arch.name, self.arch):
            return False
        kind = (
            (self.backward, isinstance(inp, BackwardInputs)),
            (self.varlen, inp.is_varlen),
            (self.sinks, inp.sinks is not None),
            (self.softcap, inp.softcap is not None),
        )
        if any(wanted is not None and wanted != actual for wanted, actual in kind):
            return False
        if self.when is not None and not self.when():
            return False
        bounds = (
            (self.max_batch_heads, inp.batch * inp.heads),
            (self.max_seqlen_k, inp.max_seqlen_k),
        )
        return all(bound is None or actual <= bound for bound, actual in bounds)


def rule_priority(
    rules: tuple[PriorityRule, ...], inp: ForwardInputs, arch: Arch, execution: str | None
) -> int | None:
    """The priority of the first of ``rules`` matching ``inp`` on ``arch`` in ``execution``
    (``None``: no rule matches)."""
    for rule in rules:
        if rule.matches(inp, arch, execution):
            return rule.priority
    return None


def rules_problem(rules: object) -> str | None:
    """What is wrong with a declared ``priority_rules`` (``None``: nothing)."""
    if not isinstance(rules, tuple) or not all(isinstance(r, PriorityRule) for r in rules):
        return f"priority_rules={rules!r} must be a tuple of PriorityRule"
    return None
