"""``bench_kernel_rev.py``: a kernel source from git loads as a second module of the package."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_kernel_rev  # noqa: E402


def test_shapes_parse_and_bad_ones_are_named() -> None:
    assert bench_kernel_rev.parse_shapes("4096c, 16384") == [(4096, True), (16384, False)]
    for bad in ("4k", "c", "0c", "-8"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            bench_kernel_rev.parse_shapes(bad)


def test_the_kernel_at_a_commit_loads_beside_this_one(tmp_path: Path) -> None:
    """The committed source of the kernel, loaded as ``_bwd_dkdv_sm90_rev``: a second kernel
    object whose source is that text (triton reads it from the module's file)."""
    try:
        source = bench_kernel_rev.kernel_source_at("HEAD")
    except SystemExit as exc:  # (a copy of the tree without its git history)
        pytest.skip(str(exc))
    from attn_dispatch_triton import _bwd_dkdv_sm90

    module = bench_kernel_rev.load_kernel_module(source, directory=str(tmp_path))
    assert module.__name__ == "attn_dispatch_triton._bwd_dkdv_sm90_rev"
    kernel = module._attn_bwd_dkdv_sm90
    assert kernel is not _bwd_dkdv_sm90._attn_bwd_dkdv_sm90
    assert Path(module.__file__).parent == tmp_path
    assert Path(module.__file__).read_text() == source
    assert kernel.src.startswith("def _attn_bwd_dkdv_sm90(") and kernel.src in source


def test_an_unknown_commit_is_named() -> None:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    with pytest.raises(SystemExit, match="no-such-rev"):
        bench_kernel_rev.kernel_source_at("no-such-rev")


def test_a_saved_copy_of_the_kernel_is_read_and_a_missing_one_named(tmp_path: Path) -> None:
    saved = tmp_path / "kernel_old.py"
    saved.write_text("def _attn_bwd_dkdv_sm90(): pass\n")
    assert bench_kernel_rev.kernel_source_at(str(saved)) == saved.read_text()
    with pytest.raises(SystemExit, match="absent.py"):
        bench_kernel_rev.kernel_source_at(str(tmp_path / "absent.py"))
