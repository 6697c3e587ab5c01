"""``attn-dispatch doctor``: the installed stack against the one every published figure was
measured on, and each fast path that is off on it and why. It reports and never fails (status 0).

The backends' fast paths come from their implementations' ``fast_paths()`` hook (the plugin
API: the core imports no backend); a hook that raises is reported as that implementation's
problem alone. Cost-table drift is the note ``explain`` shows (``attn_dispatch._costs``)."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
from dataclasses import asdict, dataclass

import torch

from .. import _costs, _settings
from .._implementation import Implementation

# The measured stack of docs/benchmarks.md, as constraints/nvidia.txt pins it (a test keeps them
# equal): what ``scripts/setup.sh`` installs on an NVIDIA machine.
MEASURED = {
    "torch": "2.11.0",
    "triton": "3.6.0",
    "flash-attn-4": "4.0.0b36",
    "nvidia-cutlass-dsl": "4.8.1",
    "transformers": "5.17.0",
}
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
class Report:
    versions: dict[str, dict[str, str | None]]  # distribution -> installed, measured
    fast_paths: list[PathReport]
    # implementation -> why its fast_paths() failed; backend -> why it failed to load
    errors: dict[str, str]
    cost_tables: list[dict[str, str | None]]  # source, drift (or error)
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


def _tables(impls: list[Implementation]) -> list[dict[str, str | None]]:
    """Every shipped cost table of these implementations, with its version drift (or why it
    cannot be read)."""
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
                found.append({"source": source, "drift": None, "error": str(exc)})
                continue
            if table is not None:
                found.append({"source": source, "drift": table.drift, "error": None})
    return found


def report() -> Report:
    errors: dict[str, str] = {}
    paths: list[PathReport] = []
    impls: list[Implementation] = []
    for record in _settings.current().registry.backends.values():
        if record.error is not None:
            errors[record.name] = f"the backend failed to load: {record.error}"
            continue
        paths += _fast_paths(record.name, record.implementations, errors)
        impls += record.implementations
    versions = {d: {"installed": _installed(d), "measured": m} for d, m in MEASURED.items()}
    gpu = torch.cuda.is_available()
    return Report(versions, paths, errors, _tables(impls), gpu)


def text(rep: Report) -> str:
    lines = ["installed versions (measured stack: constraints/nvidia.txt):"]
    for dist, v in rep.versions.items():
        installed = v["installed"] or "not installed"
        same = v["installed"] and v["installed"].split("+")[0] == v["measured"]
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
    if not rep.gpu:
        lines.append(NO_GPU)
    return "\n".join(lines)


def run(as_json: bool) -> int:
    rep = report()
    print(json.dumps(rep.to_dict(), indent=2) if as_json else text(rep))
    return 0
