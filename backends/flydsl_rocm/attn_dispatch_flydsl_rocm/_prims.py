"""Device-side primitives the kernels are written in (imported only at kernel build time).

Most of FlyDSL's unstable surface the backend needs (``flydsl._mlir`` dialects, ``fx.rocdl``
builders outside ``__all__``) is confined to this module; ``_flydsl_api`` lists it.

Thin, explicit wrappers over ROCDL/LLVM ops: buffer-resource global memory access (out-of-range
offsets read 0 and drop writes, which is how every kernel handles sequence tails), LDS access by
32-bit byte address, MFMA, the gfx950 LDS transpose read, hardware exp2 and f32 buffer atomics.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, vector
from flydsl._mlir.dialects import rocdl as mrocdl
from flydsl.expr import rocdl

LOG2E = 1.4426950408889634


def raw(v):
    """The MLIR value behind a DSL numeric (or the value itself)."""
    if isinstance(v, ir.Value):
        return v
    if hasattr(v, "ir_value"):
        return v.ir_value()
    if isinstance(v, int):
        return fx.Int32(v).ir_value()
    if isinstance(v, float):
        return fx.Float32(v).ir_value()
    return v


def i32(v) -> fx.Int32:
    return fx.Int32(v)


def vec_t(n: int, elem: ir.Type) -> ir.Type:
    return ir.VectorType.get([n], elem)


def i32_t() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def f32_t() -> ir.Type:
    return ir.F32Type.get()


def elem_t(dtype: str) -> ir.Type:
    return ir.BF16Type.get() if dtype == "bf16" else ir.F16Type.get()


# ---------------------------------------------------------------- global memory (buffers)


def buffer_rsrc(tensor, elem_offset, num_elems, elem_bytes: int):
    """Buffer resource for ``tensor`` starting ``elem_offset`` (Int64) elements in, ``num_elems``
    (Int32/Int64) elements long: accesses past the end read 0 and writes are dropped."""
    base = fx.Int64(fx.ptrtoint(fx.get_iter(tensor))) + fx.Int64(elem_offset) * elem_bytes
    nbytes = fx.Int64(num_elems) * elem_bytes
    ptr_ty = llvm.PointerType.get(1)
    gptr = llvm.inttoptr(ptr_ty, raw(base))
    flags = (7 << 12) | (4 << 15)
    rs = mrocdl.make_buffer_rsrc(
        llvm.PointerType.get(8), gptr, raw(fx.Int16(0)), raw(nbytes), raw(fx.Int32(flags))
    )
    return rs


def gload(res_ty: ir.Type, rsrc, byte_off):
    return rocdl.raw_ptr_buffer_load(res_ty, rsrc, raw(i32(byte_off)), raw(i32(0)), aux=0)


def gstore(val, rsrc, byte_off) -> None:
    mrocdl.raw_ptr_buffer_store(
        raw(val),
        rsrc,
        raw(i32(byte_off)),
        raw(i32(0)),
        aux=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 0),
    )


def gatomic_add_f32(val, rsrc, byte_off) -> None:
    rocdl.raw_ptr_buffer_atomic_fadd(raw(val), rsrc, raw(i32(byte_off)), raw(i32(0)), aux=0)


# ---------------------------------------------------------------- LDS


def lds_base(storage) -> fx.Int32:
    """LDS byte address of a ``SharedAllocator().allocate(n)`` result. FlyDSL has no public
    accessor for a storage's pointer: ``_ptr`` is checked by ``_flydsl_api``."""
    return fx.Int32(fx.ptrtoint(storage._ptr))


def lds_ptr(addr):
    return llvm.inttoptr(llvm.PointerType.get(3), raw(i32(addr)))


def lds_load(res_ty: ir.Type, addr, align: int = 16):
    return llvm.load(res_ty, lds_ptr(addr), alignment=align)


def lds_store(val, addr, align: int = 16) -> None:
    llvm.store(raw(val), lds_ptr(addr), alignment=align)


def lds_read_tr16(res_ty: ir.Type, addr):
    """gfx950 ``ds_read_b64_tr_b16``: four 16-bit values of one column from four rows."""
    return mrocdl.ds_read_tr16_b64(res_ty, lds_ptr(addr))


# ---------------------------------------------------------------- math


def mfma(shape: tuple[int, int, int], dtype: str, a, b, c):
    """One MFMA ``c += a @ b`` for ``shape`` (M, N, K) with 16-bit inputs and f32 accumulator."""
    m, n, k = shape
    res = vec_t(m * n // 64, f32_t())
    tag = {"bf16": "bf16", "f16": "f16"}[dtype]
    name = {
        (32, 32, 8): f"mfma_f32_32x32x8{tag}" + ("_1k" if tag == "bf16" else ""),
        (16, 16, 32): f"mfma_f32_16x16x32_{tag}",
        (32, 32, 16): f"mfma_f32_32x32x16_{tag}",
        (16, 16, 16): f"mfma_f32_16x16x16{tag}" + ("_1k" if tag == "bf16" else ""),
    }[shape]
    fn = getattr(rocdl, name)
    a, b = raw(a), raw(b)
    if name.endswith("_1k"):  # the CDNA3 bf16 forms take the operands as i16 vectors
        i16 = ir.IntegerType.get_signless(16)
        n_ab = ir.VectorType(a.type).shape[0]
        a = vector.bitcast(vec_t(n_ab, i16), a)
        b = vector.bitcast(vec_t(n_ab, i16), b)
    return fn(res, [a, b, raw(c), 0, 0, 0])


def exp2(x):
    """Hardware ``v_exp_f32`` (no OCML call)."""
    return mrocdl.exp2(f32_t(), raw(x))


def splat(val, n: int):
    v = raw(val)
    return vector.broadcast(vec_t(n, v.type), v)


def const_vec(val: float, n: int, ty: ir.Type | None = None):
    ty = ty or f32_t()
    return arith.constant(
        vec_t(n, ty), ir.DenseElementsAttr.get_splat(vec_t(n, ty), ir.FloatAttr.get(ty, val))
    )


def extract(v, i: int):
    return vector.extract(raw(v), static_position=[i], dynamic_position=[])


def from_elems(elems, ty: ir.Type):
    return vector.from_elements(vec_t(len(elems), ty), [raw(e) for e in elems])


def bitcast(v, ty: ir.Type):
    return vector.bitcast(ty, raw(v))


def shuffle(a, b, idx):
    return vector.shuffle(raw(a), raw(b), list(idx))


def select(cond, a, b):
    """``cond ? a : b`` on MLIR values (scalars or vectors)."""
    return arith.select(raw(cond), raw(a), raw(b))


def truncf(ty: ir.Type, v):
    return arith.truncf(ty, raw(v))


def extf(ty: ir.Type, v):
    return arith.extf(ty, raw(v))


def mulf(a, b):
    return arith.mulf(raw(a), raw(b))


def trunc_f32(v, n: int, dtype: str):
    """f32 vector -> 16-bit vector (round to nearest even)."""
    return arith.truncf(vec_t(n, elem_t(dtype)), raw(v))
