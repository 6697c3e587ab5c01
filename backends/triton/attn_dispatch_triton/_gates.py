"""The triton versions this backend's fast paths were checked with, as ``attn-dispatch doctor``
reports them (``Fused.fast_paths``): the Gluon sm_90 kernels (:data:`._tma_rows.GLUON_TRITON`)
and the launch plans' replay (:data:`._plan.VERIFIED_TRITON`) run only on those; elsewhere the
``tl`` kernels and the ``kernel[grid]`` path run, correct and slower."""

from __future__ import annotations

from attn_dispatch import backend as adb


def triton_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the importable triton (``None``: none is), the one lookup every
    version gate of the backend reads."""
    try:
        import triton
    except ImportError:
        return None
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


def _label(versions) -> str:
    return ", ".join(".".join(map(str, v)) for v in versions)


def _gate(name: str, checked: tuple[tuple[int, int], ...], off_means: str) -> adb.FastPath:
    version = triton_version()
    if version is None:
        return adb.FastPath(name, False, "triton is not installed")
    here = ".".join(map(str, version))
    if version in checked:
        return adb.FastPath(name, True, f"triton {here} is a release it was checked with")
    return adb.FastPath(
        name,
        False,
        f"triton {here} is installed; it was checked with triton {_label(checked)} only, so "
        f"{off_means}",
    )


def fast_paths() -> list[adb.FastPath]:
    from ._plan import PLANS_VARIABLE, VERIFIED_TRITON
    from ._tma_rows import GLUON_TRITON

    gluon = _gate(
        "Gluon sm_90 kernels", GLUON_TRITON, "the tl kernels run on sm_90 (slower at long rows)"
    )
    plans = _gate(
        "launch-plan replay",
        VERIFIED_TRITON,
        "every call launches through kernel[grid] (more host time per call)",
    )
    if plans.on and not adb.env_flag(PLANS_VARIABLE, True):
        plans = adb.FastPath(plans.name, False, f"{PLANS_VARIABLE} turns it off")
    return [gluon, plans]
