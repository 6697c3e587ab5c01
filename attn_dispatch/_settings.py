"""The selection environment: env vars, ``enable()``, ``use_backend()``, loaded plugins.

Everything here is read once, on the first dispatch, and again on ``reload()``. Each change
clears the cached decisions (each Settings object owns its decision cache).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from ._arch import ARCH_ENV, Arch
from ._errors import UnknownBackendError
from ._registry import Registry, discover

log = logging.getLogger("attn_dispatch")

BACKEND_ENV = "ATTN_DISPATCH_BACKEND"
ENABLE_ENV = "ATTN_DISPATCH_ENABLE"
DISABLE_ENV = "ATTN_DISPATCH_DISABLE"
PLUGINS_ENV = "ATTN_DISPATCH_PLUGINS"

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "attn_dispatch_forced", default=None
)


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


@dataclass
class Settings:
    """A snapshot of the environment and the loaded plugins."""

    registry: Registry
    forced_env: str | None
    enabled: set[str]
    disabled: set[str]
    arch_override: Arch | None
    # signature key -> Decision (see _dispatch); cleared on every change of the settings.
    decisions: dict = field(default_factory=dict)
    # flags -> [(guard, Decision)]: the C-level front of ``decisions`` (see _guards).
    guarded: dict = field(default_factory=dict)

    def forget(self) -> None:
        """Drop every cached decision."""
        self.decisions.clear()
        self.guarded.clear()

    def matches(self, names: set[str], full_name: str) -> bool:
        """Whether ``full_name`` (``backend:impl``) or its backend is in ``names``."""
        return full_name in names or full_name.split(":", 1)[0] in names


_lock = threading.Lock()
_settings: Settings | None = None
_programmatic_enabled: set[str] = set()


def _warn_unknown(variable: str, names: list[str], known: set[str]) -> None:
    for name in names:
        if name not in known:
            message = (
                f"{variable} names {name!r}, which no installed backend provides "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
            log.warning("attn_dispatch: %s", message)
            warnings.warn(message, stacklevel=4)


def _load() -> Settings:
    plugins_env = os.environ.get(PLUGINS_ENV)
    allowlist = None if plugins_env is None else _split(plugins_env)
    registry = discover(allowlist)
    if allowlist is not None:
        _warn_unknown(PLUGINS_ENV, allowlist, set(registry.entry_point_names))
    known = set(registry.known_names())
    enabled = _split(os.environ.get(ENABLE_ENV))
    disabled = _split(os.environ.get(DISABLE_ENV))
    _warn_unknown(ENABLE_ENV, enabled, known)
    _warn_unknown(DISABLE_ENV, disabled, known)
    arch_text = os.environ.get(ARCH_ENV)
    return Settings(
        registry=registry,
        forced_env=os.environ.get(BACKEND_ENV) or None,
        enabled=set(enabled) | _programmatic_enabled,
        disabled=set(disabled),
        arch_override=Arch.parse(arch_text) if arch_text else None,
    )


def current() -> Settings:
    """The settings, loading plugins and reading the environment on first use."""
    settings = _settings
    if settings is None:
        with _lock:
            if _settings is None:
                _install(_load())
            settings = _settings
    return settings  # type: ignore[return-value]


def _install(settings: Settings) -> None:
    global _settings
    _settings = settings


def reload(*, reset_enabled: bool = False) -> None:
    """Re-read the environment variables and rediscover plugins; clears cached decisions.

    Opt-ins made with ``enable()`` are kept unless ``reset_enabled=True``.
    """
    from ._requirements import missing_requirement

    missing_requirement.cache_clear()
    with _lock:
        if reset_enabled:
            _programmatic_enabled.clear()
        _install(_load())


def check_name(name: object, argument: str) -> str:
    """Validate a backend or ``backend:impl`` name; raise listing the known names."""
    if not isinstance(name, str):
        raise TypeError(
            f"argument '{argument}': expected a backend name (str), got {type(name).__name__}"
        )
    registry = current().registry
    if name not in registry.backends and name not in registry.implementations:
        raise UnknownBackendError(
            f"argument '{argument}': unknown backend {name!r}; known: "
            f"{', '.join(registry.known_names()) or 'none (no backend plugin is installed)'}"
        )
    return name


def forced_name(backend: str | None, settings: Settings) -> str | None:
    """The name forced for a call, unchecked (it goes into the decision key): the ``backend``
    argument, else ``use_backend()``, else ``ATTN_DISPATCH_BACKEND``."""
    return backend or _forced.get() or settings.forced_env


def resolve_forced(backend: object, settings: Settings) -> str | None:
    """:func:`forced_name`, checked: an unknown name raises listing the known ones."""
    if backend is not None:
        return check_name(backend, "backend")
    name = _forced.get()
    if name is not None:
        return name
    if settings.forced_env is not None:
        check_name(settings.forced_env, BACKEND_ENV)
    return settings.forced_env


def enable(*names: str) -> None:
    """Admit opt-in backends or implementations to automatic selection (until ``reload``
    re-reads the environment, programmatic opt-ins are kept)."""
    for name in names:
        check_name(name, "name")
    with _lock:
        _programmatic_enabled.update(names)
        settings = current()
        settings.enabled.update(names)
        settings.forget()


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force ``name`` (``backend`` or ``backend:impl``) for calls in this context (contextvars:
    threads and asyncio tasks do not see each other's choice)."""
    check_name(name, "name")
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)
