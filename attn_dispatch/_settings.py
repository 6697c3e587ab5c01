"""The selection environment: env vars, ``enable()``, ``use_backend()``, ``autotune()``, loaded
plugins.

Everything here is read once, on the first dispatch, and again on ``reload()``. Settings objects
are never changed once installed: ``enable()`` and ``reload()`` install a new one, with an empty
decision cache, in one assignment. A selection that was in progress against the old object stores
its decision in the old object's cache, which no later call reads.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._arch import Arch, arch_from_env
from ._errors import SettingError, UnknownBackendError
from ._registry import Registry, discover

log = logging.getLogger("attn_dispatch")

BACKEND_ENV = "ATTN_DISPATCH_BACKEND"
DEBUG_ENV = "ATTN_DISPATCH_DEBUG"
ENABLE_ENV = "ATTN_DISPATCH_ENABLE"
DISABLE_ENV = "ATTN_DISPATCH_DISABLE"
PLUGINS_ENV = "ATTN_DISPATCH_PLUGINS"
AUTOTUNE_ENV = "ATTN_DISPATCH_AUTOTUNE"
CACHE_DIR_ENV = "ATTN_DISPATCH_CACHE_DIR"

# The name use_backend() forces in this context. A call's forced name is its ``backend``
# argument, else this, else ``ATTN_DISPATCH_BACKEND``: ``_call`` reads it so on every call, and
# resolve_forced checks it on a signature's first call.
forced_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "attn_dispatch_forced", default=None
)


# The one spelling of a boolean variable's values, for the core and every backend (env_flag).
BOOLEAN_VALUES = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def env_flag(variable: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The boolean environment variable ``variable`` (of ``environ``, default ``os.environ``):
    ``default`` when unset, else ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``
    in any case, surrounding whitespace ignored. Any other value, the empty string included,
    raises :class:`SettingError` naming the variable and the accepted values."""
    raw = (os.environ if environ is None else environ).get(variable)
    if raw is None:
        return default
    value = BOOLEAN_VALUES.get(raw.strip().lower())
    if value is None:
        raise SettingError(
            f"{variable}={raw!r} is not a boolean: expected 1, true, yes, on or 0, false, no, "
            "off (any case), or the variable unset"
        )
    return value


@dataclass(frozen=True)
class AutotuneConfig:
    """Autotune as the settings hold it (``None`` there: off): where measurements persist."""

    directory: Path


def autotune_config(override: bool | None = None) -> AutotuneConfig | None:
    """The autotune settings from the environment (``ATTN_DISPATCH_AUTOTUNE``, a boolean read
    as every boolean variable is, and ``ATTN_DISPATCH_CACHE_DIR`` for the directory), with
    ``override`` (``autotune()``) taking precedence over the variable. A value that is not a
    boolean is a ``SettingError`` (a ``ValueError``) naming the variable."""
    on = env_flag(AUTOTUNE_ENV, False) if override is None else override
    return AutotuneConfig(cache_directory()) if on else None


def cache_root() -> Path:
    """The user's cache directory: ``ATTN_DISPATCH_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/attn_dispatch``, else ``~/.cache/attn_dispatch``."""
    explicit = os.environ.get(CACHE_DIR_ENV, "").strip()
    if explicit:
        try:
            return Path(explicit).expanduser()
        except RuntimeError as exc:  # "~user" of no such user
            raise SettingError(
                f"{CACHE_DIR_ENV}={explicit!r}: expected a directory path ({exc})"
            ) from None
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "attn_dispatch"


def cache_directory() -> Path:
    """Where autotune's measurements persist: the ``autotune`` subdirectory of
    :func:`cache_root`."""
    return cache_root() / "autotune"


def costs_directory() -> Path:
    """Where the user's own cost tables are (``attn-dispatch tune --grid``): the ``costs``
    subdirectory of :func:`cache_root`, one folder per arch."""
    return cache_root() / "costs"


