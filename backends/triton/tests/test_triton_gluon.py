"""The Gluon sm_90 kernels (``_bwd_dkdv_sm90``, ``_bwd_dq_sm90``): cross-compiled on the CPU,
their eligibility rules, and their numerics against the float64 oracle on a Hopper GPU.

Gluon has no interpreter, so on a machine without an sm_90 GPU only the compile and eligibility
tests run; the GPU cases are skipped with the reason.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

triton = pytest.importorskip("triton")
if importlib.util.find_spec("triton.experimental.gluon") is None:
    pytest.skip("this triton has no Gluon", allow_module_level=True)

from attn_dispatch_triton import _sm90  # noqa: E402
from attn_dispatch_triton._bwd_dkdv_sm90 import _attn_bwd_dkdv_sm90  # noqa: E402
from attn_dispatch_triton._bwd_dq_sm90 import _attn_bwd_dq_sm90  # noqa: E402
from attn_dispatch_triton._common import SOFTCAP_NONE, SOFTCAP_TANH_APPROX  # noqa: E402
from attn_dispatch_triton._kernel_support import gluon_sm90  # noqa: E402
from attn_dispatch_triton._launch_policy import GridLayout  # noqa: E402
from attn_dispatch_triton._launcher import GLUON_STAGES  # noqa: E402
from attn_dispatch_triton.backward import BackwardLaunch, attention_backward  # noqa: E402
from attn_dispatch_triton.tuning import get_backward_config, lookup  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from attn_dispatch import backend as adb  # noqa: E402
from attn_dispatch.testing import oracle  # noqa: E402

FULL = adb.Band(None, None, False)

KERNELS = {"dkdv": (_attn_bwd_dkdv_sm90, (64, 128)), "dq": (_attn_bwd_dq_sm90, (128, 64))}
SMEM_SM90 = 232448
# int32 scalars besides stride_* and seqlen_*
INTS = {"heads", "kv_heads", "group", "unit_offset", "key_blocks", "win_left", "win_right"}
DESC = (
    "tensordesc<{dtype}[{rows}, 128],NVMMASharedLayout(swizzle_byte_width=128, "
    "element_bitwidth=16, rank=2, transposed=False, fp4_padded=False, cga_layout=[])>"
)
DESC_DQ = (
    "tensordesc<fp32[64, 64],NVMMASharedLayout(swizzle_byte_width=128, "
    "element_bitwidth=32, rank=2, transposed=False, fp4_padded=False, cga_layout=[])>"
)


def compile_sm90(
    kernel: str,
    *,
    causal: bool,
    varlen: bool,
    heavy_first: bool = False,
    dtype: str = "bf16",
    atomic_dq: bool = False,
    window: int = 0,
    add_dkdv: bool = False,
    units: bool = False,
    step_slices: bool = False,
    wide_store: bool = False,
    window_left: bool = False,
    softcap: bool = False,
):
    """Compile one Gluon kernel for sm_90 as the launcher would launch it (the dK/dV kernel's
    grid layout: ``window`` > 0 windowed, else ``units``, else ``heavy_first``, else natural;
    ``causal`` bounds the band's right side, ``window_left`` its left side)."""
    fn, (block_m, block_n) = KERNELS[kernel]
    q_rows, k_rows = (block_m, block_n)
    layout = (
        GridLayout.WINDOWED
        if window
        else GridLayout.UNITS
        if units
        else GridLayout.HEAVY_FIRST
        if heavy_first
        else GridLayout.NATURAL
    )
    consts = dict(
        D=128,
        LIMIT_RIGHT=causal,
        LIMIT_LEFT=window_left,
        SOFTCAP=SOFTCAP_TANH_APPROX if softcap else SOFTCAP_NONE,  # the launcher's value
        BOTTOM_RIGHT=causal,
        IS_VARLEN=varlen,
        HEAVY_FIRST=heavy_first,
        GRID_LAYOUT=int(layout),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        STAGES=GLUON_STAGES,
        ATOMIC_DQ=atomic_dq,
        ADD_DKDV=add_dkdv,
        WINDOW=window,
        STEP_SLICES=step_slices,
        WIDE_STORE=wide_store,
        num_warps=_sm90.WARPS,
    )
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if fn.params[i].is_constexpr:
            signature[name], constexprs[name] = "constexpr", consts[name]
        elif name == "dqa_desc" and not atomic_dq:  # the launcher passes None: no dQ
            signature[name], constexprs[name] = "constexpr", None
        elif name == "dqa_desc":  # the fp32 dQ scratch
            signature[name] = DESC_DQ
        elif name in ("q_desc", "do_desc"):
            signature[name] = DESC.format(dtype=dtype, rows=q_rows)
        elif name in ("k_desc", "v_desc"):
            signature[name] = DESC.format(dtype=dtype, rows=k_rows)
        elif name in ("qk_scale", "scale", "softcap"):
            signature[name] = "fp32"
        elif name.startswith(("stride_", "seqlen_")) or name in INTS:
            signature[name] = "i32"
        else:
            # (dK / dV in the fp32 buffer: the slices add, TAIL_SLICES' whole units store)
            fp32 = ("Lse2", "Delta", "DK", "DV_") if add_dkdv or units else ("Lse2", "Delta")
            signature[name] = (
                "*fp32" if name in fp32 else "*i32" if name.startswith("CU_") else f"*{dtype}"
            )
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": _sm90.WARPS, "maxnreg": _sm90.MAXNREG},
    )


