"""Compile-only checks of every kernel for gfx942 and gfx950, asserting on the ISA and the
linked code object. Each build runs in a child process (a bad compile can abort a process)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from attn_dispatch_flydsl_rocm import KernelSpec, specs_for
from attn_dispatch_flydsl_rocm._tiles import LDS_BUDGET
from flydsl_gate import require_flydsl


@pytest.fixture(autouse=True)
def _flydsl() -> None:
    """Skipped without a usable FlyDSL; failed instead under ATTN_DISPATCH_REQUIRE_FLYDSL=1 (CI)."""
    require_flydsl()


def _have_linker() -> bool:
    from attn_dispatch_flydsl_rocm._toolchain import rocm_path

    return rocm_path() is not None


def _check(spec: KernelSpec, st: dict, out: Path) -> None:
    assert st["target"].endswith(spec.arch)
    assert st["scratch_bytes"] == 0 and st["vgpr_spills"] == 0 and st["scratch_instructions"] == 0
    assert st["lds_bytes"] <= LDS_BUDGET[spec.arch]
    if spec.kind == "main":
        mfma = st["mfma"]
        tag = spec.dtype
        if spec.variant == "gfx950_fused":
            assert set(mfma) == {f"v_mfma_f32_16x16x32_{tag}"}, mfma
            assert st["ds_read_b64_tr_b16"] > 0
        else:
            assert set(mfma) == {f"v_mfma_f32_32x32x8_{tag}"}, mfma
            assert st["ds_read_b64_tr_b16"] == 0
        assert st["buffer_atomics"].get("buffer_atomic_add_f32", 0) > 0
    if _have_linker():
        blob = (out / f"{spec.key()}.hsaco").read_bytes()
        e_type, e_machine = struct.unpack_from("<HH", blob, 16)
        assert blob[:4] == b"\x7fELF" and e_type == 3 and e_machine == 0xE0  # ET_DYN, AMDGPU


def _build_and_check(tmp_path: Path, variant, arch, dtype, d, causal, varlen, group) -> None:
    from attn_dispatch_flydsl_rocm._toolchain import compile_in_subprocess

    for spec in specs_for(variant, arch, dtype, d, causal, varlen, group):
        _check(spec, compile_in_subprocess(spec, out_dir=tmp_path), tmp_path)


def test_aot_command_gfx950_fused(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "attn_dispatch_flydsl_rocm.aot",
            "--arch",
            "gfx950",
            "--head-dim",
            "128",
            "--dtype",
            "bf16",
            "--causal",
            "--gqa",
            "8",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert [r["kernel"].split("-")[0] for r in rows] == ["preprocess", "main", "convert"]
    main = rows[1]
    assert main["arch"] == "gfx950" and main["scratch_bytes"] == 0
    assert main["mfma"].get("v_mfma_f32_16x16x32_bf16", 0) > 0
    assert main["ds_read_b64_tr_b16"] > 0 and main["buffer_atomics"]["buffer_atomic_add_f32"] > 0
    for r in rows:
        assert {"vgprs", "agprs", "lds_bytes", "scratch_bytes"} <= set(r)
        assert Path(r["isa"]).exists()
        if _have_linker():
            blob = Path(r["code_object"]).read_bytes()
            assert blob[:4] == b"\x7fELF" and struct.unpack_from("<H", blob, 16)[0] == 3


def test_gfx942_kernel_varlen_f16(tmp_path):
    _build_and_check(tmp_path, "gfx942_mfma", "gfx942", "f16", 64, False, True, 1)


def test_compile_error_is_an_exception_not_an_abort(tmp_path):
    from attn_dispatch_flydsl_rocm._toolchain import compile_in_subprocess

    bad = KernelSpec("main", "gfx942", "bf16", 64, False, "gfx950_fused", False, 1)
    with pytest.raises(RuntimeError, match="compiling main-gfx942-bf16-d64-gfx950_fused"):
        compile_in_subprocess(bad, out_dir=tmp_path)


def test_disk_cache_skips_the_compile(tmp_path, monkeypatch):
    from attn_dispatch_flydsl_rocm import _toolchain

    monkeypatch.setenv("ATTN_DISPATCH_FLYDSL_CACHE", str(tmp_path))
    spec = KernelSpec("convert", "gfx950", "bf16", 128)
    first = _toolchain.compile_in_subprocess(spec)
    _toolchain._memory.clear()

    def no_subprocess(*a, **k):
        raise AssertionError("recompiled although cached on disk")

    monkeypatch.setattr(_toolchain.subprocess, "run", no_subprocess)
    assert _toolchain.compile_in_subprocess(spec) == first


def test_disk_cache_is_keyed_by_flydsl_version(tmp_path, monkeypatch):
    """Figures cached by another FlyDSL (or by the unversioned layout) are never returned: the
    compile runs again in a child process under the installed version."""
    from attn_dispatch_flydsl_rocm import _toolchain

    monkeypatch.setenv("ATTN_DISPATCH_FLYDSL_CACHE", str(tmp_path))
    _toolchain._memory.clear()
    spec = KernelSpec("convert", "gfx950", "bf16", 128)
    stale = json.dumps({"vgprs": -1, "key": spec.key()})
    for old in (tmp_path / "kernels", tmp_path / "kernels" / "flydsl-0.4.0"):
        old.mkdir(parents=True, exist_ok=True)
        (old / f"{spec.key()}.json").write_text(stale)
    version = _toolchain.flydsl_version()
    st = _toolchain.compile_in_subprocess(spec)
    assert st["vgprs"] > 0 and st["flydsl"] == version
    assert (tmp_path / "kernels" / f"flydsl-{version}" / f"{spec.key()}.json").exists()


def test_version_is_read_without_importing_flydsl():
    code = (
        "import sys; from attn_dispatch_flydsl_rocm._toolchain import kernel_cache_dir; "
        "print(kernel_cache_dir().name); assert 'flydsl' not in sys.modules"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    from importlib import metadata

    assert res.stdout.strip() == f"flydsl-{metadata.version('flydsl')}"


MATRIX = [
    (variant, arch, dtype, d, causal, varlen, group)
    for variant, arch in (
        ("gfx950_fused", "gfx950"),
        ("gfx942_mfma", "gfx942"),
        ("gfx942_mfma", "gfx950"),
    )
    for dtype in ("bf16", "f16")
    for d in (64, 128, 256)
    for causal in (False, True)
    for varlen in (False, True)
    for group in (1, 8)
    if not (variant == "gfx942_mfma" and d == 256)
]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", MATRIX, ids=lambda c: "-".join(map(str, c)))
def test_compile_matrix(tmp_path, cfg):
    _build_and_check(tmp_path, *cfg)


@pytest.mark.slow
def test_gfx942_head_dim_256_really_spills(tmp_path):
    """Keeps the supports() rejection honest: the 32x32x8 kernel spills at D=256."""
    from attn_dispatch_flydsl_rocm._toolchain import compile_in_subprocess

    spec = KernelSpec("main", "gfx942", "bf16", 256, False, "gfx942_mfma", False, 1)
    st = compile_in_subprocess(spec, out_dir=tmp_path)
    assert st["vgpr_spills"] > 0
