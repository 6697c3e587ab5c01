"""What the benchmark scripts record about the tree they ran from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_commit() -> str:
    """The short commit of this clone; ``$COMMIT`` where the tree was copied without its
    history (empty when neither is known)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            timeout=10,
        ).stdout.strip()
    except OSError:
        commit = ""
    return commit or os.environ.get("COMMIT", "")