@pytest.mark.skipif(
    not isinstance(_attn_bwd_dkdv_sm90, JITFunction),
    reason="kernels were defined in interpreter mode: nothing to compile",
)
@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
@pytest.mark.parametrize(
    ("causal", "varlen", "heavy_first"),
    [(False, False, False), (True, False, True), (True, True, False)],
    ids=["full-dense", "causal-dense-heavy-first", "causal-varlen"],
)
def test_gluon_kernel_compiles_for_sm90(kernel, causal, varlen, heavy_first) -> None:
    """Warp-group MMAs, TMA copies, the producer/consumer register split, shared memory in
    budget, a cubin."""
    compiled = compile_sm90(kernel, causal=causal, varlen=varlen, heavy_first=heavy_first)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor.2d" in ptx
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{int(_sm90.CONSUMER_REGS)}" in ptx
    assert "setmaxnreg.dec" in ptx
    assert compiled.metadata.shared <= SMEM_SM90
    assert len(compiled.asm["cubin"]) > 0


@pytest.mark.skipif(
    not isinstance(_attn_bwd_dkdv_sm90, JITFunction),
    reason="kernels were defined in interpreter mode: nothing to compile",
)
@pytest.mark.parametrize(
    ("causal", "varlen", "heavy_first", "window", "add_dkdv", "units", "steps"),
    [
        (False, False, False, 0, False, False, False),
        (True, True, False, 0, False, False, False),
        (True, False, True, 0, False, False, False),
        (True, False, False, 1, False, False, False),
        (True, False, False, 1, True, False, False),
        (False, False, False, 0, False, True, False),
        (False, False, False, 0, True, True, True),
    ],
    ids=[
        "full-dense",
        "causal-varlen",
        "causal-dense-heavy-first",
        "causal-dense-window",
        "causal-dense-window-add-dkdv",
        "full-dense-tail-whole-units",
        "full-dense-tail-slices",
    ],
)
def test_gluon_dkdv_with_atomic_dq_compiles_for_sm90(
    causal, varlen, heavy_first, window, add_dkdv, units, steps
) -> None:
    """The fused-atomic variant: a fifth warp-group MMA per step (dQ, with dS^T from shared
    memory), dQ added to the fp32 scratch by TMA reductions, shared memory in budget; with
    ``ADD_DKDV`` (a split GQA group) dK and dV added to an fp32 buffer by atomics; with
    ``UNITS`` (and ``STEP_SLICES``) as ``TAIL_SLICES`` launches its whole units (and its last
    wave's slices)."""
    plain = compile_sm90(
        "dkdv",
        causal=causal,
        varlen=varlen,
        heavy_first=heavy_first,
        window=window,
        units=units,
        step_slices=steps,
    )
    fused = compile_sm90(
        "dkdv",
        causal=causal,
        varlen=varlen,
        atomic_dq=True,
        heavy_first=heavy_first,
        window=window,
        add_dkdv=add_dkdv,
        units=units,
        step_slices=steps,
        wide_store=True,
    )
    ptx = fused.asm["ptx"]
    assert ("atom.global.gpu.relaxed.add.f32" in ptx) == add_dkdv
    reduce = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"
    assert reduce in ptx and reduce not in plain.asm["ptx"]
    assert ptx.count("wgmma.mma_async") > plain.asm["ptx"].count("wgmma.mma_async")
    assert "m64n64k16" in ptx  # dQ[:, half of D] per warp group
    assert fused.metadata.shared <= SMEM_SM90
    assert len(fused.asm["cubin"]) > 0


