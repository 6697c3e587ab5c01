"""Argument parsing shared by the ``attn-dispatch`` command and its ``bench`` subcommand."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

PROG = "attn-dispatch"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` that shows every option's default: argparse's ``(default: X)``, unless the help
    text already says it (a default described in words, such as "default: --seqlen"), and
    ``(required)`` for a required option."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required:
            return f"{text} (required)"
        if "default" in text:
            return text
        return super()._get_help_string(action) or ""


def plain(doc: str) -> str:
    """A docstring as a terminal shows it: without reStructuredText's ``literal`` quotes and
    ``:role:`target``` markup."""
    doc = re.sub(r":\w+:`~?([^`]*)`", r"\1", doc)
    return doc.replace("``", "")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``<prog>: error: <message>``, exit 2,
    and whose ``--help`` shows each option's default (:class:`HelpFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

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
