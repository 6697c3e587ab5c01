"""What chip a tensor lives on: ``Arch`` values, parsing, detection and the env override."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import torch

from ._errors import SettingError

ARCH_ENV = "ATTN_DISPATCH_ARCH"
# ``sm_90a`` / ``sm_100a`` (nvcc's and FlashAttention's names for the arch-specific feature
# sets) name the same chips as ``sm_90`` / ``sm_100``
_SM = re.compile(r"sm_?(\d+)a?")
_GFX = re.compile(r"gfx[0-9a-f]+")


@dataclass(frozen=True)
class Arch:
    """A target: ``vendor`` is cpu/cuda/rocm; ``name`` is ``cpu``, ``sm_90``, ``gfx950``, …

    ``full`` keeps the original string (``gfx950:sramecc+:xnack-`` on ROCm).
    """

    vendor: str
    name: str
    full: str

    def __str__(self) -> str:
        return self.name

    @property
    def sm(self) -> int | None:
        """The CUDA compute capability as one number (``sm_90`` -> 90, ``sm_100`` -> 100);
        ``None`` on a non-CUDA arch."""
        if self.vendor != "cuda" or not self.name.startswith("sm_"):
            return None
        digits = self.name[3:]
        return int(digits) if digits.isdigit() else None

    @property
    def capability(self) -> tuple[int, int] | None:
        """The CUDA compute capability ``(major, minor)`` (``sm_90`` -> (9, 0), ``sm_120`` ->
        (12, 0)); ``None`` on a non-CUDA arch."""
        sm = self.sm
        return None if sm is None else divmod(sm, 10)

    @classmethod
    def parse(cls, text: str) -> Arch:
        """Parse ``cpu``, ``sm_90`` / ``sm90`` / ``sm_90a``, or a gfx name with optional
        feature suffixes."""
        if not isinstance(text, str):
            raise TypeError(
                f"arch must be a str such as 'sm_90' or 'gfx950', got {type(text).__name__}"
            )
        raw = text.strip()
        lowered = raw.lower()
        if lowered == "cpu":
            return cls("cpu", "cpu", raw)
        if m := _SM.fullmatch(lowered):
            return cls("cuda", f"sm_{m.group(1)}", raw)
        base = lowered.split(":", 1)[0]
        if _GFX.fullmatch(base):
            return cls("rocm", base, raw)
        raise ValueError(
            f"arch={text!r} is not a known arch; expected 'cpu', 'sm_<major><minor>' "
            "(e.g. 'sm_90' or 'sm_90a') or a gfx name (e.g. 'gfx942', 'gfx950:sramecc+:xnack-')"
        )


CPU = Arch("cpu", "cpu", "cpu")


@functools.cache
def _gpu_arch(index: int) -> Arch:
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        full = getattr(props, "gcnArchName", "") or ""
        return Arch("rocm", full.split(":", 1)[0], full)
    name = f"sm_{props.major}{props.minor}"
    return Arch("cuda", name, name)


def resolve_arch(device: torch.device, override: Arch | None = None) -> Arch:
    """The arch of tensors on ``device``: ``override`` when given, else detected. A ``meta``
    (or device-less) tensor stands for the current CUDA/ROCm device when there is one."""
    if override is not None:
        return override
    if device.type == "cuda" or device.type == "meta" and torch.cuda.is_available():
        index = device.index if device.type == "cuda" and device.index is not None else None
        return _gpu_arch(torch.cuda.current_device() if index is None else index)
    return CPU


def arch_from_env() -> Arch | None:
    """``ATTN_DISPATCH_ARCH``: ``None`` when unset or blank, else the arch it names; a value
    that names none raises :class:`SettingError` naming the variable."""
    text = os.environ.get(ARCH_ENV, "").strip()
    if not text:
        return None
    try:
        return Arch.parse(text)
    except ValueError as exc:
        raise SettingError(f"{ARCH_ENV}: {exc}") from None


def detect_arch(device: torch.device | str | None = None) -> Arch:
    """The arch of ``device`` (default: the current CUDA/ROCm device if any, else CPU).

    ``ATTN_DISPATCH_ARCH`` overrides detection; it changes the arch, not where tensors live.
    """
    override = arch_from_env()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return resolve_arch(_checked_device(device, gpu_needed=override is None), override)


def _checked_device(device: object, gpu_needed: bool) -> torch.device:
    """``device`` as a ``torch.device``; a CUDA one must be a present GPU when ``gpu_needed``
    (its arch is read from it)."""
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"argument 'device': expected a torch.device or str, got {type(device).__name__}"
        )
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"argument 'device': {exc}") from None
    if parsed.type == "cuda" and gpu_needed:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if parsed.index is not None and parsed.index >= count or count == 0:
            raise ValueError(
                f"argument 'device': {str(parsed)!r} is not a GPU of this machine "
                f"({count} CUDA/ROCm device(s))"
            )
    return parsed