@dataclass
class Settings:
    """A snapshot of the environment and the loaded plugins (never changed once installed,
    except for its caches)."""

    registry: Registry
    forced_env: str | None
    enabled: frozenset[str]
    disabled: frozenset[str]
    arch_override: Arch | None
    debug: bool = False
    # ``None``: autotune off; else where its measurements persist (see _autotune)
    autotune: AutotuneConfig | None = None
    # signature key -> Decision (see _dispatch).
    decisions: dict = field(default_factory=dict)
    # flags -> [(guard, Decision)]: the C-level front of ``decisions`` (see _guards).
    guarded: dict = field(default_factory=dict)
    # (forward Call, heads_first) -> [(guard, OwnNode)]: which eager ``attention`` signatures
    # record their implementation's own autograd node (see _own_node).
    own_nodes: dict = field(default_factory=dict)
    # (signature key, heads_first, which inputs require grad) -> OwnNode: every eager
    # ``attention`` signature's verdict; ``own_nodes``' guards are the faster front of it.
    own_node_keys: dict = field(default_factory=dict)
    # the flags of a dense eager ``attention`` call as given, with its scope -> what an earlier
    # call of them checked (``_autograd._Front``): their calls skip the checks
    fronts: dict = field(default_factory=dict)

    def forget(self) -> None:
        """Drop every cached decision."""
        self.decisions.clear()
        self.guarded.clear()
        self.own_nodes.clear()
        self.own_node_keys.clear()
        self.fronts.clear()

    def fresh(self, **changes) -> Settings:
        """A copy with ``changes`` and empty caches."""
        return dataclasses.replace(
            self, decisions={}, guarded={}, own_nodes={}, own_node_keys={}, fronts={}, **changes
        )

    def matches(self, names: set[str], full_name: str) -> bool:
        """Whether ``full_name`` (``backend:impl``) or its backend is in ``names``."""
        return full_name in names or full_name.split(":", 1)[0] in names


# Reentrant: enable() and reload() may be reached from code that already holds it.
_lock = threading.RLock()
# The settings in force (None until first use); the public calls read it directly on their hot
# path and call current() only while it is None.
installed: Settings | None = None
_programmatic_enabled: set[str] = set()
# What autotune() set (None: follow the environment variable).
autotune_override: bool | None = None
# Set while this thread discovers plugins: a plugin that calls back into the library from its
# import or hook would otherwise wait for itself, or start discovery again.
_loading = threading.local()

REENTRANT_LOAD = (
    "attn_dispatch was called while it loads its backend plugins (from a plugin's import or "
    "its attn_dispatch_implementations hook); a plugin must not call the library before its "
    "hook has returned"
)


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
    if getattr(_loading, "active", False):
        raise RuntimeError(REENTRANT_LOAD)
    arch_override = arch_from_env()
    plugins_env = os.environ.get(PLUGINS_ENV)
    allowlist = None if plugins_env is None else _split(plugins_env)
    _loading.active = True
    try:
        registry = discover(allowlist)
    finally:
        _loading.active = False
    if allowlist is not None:
        _warn_unknown(PLUGINS_ENV, allowlist, set(registry.entry_point_names))
    known = set(registry.known_names())
    enabled = _split(os.environ.get(ENABLE_ENV))
    disabled = _split(os.environ.get(DISABLE_ENV))
    _warn_unknown(ENABLE_ENV, enabled, known)
    _warn_unknown(DISABLE_ENV, disabled, known)
    return Settings(
        registry=registry,
        forced_env=os.environ.get(BACKEND_ENV, "").strip() or None,
        enabled=frozenset(enabled) | frozenset(_programmatic_enabled),
        disabled=frozenset(disabled),
        arch_override=arch_override,
        debug=env_flag(DEBUG_ENV, False),
        autotune=autotune_config(autotune_override),
    )


def current() -> Settings:
    """The settings, loading plugins and reading the environment on first use."""
    settings = installed
    if settings is None:
        if getattr(_loading, "active", False):
            raise RuntimeError(REENTRANT_LOAD)
        with _lock:
            if installed is None:
                _install(_load())
            settings = installed
    return settings  # type: ignore[return-value]


def _install(settings: Settings | None) -> None:
    global installed
    installed = settings


