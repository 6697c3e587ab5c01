"""Recorded cost tables: measured times that rank implementations instead of hand rules.

A backend ships, per arch it was measured on, ``<package>/costs/<arch>.json`` (its own
package's, or the one an implementation names in ``cost_tables``: :func:`tables_of`), written by
``benchmarks/cost_grid.py`` on that GPU: a format version (:data:`FORMAT`), its commit, versions
and commands, the versions of the distributions its kernels come from (``requires``: under
other versions the rows still rank, and ``explain`` names the drift), and one row per
(implementation, kind, grid point) with the median microseconds per call eager (``eager_us``,
host work included) and under CUDA graphs (``graph_us``, the GPU's time); an attention row
(kinds ``attention_bshd``, ``attention_bhsd``) times a forward and its backward through eager
``attention`` with that ``layout`` (``eager_us`` only). The format, and what a malformed table
or row costs, are documented in docs/design.md ("Recorded cost tables"); :func:`parse`
validates a table against it when it is read. The user's tables
(``attn-dispatch tune --grid``: ``<cache dir>/costs/<arch>/<package>.json``, :func:`user_path`)
have the same format and outrank the shipped one call by call: a call the user's table covers
is ranked by it, any other by the shipped table where that covers it (:func:`predict`).

The model that turns rows into a prediction, kept small so that it can be stated in a line:
for a call, each implementation's rows of the same kind (forward, backward, or for a pass of
an eager ``attention`` call the attention rows of its layout: ``_selection.evaluate``), mask class
(``none``, ``causal``, ``window``), sinks, soft cap and packing (varlen: a packed call counts as
its sequences at their mean lengths) are its candidates; the *nearest* of them
by :func:`distance` (the sum of ``|log2|`` ratios of batch, query heads, GQA group, lengths,
head dim and window width; ties averaged) give the time per unit of work, which times
the call's work (:func:`work`) is the prediction. A row further than :data:`COVERAGE` covers
nothing: the call is then outside what was measured, and the implementation is ranked by the
shipped table where only the user's does not cover it, else by its priority. The prediction
reads only shapes and flags, never a tensor, so ``explain`` on meta tensors predicts what the
same call on the device does.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.resources
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ._arch import Arch
from ._inputs import LAYOUTS, ForwardInputs

if TYPE_CHECKING:
    from ._implementation import Implementation

COSTS_DIR = "costs"
# The table format this module writes and the newest it reads (``format`` in a table;
# docs/design.md, "Recorded cost tables"): format 2 added the attention rows, so a reader
# of format 1 fails a table that may hold them with a reason, not silently. A table of a newer
# format fails its implementations the same way.
FORMAT = 2
# The log2 distance (see ``distance``) within which a measured row predicts a call: a factor of 2
# in two of batch, heads, group, length, head dim and window width, or of 4 in one.
# Batch and heads count as much as the other features: their time does not scale with the work
# ratio where a row's few heads leave most of the GPU idle (on the sm_90 grid, predicting each
# batch x heads layout from the others' rows ranked worse than the priorities did; docs/
# benchmarks.md section 11).
COVERAGE = 2.0
KINDS = ("forward", "backward")


def attention_kind(layout: str) -> str:
    """The kind of the attention rows of ``attention(..., layout=layout)`` calls."""
    return f"attention_{layout}"


# A forward and its backward through eager ``attention`` with each layout, the implementation
# forced for both: what such a call costs with its autograd node (the implementation's own or
# the library's), whose form depends on the layout
ATTENTION_KINDS = tuple(attention_kind(layout) for layout in LAYOUTS)
ROW_KINDS = (*KINDS, *ATTENTION_KINDS)


@dataclass(frozen=True)
class Shape:
    """The features of a call (or a measured grid point) the model reads."""

    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    mask: str  # "none", "causal" or "window"
    window: int | None = None  # visible keys per row when ``mask == "window"``
    sinks: bool = False
    softcap: bool = False
    # packed sequences (THD): ``batch`` of them, ``seqlen_q`` / ``seqlen_k`` their mean lengths
    varlen: bool = False

    @property
    def label(self) -> str:
        """``B=1 H=64/8 S=4096 D=128 causal`` (``Sq/Sk`` when they differ; ``varlen``: B
        sequences of mean length S, packed)."""
        lengths = (
            f"{self.seqlen_q}"
            if self.seqlen_q == self.seqlen_k
            else f"{self.seqlen_q}/{self.seqlen_k}"
        )
        mask = {"none": "", "causal": " causal"}.get(self.mask, f" window {self.window}")
        extra = (" sinks" if self.sinks else "") + (" softcap" if self.softcap else "")
        extra += " varlen" if self.varlen else ""
        heads = f"{self.heads}/{self.kv_heads}"
        return f"B={self.batch} H={heads} S={lengths} D={self.head_dim}{mask}{extra}"

    @property
    def group(self) -> int:
        return max(1, self.heads // max(1, self.kv_heads))

    @classmethod
    def of(cls, inp: ForwardInputs) -> Shape | None:
        """The features of ``inp``; ``None`` for an empty call (a zero size: no work to
        predict, and no logarithm of it). A varlen call is its sequences at their mean lengths
        (the tokens over the sequences: the shapes tell no more, and on meta tensors the
        offsets cannot be read), which only rows measured on packed sequences predict."""
        batch, seqlen_q, seqlen_k = inp.batch, inp.seqlen_q, inp.seqlen_k
        if inp.is_varlen:
            batch = inp.cu_seqlens_q.shape[0] - 1
            if batch > 0:
                seqlen_q = round(inp.q.shape[0] / batch)
                seqlen_k = round(inp.k.shape[0] / batch)
        sizes = (batch, inp.heads, inp.kv_heads, seqlen_q, seqlen_k, inp.head_dim)
        if min(sizes) <= 0:
            return None
        mask, width = mask_of(inp.band.left, inp.band.right)
        return cls(
            batch,
            inp.heads,
            inp.kv_heads,
            seqlen_q,
            seqlen_k,
            max(inp.head_dim, inp.head_dim_v),
            mask,
            width,
            inp.sinks is not None,
            inp.softcap is not None,
            inp.is_varlen,
        )

    @property
    def features(self) -> dict[str, float]:
        values = {
            "batch": self.batch,
            "heads": self.heads,
            "group": self.group,
            "seqlen_q": self.seqlen_q,
            "seqlen_k": self.seqlen_k,
            "head_dim": self.head_dim,
        }
        if self.window is not None:
            values["window"] = self.window
        return {name: math.log2(value) for name, value in values.items()}

    @property
    def exact(self) -> tuple:
        """What a row must match exactly to predict this call."""
        return (self.mask, self.sinks, self.softcap, self.varlen)


def mask_of(left: int | None, right: int | None) -> tuple[str, int | None]:
    """The mask class of a band's sides and, for a window, the keys each row sees."""
    if left is None and right is None:
        return "none", None
    if left is None and right == 0:
        return "causal", None
    if left is None or right is None:
        return "window", None  # one side unbounded but not causal: no measured class
    return "window", left + right + 1


