"""The ``attn-dispatch`` command: ``list``, ``explain``, ``demo``, ``doctor``, ``bench``,
``tune``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import attn_dispatch as ad
from attn_dispatch import _settings
from attn_dispatch import backend as adb

from . import bench, doctor, tune
from ._args import MAX_TENSOR_BYTES, PROG, Parser, nonnegative_int, plain, positive_int
from ._args import window_sides as _window

DTYPES = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "fp16": torch.float16,
    "f32": torch.float32,
    "fp32": torch.float32,
    "f64": torch.float64,
}


def _arch(text: str) -> ad.Arch:
    try:
        return ad.Arch.parse(text)
    except ValueError as exc:  # argparse would replace the message with "invalid value"
        raise argparse.ArgumentTypeError(str(exc)) from None


# The archs of the priority table (README and `attn-dispatch list`): one per supported chip family.
TABLE_ARCHS = ("cpu", "sm_80", "sm_90", "sm_100", "gfx942", "gfx950")


def priority_rows(infos: list[ad.BackendInfo]) -> list[list[str]]:
    """Header and one row per loaded implementation: opt-in, deterministic, and its priority on
    each of TABLE_ARCHS ('-': never chosen automatically there)."""
    rows = [["implementation", "opt-in", "deterministic", *TABLE_ARCHS]]
    for info in sorted(infos, key=lambda b: b.name):
        for impl in info.implementations:
            values = [impl.priority_for(arch) for arch in TABLE_ARCHS]
            rows.append(
                [
                    impl.name,
                    "yes" if impl.opt_in else "no",
                    "yes" if impl.deterministic else "no",
                    *("-" if value is None else str(value) for value in values),
                ]
            )
    return rows


def priority_table_markdown(infos: list[ad.BackendInfo]) -> str:
    """The priority table as Markdown (the README's generated section)."""
    header, *rows = priority_rows(infos)
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|" + "---|" * len(TABLE_ARCHS)]
    lines += [f"| `{row[0]}` | " + " | ".join(row[1:]) + " |" for row in rows]
    return "\n".join(lines)


def priority_table_text(infos: list[ad.BackendInfo]) -> str:
    """The priority table in aligned columns, for the terminal."""
    rows = priority_rows(infos)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


def _cmd_list(args: argparse.Namespace) -> int:
    infos = ad.backends()
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
                    (
                        f"opt-in ({impl.opt_in_reason})" if impl.opt_in_reason else "opt-in",
                        impl.opt_in,
                    ),
                    ("non-deterministic", not impl.deterministic),
                    ("forward", impl.has_forward),
                    ("window", impl.window),
                    ("softcap", impl.softcap),
                    ("sinks", impl.sinks),
                )
                if on
            )
            prio = ", ".join(f"{k}={v}" for k, v in impl.priority.items()) or "none"
            print(f"  {impl.name:<28} priority: {prio}" + (f"  [{flags}]" if flags else ""))
    loaded = [i for i in infos if i.error is None]
    if any(info.implementations for info in loaded):
        print(
            "\npriority per arch ('-': never chosen automatically there; still runs when forced):"
        )
        print(priority_table_text(loaded))
    return 0


