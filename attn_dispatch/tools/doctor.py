"""``attn-dispatch doctor``: the installed stack against the one the shipped cost tables (and
every published figure) were measured on, each fast path that is off on it and why, and which
cost table ranks each implementation. It reports and never fails (status 0).

The backends' fast paths come from their implementations' ``fast_paths()`` hook (the plugin
API: the core imports no backend); a hook that raises is reported as that implementation's
problem alone. The measured versions are the shipped cost tables' own (their provenance's
``versions``), so that there is one record of them; cost-table drift is the note ``explain``
shows (``attn_dispatch._costs``), and the table that ranks an implementation is the one
automatic selection reads (``_selection.cost_tables_of``): the user's own for the calls it
covers where it holds the implementation's rows, the shipped one for the others."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from .. import _costs, _settings
from .._arch import Arch, detect_arch
from .._implementation import Implementation
from .._selection import cost_tables_of

NO_GPU = "no GPU: kernels run only on the reference backend"


@dataclass(frozen=True)
class PathReport:
    """One fast path of a backend, with the implementations that declare it."""

    backend: str
    implementations: tuple[str, ...]
    name: str
    on: bool
    reason: str


@dataclass(frozen=True)
class Ranking:
    """The cost table that ranks one implementation on ``arch``: ``table`` ``"user"`` (the
    user's own, ``attn-dispatch tune --grid``), ``"shipped"`` or ``None`` (none: ranked by
    its priority); ``source`` its file, ``drift`` its version drift, ``error`` why it cannot
    be read (the implementation then fails its calls). A user table ranks only the calls it
    covers: ``elsewhere`` is the shipped table's ranking of the others (``None`` when the
    shipped table holds no rows of the implementation)."""

    implementation: str
    arch: str
    table: str | None
    source: str | None
    drift: str | None
    error: str | None
    elsewhere: Ranking | None = None


@dataclass(frozen=True)
class Report:
    versions: dict[str, dict[str, str | None]]  # distribution -> installed, measured
    fast_paths: list[PathReport]
    # implementation -> why its fast_paths() failed; backend -> why it failed to load
    errors: dict[str, str]
    cost_tables: list[dict[str, str | None]]  # source, drift (or error)
    rankings: list[Ranking]
    gpu: bool

    def to_dict(self) -> dict:
        data = asdict(self)
        data["notes"] = [] if self.gpu else [NO_GPU]
        return data


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fast_paths(
    backend: str, impls: list[Implementation], errors: dict[str, str]
) -> list[PathReport]:
    """The backend's fast paths, one entry per distinct (name, on, reason)."""
    seen: dict[tuple, list[str]] = {}
    for impl in impls:
        try:
            paths = [tuple(p) for p in impl.fast_paths()]
            for path in paths:
                if len(path) != 3:
                    raise TypeError(f"fast_paths() returned {path!r}, not (name, on, reason)")
        except Exception as exc:  # a plugin's hook: its failure is reported, not raised
            errors[impl.full_name] = f"fast_paths() raised {type(exc).__name__}: {exc}"
            continue
        for name, on, reason in paths:
            seen.setdefault((str(name), bool(on), str(reason)), []).append(impl.full_name)
    return [PathReport(backend, tuple(i), *key) for key, i in seen.items()]


def _shipped(impls: list[Implementation]) -> list[tuple[str, _costs.CostTable | None, str | None]]:
    """Every shipped cost table of these implementations: its source, the table (``None``
    when it cannot be read) and why not."""
    found = []
    packages = sorted({p for p in map(_costs.tables_of, impls) if p is not None})
    for package in packages:
        folder = importlib.resources.files(package).joinpath(_costs.COSTS_DIR)
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".json"):
                continue
            source = f"{package}/{_costs.COSTS_DIR}/{entry.name}"
            try:
                table = _costs.load(package, entry.name.removesuffix(".json"))
            except _costs.CostTableError as exc:
                found.append((source, None, str(exc)))
                continue
            if table is not None:
                found.append((source, table, None))
    return found


def measured_versions(tables: list[_costs.CostTable]) -> dict[str, str]:
    """The versions the tables were measured with (their provenance's ``versions``), by
    distribution; where tables differ, their versions joined by `` / ``."""
    seen: dict[str, list[str]] = {}
    for table in tables:
        versions = table.provenance.get("versions", {})
        for dist, version in versions.items() if isinstance(versions, dict) else ():
            if isinstance(version, str) and version not in seen.setdefault(dist, []):
                seen[dist].append(version)
    return {dist: " / ".join(v) for dist, v in seen.items() if v}