@pytest.mark.skipif(
    not isinstance(_attn_bwd_dkdv_sm90, JITFunction),
    reason="kernels were defined in interpreter mode: nothing to compile",
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_wide_store_stores_dq_tiles_16_bytes_per_thread(causal) -> None:
    """``WIDE_STORE``: each consumer thread's 32 dQ values go to shared memory as 8 16-byte
    stores instead of 16 8-byte ones (the latter collide in the swizzled tile), both consumer
    partitions; the relabelling moves no data (no more shared-memory loads)."""
    plain, wide = (
        compile_sm90("dkdv", causal=causal, varlen=False, atomic_dq=True, wide_store=w).asm["ptx"]
        for w in (False, True)
    )
    assert wide.count("st.shared.v4.b32") - plain.count("st.shared.v4.b32") == 2 * 8
    assert plain.count("st.shared.v2.b32") - wide.count("st.shared.v2.b32") == 2 * 16
    assert wide.count("ld.shared") == plain.count("ld.shared")


BAND_VARIANTS = {  # (causal: right side bounded, window_left, softcap)
    "left-only": (False, True, False),
    "causal-left": (True, True, False),
    "softcap": (False, False, True),
    "causal-left-softcap": (True, True, True),
}


@pytest.mark.skipif(
    not isinstance(_attn_bwd_dkdv_sm90, JITFunction),
    reason="kernels were defined in interpreter mode: nothing to compile",
)
@pytest.mark.parametrize(
    ("kernel", "variant"),
    [
        pytest.param(k, v, marks=() if (i + j) % 3 == 0 else pytest.mark.slow)
        for i, k in enumerate(("dkdv", "dkdv-atomic-dq", "dq"))
        for j, v in enumerate(BAND_VARIANTS)
    ],
)
def test_gluon_band_and_softcap_variants_compile_for_sm90(kernel, variant) -> None:
    """Sliding-window bands and the soft cap in both Gluon kernels (and the fused-atomic one):
    the same warp-group MMAs and shared memory budget; the cap is one hardware ``tanh`` per
    score and adds no ``exp2``. By default every kernel and every variant at least once; each
    pair under ``-m slow``."""
    causal, left, cap = BAND_VARIANTS[variant]
    name, atomic = kernel.removesuffix("-atomic-dq"), kernel.endswith("-atomic-dq")
    common = dict(causal=causal, varlen=False, atomic_dq=atomic, window_left=left)
    plain = compile_sm90(name, **common).asm["ptx"]
    compiled = compile_sm90(name, **common, softcap=cap)
    ptx = compiled.asm["ptx"]
    assert ptx.count("wgmma.mma_async") == plain.count("wgmma.mma_async") > 0
    assert ("tanh.approx.f32" in ptx) == cap and "tanh.approx" not in plain
    assert ptx.count("ex2.approx") == plain.count("ex2.approx")
    assert compiled.metadata.shared <= SMEM_SM90
    assert len(compiled.asm["cubin"]) > 0


def _qkv(shape_q, shape_kv, dtype=torch.bfloat16, device="cpu"):
    q = torch.randn(*shape_q, dtype=dtype, device=device)
    k = torch.randn(*shape_kv, dtype=dtype, device=device)
    return q, k, torch.randn_like(k), torch.randn_like(q)


def test_descriptors_accept_tokens_in_rows() -> None:
    """Contiguous tensors, varlen tensors and a q sliced from a packed [B, S, 3, H, D] qkv
    (rows evenly spaced, heads adjacent) are read as ``[rows, heads * D]``."""
    q, k, v, do = _qkv((2, 64, 4, 128), (2, 64, 2, 128))
    assert _sm90.sm90_descriptors(q, k, v, do, False, 64, 128) is not None
    assert _sm90.sm90_descriptors(q[0], k[0], v[0], do[0], True, 64, 128) is not None
    qkv = torch.randn(2, 64, 3, 4, 128, dtype=torch.bfloat16)
    descs = _sm90.sm90_descriptors(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], do, False, 64, 128)
    assert descs is not None
    assert descs[0].strides == [3 * 4 * 128, 1] and descs[0].shape == [128, 4 * 128]


