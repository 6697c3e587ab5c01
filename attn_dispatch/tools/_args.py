"""Argument parsing shared by the ``attn-dispatch`` command and its ``bench`` and ``tune``
subcommands."""

from __future__ import annotations

import argparse
import math
import os
import re
from typing import Any, NoReturn

import torch

MAX_TENSOR_BYTES = 2**63 - 1  # torch counts a tensor's bytes in an int64

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


def cpu_or_cuda(text: str) -> torch.device:
    """argparse type: ``cpu``, or ``cuda[:N]`` when that GPU is present."""
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {text!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(
                f"{text!r}: no CUDA or ROCm GPU is available to this torch ({torch.__version__})"
            )
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: there are only {count} GPUs")
    return device


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
    if not path.strip():  # an empty path would be skipped silently where the file is written
        parser.error(f"{option}: expected a file path, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{option}: {path!r} is a directory")
    if not os.path.isdir(folder):
        parser.error(f"{option}: the directory {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        parser.error(f"{option}: the directory {folder!r} is not writable")


def random_tensor(
    size: tuple[int, ...], generator: torch.Generator, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """``torch.randn`` of ``size``; sizes beyond what a tensor or this device's memory holds
    are a ValueError naming the shape (the commands' sizes come from their arguments)."""
    nbytes = math.prod(size) * dtype.itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ValueError(
            f"a tensor of shape {list(size)} would take {float(nbytes):.3g} bytes, more than a "
            "tensor can hold (2**63 - 1); give smaller sizes"
        )
    try:
        return torch.randn(size, generator=generator, device=device, dtype=dtype)
    except RuntimeError as exc:  # torch.OutOfMemoryError on a GPU, a RuntimeError on the CPU
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"cannot allocate a tensor of shape {list(size)} ({nbytes / 2**30:.3g} GiB) on "
            f"{device}: give smaller sizes ({first})"
        ) from None
