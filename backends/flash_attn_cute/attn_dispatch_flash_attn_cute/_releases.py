"""The FlashAttention-4 releases this backend was tested with, as data: one row per release.

The backend calls FA4's private entry points, and which head dims FA4's sm_90 backward gets
right changes between betas, so nothing is assumed about a release that has no row here: the
backend stays off with it (``_support.fa4_problem`` says so). A row records what a GPU run
proved on that release:

* ``sm90_head_dims``: the head dims D (= Dv), MHA and GQA, for which FA4's sm_90 output and
  every gradient matched the float64 oracle (the scan of
  ``tests/test_flash_attn_cute_head_dims_gpu.py``). The backend admits exactly these on sm_90.
* ``sm90_wrong_backward``: head dims at which that scan found FA4's sm_90 backward wrong; they
  are refused naming the defect (any other unproven head dim is refused as not proven).
* ``replay_tested``: whether the host-code replay (``_replay``) was proven on that release's
  GPU run (replayed calls equal to FA4 called directly, the replay GPU tests passing). Without
  it FA4's host code runs on every call, and that is logged once.

Adding a release is adding a row, after the head-dim scan and the GPU suite passed on it (and
widening the package's ``flash-attn-4`` dependency in ``pyproject.toml`` to include it).
"""

from __future__ import annotations

from dataclasses import dataclass

# D rounded up to 16 differs from D rounded up to 32 for these D <= 128 (the kernel pads the
# head dim to 16, the interface allocates and post-processes the dQ accumulator padded to 32):
# measured wrong on an H200 in both releases below (112 in b40; b36 shares the cause).
_DQ_ACCUMULATOR_DEFECT = frozenset({8, 16, 40, 48, 72, 80, 104, 112})


@dataclass(frozen=True)
class Release:
    """What a GPU run proved about one FA4 release (see the module docstring)."""

    version: str
    sm90_head_dims: frozenset[int]
    sm90_wrong_backward: frozenset[int]
    replay_tested: bool
    evidence: str


RELEASES: dict[str, Release] = {
    release.version: release
    for release in (
        Release(
            version="4.0.0b36",
            sm90_head_dims=frozenset({24, 32, 64, 96, 128, 160, 192, 256}),
            sm90_wrong_backward=_DQ_ACCUMULATOR_DEFECT,
            replay_tested=True,
            evidence="H200, torch 2.11.0+cu130, 2026-12-03: head-dim scan, GPU suite, replay",
        ),
        Release(
            version="4.0.0b40",
            sm90_head_dims=frozenset({24, 32, 56, 64, 88, 96, 120, *range(128, 257, 8)}),
            sm90_wrong_backward=_DQ_ACCUMULATOR_DEFECT,
            replay_tested=False,
            evidence=(
                "H200, torch 2.11.0+cu130, 2026-12-04: head-dim scan D = 8-256 (multiples of "
                "8, MHA and GQA) and the backend's GPU tests"
            ),
        ),
    )
}


def tested_versions() -> list[str]:
    """The releases with a row, oldest first."""
    from packaging.version import Version

    return sorted(RELEASES, key=Version)


def release_for(version: str) -> Release | None:
    """The row of ``version`` (compared as versions: ``4.0.0b40`` and ``4.0.0-beta40`` are one
    release), or ``None`` for an untested release."""
    from packaging.version import InvalidVersion, Version

    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    for name, release in RELEASES.items():
        if Version(name) == wanted:
            return release
    return None