def reload(*, reset_enabled: bool = False) -> None:
    """Re-read the environment variables, rediscover plugins and re-read their cost tables;
    clears cached decisions.

    Opt-ins made with ``enable()`` are kept unless ``reset_enabled=True``.
    """
    from ._costs import clear
    from ._requirements import missing_requirement

    missing_requirement.cache_clear()
    clear()
    with _lock:
        if reset_enabled:
            _programmatic_enabled.clear()
        try:
            settings = _load()
        except SettingError:
            # no call may go on with the settings of the environment before: the next one
            # reads the environment again and raises until it is fixed
            _install(None)
            raise
        _install(settings)


# The backends this project ships under backends/<name>: a name among them that no plugin provides
# is one the user has not installed, not a typo, and the error says how to install it.
PROJECT_BACKENDS = ("reference", "torch_sdpa", "triton", "flash_attn_cute", "flydsl_rocm")


def check_name(name: object, argument: str) -> str:
    """Validate a backend or ``backend:impl`` name; raise listing the known names."""
    if not isinstance(name, str):
        raise TypeError(
            f"argument '{argument}': expected a backend name (str), got {type(name).__name__}"
        )
    registry = current().registry
    if name not in registry.backends and name not in registry.implementations:
        backend = name.split(":", 1)[0]
        if backend in PROJECT_BACKENDS and backend not in registry.entry_point_names:
            raise UnknownBackendError(
                f"argument '{argument}': backend {backend!r} is not installed: install it with "
                f"pip install -e backends/{backend} (from a clone of attn_dispatch)"
            )
        raise UnknownBackendError(
            f"argument '{argument}': unknown backend {name!r}; known: "
            f"{', '.join(registry.known_names()) or 'none (no backend plugin is installed)'}"
        )
    return name


def resolve_forced(name: str | None, forced_by: str | None) -> str | None:
    """A call's forced name (``Call.backend``: the ``backend`` argument, else ``use_backend()``,
    else ``ATTN_DISPATCH_BACKEND``) checked, the error naming ``forced_by``, where it came from:
    an unknown name raises listing the known ones (a ``use_backend`` name too: a reload since
    its ``with`` began may have dropped it)."""
    return None if name is None else check_name(name, forced_by)


def enable(*names: str) -> None:
    """Admit opt-in backends or implementations to automatic selection (until ``reload``
    re-reads the environment, programmatic opt-ins are kept)."""
    for name in names:
        check_name(name, "name")
    with _lock:
        _programmatic_enabled.update(names)
        settings = current()
        _install(settings.fresh(enabled=settings.enabled | frozenset(names)))


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force ``name`` (``backend`` or ``backend:impl``) for calls in this context (contextvars:
    threads and asyncio tasks do not see each other's choice)."""
    check_name(name, "name")
    token = forced_var.set(name)
    try:
        yield
    finally:
        forced_var.reset(token)


class _Switch:
    """What :func:`autotune` returns: the switch is already set; as a context manager it
    restores the previous setting on exit."""

    def __init__(self, previous: bool | None) -> None:
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        _set_autotune(self._previous)


def autotune(enabled: bool | None = True) -> _Switch:
    """Switch autotune on (or off with ``False``) for the whole process, over
    ``ATTN_DISPATCH_AUTOTUNE``; ``autotune(None)`` follows the variable again. Cached decisions
    are dropped, so every signature is decided afresh under the new setting.

    Used as a context manager, the previous setting is restored when the block ends::

        ad.autotune(True)          # from now on
        with ad.autotune():        # inside the block only
            train_step()

    The setting is process-wide (not per thread), like ``torch.backends.cudnn.benchmark``.
    """
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"argument 'enabled': expected a bool or None, got {enabled!r}")
    previous = autotune_override
    _set_autotune(enabled)
    return _Switch(previous)


def _set_autotune(enabled: bool | None) -> None:
    global autotune_override
    with _lock:
        config = autotune_config(enabled)  # before anything changes: it may raise
        settings = current()
        autotune_override = enabled
        _install(settings.fresh(autotune=config))
