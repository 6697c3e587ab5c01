"""Correctness, tuning and timing of the triton backend's kernels on one GPU.

One run does, in order (printing a table last, writing everything under ``--out``):

1. environment and the bf16 matmul ceiling (8192^3, random data);
2. compiles every candidate configuration in parallel worker processes (Triton's disk cache
   then serves the timing process);
3. correctness at the seed shapes (B=1, D=128, bf16; GQA 64/8 and MHA 8; Sq=Sk 1K-16K; causal
   and not) against a float64 oracle evaluated head by head on the GPU (the first 16 heads),
   outputs poisoned with NaN first; plus small odd shapes (varlen with an empty sequence,
   bottom-right causal with Sq != Sk, D=64/96/256, f16);
4. per seed shape, times every dK/dV and dQ candidate, then picks one configuration per shape
   class (GQA/MHA x causal x short/long) and writes it as the on-disk tuning cache format;
5. times our backward (preprocess + dK/dV + dQ, chosen configs) against PyTorch's
   FlashAttention-2 and cuDNN backward (autograd.grad on one SDPA forward), same inputs.

Usage::

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_kernels.py --out /tmp/bench
    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_kernels.py --shapes short --out /tmp/short
    python benchmarks/triton/bench_kernels.py --smoke   # CPU: interpreter, tiny shapes, no timing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

if "--smoke" in sys.argv:  # the interpreter must be chosen before the kernels are defined
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(
        0,
        os.path.join(
            os.path.dirname(os.path.abspath(__file__)),
            os.pardir,
            os.pardir,
            "backends",
            "triton",
            "tests",
        ),
    )
    from triton_interp_worker import patch_interpreter

    patch_interpreter()

import torch  # noqa: E402

from attn_dispatch import backend as adb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SEED_SHAPES = [  # (name, H, Hkv, S, causal)
    ("GQA 64/8 1K", 64, 8, 1024, False),
    ("GQA 64/8 4K causal", 64, 8, 4096, True),
    ("GQA 64/8 8K", 64, 8, 8192, False),
    ("GQA 64/8 16K", 64, 8, 16384, False),
    ("GQA 64/8 16K causal", 64, 8, 16384, True),
    ("MHA 8 1K", 8, 8, 1024, False),
    ("MHA 8 4K", 8, 8, 4096, False),
    ("MHA 8 16K", 8, 8, 16384, False),
    ("MHA 8 16K causal", 8, 8, 16384, True),
]


def cfg(bm: int, bn: int, w: int, s: int, **extra) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, **extra}


def tma(bm: int, bn: int, w: int, s: int) -> dict:
    """A candidate whose loop tiles come by TMA copies (tensor descriptors; sm_90+)."""
    return cfg(bm, bn, w, s, LOAD_TMA=1)


# The 4-warp tiles of <= 114 KB shared memory run two programs per SM (each SM has 228 KB).
DKDV_CANDIDATES = [
    *(cfg(64, 128, 8, s) for s in (2, 3)),
    *(cfg(32, 128, w, 3) for w in (4, 8)),
    cfg(64, 64, 4, 3),
    cfg(128, 128, 8, 2),
    *(tma(64, 128, 8, s) for s in (3, 2)),
    *(cfg(32, 64, 4, s) for s in (3, 4)),
    cfg(64, 64, 4, 2),
    tma(32, 64, 4, 4),
]
DQ_CANDIDATES = [
    *(cfg(128, 64, 8, s) for s in (2, 3)),
    cfg(128, 32, 4, 3),
    cfg(64, 64, 4, 3),
    *(cfg(bm, 128, 8, 2) for bm in (128, 64)),
    *(tma(128, 64, 8, s) for s in (3, 2)),
    *(f(64, 64, 4, 2) for f in (cfg, tma)),
]
# --shapes short: the sequence lengths at or below tuning.SHORT_SEQ, with smaller tiles too
SHORT_SHAPES = [
    (f"{kind} {s // 1024}K" + (" causal" if causal else ""), h, hk, s, causal)
    for s in (1024, 2048)
    for causal in (False, True)
    for kind, h, hk in (("GQA 64/8", 64, 8), ("MHA 8", 8, 8))
]
SHORT_DKDV_EXTRA = [cfg(32, 128, 8, 2), cfg(64, 64, 8, 3), tma(32, 64, 4, 3)]
# dK/dV with dP's product before the exponentials (DP_FIRST) on the tiles of the sm_90 table
DKDV_CANDIDATES += [{**c, "DP_FIRST": 1} for c in (tma(64, 128, 8, 3), cfg(32, 64, 4, 3))]
SHORT_DKDV_EXTRA += [
    {**c, "DP_FIRST": 1} for c in (tma(32, 64, 4, 3), tma(32, 64, 4, 4), cfg(32, 64, 4, 4))
]
SHORT_DQ_EXTRA = [cfg(64, 32, 4, 3), cfg(64, 64, 8, 3), cfg(32, 64, 4, 3), tma(64, 64, 4, 3)]
PRE = cfg(64, 0, 4, 1)
FWD = cfg(128, 64, 8, 3)


def log(*a) -> None:
    print(*a, flush=True)


# ------------------------------------------------------------------------------ problem setup


def make_problem(
    h: int,
    hk: int,
    s: int,
    d: int = 128,
    dtype=torch.bfloat16,
    b: int = 1,
    device: str = "cuda",
    sk: int | None = None,
    seed: int = 0,
):
    g = torch.Generator(device=device).manual_seed(seed)
    sk = sk or s

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    return rnd(b, s, h, d), rnd(b, sk, hk, d), rnd(b, sk, hk, d), rnd(b, s, h, d)


def timing_inputs(
    h: int, hk: int, s: int, sk: int | None = None, device: str = "cuda", seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """``(q, k, v, out, lse, do)`` for timing a backward (B=1, D=128, bf16): random ``out``
    and ``lse`` (around 6) instead of a forward's, which timing does not need."""
    q, k, v, do = make_problem(h, hk, s, sk=sk, device=device, seed=seed)
    out = make_problem(h, hk, s, device=device, seed=seed + 1)[0]
    lse = torch.randn(1, h, s, device=device) + 6.0
    return q, k, v, out, lse, do


