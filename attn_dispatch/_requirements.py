"""Cheap checks of installed distributions, for ``supports``: metadata only, nothing imported."""

from __future__ import annotations

import functools
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement


@functools.cache
def missing_requirement(requirement: str) -> str | None:
    """Return why ``requirement`` (e.g. ``"triton>=3.2,<4"``) is not met, or ``None`` when it is.

    Reads installed metadata with ``importlib.metadata`` and compares versions with
    ``packaging``; the distribution is never imported. Cached: call ``reload()`` after
    installing packages in a running process.
    """
    try:
        req = Requirement(requirement)
    except InvalidRequirement as exc:
        raise ValueError(f"requirement={requirement!r} is not a valid requirement: {exc}") from None
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return f"{req.name} is not installed (needs {requirement})"
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        return f"{req.name} {version} is installed; needs {requirement}"
    return None
