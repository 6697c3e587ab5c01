"""Plugin discovery: entry points in ``attn_dispatch.backends``, each loaded and called alone.

pluggy's bulk hook calls stop at the first exception, so every plugin is imported, registered
and asked for its implementations on its own: a broken plugin is recorded with its error and
costs only itself.
"""

from __future__ import annotations

import logging
import re
import traceback
import warnings
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from . import _hookspecs
from ._capabilities import declaration_problems
from ._errors import SettingError
from ._implementation import Implementation

log = logging.getLogger("attn_dispatch")


@dataclass
class BackendRecord:
    """One backend plugin: where it came from, what it provides, or why it failed."""

    name: str
    distribution: str | None = None
    version: str | None = None
    implementations: list[Implementation] = field(default_factory=list)
    error: str | None = None


@dataclass
class Registry:
    """Every discovered backend (loaded or failed) and the implementations by full name."""

    backends: dict[str, BackendRecord] = field(default_factory=dict)
    implementations: dict[str, Implementation] = field(default_factory=dict)
    entry_point_names: tuple[str, ...] = ()

    @property
    def failed(self) -> list[BackendRecord]:
        return [b for b in self.backends.values() if b.error is not None]

    def known_names(self) -> list[str]:
        """Backend names and ``backend:impl`` names, sorted."""
        return sorted(set(self.backends) | set(self.implementations))


def describe_error(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {frame[0].filename}:{frame[0].lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _report_failure(message: str) -> None:
    log.warning("attn_dispatch: %s", message)
    warnings.warn(message, stacklevel=2)


def _declaration_problems(impl: Implementation) -> list[str]:
    """``impl``'s invalid capability declarations, each prefixed with its name."""
    try:
        problems = declaration_problems(impl)
    except Exception as exc:  # e.g. a capability property that raises
        problems = [f"reading its capabilities raised {describe_error(exc)}"]
    return [f"{impl.full_name}: {problem}" for problem in problems]


def _origin(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name if dist else 'an unknown distribution'} ({ep.value})"


def _clash(name: str, group: list[metadata.EntryPoint]) -> str:
    return (
        f"backend name {name!r} is declared by {len(group)} entry points: "
        f"{', '.join(_origin(ep) for ep in group)}; none of them is loaded, since which one "
        "would win depends on sys.path order (uninstall or rename all but one)"
    )


def discover(allowlist: list[str] | None) -> Registry:
    """Load the entry points of group ``attn_dispatch.backends`` (only ``allowlist`` if given).

    A backend name declared by two entry points that load different modules is a clash: neither
    is loaded, and the name is recorded as failed with both origins, so a call that would have
    used either fails naming the clash instead of running whichever ``sys.path`` put first.
    """
    manager = pluggy.PluginManager(_hookspecs.PROJECT)
    manager.add_hookspecs(_hookspecs)
    registry = Registry()
    groups: dict[str, list[metadata.EntryPoint]] = {}
    for ep in metadata.entry_points(group=_hookspecs.ENTRY_POINT_GROUP):
        groups.setdefault(ep.name, []).append(ep)
    registry.entry_point_names = tuple(sorted(groups))
    for name in registry.entry_point_names:
        if allowlist is not None and name not in allowlist:
            continue
        group = groups[name]
        ep = group[0]
        dist = getattr(ep, "dist", None)
        record = BackendRecord(name, dist.name if dist else None, dist.version if dist else None)
        registry.backends[name] = record
        if len({other.value for other in group}) > 1:
            record.error = _clash(name, group)
            _report_failure(f"backend plugin {name!r} is not loaded: {record.error}")
            continue
        _load_one(manager, ep, record, registry)
    return registry


# What a backend or implementation name may hold: names are joined as ``backend:impl`` and
# listed in comma-separated variables (ATTN_DISPATCH_PLUGINS, _ENABLE, _DISABLE), so a ``:``, a
# comma or a space in one could never be forced, blocked or enabled by that name.
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _bad_name(what: str, name: object) -> str | None:
    """Why ``name`` cannot name a backend or implementation, or ``None``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"{what} {name!r} is not a name of letters, digits, '_', '.' and '-'"
    return None


def _load_one(
    manager: pluggy.PluginManager,
    ep: metadata.EntryPoint,
    record: BackendRecord,
    registry: Registry,
) -> None:
    if (why := _bad_name("the entry point's name", ep.name)) is not None:
        record.error = why
        _report_failure(f"backend plugin {ep.name!r} is not loaded: {why}")
        return
    try:
        module = ep.load()
        manager.register(module, name=ep.name)
        others = [p for p in manager.get_plugins() if p is not module]
        call = manager.subset_hook_caller("attn_dispatch_implementations", remove_plugins=others)
        provided = [impl for batch in call() for impl in (batch or [])]
    except SettingError:  # a bad variable the plugin read: the user's to fix, never a skip
        raise
    except Exception as exc:  # a broken plugin costs only itself
        record.error = describe_error(exc)
        _report_failure(f"backend plugin {ep.name!r} failed to load: {record.error}")
        return
    problems = []
    for impl in provided:
        if not isinstance(impl, Implementation):
            problems.append(f"returned {impl!r}, which is not an attn_dispatch.Implementation")
        elif impl.backend != ep.name:
            problems.append(
                f"{impl!r} declares backend {impl.backend!r}, but its entry point "
                f"is named {ep.name!r}"
            )
        elif (why := _bad_name("its name", impl.name)) is not None:
            problems.append(f"{impl!r}: {why}")
        elif impl.full_name in registry.implementations:
            problems.append(f"{impl.full_name} is provided twice")
        else:
            problems += _declaration_problems(impl)
    if problems:
        record.error = "; ".join(problems)
        _report_failure(f"backend plugin {ep.name!r} is invalid: {record.error}")
        return
    record.implementations = list(provided)
    for impl in provided:
        registry.implementations[impl.full_name] = impl
