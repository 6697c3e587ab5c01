"""Whether what scripts/setup.sh would install is already in the environment, so that a re-run
skips pip (seconds each, and pip's "Requirement already satisfied" lines) when nothing changed.

    python scripts/setup_installed.py check REQ_OR_DIR...   status 0 when every one is installed
    python scripts/setup_installed.py record DIR...         after `pip install -e DIR`
    python scripts/setup_installed.py torch-triton          the triton requirement of the torch
                                                            installed (empty: it needs none)

A requirement ("triton==3.6.0", "flydsl>=0.4.2,<0.6") is installed when a distribution of that
name has a version it admits. A project directory is installed when an editable install of it
points at that directory and its pyproject.toml is the one recorded when it was installed (a
changed dependency, entry point or version installs it again). Standard library only, plus
packaging (the core's dependency; pip's own copy before the core is installed).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

try:
    from packaging.requirements import Requirement
except ImportError:  # before the core (which depends on packaging) is installed
    from pip._vendor.packaging.requirements import Requirement

RECORDS = Path(sys.prefix) / "attn_dispatch_setup"


def _project(directory: Path) -> tuple[str, str]:
    """(distribution name, hash of pyproject.toml) of a project directory."""
    text = (directory / "pyproject.toml").read_text()
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if name is None:
        raise SystemExit(f"{directory}/pyproject.toml: no project name")
    return name.group(1), hashlib.sha256(text.encode()).hexdigest()


def _record_file(name: str) -> Path:
    return RECORDS / f"{re.sub(r'[-_.]+', '-', name).lower()}.json"


def _editable_here(name: str, directory: Path) -> bool:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    if not url.get("dir_info", {}).get("editable"):
        return False
    return Path(unquote(urlparse(url.get("url", "")).path)) == directory


def installed(item: str) -> bool:
    directory = Path(item)
    if directory.is_dir():
        directory = directory.resolve()
        name, digest = _project(directory)
        record = _record_file(name)
        if not record.is_file() or not _editable_here(name, directory):
            return False
        return json.loads(record.read_text()) == {"path": str(directory), "pyproject": digest}
    req = Requirement(item)
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return False
    return req.specifier.contains(version, prereleases=True)


def record(item: str) -> None:
    directory = Path(item).resolve()
    name, digest = _project(directory)
    RECORDS.mkdir(exist_ok=True)
    _record_file(name).write_text(json.dumps({"path": str(directory), "pyproject": digest}))


def torch_triton() -> str:
    """The triton the installed torch requires on this machine ("triton==3.7.1" for PyPI's CUDA
    builds, "pytorch-triton-rocm==..." for ROCm builds), or "" (CPU builds need none)."""
    for text in metadata.requires("torch") or ():
        req = Requirement(text)
        if "triton" in req.name and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return str(req).split(";")[0].strip()
    return ""


def main(argv: list[str]) -> int:
    command, items = argv[0], argv[1:]
    if command == "check":
        return 0 if all(installed(item) for item in items) else 1
    if command == "record":
        for item in items:
            record(item)
        return 0
    if command == "torch-triton":
        print(torch_triton())
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