def _table_ranking(
    name: str, arch: str, kind: str, source: str, read: Callable[[], _costs.CostTable | None]
) -> Ranking | None:
    """``read()``'s table as the ranking of ``name`` (``kind``: ``"user"`` or ``"shipped"``,
    ``source`` its file), ``None`` when there is no such table or it holds no rows of
    ``name``; a table that cannot be read is the ranking's error."""
    try:
        table = read()
    except _costs.CostTableError as exc:
        return Ranking(name, arch, kind, source, None, str(exc))
    if table is None or not table.covers(name):  # a table without its rows ranks it not
        return None
    return Ranking(name, arch, kind, table.source, table.drift, table.broken.get(name))


def _ranking(impl: Implementation, arch: str) -> Ranking:
    """The tables that rank ``impl`` on ``arch``, as automatic selection finds them
    (``_costs.predict``): the user's where it covers a call, the shipped one elsewhere."""
    package, (directory, owner) = cost_tables_of(impl)
    name = impl.full_name
    mine = _table_ranking(
        name,
        arch,
        "user",
        str(_costs.user_path(directory, owner, arch)),
        lambda: _costs.load_user(directory, owner, arch),
    )
    shipped = (
        None
        if package is None
        else _table_ranking(
            name,
            arch,
            "shipped",
            f"{package}/{_costs.COSTS_DIR}/{arch}.json",
            lambda: _costs.load(package, arch),
        )
    )
    if mine is None:
        return shipped or Ranking(name, arch, None, None, None, None)
    # a user table that cannot be read fails every call before the shipped one is consulted
    return mine if mine.error is not None else replace(mine, elsewhere=shipped)


def report(arch: Arch | None = None) -> Report:
    """The report for ``arch``'s cost tables (default: this machine's, ``detect_arch()``)."""
    arch_name = (arch or detect_arch()).name
    errors: dict[str, str] = {}
    paths: list[PathReport] = []
    impls: list[Implementation] = []
    for record in _settings.current().registry.backends.values():
        if record.error is not None:
            errors[record.name] = f"the backend failed to load: {record.error}"
            continue
        paths += _fast_paths(record.name, record.implementations, errors)
        impls += record.implementations
    shipped = _shipped(impls)
    measured = measured_versions([t for _, t, _ in shipped if t is not None])
    versions = {d: {"installed": _installed(d), "measured": m} for d, m in measured.items()}
    tables = [{"source": src, "drift": t and t.drift, "error": e} for src, t, e in shipped]
    rankings = [_ranking(i, arch_name) for i in impls]
    return Report(versions, paths, errors, tables, rankings, torch.cuda.is_available())


def text(rep: Report) -> str:
    lines = ["installed versions (measured stack: the shipped cost tables' provenance):"]
    if not rep.versions:
        lines.append("  none recorded: the installed backends ship no cost table")
    for dist, v in rep.versions.items():
        installed = v["installed"] or "not installed"
        measured = [m.split("+")[0] for m in v["measured"].split(" / ")]
        same = v["installed"] and measured == [v["installed"].split("+")[0]]
        mark = "" if same else f"  (measured: {v['measured']})"
        lines.append(f"  {dist:<20} {installed}{mark}")
    lines.append("fast paths:")
    if not rep.fast_paths and not rep.errors:
        lines.append("  none declared by the installed backends")
    for p in rep.fast_paths:
        state = "on " if p.on else "OFF"
        lines.append(f"  {state} {p.backend}: {p.name}: {p.reason}")
    for impl, error in rep.errors.items():
        lines.append(f"  ?   {impl}: {error}")
    lines.append("cost tables:")
    if not rep.cost_tables:
        lines.append("  none shipped by the installed backends")
    for t in rep.cost_tables:
        note = t["error"] or t["drift"] or "the measured versions are installed"
        lines.append(f"  {t['source']}: {note}")
    arch = rep.rankings[0].arch if rep.rankings else "-"
    lines.append(f"cost table ranking each implementation on {arch}:")
    for r in rep.rankings:
        if r.table is None:
            lines.append(f"  {r.implementation}: none (ranked by its priority)")
            continue
        line = f"  {r.implementation}: {_table_text(r)}"
        if r.elsewhere is not None:
            line = f"{line}; elsewhere {_table_text(r.elsewhere)}"
        lines.append(line)
    if not rep.gpu:
        lines.append(NO_GPU)
    return "\n".join(lines)


def _table_text(r: Ranking) -> str:
    """``user <path>`` or ``shipped <source>``, the calls a user table ranks when the shipped
    one ranks the rest, and the table's error or drift."""
    scope = " where it covers the call" if r.elsewhere is not None else ""
    note = f"; {r.error}" if r.error else (f"; {r.drift}" if r.drift else "")
    return f"{r.table} {r.source}{scope}{note}"


def run(as_json: bool, arch: Arch | None = None) -> int:
    rep = report(arch)
    print(json.dumps(rep.to_dict(), indent=2) if as_json else text(rep))
    return 0