def work(shape: Shape) -> float:
    """Visible scores times head dim: what a call's time scales with at a fixed kernel."""
    sq, sk = shape.seqlen_q, shape.seqlen_k
    if shape.mask == "causal":  # row i sees min(i + 1, Sk) keys (top-left; close otherwise)
        m = min(sq, sk)
        visible = m * (m + 1) / 2 + (sq - m) * sk
    elif shape.mask == "window" and shape.window is not None:
        visible = sq * min(sk, shape.window)
    else:
        visible = sq * sk
    return shape.batch * shape.heads * visible * shape.head_dim


def distance(a: Shape, b: Shape) -> float:
    """The sum of ``|log2(a/b)|`` over the features both have; ``inf`` when they differ in mask
    class, sinks, soft cap or packing (varlen), or only one is a window with a width."""
    if a.exact != b.exact or (a.window is None) != (b.window is None):
        return math.inf
    fa, fb = a.features, b.features
    return sum(abs(fa[name] - fb[name]) for name in fa)


@dataclass(frozen=True)
class Row:
    """One measured grid point of one implementation."""

    impl: str
    kind: str
    shape: Shape
    us: dict[str, float]  # execution mode -> median microseconds per call


@dataclass(frozen=True, eq=False)
class CostTable:
    """One backend's measured rows on one arch, with where they came from."""

    arch: str
    source: str  # the file it was read from
    provenance: dict
    rows: tuple[Row, ...]
    # implementation -> why its rows cannot be read (a bad row fails its implementation alone)
    broken: dict[str, str] = field(default_factory=dict)
    user: bool = False  # the user's own table (the cache directory's), not a shipped one

    def covers(self, impl: str) -> bool:
        """Whether the table holds rows of ``impl`` (or rows that fail it)."""
        return impl in self.broken or any(r.impl == impl for r in self.rows)

    @functools.cached_property
    def drift(self) -> str | None:
        """How the installed kernels' versions differ from those the rows were measured with,
        or ``None``: the table names (``provenance.requires``) the distributions its kernels
        come from, compared without local labels such as ``+cu130``. Drift does not retire a
        table: which kernel is faster changes far less between releases than the kernels do,
        so the rows still rank, and ``explain`` names the drift beside each prediction."""
        notes = []
        for dist, version in self.provenance.get("requires", {}).items():
            try:
                installed = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                notes.append(f"measured with {dist} {version}, not installed")
                continue
            if installed.split("+")[0] != version.split("+")[0]:
                notes.append(f"measured with {dist} {version}, installed {installed}")
        return "; ".join(notes) or None

    def predict(self, impl: str, kind: str, execution: str, shape: Shape) -> Prediction | None:
        """The predicted time of ``impl`` for a call of ``shape``, or ``None`` when no row of
        it lies within :data:`COVERAGE`."""
        best, nearest = math.inf, []
        for row in self.rows:
            if row.impl != impl or row.kind != kind or execution not in row.us:
                continue
            d = distance(shape, row.shape)
            if d < best - 1e-9:
                best, nearest = d, [row]
            elif abs(d - best) <= 1e-9:
                nearest.append(row)
        if not nearest or best > COVERAGE:
            return None
        per_work = sum(r.us[execution] / work(r.shape) for r in nearest) / len(nearest)
        shapes = tuple(r.shape for r in nearest)
        user = self.source if self.user else None
        return Prediction(per_work * work(shape), best, shapes, self.drift, user, kind=kind)

    def check(self, impl: str) -> None:
        """:class:`CostTableError` when ``impl``'s rows in this table cannot be read."""
        if impl in self.broken:
            raise CostTableError(self.broken[impl])


