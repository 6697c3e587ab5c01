"""``attn-dispatch tune``: measure the implementations for a list of shapes ahead of a run.

Each shape is run once with autotune on, forward then backward (``--passes``), on random
tensors of the device (default: CUDA when there is one), so that its measurements land in the
autotune cache directory (``ATTN_DISPATCH_CACHE_DIR``, default ``$XDG_CACHE_HOME/attn_dispatch``)
where a later process with the same device and versions finds them: a model's shapes are then
tuned before its first training step, not during it. One progress line per shape says what was
chosen and how long the measurement took; a shape already measured is reused, not timed again.

Shapes are ``B,S,H,HKV,D`` (batch, sequence length, query heads, key/value heads, head dim),
optionally ``B,S,H,HKV,D,SK`` for another key length; give them with repeated ``--shape`` or
one per line in ``--shapes FILE`` (blank lines and ``#`` comments are skipped). The flags
(dtype, causal, window, soft cap, determinism, execution mode) apply to every shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import attn_dispatch as ad
from attn_dispatch import _settings

from ._args import (
    PROG,
    Parser,
    check_output_path,
    plain,
    positive_int,
    random_tensor,
    window_sides,
)

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
PASSES = ("forward", "backward")


def shape(text: str) -> tuple[int, ...]:
    """argparse type: ``B,S,H,HKV,D`` or ``B,S,H,HKV,D,SK``, each a positive int, H a
    multiple of HKV."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (5, 6):
        raise argparse.ArgumentTypeError(
            f"expected B,S,H,HKV,D or B,S,H,HKV,D,SK (e.g. 2,4096,32,8,128), got {text!r}"
        )
    values = tuple(positive_int(p) for p in parts)
    if values[2] % values[3]:
        raise argparse.ArgumentTypeError(
            f"{text!r}: H={values[2]} is not a multiple of HKV={values[3]}"
        )
    return values


def shapes_of_file(path: str) -> list[tuple[int, ...]]:
    """The shapes in ``path``, one per line; a bad line is an error naming it."""
    found = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"--shapes: cannot read {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            found.append(shape(text))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"--shapes {path}, line {number}: {exc}") from None
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=f"{PROG} tune", description=plain(__doc__))
    parser.add_argument(
        "--shape",
        type=shape,
        action="append",
        default=[],
        metavar="B,S,H,HKV,D[,SK]",
        help="a shape to tune (repeat for more)",
    )
    parser.add_argument(
        "--shapes", metavar="FILE", help="a file of shapes, one per line (default: none)"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="inputs' dtype")
    parser.add_argument("--causal", action="store_true", help="causal attention")
    parser.add_argument(
        "--window",
        type=window_sides,
        default=None,
        metavar="L,R",
        help="sliding window, as explain's (default: no window)",
    )
    parser.add_argument(
        "--softcap", type=float, default=None, metavar="C", help="logit soft cap (default: none)"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="tune the deterministic implementations"
    )
    parser.add_argument(
        "--passes",
        default="forward,backward",
        help="comma list of forward, backward (default: both)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="tune for calls captured into CUDA graphs: the graph-mode decision",
    )
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--json", metavar="FILE", help="also write the results as JSON here (default: none)"
    )
    return parser


def _passes(text: str) -> list[str]:
    passes = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in passes if p not in PASSES]
    if bad or not passes:
        raise ValueError(f"--passes: expected a comma list of forward, backward, got {text!r}")
    return passes


def _describe(dims: tuple[int, ...], args: argparse.Namespace) -> str:
    b, s, h, hkv, d = dims[:5]
    text = f"B={b} S={s}" + (f" Sk={dims[5]}" if len(dims) == 6 else "")
    text += f" H={h}/{hkv} D={d} {args.dtype}"
    flags = [
        "causal" if args.causal else "",
        f"window={args.window}" if args.window else "",
        f"softcap={args.softcap:g}" if args.softcap else "",
        "deterministic" if args.deterministic else "",
    ]
    return " ".join([text, *filter(None, flags)])