def timed_backward(inputs: tuple[torch.Tensor, ...], causal: bool, atomic_dq: bool = True):
    """The Triton backward on :func:`timing_inputs`' tensors: ``(dq, dk, dv)``, top-left mask
    when ``causal``, scale ``1/sqrt(128)``."""
    from attn_dispatch_triton.backward import attention_backward

    band = adb.Band.of(None, causal, "top_left")
    return attention_backward(*inputs, band=band, scale=128**-0.5, atomic_dq=atomic_dq)


def oracle_heads(q, k, v, do, causal, bottom_right, scale, heads):
    """float64 out/lse/dq/dk/dv for the listed query heads of batch 0 (plain math)."""
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    res = {}
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    mask = (j <= i + (sk - sq if bottom_right else 0)) if causal else None
    for h in heads:
        qh, kh, vh, doh = (
            t[0, :, hh].double() for t, hh in ((q, h), (k, h // group), (v, h // group), (do, h))
        )
        sc = (qh @ kh.T) * scale
        if mask is not None:
            sc = sc.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(sc, -1)
        p = torch.exp(sc - lse[:, None]).nan_to_num_(0.0)
        del sc
        o = p @ vh
        dv = p.T @ doh
        dp = doh @ vh.T
        delta = (doh * o).sum(-1)
        ds = p * (dp - delta[:, None])
        del p, dp
        res[h] = dict(out=o, lse=lse, dq=(ds @ kh) * scale, dk=(ds.T @ qh) * scale, dv=dv)
        del ds
    return res


def checked_problem(
    h: int, hk: int, s: int, d: int, causal: bool, scale: float, dev: str, fwd_cfg=None
) -> tuple:
    """``(q, k, v, do, out, lse, grads)`` for a correctness check: a fresh problem, its forward
    into NaN-poisoned ``out`` / ``lse``, and NaN-poisoned ``(dq, dk, dv)`` for the backward."""
    from attn_dispatch_triton.forward import attention_forward

    q, k, v, do = make_problem(h, hk, s, d, device=dev)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, h, s), float("nan"), device=dev)
    attention_forward(
        q,
        k,
        v,
        band=adb.Band.of(None, causal, "top_left"),
        scale=scale,
        config=fwd_cfg,
        out=out,
        lse=lse,
    )
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    return q, k, v, do, out, lse, grads