@dataclass(frozen=True)
class Prediction:
    """A predicted time per call, how far the nearest measured rows were, which, and how the
    installed versions differ from those they were measured with (:attr:`CostTable.drift`)."""

    us: float
    distance: float
    nearest: tuple[Shape, ...]
    drift: str | None = None
    # the file of the user's own table (``attn-dispatch tune --grid``), ``None`` for a shipped one
    user_table: str | None = None
    # for a shipped table's prediction: the user's table that holds rows of the implementation
    # but does not cover this call (so the shipped table ranked it), else ``None``
    beyond: str | None = None
    kind: str = "forward"  # the rows' kind (one of ROW_KINDS)

    @property
    def source(self) -> str:
        """Where the prediction came from, as ``explain`` shows it."""
        near = ", ".join(s.label for s in self.nearest)
        table = f"user cost table {self.user_table}" if self.user_table else "cost table"
        if self.beyond:
            table += f" (the user cost table {self.beyond} does not cover the call)"
        rows = f", {self.kind} rows" if self.kind in ATTENTION_KINDS else ""
        note = f"{table}{rows}: nearest measured {near} (distance {self.distance:.2f})"
        return note + (f"; {self.drift}" if self.drift else "")


class CostTableError(ValueError):
    """A shipped or user cost table, or one row of it, that cannot be read."""


SIZES = ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim")
MASKS = ("none", "causal", "window")
EXECUTIONS = ("eager", "graph")
TABLE_FIELDS = frozenset({"format", "arch", "provenance", "rows"})
ROW_FIELDS = frozenset(
    {"impl", "kind", *SIZES, "mask", "window", "sinks", "softcap", "varlen"}
    | {f"{m}_us" for m in EXECUTIONS}
)


def _positive_int(entry: dict, name: str) -> int:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} {value!r} is not a positive integer")
    return value


def _flag(entry: dict, name: str) -> bool:
    value = entry.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"{name} {value!r} is not true or false")
    return value


