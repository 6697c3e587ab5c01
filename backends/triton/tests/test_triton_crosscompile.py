"""Cross-compile every Triton kernel for Hopper (sm_90), MI300X (gfx942) and MI355X (gfx950).

``triton.compile(ASTSource(...), target=GPUTarget(...))`` runs the whole pipeline (TTIR ->
TTGIR -> LLVM -> PTX/cubin or AMDGCN/HSACO) on the CPU, so an arch-specific break (an MMA the
target lacks, shared memory over budget, a layout the backend rejects) shows up in CI. Each
kernel is compiled with the configuration the tuning table would launch it with, and we check
that the tensor-core instructions are there (``wgmma`` on sm_90, ``mma`` on sm_80, ``v_mfma``
on gfx9), that shared memory fits the target, and that fp32 atomic adds appear in the fused-atomic
dK/dV/dQ kernel (on sm_90 the table's TMA bulk reduce-add, ``cp.reduce.async.bulk.tensor``, or
``atom``/``red`` in the PTX; ``global_/buffer_atomic_add_f32`` in the AMDGCN) and in no other
kernel.
"""

from __future__ import annotations

import itertools
import re

import pytest

triton = pytest.importorskip("triton")

from attn_dispatch_triton._bwd_dkdv import _attn_bwd_dkdv  # noqa: E402
from attn_dispatch_triton._bwd_dq import _attn_bwd_dq  # noqa: E402
from attn_dispatch_triton._bwd_dq_convert import _attn_bwd_dq_convert  # noqa: E402
from attn_dispatch_triton._bwd_preprocess import _attn_bwd_preprocess  # noqa: E402
from attn_dispatch_triton._common import (  # noqa: E402
    SOFTCAP_EXP2,
    SOFTCAP_NONE,
    SOFTCAP_TANH_APPROX,
    padded_dim,
)
from attn_dispatch_triton.forward import _attn_fwd  # noqa: E402
from attn_dispatch_triton.tuning import configs_for, lookup  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGETS = {
    "sm_90": (GPUTarget("cuda", 90, 32), "ptx", "wgmma", 232448),
    "sm_80": (GPUTarget("cuda", 80, 32), "ptx", "mma.sync", 166912),
    "gfx942": (GPUTarget("hip", "gfx942", 64), "amdgcn", "v_mfma", 65536),
    "gfx950": (GPUTarget("hip", "gfx950", 64), "amdgcn", "v_mfma", 163840),
}
KERNELS = {
    "fwd": _attn_fwd,
    "pre": _attn_bwd_preprocess,
    "dkdv": _attn_bwd_dkdv,
    "dq": _attn_bwd_dq,
    "dkdvq": _attn_bwd_dkdv,
    "cvt": _attn_bwd_dq_convert,
}
NO_MMA = {"pre", "cvt"}  # a reduction and an elementwise pass: no matrix product
# fp32 atomic adds in the fused-atomic dK/dV/dQ kernel: a PTX atom/red instruction (not a
# bar.red), an AMDGPU global or buffer fp32 atomic add.
ATOMICS = {
    "ptx": re.compile(r"(?<![.\w])(?:red|atom)\.[\w.]*add[\w.]*f32"),
    "amdgcn": re.compile(r"\b(?:global|buffer)_atomic_add_f32\b"),
}
TMA_REDUCE = "cp.reduce.async.bulk.tensor"  # Hopper: dQ tiles added by TMA reductions
FLOAT_POINTERS = {"Lse", "Lse2", "Delta", "DQA", "ACC", "Sinks", "Partial"}
INT_POINTERS = {"CU_Q", "CU_K"}
FLOATS = {"qk_scale", "scale", "softcap"}
INTS = {"heads", "kv_heads", "group", "win_left", "win_right"}  # with stride_* and seqlen_*
TILE_DESCRIPTORS = {"QDESC", "DODESC", "KDESC", "VDESC"}  # TMA tile loads (config LOAD_TMA)
TMA_LOAD = "cp.async.bulk.tensor.4d"