def checked_backward_args(grads: tuple, causal: bool, scale: float) -> dict:
    """The keyword arguments of a backward on ``checked_problem``'s inputs writing ``grads``."""
    dq, dk, dv = grads
    return dict(band=adb.Band.of(None, causal, "top_left"), scale=scale, dq=dq, dk=dk, dv=dv)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.double()
    if torch.isnan(a).any():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_against_oracle(q, k, v, do, out, lse, grads, causal, bottom_right, scale, heads):
    """Max over the listed heads of each tensor's relative error (dk/dv: the kv heads touched;
    a kv head's dk/dv sums its whole group, so all its query heads must be listed)."""
    group = q.shape[2] // k.shape[2]
    ref = oracle_heads(q, k, v, do, causal, bottom_right, scale, heads)
    err = {"out": 0.0, "lse": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    for h in heads:
        r = ref[h]
        if out is not None:
            err["out"] = max(err["out"], rel(out[0, :, h], r["out"]))
            fin = torch.isfinite(r["lse"])
            err["lse"] = max(
                err["lse"],
                (lse[0, h][fin].double() - r["lse"][fin]).abs().max().item() if fin.any() else 0.0,
            )
        err["dq"] = max(err["dq"], rel(grads[0][0, :, h], r["dq"]))
    for hk in sorted({h // group for h in heads}):
        members = [h for h in heads if h // group == hk]
        if len(members) < group:
            continue
        dk = sum(ref[h]["dk"] for h in members)
        dv = sum(ref[h]["dv"] for h in members)
        err["dk"] = max(err["dk"], rel(grads[1][0, :, hk], dk))
        err["dv"] = max(err["dv"], rel(grads[2][0, :, hk], dv))
    return err


# ----------------------------------------------------------------------------------- timing


def gpu_environment() -> tuple[dict, float]:
    """The environment and the bf16 matmul ceiling (8192^3, TFLOP/s), as ``attn-dispatch
    bench`` measures them, logged."""
    from attn_dispatch.tools.bench import environment, matmul_ceiling

    device = torch.device("cuda")
    env, tflops = environment(device), matmul_ceiling(device)
    log("env", env)
    log(f"bf16 matmul 8192^3: {tflops:.0f} TFLOP/s")
    return env, tflops


def bench(fn, smoke: bool, est_ms: float | None = None) -> float:
    """Median milliseconds (events, L2 flushed by do_bench); smoke mode: one wall-clock run."""
    if smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench

    rep = 200 if (est_ms or 0) < 20 else 400
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def bwd_flops(h: int, s: int, sk: int, d: int, causal: bool) -> float:
    f = 10.0 * h * s * sk * d
    return f / 2 if causal else f


def fwd_flops(h: int, s: int, sk: int, d: int, causal: bool) -> float:
    f = 4.0 * h * s * sk * d
    return f / 2 if causal else f


def candidate_ms(
    launch, kernel: str, c: dict, ref: list, smoke: bool, est: float, shape: str
) -> float:
    """Time one candidate after checking its gradients against the default configs' (outputs
    poisoned first); a candidate that disagrees (rel. error > 1e-2) gets ``inf``."""
    outs = (launch.dk, launch.dv) if kernel == "dkdv" else (launch.dq,)
    want = ref[1:] if kernel == "dkdv" else ref[:1]
    for t in outs:
        t.fill_(float("nan"))
    run = (lambda: launch.dkdv(c)) if kernel == "dkdv" else (lambda: launch.dq_(c))
    run()
    err = max(rel(got, w) for got, w in zip(outs, want))
    if not err <= 1e-2:
        log(f"  WRONG {shape} {kernel} {c}: rel err {err:.2e} against the default config")
        return math.inf
    return bench(run, smoke, est)


# ---------------------------------------------------------------------------- compile warmup


def _warm(job: tuple) -> str:
    """Worker: launch one kernel config once on a small problem (fills Triton's disk cache)."""
    kernel, c, causal, d = job
    from attn_dispatch_triton.backward import BackwardLaunch
    from attn_dispatch_triton.forward import attention_forward

    t = time.time()
    q, k, v, do = make_problem(16, 2, 256, d)
    out, lse = attention_forward(
        q, k, v, band=adb.Band.of(None, causal, "top_left"), scale=0.1, config=FWD
    )
    launch = BackwardLaunch(
        q, k, v, out, lse, do, band=adb.Band.of(None, causal, "top_left"), scale=0.1
    )
    launch.preprocess(PRE)
    if kernel == "dkdv":
        launch.dkdv(c)
    elif kernel == "dq":
        launch.dq_(c)
    torch.cuda.synchronize()
    return f"{kernel} {c} causal={causal} d={d}: {time.time() - t:.1f}s"


def precompile(workers: int, dkdv_cands: list, dq_cands: list) -> None:
    jobs = [("fwd", FWD, causal, d) for causal in (False, True) for d in (128,)]
    jobs += [("dkdv", c, causal, 128) for c in dkdv_cands for causal in (False, True)]
    jobs += [("dq", c, causal, 128) for c in dq_cands for causal in (False, True)]
    compile_in_workers(_warm, jobs, workers)


def compile_in_workers(warm, jobs: list, workers: int) -> None:
    """``warm`` on every job in spawned worker processes (they fill Triton's disk cache)."""
    import multiprocessing as mp

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for line in ex.map(warm, jobs):
            log("  compiled", line)


# ------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/attn_triton_bench"))
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    ap.add_argument("--budget", type=float, default=470.0, help="seconds before skipping work")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument(
        "--shapes",
        choices=("seed", "short"),
        default="seed",
        help="the seed shapes, or the short ones (<= 2K) with extra small tiles",
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    results: dict = {"shapes": {}, "extra_checks": [], "tuning": {}}

    import triton
    from attn_dispatch_triton.backward import BackwardLaunch
    from attn_dispatch_triton.forward import attention_forward
    from attn_dispatch_triton.tuning import shape_class

    shapes = SEED_SHAPES
    dkdv_cands, dq_cands = DKDV_CANDIDATES, DQ_CANDIDATES
    if args.shapes == "short":
        shapes = SHORT_SHAPES
        dkdv_cands = DKDV_CANDIDATES + SHORT_DKDV_EXTRA
        dq_cands = DQ_CANDIDATES + SHORT_DQ_EXTRA
    if smoke:
        shapes = [("GQA 4/2 64", 4, 2, 64, False), ("MHA 2 48 causal", 2, 2, 48, True)]
        dkdv_cands = [cfg(16, 16, 4, 1), cfg(32, 16, 4, 1, DP_FIRST=1)]
        dq_cands = [cfg(16, 16, 4, 1), cfg(32, 16, 4, 1)]
        fwd_cfg, pre_cfg = cfg(16, 16, 4, 1), cfg(16, 0, 4, 1)
    else:
        fwd_cfg, pre_cfg = FWD, PRE
        results["env"], results["matmul_tflops"] = gpu_environment()
        t = time.time()
        precompile(args.workers, dkdv_cands, dq_cands)
        log(f"precompile: {time.time() - t:.0f}s")

    d = 128 if not smoke else 64
    scale = 1 / math.sqrt(d)

    # ---- 3. correctness at the seed shapes (default configs = the first candidates)
    default = {"pre": pre_cfg, "dkdv": dkdv_cands[0], "dq": dq_cands[0]}
    for name, h, hk, s, causal in shapes:
        q, k, v, do, out, lse, grads = checked_problem(h, hk, s, d, causal, scale, dev, fwd_cfg)
        BackwardLaunch(q, k, v, out, lse, do, **checked_backward_args(grads, causal, scale)).run(
            default
        )
        heads = list(range(min(h, 16)))
        err = check_against_oracle(q, k, v, do, out, lse, grads, causal, False, scale, heads)
        results["shapes"][name] = {"errors": err, "checked_heads": len(heads)}
        log(f"check {name}: " + " ".join(f"{k_}={v_:.2e}" for k_, v_ in err.items()))
    jobs = [("extra", e, dev, smoke) for e in (EXTRA[:2] if smoke else EXTRA)]
    jobs.append(("varlen", None, dev, smoke))
    results["extra_checks"].extend(run_extra_checks(jobs, smoke))

    # ---- 4. tuning: every candidate per seed shape, per kernel
    per_shape: dict = {}
    for name, h, hk, s, causal in shapes:
        if time.time() - t_start > args.budget * 0.6:
            log(f"tuning: budget reached, skipping {name}")
            continue
        q, k, v, do = make_problem(h, hk, s, d, device=dev)
        out, lse = attention_forward(
            q, k, v, band=adb.Band.of(None, causal, "top_left"), scale=scale, config=fwd_cfg
        )
        launch = BackwardLaunch(
            q, k, v, out, lse, do, band=adb.Band.of(None, causal, "top_left"), scale=scale
        )
        ref = [t.clone() for t in launch.run(default)]  # the checked default configs
        est = bwd_flops(h, s, s, d, causal) / 300e12 * 1e3
        t_pre = bench(lambda L=launch: L.preprocess(pre_cfg), smoke)
        t_dkdv = [candidate_ms(launch, "dkdv", c, ref, smoke, est, name) for c in dkdv_cands]
        t_dq = [candidate_ms(launch, "dq", c, ref, smoke, est, name) for c in dq_cands]
        per_shape[name] = dict(pre=t_pre, dkdv=t_dkdv, dq=t_dq)
        best = dkdv_cands[min(range(len(dkdv_cands)), key=t_dkdv.__getitem__)]
        split_ms = {f"auto={launch.dkdv_plan(best).split}": min(t_dkdv)}
        for sp in (1, 2, 4, 8):
            if h // hk > 1 and (h // hk) % sp == 0:
                split_ms[sp] = bench(
                    lambda L=launch, c={**best, "SPLIT": sp}: L.dkdv(c), smoke, est
                )
        per_shape[name]["dkdv_best_by_split"] = split_ms
        log(
            f"  group split {name}: "
            + " ".join(f"{k_}:{v_ * 1e3:.0f}us" for k_, v_ in split_ms.items())
        )
        log(
            f"tune {name}: pre {t_pre * 1e3:.0f}us dkdv "
            + " ".join(f"{t * 1e3:.0f}" for t in t_dkdv)
            + " | dq "
            + " ".join(f"{t * 1e3:.0f}" for t in t_dq)
        )
    results["tuning"]["per_shape_ms"] = per_shape
    results["tuning"]["dkdv_candidates"] = dkdv_cands
    results["tuning"]["dq_candidates"] = dq_cands
    classes: dict = {}
    for name, h, hk, s, causal in shapes:
        if name in per_shape:
            classes.setdefault(shape_class(d, causal, h // hk, s), []).append(name)
    table = {}
    for key, names in classes.items():
        entry = {"pre": pre_cfg, "fwd": fwd_cfg}
        for kern, cands in (("dkdv", dkdv_cands), ("dq", dq_cands)):
            score = [
                sum(per_shape[n][kern][i] / min(per_shape[n][kern]) for n in names)
                for i in range(len(cands))
            ]
            entry[kern] = cands[min(range(len(cands)), key=score.__getitem__)]
        table[key] = entry
    results["tuning"]["table"] = table
    arch = (
        "cpu"
        if smoke
        else f"sm_{torch.cuda.get_device_capability()[0]}{torch.cuda.get_device_capability()[1]}"
    )
    with open(os.path.join(args.out, f"configs-{arch}-triton{triton.__version__}.json"), "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)

    # ---- 5. ours (tuned) vs FA2 vs cuDNN, backward only, same inputs
    rows = []
    for name, h, hk, s, causal in shapes:
        key = shape_class(d, causal, h // hk, s)
        c = table.get(key, default)
        q, k, v, do = make_problem(h, hk, s, d, device=dev)
        out, lse = attention_forward(
            q, k, v, band=adb.Band.of(None, causal, "top_left"), scale=scale, config=fwd_cfg
        )
        launch = BackwardLaunch(
            q, k, v, out, lse, do, band=adb.Band.of(None, causal, "top_left"), scale=scale
        )
        est = bwd_flops(h, s, s, d, causal) / 300e12 * 1e3
        fwd_args = dict(band=adb.Band.of(None, causal, "top_left"), scale=scale, config=fwd_cfg)
        row = {
            "shape": name,
            "ours": bench(lambda L=launch, c=c: L.run(c), smoke, est),
            "ours_fwd": bench(
                lambda a=(q, k, v), kw=fwd_args: attention_forward(*a, **kw), smoke, est / 2
            ),
        }
        if not smoke:
            for label, backend in (("fa2", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
                row[label] = sdpa_backward_ms(q, k, v, do, causal, backend, est)
        row["flops"] = bwd_flops(h, s, s, d, causal)
        row["fwd_flops"] = fwd_flops(h, s, s, d, causal)
        rows.append(row)
        log("time", row)
    results["timing"] = rows
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print_table(results)
    log(f"total {time.time() - t_start:.0f}s")


def sdpa_backward_ms(q, k, v, do, causal, backend: str, est: float) -> float | None:
    """Median ms of autograd.grad through one SDPA forward with only ``backend`` enabled."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    gqa = q.shape[2] != k.shape[2]
    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
    dot = do.transpose(1, 2)
    try:
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            o = sdpa(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
            fn = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)  # noqa: E731
            fn()
            return bench(fn, False, est)
    except Exception as exc:  # recorded, not fatal: the backend may not take this shape
        log(f"  {backend}: {type(exc).__name__}: {str(exc)[:200]}")
        return None


EXTRA = [  # (label, h, hk, sq, sk, d, causal, bottom_right, dtype)
    ("sq<sk br causal gqa4 d64 f16", 8, 2, 300, 777, 64, True, True, "float16"),
    ("sq>sk br causal d96", 4, 4, 513, 200, 96, True, True, "bfloat16"),
    ("sq<sk tl causal d256", 4, 2, 250, 411, 256, True, False, "bfloat16"),
    ("odd d32 mqa", 8, 1, 333, 333, 32, False, False, "float16"),
]


def run_extra_checks(jobs: list, smoke: bool, worker=None) -> list[dict]:
    """``_extra_job`` on each job, logging each result: inline when ``smoke``, else each in its
    own spawned process through ``worker`` (default ``_extra_job``), all at once."""
    if smoke:
        results = [_extra_job(j) for j in jobs]
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(len(jobs), mp_context=mp.get_context("spawn")) as ex:
            results = list(ex.map(worker or _extra_job, jobs))
    for r in results:
        log(
            f"check {r['case']}: "
            + " ".join(f"{n}={e:.2e}" for n, e in r["errors"].items())
            + (f" empty-ok={r['empty_sequences_ok']}" if "empty_sequences_ok" in r else "")
        )
    return results


def _extra_job(job: tuple) -> dict:
    """One small odd-shape check (tuning-table configs) against the oracle; runs in a worker."""
    kind, spec, dev, smoke, *rest = job
    atomic = bool(rest and rest[0])  # the fused-atomic backward instead of the split one
    if kind == "varlen":
        return varlen_check(dev, smoke, atomic)
    from attn_dispatch_triton.backward import attention_backward
    from attn_dispatch_triton.forward import attention_forward

    label, h, hk, sq, sk, dd, causal, br, dt = spec
    if smoke:
        sq, sk = sq // 8, sk // 8
    q, k, v, do = make_problem(h, hk, sq, dd, dtype=getattr(torch, dt), device=dev, sk=sk, seed=1)
    sc = 0.5 / math.sqrt(dd)
    align = "bottom_right" if br else "top_left"
    flags = dict(band=adb.Band.of(None, causal, align), scale=sc)
    out, lse = attention_forward(q, k, v, **flags)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    attention_backward(
        q, k, v, out, lse, do, **flags, dq=grads[0], dk=grads[1], dv=grads[2], atomic_dq=atomic
    )
    err = check_against_oracle(q, k, v, do, out, lse, grads, causal, br, sc, list(range(h)))
    return {"case": label + (" atomic" if atomic else ""), "errors": err}


def _cumulative(lengths: list[int], dev: str) -> torch.Tensor:
    """The int32 cumulative lengths ``[0, l0, l0 + l1, ...]`` of varlen sequences."""
    return torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=dev
    )


def varlen_check(dev: str, smoke: bool, atomic: bool = False) -> dict:
    """Varlen (an empty sequence, causal bottom-right, GQA 4) against per-sequence oracles."""
    from attn_dispatch_triton.backward import attention_backward
    from attn_dispatch_triton.forward import attention_forward

    lens_q = [300, 0, 517, 64] if not smoke else [30, 0, 17]
    lens_k = [280, 77, 600, 0] if not smoke else [20, 7, 33]
    h, hk, d = 8, 2, 128
    g = torch.Generator(device=dev).manual_seed(3)
    mk = lambda *s: torch.randn(*s, generator=g, device=dev).to(torch.bfloat16)  # noqa: E731
    q, k, v = mk(sum(lens_q), h, d), mk(sum(lens_k), hk, d), mk(sum(lens_k), hk, d)
    do = mk(sum(lens_q), h, d)
    flags = dict(
        band=adb.Band.of(None, True, "bottom_right"),
        scale=0.1,
        cu_seqlens_q=(cu_q := _cumulative(lens_q, dev)),
        cu_seqlens_k=(cu_k := _cumulative(lens_k, dev)),
        max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k),
    )
    out, lse = attention_forward(q, k, v, **flags)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    attention_backward(
        q, k, v, out, lse, do, **flags, dq=grads[0], dk=grads[1], dv=grads[2], atomic_dq=atomic
    )
    worst = {"out": 0.0, "lse": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    zero_ok = True
    for b in range(len(lens_q)):
        qs, qe, ks, ke = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        if ke == ks:  # no keys: out 0, lse -inf, grads 0
            zero_ok &= bool(
                (out[qs:qe] == 0).all()
                and torch.isneginf(lse[:, qs:qe]).all()
                and (grads[0][qs:qe] == 0).all()
            )
            continue
        if qe == qs:  # no queries: dk = dv = 0
            zero_ok &= bool((grads[1][ks:ke] == 0).all() and (grads[2][ks:ke] == 0).all())
            continue
        sl = lambda t, a, e: t[a:e].unsqueeze(0)  # noqa: E731
        err = check_against_oracle(
            sl(q, qs, qe),
            sl(k, ks, ke),
            sl(v, ks, ke),
            sl(do, qs, qe),
            sl(out, qs, qe),
            lse[:, qs:qe].unsqueeze(0),
            (sl(grads[0], qs, qe), sl(grads[1], ks, ke), sl(grads[2], ks, ke)),
            True,
            True,
            0.1,
            list(range(h)),
        )
        worst = {n: max(worst[n], e) for n, e in err.items()}
    return {
        "case": "varlen empty seqs br causal gqa4" + (" atomic" if atomic else ""),
        "errors": worst,
        "empty_sequences_ok": zero_ok,
    }


def print_table(results: dict) -> None:
    peak = results.get("matmul_tflops")
    log(
        "\n| shape | ours us (TF/s) | FA2 us (TF/s) | cuDNN us (TF/s) | vs FA2 | vs cuDNN "
        "| ours fwd us (TF/s) | max rel err dq/dk/dv |"
    )
    log("|---|---|---|---|---|---|---|---|")
    for r in results["timing"]:

        def cell(ms, flops):
            return "-" if ms is None else f"{ms * 1e3:.0f} ({flops / ms / 1e9:.0f})"

        e = results["shapes"].get(r["shape"], {}).get("errors", {})
        errs = "/".join(f"{e.get(n, float('nan')):.1e}" for n in ("dq", "dk", "dv"))
        fa2, cud = r.get("fa2"), r.get("cudnn")
        log(
            f"| {r['shape']} | {cell(r['ours'], r['flops'])} | {cell(fa2, r['flops'])} | "
            f"{cell(cud, r['flops'])} | {fa2 / r['ours'] if fa2 else float('nan'):.2f}x | "
            f"{cud / r['ours'] if cud else float('nan'):.2f}x | "
            f"{cell(r['ours_fwd'], r['fwd_flops'])} | {errs} |"
        )
    if peak:
        log(f"bf16 matmul ceiling: {peak:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