# The longest time a row may hold, in microseconds (about 17 minutes per call): a larger one is
# no measurement, and scaled to a larger call it would overflow a prediction to infinity.
MAX_US = 1e9


def _times(entry: dict) -> dict[str, float]:
    """The row's microseconds per execution mode: each finite and positive (a NaN or a
    negative time would rank as the fastest), at least one of them."""
    us = {}
    for mode in EXECUTIONS:
        value = entry.get(f"{mode}_us")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{mode}_us {value!r} is not a number")
        if not (0 < value <= MAX_US):  # also False for NaN (and an int beyond float's range)
            raise ValueError(f"{mode}_us {value!r} is not a positive time of at most {MAX_US:g}")
        us[mode] = float(value)
    if not us:
        raise ValueError("no time (eager_us or graph_us)")
    return us


def validated_row(entry: dict, impl: str) -> Row:
    """One validated row of ``impl`` (``ValueError`` naming the bad field); the loader's
    check, which writers use too before a table holds a row."""
    unknown = sorted(set(entry) - ROW_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {unknown}")
    kind = entry.get("kind")
    if kind not in ROW_KINDS:
        raise ValueError(f"kind {kind!r} is not one of {ROW_KINDS}")
    mask = entry.get("mask")
    if mask not in MASKS:
        raise ValueError(f"mask {mask!r} is not one of {MASKS}")
    window = entry.get("window")
    if window is not None:
        if mask != "window":
            raise ValueError(f"window {window!r} with mask {mask!r}")
        window = _positive_int(entry, "window")
    sizes = [_positive_int(entry, name) for name in SIZES]
    flags = (_flag(entry, "sinks"), _flag(entry, "softcap"), _flag(entry, "varlen"))
    return Row(impl, kind, Shape(*sizes, mask, window, *flags), _times(entry))


def _provenance(data: dict) -> dict:
    info = data.get("provenance", {})
    if not isinstance(info, dict):
        raise ValueError(f"provenance {info!r} is not an object")
    requires = info.get("requires", {})
    if not isinstance(requires, dict) or not all(
        _name(k) and _name(v) for k, v in requires.items()
    ):
        raise ValueError(
            f"provenance.requires {requires!r} is not an object of distribution: version"
        )
    return info


def _name(value: object) -> bool:
    """A distribution name or version: a non-empty string (``importlib.metadata`` raises on an
    empty name)."""
    return isinstance(value, str) and bool(value.strip())


def _table(data: object, source: str) -> CostTable:
    """A cost table from decoded JSON; ``ValueError`` for what fails the whole table, while a
    bad row fails only the implementation it names (``CostTable.broken``)."""
    if not isinstance(data, dict):
        raise ValueError(f"the top level is {type(data).__name__}, not an object")
    version = data.get("format")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"format {version!r} is not a format version (this reads {FORMAT})")
    if version > FORMAT:
        raise ValueError(
            f"format {version} is newer than this attn_dispatch reads ({FORMAT}): upgrade it"
        )
    unknown = sorted(set(data) - TABLE_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {unknown}")
    arch, entries = data.get("arch"), data.get("rows")
    if not isinstance(arch, str) or not arch:
        raise ValueError(f"arch {arch!r} is not an arch name")
    if not isinstance(entries, list):
        raise ValueError(f"rows {type(entries).__name__} is not a list")
    info = _provenance(data)
    rows, broken = [], {}
    for number, entry in enumerate(entries):
        impl = entry.get("impl") if isinstance(entry, dict) else None
        if not isinstance(impl, str) or not impl:
            raise ValueError(f"row {number} names no implementation (impl)")
        try:
            rows.append(validated_row(entry, impl))
        except ValueError as exc:
            broken.setdefault(impl, f"cost table {source} is malformed: row {number}: {exc}")
    return CostTable(arch, source, info, tuple(r for r in rows if r.impl not in broken), broken)


def parse(text: str | bytes, source: str) -> CostTable:
    """A cost table from its JSON text or bytes (UTF-8; ``source`` names it in errors);
    :class:`CostTableError` when the table as a whole cannot be read."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return _table(json.loads(text), source)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSON errors included
        reason = "nested too deeply" if isinstance(exc, RecursionError) else repr(exc)
        raise CostTableError(f"cost table {source} is malformed: {reason}") from exc


def tables_of(impl: Implementation) -> str | None:
    """The package whose ``costs/`` holds ``impl``'s tables: its ``cost_tables``, else its own
    top-level package when that has a ``costs/`` folder (so a backend that ships tables beside
    its code needs to name nothing), else ``None``."""
    if impl.cost_tables is not None:
        return impl.cost_tables
    package = type(impl).__module__.partition(".")[0]
    if not hasattr(sys.modules.get(package), "__path__"):  # a lone module has no folder
        return None
    return package if importlib.resources.files(package).joinpath(COSTS_DIR).is_dir() else None


@functools.cache
def load(package: str, arch: str) -> CostTable | None:
    """``package``'s table for ``arch`` (``<package>/costs/<arch>.json``), ``None`` when it
    ships none; :class:`CostTableError` when the file cannot be read."""
    try:
        path = importlib.resources.files(package).joinpath(COSTS_DIR, f"{arch}.json")
    except ModuleNotFoundError as exc:
        raise CostTableError(f"cost tables of {package!r}: {exc}") from exc
    if not path.is_file():
        return None
    return _read(path, f"{package}/{COSTS_DIR}/{arch}.json", arch)


def owner(impl: Implementation) -> str:
    """The package that names ``impl``'s tables: :func:`tables_of`, else its own top-level
    package (a user table can cover an implementation that ships none)."""
    return tables_of(impl) or type(impl).__module__.partition(".")[0]


def user_path(directory: Path, package: str, arch: str) -> Path:
    """The user's table of ``package``'s implementations on ``arch`` in ``directory`` (the
    cache directory's ``costs``: ``_settings.costs_directory``)."""
    return directory / arch / f"{package}.json"


def load_user(directory: Path, package: str, arch: str) -> CostTable | None:
    """The user's own table of ``package`` for ``arch`` (:func:`user_path`), ``None`` when
    there is none; :class:`CostTableError` when the file cannot be read."""
    return _load_file(str(user_path(directory, package, arch)), arch)


@functools.cache
def _load_file(path: str, arch: str) -> CostTable | None:
    file = Path(path)
    if not file.is_file():
        return None
    return dataclasses.replace(_read(file, path, arch), user=True)


def _read(path, source: str, arch: str) -> CostTable:
    """The table in the file ``path`` (named ``source`` in messages), which must be ``arch``'s."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CostTableError(f"cost table {source} cannot be read: {exc}") from exc
    table = parse(data, source)
    if table.arch != arch:
        raise CostTableError(f"{source} says arch {table.arch!r}")
    return table


def clear() -> None:
    """Forget the tables read so far (``ad.reload()``: re-read them)."""
    load.cache_clear()
    _load_file.cache_clear()


def predict(
    package: str | None,
    impl: str,
    kind: str,
    execution: str,
    arch: Arch,
    inp: ForwardInputs,
    user: tuple[Path, str] | None = None,
) -> Prediction | None:
    """``impl``'s predicted time for ``inp``: from the user's own table (``user``: the
    directory of the user's tables and the package it is named after) where that covers the
    call, else from ``package``'s shipped table for ``arch`` where that covers it, else
    ``None`` (no table, an empty call, nothing measured within :data:`COVERAGE`).
    A user table measures a grid of its own (``tune --grid``'s default holds D 64 and 128
    only), so it outranks the shipped one only within what it measured.
    :class:`CostTableError` when a table consulted, or ``impl``'s rows in it, cannot be read:
    the user's is consulted first, the shipped one only for a call the user's does not cover."""
    shape = Shape.of(inp)
    mine = None if user is None else load_user(*user, arch.name)
    if mine is not None and mine.covers(impl):
        mine.check(impl)
        found = None if shape is None else mine.predict(impl, kind, execution, shape)
        if found is not None:
            return found
    else:
        mine = None
    shipped = None if package is None else load(package, arch.name)
    if shipped is None:
        return None
    shipped.check(impl)
    found = None if shape is None else shipped.predict(impl, kind, execution, shape)
    if found is None or mine is None:
        return found
    return dataclasses.replace(found, beyond=mine.source)
