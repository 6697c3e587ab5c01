"""Child process that compiles one kernel and writes its ISA, code object and resource figures.

Run as ``python -m attn_dispatch_flydsl_rocm._worker SPEC_JSON OUT_DIR``. A compile can end the
process (an MFMA the target lacks aborts LLVM), so callers always run this in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from ._isa import isa_stats
from ._spec import KernelSpec
from ._toolchain import flydsl_version

# FlyDSL's name for the final ISA stage of an IR dump (not a documented API).
ISA_DUMP_GLOB = "*_final_isa.s"


_ELF_MAGIC = b"\x7fELF"
_EM_AMDGPU = 0xE0


def _embedded_code_object(host_object: bytes) -> bytes | None:
    """The AMDGPU ELF code object embedded in a host object file, or None.

    An ELF64 file ends with its section header table, so its size is ``e_shoff + e_shnum *
    e_shentsize``; the host object's own header (offset 0) is skipped.
    """
    at = host_object.find(_ELF_MAGIC, 1)
    while at >= 0:
        (machine,) = struct.unpack_from("<H", host_object, at + 18)
        if machine == _EM_AMDGPU:
            (shoff,) = struct.unpack_from("<Q", host_object, at + 0x28)
            shentsize, shnum = struct.unpack_from("<HH", host_object, at + 0x3A)
            return host_object[at : at + shoff + shentsize * shnum]
        at = host_object.find(_ELF_MAGIC, at + 1)
    return None


def _have_linker() -> bool:
    return Path(os.environ.get("ROCM_PATH", ""), "llvm", "bin", "ld.lld").exists()


def _code_object(compiled, work: Path) -> bytes | None:
    """The linked code object of a ``flyc.compile`` result, through its public
    ``export_to_c`` (a host object embedding the code object); None without an lld."""
    if not _have_linker():
        return None
    if compiled is None or not hasattr(compiled, "export_to_c"):
        raise RuntimeError(
            "flyc.compile() returned no CompiledFunction with export_to_c(): the FlyDSL API "
            "the backend extracts code objects with has changed"
        )
    work.mkdir()
    compiled.export_to_c(str(work), "kernel")
    host = sorted(work.glob("kernel.o*"))
    if not host:
        raise RuntimeError(f"CompiledFunction.export_to_c() wrote no kernel.o in {work}")
    co = _embedded_code_object(host[0].read_bytes())
    if co is None:
        raise RuntimeError("CompiledFunction.export_to_c() wrote no embedded AMDGPU code object")
    return co


def _dumped_isa(dump: Path, key: str) -> str:
    """The final ISA FlyDSL wrote under ``FLYDSL_DUMP_DIR`` (``FLYDSL_DEBUG_DUMP_ASM=1``)."""
    isa_files = sorted(dump.rglob(ISA_DUMP_GLOB))
    if not isa_files:
        raise RuntimeError(
            f"no ISA produced for {key}: FlyDSL wrote no {ISA_DUMP_GLOB!r} under FLYDSL_DUMP_DIR "
            "with FLYDSL_DEBUG_DUMP_ASM=1 (its ISA dump naming may have changed)"
        )
    return isa_files[-1].read_text()


def compile_spec(spec: KernelSpec, out_dir: Path) -> dict:
    """Compile ``spec`` for its arch in this process; write ``<key>.s``/``.hsaco``/``.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dump = Path(tempfile.mkdtemp(prefix="fly-dump-", dir=out_dir))
    os.environ.update(
        {
            "ARCH": spec.arch,
            "FLYDSL_DEBUG_DUMP_ASM": "1",
            "FLYDSL_DUMP_DIR": str(dump),
            "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        }
    )
    import flydsl.compiler as flyc

    from ._builders import launcher, placeholder_args

    # Placeholder CPU tensors: flyc.compile builds without touching a GPU runtime.
    compiled = flyc.compile(launcher(spec), *placeholder_args(spec))
    isa = _dumped_isa(dump, spec.key())
    key = spec.key()
    (out_dir / f"{key}.s").write_text(isa)
    co = _code_object(compiled, dump / "export")
    if co is not None:
        (out_dir / f"{key}.hsaco").write_bytes(co)
    stats = isa_stats(isa)
    stats.update(
        {
            "key": key,
            "arch": spec.arch,
            "code_object": co is not None,
            "code_object_bytes": len(co) if co else 0,
            "flydsl": flydsl_version(),
        }
    )
    (out_dir / f"{key}.json").write_text(json.dumps(stats, indent=1))
    shutil.rmtree(dump)
    return stats


def main(argv: list[str]) -> int:
    spec = KernelSpec(**json.loads(argv[0]))
    stats = compile_spec(spec, Path(argv[1]))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
