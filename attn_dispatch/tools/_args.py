"""Argument parsing shared by the ``attn-dispatch`` command and its ``bench`` and ``tune``
subcommands."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

PROG = "attn-dispatch"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``<prog>: error: <message>``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (sizes and counts, where 0 or less means nothing)."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


def window_sides(text: str) -> tuple[int | None, int | None]:
    """argparse type: a window ``L,R`` with ``none`` (or ``-``, as ``--window=-,64``) for an
    unbounded side."""
    sides = text.split(",")
    if len(sides) != 2:
        raise argparse.ArgumentTypeError(f"expected L,R (e.g. 128,0 or none,64), got {text!r}")
    parsed: list[int | None] = []
    for side in sides:
        side = side.strip()
        if side.lower() in ("-", "none"):
            parsed.append(None)
        else:
            parsed.append(nonnegative_int(side))
    return parsed[0], parsed[1]


def check_output_path(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    """Fail before the work, not after it, when ``path`` cannot be written."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{option}: {path!r} is a directory")
    if not os.path.isdir(folder):
        parser.error(f"{option}: the directory {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        parser.error(f"{option}: the directory {folder!r} is not writable")
