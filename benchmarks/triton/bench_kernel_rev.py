"""The fused-atomic Gluon dK/dV kernel of this tree against its source at another commit, with
cuDNN, in one process (GQA 64/8, B=1, D=128, bf16).

The file ``_bwd_dkdv_sm90.py`` as it was at ``REV`` (``git show``; or ``REV`` is the path of a
saved copy of that file, for a tree without its git history) is loaded as a second module of the
package, and each call of ``triton:fused_atomic`` runs either kernel (launch plans off:
a plan would replay the kernel it recorded; the rest of the backward is this tree's). Per shape:
both forms' gradients against cuDNN's (relative Frobenius difference < 2e-2) and against each
other; the kernels' GPU time per call (``torch.profiler``, as ``bench_breakdown.py``); then
``triton.testing.do_bench`` medians over rounds in alternating order. A shape is ``4096`` or
``4096c`` (causal).

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_kernel_rev.py REV
        [--shapes 4096c,8192c,16384c,4096,16384] [--rounds 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from types import ModuleType

KERNEL_FILE = "backends/triton/attn_dispatch_triton/_bwd_dkdv_sm90.py"


def kernel_source_at(rev: str) -> str:
    """The Gluon dK/dV kernel's source at ``rev``: the file itself where ``rev`` is the path of
    a ``.py`` file, else ``git show`` from this checkout."""
    if rev.endswith(".py"):
        try:
            with open(rev) as f:
                return f.read()
        except OSError as exc:
            raise SystemExit(f"REV {rev!r}: cannot read the kernel file: {exc}") from None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo
    try:
        return subprocess.run(
            ["git", "show", f"{rev}:{KERNEL_FILE}"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise SystemExit(f"REV {rev!r}: cannot read {KERNEL_FILE}: {detail}") from None


def load_kernel_module(
    source: str, name: str = "_bwd_dkdv_sm90_rev", directory: str | None = None
) -> ModuleType:
    """``source`` as module ``attn_dispatch_triton.<name>``: its relative imports resolve in the
    package, and triton reads its kernels' source from a real file (in ``directory``, by default
    a new temporary one)."""
    import attn_dispatch_triton

    path = os.path.join(directory or tempfile.mkdtemp(prefix="kernel_rev_"), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    full = f"{attn_dispatch_triton.__name__}.{name}"
    spec = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def parse_shapes(text: str) -> list[tuple[int, bool]]:
    """``"4096c,16384"`` -> ``[(4096, True), (16384, False)]``."""
    shapes = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        causal = item.endswith("c")
        digits = item[:-1] if causal else item
        if not digits.isdigit() or int(digits) <= 0:
            raise argparse.ArgumentTypeError(f"expected e.g. 4096 or 4096c, got {item!r}")
        shapes.append((int(digits), causal))
    return shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "rev",
        help="the commit whose kernel source to compare with (e.g. "
        "HEAD~1), or a saved copy of that file (a path ending in .py)",
    )
    ap.add_argument(
        "--shapes", type=parse_shapes, default=parse_shapes("4096c,8192c,16384c,4096,16384")
    )
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    os.environ["ATTN_DISPATCH_TRITON_PLANS"] = "0"  # read at the first call

    import torch
    from attn_dispatch_triton import _bwd_dkdv_sm90 as this_module
    from bench_breakdown import kernel_times
    from bench_kernels import timed_backward, timing_inputs
    from triton.testing import do_bench

    import attn_dispatch as ad

    kernels = {
        "this": this_module._attn_bwd_dkdv_sm90,
        args.rev: load_kernel_module(kernel_source_at(args.rev))._attn_bwd_dkdv_sm90,
    }
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    lines = []
    for s, causal in args.shapes:
        tensors = timing_inputs(64, 8, s)

        def ours(kernel, t=tensors, c=causal):
            def run():
                this_module._attn_bwd_dkdv_sm90 = kernel  # what backward.py imports per call
                return timed_backward(t, c)

            return run

        calls = {name: ours(kernel) for name, kernel in kernels.items()}
        calls["cuDNN"] = lambda t=tensors, c=causal: ad.backward(
            *t, causal=c, backend="torch_sdpa:cudnn"
        )
        grads = {name: call() for name, call in calls.items()}
        for name in kernels:
            for got, want, g in zip(grads[name], grads["cuDNN"], "qkv", strict=True):
                err = float((got.float() - want.float()).norm() / want.float().norm())
                if not err < 2e-2:
                    raise SystemExit(f"{name} at {s} causal={causal}: d{g} off cuDNN's by {err}")
        diff = max(
            float((a.float() - b.float()).norm() / b.float().norm())
            for a, b in zip(*(grads[n] for n in kernels), strict=True)
        )
        del grads
        total = {name: sum(kernel_times(call).values()) for name, call in calls.items()}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for rnd in range(args.rounds):
            for name in list(calls)[:: (-1 if rnd % 2 else 1)]:
                times[name].append(do_bench(calls[name], warmup=100, rep=400) * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        label = f"GQA 64/8 {s // 1024}K{' causal' if causal else ''}"
        cells = [
            f"{name} {med[name]:.0f} µs ({med['cuDNN'] / med[name]:.3f}x cuDNN; kernels "
            f"{total[name]:.0f})"
            for name in kernels
        ]
        lines.append(
            f"{label:20s} " + " | ".join(cells) + f" | cuDNN {med['cuDNN']:.0f} µs | "
            f"this / {args.rev} {med['this'] / med[args.rev]:.4f} | grads apart "
            f"{diff:.1e}"
        )
        print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
