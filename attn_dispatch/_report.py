"""Selection outcomes as data (``Candidate``, ``Report``), formatted last."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ._arch import Arch

SELECTED, SUPPORTED, REJECTED = "selected", "supported", "rejected"
OPT_IN, BLOCKED, FAILED = "opt-in", "blocked", "failed"


@dataclass(frozen=True)
class Candidate:
    """One implementation's verdict for one input signature."""

    name: str
    priority: int | None
    opt_in: bool
    status: str
    reasons: tuple[str, ...] = ()
    # the recorded cost table's predicted microseconds per call (attn_dispatch._costs)
    predicted_us: float | None = None
    # where that prediction came from, with any drift of the versions it was measured with
    prediction: str | None = None

    def to_dict(self) -> dict:
        return asdict(self) | {"reasons": list(self.reasons)}


@dataclass(frozen=True)
class Timing:
    """One candidate of an autotune measurement: its median time per call, or why it may not
    be chosen (its results disagreed, it raised, it could not be captured)."""

    name: str
    seconds: float | None
    excluded: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Measurement:
    """What autotune did for a decision: ``status`` is ``"measured"`` (timed by this call),
    ``"reused"`` (a remembered measurement), ``"pending"`` (not measured yet: nothing
    remembered, and this call could not be measured, e.g. non-finite values), ``"single"``
    (one candidate: nothing to measure) or ``"failed"`` (no candidate passed); ``note`` says
    more."""

    status: str
    timings: tuple[Timing, ...]
    note: str

    @property
    def measured(self) -> bool:
        """Whether the selection was made by a measurement."""
        return self.status in ("measured", "reused")

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "note": self.note,
            "timings": [t.to_dict() for t in self.timings],
        }


@dataclass(frozen=True)
class Report:
    """What ``explain`` returns: the arch, the choice (or ``None``) and every candidate.

    ``str(report)`` is a readable table; ``to_dict()`` is the JSON form of ``explain --json``.
    """

    arch: Arch
    selected: str | None
    candidates: tuple[Candidate, ...]
    inputs: str = ""
    forced: str | None = None
    mode: str = "backward"
    # "eager" or "graph" (captured into a CUDA graph, or declared so): priorities
    # may differ between them (see attn_dispatch._execution)
    execution: str = "eager"
    # set when autotune took part in the decision (see attn_dispatch._autotune)
    autotune: Measurement | None = None

    def to_dict(self) -> dict:
        """``arch``, ``selected``, ``candidates``, and what the text form heads them with:
        ``mode``, ``forced`` and ``inputs`` (the lines describing tensors and flags); with
        autotune on, ``autotune`` (``Measurement.to_dict``)."""
        data = {
            "arch": self.arch.name,
            "selected": self.selected,
            "candidates": [c.to_dict() for c in self.candidates],
            "mode": self.mode,
            "execution": self.execution,
            "forced": self.forced,
            "inputs": self.inputs.splitlines(),
        }
        if self.autotune is not None:
            data["autotune"] = self.autotune.to_dict()
        return data

    def __str__(self) -> str:
        head = f"attn_dispatch {self.mode} on arch {self.arch.full}"
        head += f" (forced: {self.forced})" if self.forced else ""
        head += f", {self.execution} execution"
        lines = [head]
        if self.inputs:
            lines += ["inputs:"] + [f"  {line}" for line in self.inputs.splitlines()]
        chosen = next((c for c in self.candidates if c.name == self.selected), None)
        if self.autotune and self.autotune.measured:
            how = " (measured: the fastest that agreed)"
            if not _timed_fastest(self.autotune.timings, self.selected):
                how = " (measured: within autotune's margin of the fastest, the decision's own)"
        elif chosen is not None and chosen.predicted_us is not None and not self.forced:
            how = " (the fastest the recorded cost table predicts)"
        else:
            how = ""
        lines.append(f"selected: {self.selected or 'none'}{how}")
        lines.append(format_table(self.candidates))
        if self.autotune is not None:
            lines.append(f"autotune: {self.autotune.note}")
            lines += [f"  {line}" for line in _timing_lines(self.autotune.timings, self.selected)]
        return "\n".join(lines)


def format_table(candidates: tuple[Candidate, ...] | list[Candidate]) -> str:
    """A fixed-width table: name, priority, (predicted time,) status, (the prediction's source or
    why a cost table was not used,) reasons. The prediction column is there only when some
    candidate has one; the reasons (why a candidate may not run) stay reasons alone."""
    predicted = any(c.predicted_us is not None for c in candidates)
    sourced = any(c.prediction for c in candidates)
    header = ["implementation", "priority", *(["predicted"] if predicted else []), "status"]
    rows = [(*header, *(["prediction"] if sourced else []), "reasons")]
    for c in candidates:
        prio = "-" if c.priority is None else str(c.priority)
        status = c.status + (" (opt-in)" if c.opt_in and c.status != OPT_IN else "")
        time = ("-" if c.predicted_us is None else f"{c.predicted_us:.1f} us",) if predicted else ()
        source = (c.prediction or "-",) if sourced else ()
        rows.append((c.name, prio, *time, status, *source, "; ".join(c.reasons)))
    n = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(n)]
    return "\n".join(
        (
            "  ".join(cell.ljust(width) for cell, width in zip(row[:n], widths)) + "  " + row[n]
        ).rstrip()
        for row in rows
    )


def _timed_fastest(timings: tuple[Timing, ...], selected: str | None) -> bool:
    """Whether ``selected`` took the least time of the measured candidates."""
    times = {t.name: t.seconds for t in timings if t.seconds is not None and not t.excluded}
    return selected not in times or times[selected] <= min(times.values())


def _timing_lines(timings: tuple[Timing, ...], selected: str | None) -> list[str]:
    """One line per measured candidate: name, time per call, chosen or why excluded."""
    width = max((len(t.name) for t in timings), default=0)
    lines = []
    for t in timings:
        took = "-" if t.seconds is None else f"{t.seconds * 1e6:.1f} us"
        tail = "chosen" if t.name == selected else (f"excluded: {t.excluded}" if t.excluded else "")
        lines.append(f"{t.name.ljust(width)}  {took:>12}  {tail}".rstrip())
    return lines