def _meta_shapes(args: argparse.Namespace) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each backward input the ``explain`` arguments describe."""
    dtype = DTYPES[args.dtype]
    b, sq, h, d = args.batch, args.seqlen, args.heads, args.head_dim
    sk = sq if args.seqlen_k is None else args.seqlen_k
    dv = d if args.head_dim_v is None else args.head_dim_v
    hkv = h if args.kv_heads is None else args.kv_heads
    return {
        "q": ((b, sq, h, d), dtype),
        "k": ((b, sk, hkv, d), dtype),
        "v": ((b, sk, hkv, dv), dtype),
        "out": ((b, sq, h, dv), dtype),
        "lse": ((b, h, sq), adb.lse_dtype(dtype)),
        "grad_out": ((b, sq, h, dv), dtype),
    }


def _meta_inputs(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """The inputs as ``meta`` tensors (shapes only, nothing allocated), any size torch can
    describe; a size beyond that is a ValueError naming the tensor."""
    tensors = {}
    for name, (shape, dtype) in _meta_shapes(args).items():
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        if nbytes > MAX_TENSOR_BYTES:
            raise ValueError(
                f"{name} of shape {list(shape)} would take {float(nbytes):.3g} bytes, more than "
                "a tensor can hold (2**63 - 1); give smaller sizes"
            )
        tensors[name] = torch.empty(shape, dtype=dtype, device="meta")
    return tensors


def _cmd_explain(args: argparse.Namespace) -> int:
    tensors = _meta_inputs(args)
    report = ad.explain(
        **tensors,
        causal=args.causal,
        causal_align=args.causal_align,
        scale=args.scale,
        deterministic=args.deterministic or None,
        backend=args.backend,
        arch=args.arch,
        window=args.window,
        softcap=args.softcap,
        execution="graph" if args.cuda_graphs else "eager",
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
    from attn_dispatch.testing.oracle import oracle
    from attn_dispatch.testing.tolerances import tolerance_for

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
    print(f"arch: {ad.detect_arch(device).full}   device: {device}   torch {torch.__version__}")
    print(f"job: GQA causal attention backward, B={b} S={s} H={h} Hkv={hkv} D={d} {dtype}")
    out, lse = ad.forward(q, k, v, **flags)
    report = ad.explain(q, k, v, out, lse, do, **flags)
    print(report)
    seconds = _median_seconds(
        lambda: ad.backward(q, k, v, out, lse, do, **flags), device, args.repeats
    )
    dq, dk, dv = ad.backward(q, k, v, out, lse, do, **flags)
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


def _add_fallback(p: argparse.ArgumentParser, flag: str, kind, what: str, fallback: str) -> None:
    """An optional ``flag`` that takes ``fallback``'s value when not given."""
    p.add_argument(flag, type=kind, default=None, help=f"{what} (default: {fallback})")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=plain(__doc__))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="installed backends, implementations and priorities")
    p.add_argument("--json", action="store_true", help="print the backends as JSON")
    p = sub.add_parser("explain", help="why each implementation would or would not run a shape")
    p.add_argument(
        "--arch",
        type=_arch,
        default=None,
        help="e.g. sm_90, gfx942, gfx950, cpu (default: this machine's: the current GPU's "
        "arch, else cpu; ATTN_DISPATCH_ARCH overrides the detection)",
    )
    p.add_argument("--batch", type=nonnegative_int, default=1, help="batch size")
    p.add_argument("--seqlen", type=nonnegative_int, required=True, help="query sequence length")
    _add_fallback(p, "--seqlen-k", nonnegative_int, "key sequence length", "--seqlen")
    p.add_argument("--heads", type=positive_int, required=True, help="query heads")
    _add_fallback(p, "--kv-heads", positive_int, "key/value heads", "--heads")
    p.add_argument("--head-dim", type=positive_int, required=True, help="head dimension")
    _add_fallback(p, "--head-dim-v", positive_int, "head dimension of v", "--head-dim")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="inputs' dtype")
    p.add_argument("--causal", action="store_true", help="causal attention")
    p.add_argument(
        "--causal-align",
        choices=("top_left", "bottom_right"),
        default="top_left",
        help="where the causal diagonal starts when Sq != Sk",
    )
    p.add_argument("--scale", type=float, default=None, help="default: 1/sqrt(head dim)")
    p.add_argument(
        "--window",
        type=_window,
        default=None,
        metavar="L,R",
        help="sliding window: keys d-L..d+R around each row's diagonal d; 'none' for an "
        "unbounded side (e.g. 128,0 or none,64; default: no window)",
    )
    p.add_argument(
        "--softcap", type=float, default=None, metavar="C", help="logit soft cap (default: none)"
    )
    p.add_argument(
        "--deterministic", action="store_true", help="ask for a deterministic implementation"
    )
    p.add_argument(
        "--backend", default=None, help="explain a forced choice (default: the automatic one)"
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="explain the choice for a call captured into a CUDA graph, whose priorities may "
        "differ from eager calls (torch.compile alone runs the eager choice)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p = sub.add_parser("demo", help="pick, run and verify a GQA causal backward on this machine")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even if a GPU is present")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on a GPU, else f32"
    )
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p = sub.add_parser(
        "doctor",
        help="the installed versions against the measured stack, each fast path off here "
        "and why, and the cost table ranking each implementation",
    )
    p.add_argument(
        "--arch",
        type=_arch,
        default=None,
        help="the arch whose cost tables rank (default: this machine's, as explain's)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    # bench and tune parse their own arguments (their modules' parsers)
    for name, what in (
        ("bench", "time every implementation on a shape sweep"),
        ("tune", "autotune a list of shapes ahead of a run"),
    ):
        sub.add_parser(name, help=f"{what} (see {name} --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command and return its exit status.

    Bad arguments, and the library's ``ValueError`` / ``TypeError`` (an unknown arch in
    ``ATTN_DISPATCH_ARCH``, inputs no backend takes), are one line on stderr and status 2.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        status = _run(argv)
        # Flushed here, inside the handler below: a pipe closed by its reader (`| head -1`)
        # would otherwise fail at the interpreter's own flush, outside any handler.
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader has all it wanted. Python's documented recipe: point stdout at devnull so
        # the interpreter's last flush writes nowhere, and exit as a command cut short by a
        # closed pipe does (1, without a traceback).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(argv: list[str]) -> int:
    try:
        if argv[:1] == ["bench"]:
            return bench.main(argv[1:])
        if argv[:1] == ["tune"]:
            _settings.current()  # a bad ATTN_DISPATCH_* variable is a usage error, up front
            return tune.main(argv[1:])
        args = build_parser().parse_args(argv)
        _settings.current()  # a bad ATTN_DISPATCH_* variable is then a usage error, up front
        commands = {"list": _cmd_list, "explain": _cmd_explain, "demo": _cmd_demo}
        if args.command == "doctor":
            return doctor.run(args.json, args.arch)
        return commands[args.command](args)
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse's errors and --help, returned like every other status
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


if __name__ == "__main__":
    sys.exit(main())