pytestmark = pytest.mark.skipif(
    not isinstance(_attn_fwd, JITFunction),
    reason="kernels were defined in interpreter mode (TRITON_INTERPRET set): nothing to compile",
)


def softcap_mode(softcap: bool, arch: str) -> int:
    """The ``SOFTCAP`` constexpr the launcher passes on ``arch``'s GPUs."""
    if not softcap:
        return SOFTCAP_NONE
    return SOFTCAP_TANH_APPROX if arch.startswith("sm_") else SOFTCAP_EXP2


def compile_kernel(
    kernel_name: str,
    arch: str,
    *,
    dtype: str = "bf16",
    d: int = 128,
    dv: int | None = None,
    causal: bool = True,
    bottom_right: bool = False,
    varlen: bool = False,
    group: int = 8,
    seqlen_k: int = 1 << 30,
    cfg: dict | None = None,
    window_left: bool = False,
    window_right: bool = False,
    softcap: bool = False,
    sinks: bool = False,
):
    """Compile one kernel as the launcher would launch it (with the tuning table's
    configuration unless ``cfg`` is given); returns the compiled kernel. ``window_left`` /
    ``window_right``: a sliding window bounds that side of the band (``causal`` bounds the
    right one); ``softcap``: the soft-capped scores; ``sinks``: the forward's attention
    sinks."""
    target = TARGETS[arch][0]
    fn = KERNELS[kernel_name]
    dv = dv or d
    cfg = cfg or configs_for(arch, d, dv, causal, group, seqlen_k)[kernel_name]
    load_tma = bool(cfg.get("LOAD_TMA")) and arch == "sm_90"
    tile_rows = cfg["BLOCK_M"] if kernel_name.startswith("dkdv") else cfg["BLOCK_N"]
    consts = {
        "D": d,
        "DV": dv,
        "LIMIT_LEFT": window_left,
        "LIMIT_RIGHT": causal or window_right,
        "SOFTCAP": softcap_mode(softcap, arch),
        "HAS_SINKS": sinks,
        "BOTTOM_RIGHT": bottom_right,
        "IS_VARLEN": varlen,
        "ATOMIC_DQ": kernel_name == "dkdvq",
        "DQ_TMA": kernel_name == "dkdvq" and bool(cfg.get("TMA")),
        "HEAVY_FIRST": causal and bool(cfg.get("HEAVY_FIRST", 0)),
        "DP_FIRST": bool(cfg.get("DP_FIRST", 0)),
        "BLOCK_M": cfg["BLOCK_M"],
        "BLOCK_N": cfg["BLOCK_N"],
        "BLOCK_D": padded_dim(d),
        "BLOCK_DV": padded_dim(dv),
        "LOAD_TMA": load_tma,
        # the convert pass after the Gluon fused-atomic kernel (sm_90, D = 128) reads
        # the scratch in WIDE_STORE's column order
        "WIDE_STORE": arch == "sm_90"
        and d == 128
        and bool(lookup(arch, d, causal, group, seqlen_k)["dkdvq"].get("WIDE_STORE")),
    }
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if fn.params[i].is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = consts[name]
        elif name == "DQA" and consts["DQ_TMA"]:  # the fp32 dQ scratch as a TMA descriptor
            signature[name] = f"tensordesc<fp32[{cfg['BLOCK_M']}, {padded_dim(d)}]>"
        elif name in TILE_DESCRIPTORS and load_tma:  # [B, S, H, D] with [1, rows, 1, D] tiles
            width = padded_dim(dv if name in ("DODESC", "VDESC") else d)
            signature[name] = f"tensordesc<{dtype}[1, {tile_rows}, 1, {width}]>"
        elif name in FLOATS:
            signature[name] = "fp32"
        elif name.startswith(("stride_", "seqlen_")) or name in INTS:
            signature[name] = "i32"
            if (
                name.startswith("stride_")
                and name[-1] in "bsh"
                and not (varlen and name[-1] == "b")
            ):
                attrs[(i,)] = [["tt.divisibility", 16]]  # strides of a multiple-of-16 head dim
        else:
            kind = "fp32" if name in FLOAT_POINTERS else "i32" if name in INT_POINTERS else dtype
            signature[name] = f"*{kind}"
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        src, target=target, options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    )


