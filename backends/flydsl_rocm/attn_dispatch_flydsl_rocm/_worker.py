"""Child process that compiles one kernel and writes its ISA, code object and resource figures.

Run as ``python -m attn_dispatch_flydsl_rocm._worker SPEC_JSON OUT_DIR``. A compile can end the
process (an MFMA the target lacks aborts LLVM), so callers always run this in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from ._isa import isa_stats
from ._spec import KernelSpec


def _decode_mlir_bytes(text: str) -> bytes:
    """Decode an MLIR string-literal body (``\\XX`` hex escapes) to bytes."""
    out = bytearray()
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1]
            if nxt in '\\"':
                out.append(ord(nxt))
                i += 2
                continue
            if nxt == "n":
                out.append(10)
                i += 2
                continue
            if nxt == "t":
                out.append(9)
                i += 2
                continue
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(ch.encode("latin-1"))
            i += 1
    return bytes(out)


def _code_object(module) -> bytes | None:
    """The ELF code object inside the module's ``gpu.binary`` (None when not produced)."""
    asm = module.operation.get_asm(large_elements_limit=None)
    m = re.search(r'bin\s*=\s*"((?:[^"\\]|\\.)*)"', asm)
    if not m:
        return None
    data = _decode_mlir_bytes(m.group(1))
    return data if data[:4] == b"\x7fELF" else None


def compile_spec(spec: KernelSpec, out_dir: Path) -> dict:
    """Compile ``spec`` for its arch in this process; write ``<key>.s``/``.hsaco``/``.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dump = Path(tempfile.mkdtemp(prefix="fly-dump-", dir=out_dir))
    os.environ.update(
        {
            "ARCH": spec.arch,
            "COMPILE_ONLY": "1",
            "FLYDSL_DEBUG_DUMP_ASM": "1",
            "FLYDSL_DUMP_DIR": str(dump),
            "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        }
    )
    import flydsl.compiler as flyc
    from flydsl.compiler import jit_function

    captured = []
    original = jit_function.MlirCompiler.compile

    def capture(cls, module, **kw):
        result = original.__func__(cls, module, **kw)
        captured.append(result)
        return result

    jit_function.MlirCompiler.compile = classmethod(capture)
    try:
        from ._builders import launcher, placeholder_args

        flyc.compile(launcher(spec), *placeholder_args(spec))
    finally:
        jit_function.MlirCompiler.compile = original
    isa_files = sorted(dump.rglob("*_final_isa.s"))
    if not isa_files:
        raise RuntimeError(f"no ISA produced for {spec.key()}")
    isa = isa_files[-1].read_text()
    key = spec.key()
    (out_dir / f"{key}.s").write_text(isa)
    co = _code_object(captured[-1]) if captured else None
    if co is not None:
        (out_dir / f"{key}.hsaco").write_bytes(co)
    stats = isa_stats(isa)
    stats.update(
        {
            "key": key,
            "arch": spec.arch,
            "code_object": co is not None,
            "code_object_bytes": len(co) if co else 0,
        }
    )
    (out_dir / f"{key}.json").write_text(json.dumps(stats, indent=1))
    for p in sorted(dump.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    dump.rmdir()
    return stats


def main(argv: list[str]) -> int:
    spec = KernelSpec(**json.loads(argv[0]))
    stats = compile_spec(spec, Path(argv[1]))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