@pytest.mark.parametrize(
    "bad",
    ["heads-not-adjacent", "batches-not-evenly-spaced", "empty", "misaligned", "broadcast", "fp32"],
)
def test_descriptors_refuse_other_layouts(bad) -> None:
    """Layouts TMA cannot read as ``[rows, heads * D]``, and fp32 inputs (the kernels' shared
    memory is planned for 16-bit tiles), give ``None`` (the tl kernels run)."""
    q, k, v, do = _qkv((2, 64, 4, 128), (2, 64, 2, 128))
    if bad == "fp32":
        q, k, v, do = _qkv((2, 64, 4, 128), (2, 64, 2, 128), torch.float32)
    elif bad == "heads-not-adjacent":  # [B, H, S, D] storage seen as [B, S, H, D]
        q = torch.randn(2, 4, 64, 128, dtype=q.dtype).transpose(1, 2)
    elif bad == "batches-not-evenly-spaced":
        q = torch.randn(2, 80, 4, 128, dtype=q.dtype)[:, :64]
    elif bad == "empty":
        q, do = q[:, :0], do[:, :0]
    elif bad == "misaligned":
        q = torch.randn(2 * 64 * 4 * 128 + 1, dtype=q.dtype)[1:].view(2, 64, 4, 128)
    else:  # one row expanded over the sequence (stride 0)
        q = torch.randn(2, 1, 4, 128, dtype=q.dtype).expand(2, 64, 4, 128)
    assert _sm90.sm90_descriptors(q, k, v, do, False, 64, 128) is None


def test_cpu_launch_keeps_the_portable_kernels() -> None:
    """Off a Hopper GPU a ``GLUON`` config runs the tl kernels: no descriptors are made."""
    q, k, v, do = _qkv((1, 64, 2, 128), (1, 64, 2, 128))
    launch = BackwardLaunch(q, k, v, do, torch.zeros(1, 2, 64), do, band=FULL, scale=0.1)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "GLUON": 1}
    assert not gluon_sm90(q.device)
    assert launch.sm90_descriptors(cfg, (64, 128)) is None


# (causal, group): {seqlen_k: (Gluon dK/dV, Gluon dQ)}
SM90_GLUON = {
    (False, 1): {1024: (False, False), 2048: (False, False), 8192: (True, True)},
    (False, 8): {1024: (False, True), 2048: (True, True), 8192: (True, True)},
    (True, 1): {1024: (False, False), 2048: (True, False), 4096: (True, True)},
    (True, 8): {1024: (True, True), 2048: (True, True), 16384: (True, True)},
}


@pytest.mark.parametrize(
    ("causal", "group", "seqlen_k", "dkdv", "dq"),
    [(*cls, n, *kinds) for cls, by_length in SM90_GLUON.items() for n, kinds in by_length.items()],
)
def test_sm90_table_uses_gluon_where_measured_faster(causal, group, seqlen_k, dkdv, dq) -> None:
    """The Gluon kernels where an H200 measured them faster (docs/experiments.md), with the
    tiles they are written for; MHA 1K-2K keep the tl kernels but dK/dV at MHA 2K causal."""
    cfgs = lookup("sm_90", 128, causal, group, seqlen_k)
    assert bool(cfgs["dkdv"].get("GLUON")) == dkdv
    assert bool(cfgs["dq"].get("GLUON")) == dq
    if dkdv:
        assert (cfgs["dkdv"]["BLOCK_M"], cfgs["dkdv"]["BLOCK_N"]) == KERNELS["dkdv"][1]
    if dq:
        assert (cfgs["dq"]["BLOCK_M"], cfgs["dq"]["BLOCK_N"]) == KERNELS["dq"][1]


# -- on a Hopper GPU ---------------------------------------------------------------------------