def _summary(report: ad.Report, fresh: bool) -> tuple[str, dict]:
    """One phrase and the JSON record of a pass's decision (``fresh``: measured by this run)."""
    record = {"selected": report.selected, "autotune": None, "measured_now": fresh}
    m = report.autotune
    if m is None:
        return f"{report.selected}", record
    record["autotune"] = m.to_dict()
    chosen = next((t for t in m.timings if t.name == report.selected), None)
    took = f" {chosen.seconds * 1e6:.1f} us" if chosen and chosen.seconds is not None else ""
    excluded = sum(t.excluded is not None for t in m.timings)
    detail = {
        "measured": f"{len(m.timings)} timed",
        "reused": f"{len(m.timings)} timed" if fresh else "measured before",
        "single": "only candidate",
        "pending": "not measured",
        "failed": "no candidate passed",
    }[m.status]
    if excluded:
        detail += f", {excluded} excluded"
    return f"{report.selected}{took} ({detail})", record


def _tune_one(dims: tuple[int, ...], args, passes: list[str], device: torch.device) -> dict:
    b, s, h, hkv, d = dims[:5]
    sk = dims[5] if len(dims) == 6 else s
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def rnd(*size):
        return random_tensor(size, gen, device, dtype)

    q, k, v = rnd(b, s, h, d), rnd(b, sk, hkv, d), rnd(b, sk, hkv, d)
    flags = dict(
        causal=args.causal,
        window=args.window,
        softcap=args.softcap,
        deterministic=args.deterministic or None,
    )
    results = {}
    fresh = _pending(ad.explain(q, k, v, **flags))
    out, lse = ad.forward(q, k, v, **flags)  # the backward's inputs (tunes the forward too)
    if "forward" in passes:
        results["forward"] = (ad.explain(q, k, v, **flags), fresh)
    if "backward" in passes:
        grad_out = rnd(*out.shape)
        fresh = _pending(ad.explain(q, k, v, out, lse, grad_out, **flags))
        ad.backward(q, k, v, out, lse, grad_out, **flags)
        results["backward"] = (ad.explain(q, k, v, out, lse, grad_out, **flags), fresh)
    return results


def _pending(report: ad.Report) -> bool:
    """Whether the call about to run will be measured (nothing remembered covers it)."""
    return report.autotune is not None and report.autotune.status == "pending"


def _device(text: str | None) -> torch.device:
    """``--device``: a device torch knows and this machine has (default: CUDA when present)."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device: expected a device such as cuda or cpu, got {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: no CUDA device is available here")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device {text}: expected cuda or cpu")
    return device


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_output_path(parser, "--json", args.json)
    passes = _passes(args.passes)
    shapes = list(args.shape) + (shapes_of_file(args.shapes) if args.shapes else [])
    if not shapes:
        raise ValueError("no shape to tune: give --shape B,S,H,HKV,D (repeatable) or --shapes FILE")
    device = _device(args.device)
    execution = "graph" if args.cuda_graphs else "eager"
    records = []
    with ad.autotune(True), ad.execution_mode(execution):
        directory = _settings.current().autotune.directory
        print(f"tuning {len(shapes)} shape(s) on {device}, {execution} execution -> {directory}")
        for index, dims in enumerate(shapes, 1):
            start = time.perf_counter()
            results = _tune_one(dims, args, passes, device)
            seconds = time.perf_counter() - start
            phrases, record = [], {"shape": list(dims), "seconds": seconds}
            for name, (report, fresh) in results.items():
                phrase, record[name] = _summary(report, fresh)
                phrases.append(f"{name} {phrase}")
            line = f"[{index}/{len(shapes)}] {_describe(dims, args)}: " + "; ".join(phrases)
            print(f"{line} ({seconds:.1f} s)", flush=True)
            records.append(record)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:  # checked before tuning, but the disk can still fill up
            parser.error(f"--json: writing the results: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
