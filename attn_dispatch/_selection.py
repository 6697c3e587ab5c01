"""Choosing an implementation: every candidate's verdict, then the winner.

Precedence of a forced name: ``backend=`` > ``use_backend()`` > ``ATTN_DISPATCH_BACKEND``.
Automatic choice: among enabled, unblocked implementations with a priority for the arch and no
rejection reasons, the highest priority wins (ties: alphabetical). A forced choice never falls
back and needs no priority entry.
"""

from __future__ import annotations

from ._arch import Arch
from ._capabilities import input_reasons, where_reasons
from ._errors import NoBackendError
from ._implementation import Implementation
from ._inputs import ForwardInputs
from ._registry import describe_error
from ._report import BLOCKED, FAILED, OPT_IN, REJECTED, SELECTED, SUPPORTED, Candidate, Report
from ._settings import DISABLE_ENV, Settings

NON_DETERMINISTIC = (
    "deterministic=True was requested (argument or "
    "torch.use_deterministic_algorithms); this implementation is not deterministic"
)


def _reasons(impl: Implementation, inp: ForwardInputs, arch: Arch, mode: str) -> list[str]:
    """The core's reasons (mode, determinism, declared capabilities), then ``supports``'s."""
    reasons = []
    if mode == "forward" and not impl.has_forward:
        reasons.append("provides no forward")
    if inp.deterministic and not impl.deterministic:
        reasons.append(NON_DETERMINISTIC)
    where = where_reasons(impl, inp, arch)
    if where:
        return reasons + where
    reasons += input_reasons(impl, inp)
    answer = impl.supports(inp, arch)
    if not isinstance(answer, (list, tuple)) or not all(isinstance(r, str) for r in answer):
        raise TypeError(f"supports() must return a list of str, got {answer!r}")
    return reasons + list(answer)


def _verdict(
    impl: Implementation,
    inp: ForwardInputs,
    arch: Arch,
    mode: str,
    settings: Settings,
    forced: str | None,
) -> Candidate:
    name = impl.full_name
    priority = impl.priority_for(arch)
    try:
        reasons = _reasons(impl, inp, arch, mode)
    except Exception as exc:  # a broken plugin costs only itself
        return Candidate(
            name, priority, impl.opt_in, FAILED, (f"supports() raised {describe_error(exc)}",)
        )
    try:
        priority = impl.priority_for_inputs(inp, arch)
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise TypeError(f"priority_for_inputs() must return an int or None, got {priority!r}")
    except Exception as exc:
        return Candidate(
            name,
            impl.priority_for(arch),
            impl.opt_in,
            FAILED,
            (f"priority_for_inputs() raised {describe_error(exc)}",),
        )
    if settings.matches(settings.disabled, name):
        return Candidate(
            name, priority, impl.opt_in, BLOCKED, (f"blocked by {DISABLE_ENV}",) + tuple(reasons)
        )
    if reasons:
        return Candidate(name, priority, impl.opt_in, REJECTED, tuple(reasons))
    is_forced = forced is not None and (forced == name or forced == impl.backend)
    if impl.opt_in and not is_forced and not settings.matches(settings.enabled, name):
        hint = (
            f"opt-in: enable with ATTN_DISPATCH_ENABLE={impl.backend} or "
            f"attn_dispatch.enable({impl.backend!r}), or force it"
        )
        return Candidate(name, priority, True, OPT_IN, (hint,))
    note = (
        ()
        if priority is not None
        else (f"no priority entry for {arch.name}: runs only when forced",)
    )
    return Candidate(name, priority, impl.opt_in, SUPPORTED, note)


def _rank(candidate: Candidate) -> tuple:
    return (-(candidate.priority if candidate.priority is not None else -(1 << 60)), candidate.name)


def evaluate(
    settings: Settings, inp: ForwardInputs, arch: Arch, mode: str, forced: str | None
) -> tuple[Report, Implementation | None]:
    """Every implementation's verdict and the winner (``None`` when nothing can run)."""
    registry = settings.registry
    verdicts = [
        _verdict(impl, inp, arch, mode, settings, forced)
        for impl in registry.implementations.values()
    ]
    if forced is None:
        pool = [c for c in verdicts if c.status == SUPPORTED and c.priority is not None]
    else:
        pool = [
            c
            for c in verdicts
            if c.status == SUPPORTED and (c.name == forced or c.name.split(":", 1)[0] == forced)
        ]
    winner = min(pool, key=_rank) if pool else None
    candidates = [
        Candidate(c.name, c.priority, c.opt_in, SELECTED, ()) if c is winner else c
        for c in verdicts
    ]
    candidates += [
        Candidate(b.name, None, False, FAILED, (b.error or "",)) for b in registry.failed
    ]
    candidates.sort(key=lambda c: (c.status != SELECTED, _rank(c)))
    report = Report(
        arch=arch,
        selected=winner.name if winner else None,
        candidates=tuple(candidates),
        inputs=inp.describe(),
        forced=forced,
        mode=mode,
    )
    return report, registry.implementations[winner.name] if winner else None


def no_backend_error(report: Report) -> NoBackendError:
    """The error raised when nothing (or not the forced implementation) can run the inputs."""
    if report.forced:
        head = (
            f"the forced backend {report.forced!r} cannot run these {report.mode} inputs "
            "(a forced choice never falls back):"
        )
        shown = tuple(
            c
            for c in report.candidates
            if c.name == report.forced or c.name.split(":", 1)[0] == report.forced
        )
    else:
        head = f"no installed implementation can run these {report.mode} inputs:"
        shown = report.candidates
    if not report.candidates:
        head += (
            "\nno backend plugin is installed (pip install attn-dispatch-reference, or check "
            "ATTN_DISPATCH_PLUGINS)"
        )
    body = str(Report(report.arch, None, shown, report.inputs, report.forced, report.mode))
    return NoBackendError(f"{head}\n{body}")