ON_SM90 = torch.cuda.is_available() and gluon_sm90(torch.device("cuda"))
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
GPU_CASES = [  # (name, batch, heads, kv_heads, seqlen_q, seqlen_k, causal, bottom_right, dtype,
    #            split, order: "heavy-first" / "window" / "add" /
    #            "plain-store" (atomic dQ without WIDE_STORE), "+"-joined)
    ("mha-full-odd", 1, 8, 8, 1000, 1000, False, False, "bf16", None, ""),
    ("gqa-causal-tl-sq<sk", 2, 8, 2, 300, 517, True, False, "bf16", None, ""),
    ("gqa-causal-br-sq<sk", 2, 8, 2, 300, 517, True, True, "bf16", None, ""),
    ("gqa-causal-br-sq>sk", 2, 8, 2, 517, 300, True, True, "bf16", None, ""),
    # keys past a sequence's end in its last key block are the next sequence's rows (dense
    # batch): they must not enter dQ (atomic dQ) without a mask or top-left with Sq > Sk
    ("gqa-full-b2-odd", 2, 8, 2, 300, 300, False, False, "bf16", None, ""),
    ("gqa-causal-tl-sq>sk", 2, 8, 2, 517, 300, True, False, "bf16", None, ""),
    ("gqa-causal-split2", 1, 16, 4, 700, 700, True, False, "bf16", 2, ""),
    ("gqa-full-split4-f16", 1, 16, 4, 700, 700, False, False, "f16", 4, ""),
    ("mha-causal-heavy-first", 1, 4, 4, 2048, 2048, True, False, "bf16", None, "heavy-first"),
    ("gqa-causal-br-heavy-first", 2, 8, 2, 300, 517, True, True, "bf16", None, "heavy-first"),
    ("gqa-full-split2", 1, 16, 4, 700, 700, False, False, "bf16", 2, ""),
    # launch windows of 2 kv heads (B * Hkv = 8): key block by key block, all slices together
    ("gqa-causal-split2-window", 2, 16, 4, 700, 700, True, False, "bf16", 2, "window"),
    ("gqa-causal-br-window", 2, 8, 2, 300, 517, True, True, "bf16", None, "window"),
    # a split whose slices add dK / dV into one fp32 buffer by atomics (with atomic dQ; config
    # SPLIT_ADD), in windows, and in the natural order
    ("gqa-causal-br-split4-add-window", 2, 16, 4, 300, 517, True, True, "bf16", 4, "add+window"),
    ("gqa-full-split2-add", 1, 16, 4, 700, 700, False, False, "f16", 2, "add"),
    # the dQ tile stored in its own column order (WIDE_STORE off)
    ("gqa-causal-br-plain-store", 2, 8, 2, 300, 517, True, True, "bf16", None, "plain-store"),
    ("gqa-full-b2-odd-plain-store", 2, 8, 2, 300, 300, False, False, "f16", None, "plain-store"),
]


def _gluon_config(causal, group, seqlen_k, split, order) -> dict:
    cfg = {
        n: dict(c)
        for n, c in get_backward_config(torch.device("cuda"), 128, causal, group, seqlen_k).items()
    }
    cfg["dkdv"] = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "GLUON": 1}
    cfg["dkdvq"] = cfg["dkdv"]  # (the same dict: SPLIT / HEAVY_FIRST below reach both)
    cfg["dq"] = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "GLUON": 1}
    if split:
        cfg["dkdv"]["SPLIT"] = split
    if "heavy-first" in order:
        cfg["dkdv"]["HEAVY_FIRST"] = cfg["dq"]["HEAVY_FIRST"] = 1
    if "window" in order:
        cfg["dkdv"]["WINDOW"] = 2
    if "add" in order:
        cfg["dkdv"]["SPLIT_ADD"] = 1
    if "plain-store" not in order:  # (the table's form: the fused-atomic kernel's dQ tile
        cfg["dkdv"]["WIDE_STORE"] = 1  # stored 16 bytes per thread, columns reordered)
    return cfg


def _assert_close(got, ref, name) -> None:
    assert not torch.isnan(got).any(), f"{name}: unwritten (NaN-poisoned) elements"
    err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < 1e-2, f"{name}: relative error {err:.2e} (bound 1e-2 for 16-bit inputs)"


def _assert_grads_close(grads, ref) -> None:
    for name, got, want in zip(("dq", "dk", "dv"), grads, (ref.dq, ref.dk, ref.dv)):
        _assert_close(got, want, name)


