"""The FlyDSL APIs this backend uses that FlyDSL's API-stability document calls unstable.

Each entry names the API, where the backend uses it, and a check that raises
:class:`FlyDSLAPIMoved` naming that API when a FlyDSL release removed or moved it. The tests run
every check against the installed FlyDSL, so an upgrade that breaks one fails with the API's name
instead of an error deep inside a kernel build. Importing this module does not import FlyDSL.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ._toolchain import flydsl_version


class FlyDSLAPIMoved(RuntimeError):
    """An unstable FlyDSL API the backend relies on is gone or changed."""


@dataclass(frozen=True)
class PrivateAPI:
    name: str  # the FlyDSL API as the backend spells it
    used_by: str  # the backend code that depends on it
    check: Callable[[], None]  # raises FlyDSLAPIMoved when the API is gone

    def moved(self, detail: str) -> FlyDSLAPIMoved:
        return FlyDSLAPIMoved(
            f"FlyDSL {flydsl_version()}: {self.name} is gone or changed ({detail}); the "
            f"flydsl_rocm backend uses it in {self.used_by}, so the backend needs updating for "
            "this FlyDSL release"
        )


def _module_attrs(api: str, module: str, names: tuple[str, ...]) -> Callable[[], None]:
    def check() -> None:
        entry = _BY_NAME[api]
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise entry.moved(f"import {module} failed: {exc}") from None
        missing = [n for n in names if not hasattr(mod, n)]
        if missing:
            raise entry.moved(f"{module} has no {', '.join(missing)}")

    return check


def _storage_ptr() -> None:
    """``SharedAllocator().allocate(n)`` returns ``Storage[Array[Uint8, n]](ptr)``; the kernel
    reads the LDS base address from that storage's ``_ptr`` (no public accessor exists)."""
    entry = _BY_NAME["Storage._ptr"]
    import flydsl.expr as fx

    sentinel = object()
    try:
        storage = fx.Storage[fx.Array[fx.Uint8, 16]](sentinel)
        ptr = object.__getattribute__(storage, "_ptr")
    except (AttributeError, TypeError) as exc:
        raise entry.moved(f"{type(exc).__name__}: {exc}") from None
    if ptr is not sentinel:
        raise entry.moved("Storage(ptr)._ptr is not the pointer it was built with")


def _isa_dump_name() -> None:
    """The worker finds the final ISA by FlyDSL's dump file name (``*_final_isa.s``)."""
    import tempfile
    from pathlib import Path

    from ._spec import KernelSpec
    from ._toolchain import compile_in_subprocess
    from ._worker import ISA_DUMP_GLOB

    spec = KernelSpec("convert", "gfx950", "bf16", 64)
    with tempfile.TemporaryDirectory(prefix="flydsl-api-") as out:
        try:
            compile_in_subprocess(spec, out_dir=Path(out))
        except RuntimeError as exc:
            if ISA_DUMP_GLOB in str(exc):
                raise _BY_NAME["ISA dump file name"].moved(str(exc)[-300:]) from None
            raise


PRIVATE_APIS: tuple[PrivateAPI, ...] = (
    PrivateAPI(
        "flydsl._mlir.ir",
        "_prims (vector/scalar MLIR types, attributes)",
        _module_attrs(
            "flydsl._mlir.ir",
            "flydsl._mlir.ir",
            (
                "Value",
                "Type",
                "IntegerType",
                "VectorType",
                "F32Type",
                "F16Type",
                "BF16Type",
                "IntegerAttr",
                "FloatAttr",
                "DenseElementsAttr",
            ),
        ),
    ),
    PrivateAPI(
        "flydsl._mlir.dialects.arith",
        "_prims (constant, truncf, select, extf, mulf)",
        _module_attrs(
            "flydsl._mlir.dialects.arith",
            "flydsl._mlir.dialects.arith",
            ("constant", "truncf", "extf", "mulf", "select"),
        ),
    ),
    PrivateAPI(
        "flydsl._mlir.dialects.llvm",
        "_prims (buffer base pointers, LDS loads/stores by address)",
        _module_attrs(
            "flydsl._mlir.dialects.llvm",
            "flydsl._mlir.dialects.llvm",
            ("PointerType", "inttoptr", "load", "store"),
        ),
    ),
    PrivateAPI(
        "flydsl._mlir.dialects.vector",
        "_prims (bitcast, extract, broadcast, from_elements, shuffle)",
        _module_attrs(
            "flydsl._mlir.dialects.vector",
            "flydsl._mlir.dialects.vector",
            ("bitcast", "extract", "broadcast", "from_elements", "shuffle"),
        ),
    ),
    PrivateAPI(
        "flydsl._mlir.dialects.rocdl",
        "_prims (buffer resources, buffer stores, ds_read_b64_tr_b16, hardware exp2)",
        _module_attrs(
            "flydsl._mlir.dialects.rocdl",
            "flydsl._mlir.dialects.rocdl",
            ("make_buffer_rsrc", "raw_ptr_buffer_store", "ds_read_tr16_b64", "exp2"),
        ),
    ),
    PrivateAPI(
        "flydsl.expr.rocdl builders outside __all__",
        "_prims (buffer loads, f32 buffer atomics, MFMA)",
        _module_attrs(
            "flydsl.expr.rocdl builders outside __all__",
            "flydsl.expr.rocdl",
            (
                "raw_ptr_buffer_load",
                "raw_ptr_buffer_atomic_fadd",
                "mfma_f32_16x16x32_bf16",
                "mfma_f32_16x16x32_f16",
                "mfma_f32_32x32x8bf16_1k",
                "mfma_f32_32x32x8f16",
            ),
        ),
    ),
    PrivateAPI("Storage._ptr", "_prims.lds_base (the LDS base address)", _storage_ptr),
    PrivateAPI(
        "ISA dump file name",
        "_worker (reads '*_final_isa.s' written under FLYDSL_DUMP_DIR)",
        _isa_dump_name,
    ),
)
_BY_NAME = {api.name: api for api in PRIVATE_APIS}