def _check(compiled, kernel_name: str, arch: str) -> None:
    _, asm_key, mma, smem_budget = TARGETS[arch]
    asm = compiled.asm[asm_key]
    if kernel_name not in NO_MMA:
        assert mma in asm, f"{kernel_name} on {arch}: no {mma} in the {asm_key}"
    has_atomic = ATOMICS[asm_key].search(asm) is not None or TMA_REDUCE in asm
    assert has_atomic == (kernel_name == "dkdvq"), (
        f"{kernel_name} on {arch}: atomics in the {asm_key}: {has_atomic}"
    )
    assert compiled.metadata.shared <= smem_budget, (
        f"{kernel_name} on {arch} needs {compiled.metadata.shared} B shared memory > {smem_budget}"
    )
    binary = "cubin" if asm_key == "ptx" else "hsaco"
    assert len(compiled.asm[binary]) > 0


DEFAULT = [(k, a) for k in KERNELS for a in ("sm_90", "gfx942", "gfx950")]


@pytest.mark.parametrize("kernel_name", ["fwd", "dkdv", "dq", "dkdvq"])
@pytest.mark.parametrize(("d", "dv"), [(112, 184), (48, 240)])
def test_tiles_fit_shared_memory_when_dv_is_wider_than_d(kernel_name, d, dv) -> None:
    # Tiles sized for D alone (D <= 128) overflowed sm_90's shared memory once Dv > 128.
    compiled = compile_kernel(kernel_name, "sm_90", d=d, dv=dv, causal=False, group=2)
    _check(compiled, kernel_name, "sm_90")


@pytest.mark.parametrize(("kernel_name", "arch"), DEFAULT)
def test_triton_kernel_compiles(kernel_name: str, arch: str) -> None:
    _check(compile_kernel(kernel_name, arch), kernel_name, arch)


@pytest.mark.parametrize("kernel_name", ["dkdv", "dq"])
@pytest.mark.parametrize(
    ("causal", "group", "seqlen_k"),
    [
        pytest.param(False, 1, 1024, marks=pytest.mark.slow),
        (False, 1, 2048),
        pytest.param(False, 1, 4096, marks=pytest.mark.slow),
        pytest.param(False, 8, 4096, marks=pytest.mark.slow),
        (True, 8, 1024),
        pytest.param(True, 1, 1024, marks=pytest.mark.slow),
        pytest.param(True, 1, 2048, marks=pytest.mark.slow),
        pytest.param(True, 1, 4096, marks=pytest.mark.slow),
    ],
    ids=[
        "mha-1k",
        "mha-2k",
        "mha-long",
        "gqa-long",
        "causal-gqa-short",
        "causal-mha-1k",
        "causal-mha-2k",
        "causal-mha-long",
    ],
)
def test_triton_sm90_table_entries_compile(kernel_name, causal, group, seqlen_k) -> None:
    """The sm_90 table's per-class entries (short tiles, heaviest-first order, dP first,
    4-stage dQ) compile. By default one full and one causal class of each kernel; every class
    under ``-m slow``."""
    _check(
        compile_kernel(kernel_name, "sm_90", causal=causal, group=group, seqlen_k=seqlen_k),
        kernel_name,
        "sm_90",
    )


