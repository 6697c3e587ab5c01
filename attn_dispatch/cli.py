"""The ``attn-dispatch`` command: ``list``, ``explain``, ``demo``, ``bench``."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from . import _api, _inputs, _settings
from ._arch import Arch, detect_arch

DTYPES = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "fp16": torch.float16,
    "f32": torch.float32,
    "fp32": torch.float32,
    "f64": torch.float64,
}


def _cmd_list(args: argparse.Namespace) -> int:
    infos = _api.backends()
    if args.json:
        loaded = [i.to_dict() for i in infos if i.error is None]
        failed = [i.to_dict() for i in infos if i.error is not None]
        print(json.dumps({"backends": loaded, "failed": failed}, indent=2))
        return 0
    if not infos:
        print("no backend plugin is installed (try: pip install -e backends/reference)")
    for info in infos:
        origin = f"{info.distribution or '?'} {info.version or ''}".strip()
        if info.error is not None:
            print(f"{info.name}  ({origin})  FAILED: {info.error}")
            continue
        print(f"{info.name}  ({origin})")
        for impl in info.implementations:
            flags = ", ".join(
                f
                for f, on in (
                    ("opt-in", impl.opt_in),
                    ("non-deterministic", not impl.deterministic),
                    ("forward", impl.has_forward),
                )
                if on
            )
            prio = ", ".join(f"{k}={v}" for k, v in impl.priority.items()) or "none"
            print(f"  {impl.name:<28} priority: {prio}" + (f"  [{flags}]" if flags else ""))
    return 0


def _meta_inputs(args: argparse.Namespace) -> dict:
    dtype = DTYPES[args.dtype]
    lse_dtype = _inputs.lse_dtype(dtype)
    sk = args.seqlen_k or args.seqlen
    dv = args.head_dim_v or args.head_dim
    kv_heads = args.kv_heads or args.heads

    def empty(*shape, dt=dtype):
        return torch.empty(shape, dtype=dt, device="meta")

    return dict(
        q=empty(args.batch, args.seqlen, args.heads, args.head_dim),
        k=empty(args.batch, sk, kv_heads, args.head_dim),
        v=empty(args.batch, sk, kv_heads, dv),
        out=empty(args.batch, args.seqlen, args.heads, dv),
        lse=empty(args.batch, args.heads, args.seqlen, dt=lse_dtype),
        grad_out=empty(args.batch, args.seqlen, args.heads, dv),
    )


def _cmd_explain(args: argparse.Namespace) -> int:
    tensors = _meta_inputs(args)
    report = _api.explain(
        **tensors,
        causal=args.causal,
        causal_align=args.causal_align,
        scale=args.scale,
        deterministic=args.deterministic or None,
        backend=args.backend,
        arch=args.arch,
    )
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0


def _median_seconds(fn, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .testing.oracle import oracle
    from .testing.tolerances import tolerance_for

    on_gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = DTYPES[args.dtype or ("bf16" if on_gpu else "f32")]
    b, s, h, hkv, d = (2, 2048, 16, 4, 128) if on_gpu else (2, 384, 8, 2, 64)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    q, k, v, do = (
        torch.randn(shape, generator=gen, device=device, dtype=dtype)
        for shape in ((b, s, h, d), (b, s, hkv, d), (b, s, hkv, d), (b, s, h, d))
    )
    flags = dict(causal=True)
    print(f"arch: {detect_arch(device).full}   device: {device}   torch {torch.__version__}")
    print(f"job: GQA causal attention backward, B={b} S={s} H={h} Hkv={hkv} D={d} {dtype}")
    out, lse = _api.forward(q, k, v, **flags)
    report = _api.explain(q, k, v, out, lse, do, **flags)
    print(report)
    seconds = _median_seconds(
        lambda: _api.backward(q, k, v, out, lse, do, **flags), device, args.repeats
    )
    dq, dk, dv = _api.backward(q, k, v, out, lse, do, **flags)
    ref = oracle(q, k, v, do, **flags)
    tol = tolerance_for(dtype)
    worst = 0.0
    for name, got, want in (("dq", dq, ref.dq), ("dk", dk, ref.dk), ("dv", dv, ref.dv)):
        err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
        print(f"  {name}: max|err|/max|ref| = {err:.2e} (tolerance {tol.max_err:.0e})")
    flops = 10 * b * h * s * s * d / 2
    print(
        f"ran {report.selected}: median {seconds * 1e3:.2f} ms over {args.repeats} runs "
        f"({flops / seconds / 1e12:.2f} TFLOP/s)"
    )
    ok = worst <= tol.max_err
    print("PASS: matches the float64 oracle" if ok else "FAIL: outside tolerance")
    return 0 if ok else 1


def _cmd_bench(argv: list[str]) -> int:
    from . import bench

    return bench.main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attn-dispatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="installed backends, implementations and priorities")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("explain", help="why each implementation would or would not run a shape")
    p.add_argument("--arch", type=Arch.parse, default=None, help="e.g. sm_90, gfx942, gfx950, cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--seqlen-k", type=int, default=None)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--head-dim-v", type=int, default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--causal-align", choices=("top_left", "bottom_right"), default="top_left")
    p.add_argument("--scale", type=float, default=None)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--backend", default=None, help="explain a forced choice")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("demo", help="pick, run and verify a GQA causal backward on this machine")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even if a GPU is present")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    sub.add_parser(
        "bench",
        help="time every implementation on a shape sweep (see bench --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _cmd_bench(argv[1:])
    args = build_parser().parse_args(argv)
    _settings.current()
    try:
        return {"list": _cmd_list, "explain": _cmd_explain, "demo": _cmd_demo}[args.command](args)
    except ValueError as exc:  # our errors are ValueError/TypeError: show them plainly
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TypeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