def _gluon_backward(q, k, v, do, ref, cfg, *, atomic_dq, **call):
    """``attention_backward`` with ``cfg`` into NaN-poisoned ``(dq, dk, dv)``, the oracle's out
    and lse as inputs; returns them with the :class:`BackwardLaunch` the call builds (``call``:
    the mask and varlen arguments)."""
    out, lse = ref.out.to(q.dtype), ref.lse.float()
    launch = BackwardLaunch(q, k, v, out, lse, do, **call)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    attention_backward(
        q, k, v, out, lse, do, **call, config=cfg, dq=dq, dk=dk, dv=dv, atomic_dq=atomic_dq
    )
    return launch, dq, dk, dv


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason="needs an NVIDIA sm_90 GPU and triton 3.6's Gluon")
@pytest.mark.parametrize("atomic_dq", [False, True], ids=["split", "atomic-dq"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gluon_kernels_match_the_oracle(case, atomic_dq) -> None:
    """dQ, dK, dV from the Gluon kernels (both of them, or the dK/dV one with atomic dQ; outputs
    NaN-poisoned first) against the float64 oracle: relative Frobenius error < 1e-2 for
    bf16/f16 inputs."""
    _, b, h, hk, sq, sk, causal, bottom_right, dtype, split, order = case
    dtype = DTYPES[dtype]
    torch.manual_seed(0)
    q, k, v, do = _qkv((b, sq, h, 128), (b, sk, hk, 128), dtype, "cuda")
    align = "bottom_right" if bottom_right else "top_left"
    ref = oracle(q, k, v, do, causal=causal, causal_align=align)
    cfg = _gluon_config(causal, h // hk, sk, split, order)
    launch, dq, dk, dv = _gluon_backward(
        q,
        k,
        v,
        do,
        ref,
        cfg,
        atomic_dq=atomic_dq,
        band=adb.Band.of(None, causal, align),
        scale=128**-0.5,
    )
    assert launch.sm90_descriptors(cfg["dkdv"], (64, 128)) is not None
    assert launch.sm90_descriptors(cfg["dq"], (128, 64)) is not None
    _assert_grads_close((dq, dk, dv), ref)


BAND_CASES = [  # (name, batch, heads, kv_heads, seqlen_q, seqlen_k, causal, align, window,
    #              softcap, dtype)
    ("causal-left-top-left", 2, 8, 2, 700, 700, True, "top_left", (150, None), None, "bf16"),
    ("left-only-sq<sk", 1, 8, 2, 300, 900, False, "bottom_right", (64, None), None, "bf16"),
    ("two-sided-sq>sk", 2, 4, 4, 517, 300, False, "bottom_right", (40, 77), None, "f16"),
    ("right-only", 1, 8, 2, 600, 600, False, "top_left", (None, 33), None, "bf16"),
    ("causal-softcap", 2, 8, 2, 700, 700, True, "bottom_right", None, 5.0, "bf16"),
    ("full-softcap", 1, 8, 8, 640, 500, False, "top_left", None, 2.0, "f16"),
    ("causal-left-softcap", 1, 8, 2, 1000, 1000, True, "top_left", (255, 0), 30.0, "bf16"),
    # top-left with Sq > Sk: the last rows' windows lie past the keys (rows that see nothing)
    ("left-rows-see-none", 1, 4, 2, 700, 300, False, "top_left", (20, 10), 3.0, "bf16"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason="needs an NVIDIA sm_90 GPU and triton 3.6's Gluon")
@pytest.mark.parametrize("atomic_dq", [False, True], ids=["split", "atomic-dq"])
@pytest.mark.parametrize("case", BAND_CASES, ids=[c[0] for c in BAND_CASES])
def test_gluon_band_and_softcap_match_the_oracle(case, atomic_dq) -> None:
    """Sliding windows and soft caps through the Gluon kernels (outputs NaN-poisoned) against
    the float64 oracle, with the band's key blocks skipped by loop bounds."""
    _, b, h, hk, sq, sk, causal, align, window, softcap, dtype = case
    torch.manual_seed(3)
    q, k, v, do = _qkv((b, sq, h, 128), (b, sk, hk, 128), DTYPES[dtype], "cuda")
    scale = 128**-0.5
    call = dict(causal=causal, causal_align=align, window=window, softcap=softcap, scale=scale)
    ref = oracle(q, k, v, do, **call)
    cfg = _gluon_config(causal, h // hk, sk, None, "")
    launch, dq, dk, dv = _gluon_backward(
        q,
        k,
        v,
        do,
        ref,
        cfg,
        atomic_dq=atomic_dq,
        band=adb.Band.of(window, causal, align),  # no side wider than the sequences here
        scale=scale,
        softcap=softcap,
    )
    assert launch.sm90_descriptors(cfg["dkdv"], (64, 128)) is not None
    _assert_grads_close((dq, dk, dv), ref)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason="needs an NVIDIA sm_90 GPU and triton 3.6's Gluon")
@pytest.mark.parametrize(
    ("batch", "sms", "dtype"),
    [(1, 10, torch.bfloat16), (2, 11, torch.float16)],
    ids=["b1-bf16", "b2-f16"],
)
def test_tail_slices_match_the_oracle(batch, sms, dtype, monkeypatch) -> None:
    """``TAIL_SLICES`` (fused-atomic, no mask), with a pretended SM count so a small call has
    full waves and a rest: GQA 12/4, 700 queries and keys (the last key block partial), 6 key
    blocks x 4 kv heads per sequence. The full waves' units store dK / dV; each unit of the rest
    runs as 2 slices of its 33 (head, query block) steps, split inside a head, which add into
    the fp32 buffer. Outputs NaN-poisoned; against the float64 oracle."""
    from attn_dispatch_triton import _launch_policy, tuning

    monkeypatch.setattr(tuning, "sm_count", lambda device: sms)
    monkeypatch.setattr(_launch_policy, "MIN_SLICE_STEPS", 16)  # (a small call's units are short)
    torch.manual_seed(2)
    q, k, v, do = _qkv((batch, 700, 12, 128), (batch, 700, 4, 128), dtype, "cuda")
    ref = oracle(q, k, v, do, causal=False)
    cfg = _gluon_config(False, 3, 700, None, "")
    cfg["dkdv"]["TAIL_SLICES"] = 4
    grids = []  # the dK/dV kernel's launches, as the call makes them

    def spy(self, kernel, grid, args, kwargs, _launch=BackwardLaunch._launch):
        if kernel is _attn_bwd_dkdv_sm90:
            grids.append(tuple(grid))
        return _launch(self, kernel, grid, args, kwargs)

    monkeypatch.setattr(BackwardLaunch, "_launch", spy)
    launch, dq, dk, dv = _gluon_backward(
        q, k, v, do, ref, cfg, atomic_dq=True, band=FULL, scale=128**-0.5
    )
    assert _launch_policy.tail_slices(launch.problem, cfg["dkdv"], 1, sms) == (batch * 24 - 4, 2)
    assert grids == [(batch * 24 - 4, 1, 1), (4, 1, 2)]
    _assert_grads_close((dq, dk, dv), ref)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason="needs an NVIDIA sm_90 GPU and triton 3.6's Gluon")
@pytest.mark.parametrize(
    "order", ["", "heavy-first", "window"], ids=["natural", "heavy-first", "window"]
)
@pytest.mark.parametrize("atomic_dq", [False, True], ids=["split", "atomic-dq"])
def test_gluon_kernels_varlen_with_an_empty_sequence(atomic_dq, order) -> None:
    """Packed sequences (one with no queries, whose keys get zero gradients) with a
    bottom-right causal mask: every sequence against its own oracle."""
    torch.manual_seed(1)
    lens_q, lens_k, h, hk = [100, 0, 257, 64], [130, 5, 257, 64], 8, 2
    cu_q = torch.tensor(
        [0, *torch.tensor(lens_q).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    cu_k = torch.tensor(
        [0, *torch.tensor(lens_k).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    q, k, v, do = _qkv((sum(lens_q), h, 128), (sum(lens_k), hk, 128), torch.bfloat16, "cuda")
    ref = oracle(
        q,
        k,
        v,
        do,
        causal=True,
        causal_align="bottom_right",
        scale=0.1,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )
    cfg = _gluon_config(True, h // hk, max(lens_k), None, order)
    launch, dq, dk, dv = _gluon_backward(
        q,
        k,
        v,
        do,
        ref,
        cfg,
        atomic_dq=atomic_dq,
        band=adb.Band.of(None, True, "bottom_right"),
        scale=0.1,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k),
    )
    assert launch.sm90_descriptors(cfg["dkdv"], (64, 128)) is not None
    assert launch.sm90_descriptors(cfg["dq"], (128, 64)) is not None
    _assert_grads_close((dq, dk, dv), ref)
    keys_of_empty = slice(lens_k[0], lens_k[0] + lens_k[1])
    assert dk[keys_of_empty].abs().max() == 0 and dv[keys_of_empty].abs().max() == 0
