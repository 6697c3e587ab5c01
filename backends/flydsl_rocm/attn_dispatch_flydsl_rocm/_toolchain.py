"""Where the code-object linker comes from, and the child-process compile with its caches.

FlyDSL links code objects with ``$ROCM_PATH/llvm/bin/ld.lld``. Without a ROCm install, a private
``ROCM_PATH`` whose ``llvm/bin/ld.lld`` points at a system LLVM lld (Debian ``lld-19``) is made
under the cache directory. Without any lld the ISA is still produced, just no code object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from ._spec import KernelSpec

_LLD_NAMES = ("ld.lld-19", "ld.lld-20", "ld.lld-18", "ld.lld-17", "ld.lld")
_memory: dict[str, dict] = {}


def flydsl_version() -> str | None:
    """The installed FlyDSL version from its metadata (FlyDSL is not imported), or None."""
    try:
        return metadata.version("flydsl")
    except metadata.PackageNotFoundError:
        return None


def kernel_cache_dir() -> Path:
    """Where compiled kernels' figures are kept: one directory per FlyDSL version, so an
    upgrade neither returns the old version's figures nor skips the guarding child compile."""
    return cache_dir() / "kernels" / f"flydsl-{flydsl_version() or 'none'}"


def cache_dir() -> Path:
    root = os.environ.get("ATTN_DISPATCH_FLYDSL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attn_dispatch_flydsl"


def rocm_path() -> str | None:
    """A ROCM_PATH whose ``llvm/bin/ld.lld`` exists (the real one first), else None."""
    for cand in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if cand and Path(cand, "llvm", "bin", "ld.lld").exists():
            return cand
    for name in _LLD_NAMES:
        lld = shutil.which(name)
        if lld:
            shim = cache_dir() / "rocm-shim"
            link = shim / "llvm" / "bin" / "ld.lld"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists() or os.path.realpath(link) != os.path.realpath(lld):
                tmp = link.with_suffix(f".tmp{os.getpid()}")
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(lld)
                tmp.replace(link)
            return str(shim)
    return None


def compile_in_subprocess(
    spec: KernelSpec, out_dir: Path | None = None, timeout: float = 600
) -> dict:
    """Compile ``spec`` in a child process (a compile can abort the process); cached in memory
    and on disk by the installed FlyDSL version and ``spec.key()``. Returns the resource figures
    (see ``_isa.isa_stats``)."""
    key = spec.key()
    target = Path(out_dir) if out_dir else kernel_cache_dir()
    meta = target / f"{key}.json"
    memo = str(meta)
    if out_dir is None and memo in _memory:
        return _memory[memo]
    if out_dir is None and meta.exists():
        _memory[memo] = json.loads(meta.read_text())
        return _memory[memo]
    env = dict(os.environ)
    env.pop("FLYDSL_DUMP_IR", None)
    rp = rocm_path()
    if rp:
        env["ROCM_PATH"] = rp
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attn_dispatch_flydsl_rocm._worker",
            json.dumps(spec.to_dict()),
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0 or not meta.exists():
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RuntimeError(f"compiling {key} failed (exit {proc.returncode}):\n{tail}")
    stats = json.loads(meta.read_text())
    if out_dir is None:
        _memory[memo] = stats
    return stats