@pytest.mark.parametrize("kernel_name", ["dkdv", "dq"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_triton_tma_tile_loads_compile_sm90(kernel_name: str, varlen: bool) -> None:
    """``LOAD_TMA``: the loop's tiles come by TMA copies (4-D tensor descriptors)."""
    cfg = {**lookup("sm_90", 128, True, 8, 1 << 30)[kernel_name], "LOAD_TMA": 1}
    compiled = compile_kernel(kernel_name, "sm_90", varlen=varlen, cfg=cfg)
    _check(compiled, kernel_name, "sm_90")
    assert TMA_LOAD in compiled.asm["ptx"], f"{kernel_name}: no TMA tile load in the PTX"


def test_triton_dkdv_compiles_varlen_f16_d64_sm90() -> None:
    _check(
        compile_kernel(
            "dkdv", "sm_90", dtype="fp16", d=64, causal=True, bottom_right=True, varlen=True
        ),
        "dkdv",
        "sm_90",
    )


def test_triton_fused_atomic_uses_tma_reduce_on_sm90() -> None:
    asm = compile_kernel("dkdvq", "sm_90").asm["ptx"]
    assert TMA_REDUCE in asm and ".add" in asm, "no TMA reduce-add for dQ on sm_90"


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_triton_fused_atomic_dp_first_compiles(arch: str) -> None:
    """``DP_FIRST`` in the fused-atomic dK/dV kernel (TMA dQ reduction on sm_90)."""
    cfg = {**lookup(arch, 128, False, 8)["dkdvq"], "DP_FIRST": 1}
    _check(compile_kernel("dkdvq", arch, causal=False, cfg=cfg), "dkdvq", arch)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_triton_fused_atomic_compiles_d256(arch: str) -> None:
    _check(compile_kernel("dkdvq", arch, d=256, causal=True, bottom_right=True), "dkdvq", arch)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx950"])
def test_triton_attention_sinks_compile(arch: str) -> None:
    """The forward with sinks folded into its epilogue (causal, a window, GQA 64/8, D = 64 as
    GPT-OSS), and the sinks' gradient kernel (a reduction: no matrix product, no atomics)."""
    fwd = compile_kernel("fwd", arch, d=64, window_left=True, sinks=True)
    _check(fwd, "fwd", arch)
    from attn_dispatch_triton._bwd_sinks import _attn_bwd_sinks

    _, asm_key, _, _ = TARGETS[arch]
    signature, constexprs = {}, {"DV": 64, "IS_VARLEN": False, "BLOCK_M": 64, "BLOCK_DV": 64}
    for i, name in enumerate(_attn_bwd_sinks.arg_names):
        if _attn_bwd_sinks.params[i].is_constexpr:
            signature[name] = "constexpr"
        elif name.startswith(("stride_", "seqlen_")) or name == "heads":
            signature[name] = "i32"
        else:
            kind = "fp32" if name in FLOAT_POINTERS else "i32" if name in INT_POINTERS else "bf16"
            signature[name] = f"*{kind}"
    src = ASTSource(_attn_bwd_sinks, signature, constexprs=constexprs)
    compiled = triton.compile(src, target=TARGETS[arch][0], options={"num_warps": 4})
    assert ATOMICS[asm_key].search(compiled.asm[asm_key]) is None
    assert len(compiled.asm["cubin" if asm_key == "ptx" else "hsaco"]) > 0


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx950"])
def test_triton_split_sum_compiles(arch: str) -> None:
    """The split-partial sum (4 partials, as a split GQA group launches it; 1 with
    ``SPLIT_ADD``) with the launcher's 1024 elements and 8 warps: no atomics, a binary."""
    from attn_dispatch_triton._bwd_split_sum import _attn_bwd_split_sum
    from attn_dispatch_triton._launch_policy import SUM_BLOCK, SUM_WARPS

    _, asm_key, _, _ = TARGETS[arch]
    for split in (4, 1):
        signature = {
            "PART": "*fp32",
            "DK": "*bf16",
            "DV": "*bf16",
            "n_k": "i32",
            "n_v": "i32",
            "blocks_k": "i32",
            "stride_split": "i32",
            "SPLIT": "constexpr",
            "BLOCK": "constexpr",
        }
        src = ASTSource(
            _attn_bwd_split_sum,
            signature,
            constexprs={"SPLIT": split, "BLOCK": SUM_BLOCK},
            attrs={(i,): [["tt.divisibility", 16]] for i in range(3)},
        )
        compiled = triton.compile(
            src, target=TARGETS[arch][0], options={"num_warps": SUM_WARPS, "num_stages": 1}
        )
        assert ATOMICS[asm_key].search(compiled.asm[asm_key]) is None
        assert len(compiled.asm["cubin" if asm_key == "ptx" else "hsaco"]) > 0


VARIANTS = {  # (causal, window_left, window_right, softcap): the band and soft-cap constexprs
    "window-left": (False, True, False, False),
    "window-causal": (True, True, False, False),
    "window-two-sided": (False, True, True, False),
    "softcap": (False, False, False, True),
    "softcap-window-causal": (True, True, False, True),
}
BAND_KERNELS = ("fwd", "dkdv", "dq", "dkdvq")  # the kernels that read the band and the cap


def _variant_matrix() -> list:
    """Every (variant, kernel, arch); by default each kernel on each arch once, the variant
    turning with them (each variant is compiled at least twice), the rest under ``-m slow``."""
    archs = ("sm_90", "gfx942", "gfx950")
    default = {
        (list(VARIANTS)[i % len(VARIANTS)], k, a)
        for i, (k, a) in enumerate((k, a) for k in BAND_KERNELS for a in archs)
    }
    return [
        pytest.param(v, k, a, marks=() if (v, k, a) in default else pytest.mark.slow)
        for v in VARIANTS
        for k in BAND_KERNELS
        for a in archs
    ]


@pytest.mark.parametrize(("variant", "kernel_name", "arch"), _variant_matrix())
def test_triton_window_softcap_variants_compile(kernel_name: str, arch: str, variant: str) -> None:
    """Sliding-window and soft-cap variants of every band-reading kernel, with the table's
    configuration for a causal GQA call (sm_90: TMA tile loads and the TMA dQ reduction)."""
    causal, left, right, cap = VARIANTS[variant]
    compiled = compile_kernel(
        kernel_name,
        arch,
        causal=causal,
        bottom_right=True,
        window_left=left,
        window_right=right,
        softcap=cap,
    )
    _check(compiled, kernel_name, arch)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_triton_window_softcap_varlen_d64_compiles(arch: str) -> None:
    for kernel_name in BAND_KERNELS:
        compiled = compile_kernel(
            kernel_name,
            arch,
            dtype="fp16",
            d=64,
            varlen=True,
            window_left=True,
            window_right=True,
            softcap=True,
        )
        _check(compiled, kernel_name, arch)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kernel_name", "arch", "dtype", "d", "causal", "varlen"),
    list(
        itertools.product(
            KERNELS, TARGETS, ("bf16", "fp16"), (32, 64, 96, 128, 256), (False, True), (False, True)
        )
    ),
)
def test_triton_kernel_compiles_matrix(kernel_name, arch, dtype, d, causal, varlen) -> None:
    _check(
        compile_kernel(kernel_name, arch, dtype=dtype, d=d, causal=causal, varlen=varlen),
        kernel_name,
        arch,
    )


@pytest.mark.parametrize("kernel_name", BAND_KERNELS)
def test_triton_softcap_takes_one_hardware_tanh_per_score_on_sm90(kernel_name: str) -> None:
    """On sm_90 the cap is ``tanh.approx.f32``: no exp2 and no division per score beyond those
    of the uncapped kernel (the portable form's ``exp2`` and division per score cost two
    special-function operations; a tile adds dozens of each). One scalar division may set up
    the cap's constants."""

    def count(ptx: str, op: str) -> int:
        return len(re.findall(re.escape(op), ptx))

    plain = compile_kernel(kernel_name, "sm_90").asm["ptx"]
    capped = compile_kernel(kernel_name, "sm_90", softcap=True).asm["ptx"]
    assert count(capped, "tanh.approx.f32") > 0
    assert count(plain, "tanh.approx.f32") == 0
    for op in ("ex2.approx", "div.full.f32", "div.rn.f32", "rcp."):
        assert count(plain, op) <= count(capped, op) <= count(plain, op) + 1, op
