"""Host cost of one layer's attention forward + backward, layer by layer: where the time goes.

At S=128 the kernels of one Llama-3-8B-shaped layer (B=1, 32 query / 8 KV heads, D=128, causal,
bf16, q/k/v given as [B, H, S, D] with ``requires_grad``) take a few microseconds; what a call
costs is the host's work. Each row times forward + backward (the backward with a gradient
tensor, as a training step runs it) through one more layer of the stack than the row below it:

* ``sdpa``: ``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)`` and its
  autograd backward, the baseline;
* ``ad.attention``: the automatic choice, then each installed implementation forced
  (``backend=``) that accepts the call; in eager mode one autograd node whose passes dispatch as
  ``ad.forward`` and ``ad.backward`` do, or, where the implementation offers one
  (``torch_sdpa:flash``), the operator's own compiled node; then the automatic choice as the
  transformers integration calls it ([B, S, H, D] views in, the output used in that layout, so
  its gradient needs no copy), and the same call through a minimal autograd node over
  ``ad.forward`` / ``ad.backward`` (the transformers-layout row minus that row is
  ``ad.attention``'s own node's cost), and a node over the same views that computes nothing,
  only allocating its results: what any Python autograd node and the engine's walk around it
  cost;
* ``custom ops``: the operators ``attn_dispatch::fwd`` and ``attn_dispatch::bwd`` called
  directly, without autograd: what a compiled or traced ``ad.attention`` runs (an eager call
  does not go through them);
* ``ad.forward + ad.backward``: the public dispatch calls (``ad.attention`` minus its argument
  checks, its autograd node and the copies it promises);
* ``direct``: the chosen implementations' ``forward(inp)`` and ``backward(inp)`` on the inputs
  objects ``ad.decide`` returns, with the plan each implementation prepares for the signature
  (as a cached decision hands it): no dispatch, no autograd; ``ad.attention`` minus this row is
  the library's own cost. On a GPU, the same for the implementation that calls the operators
  of the kernels sdpa picks (``torch._fused_sdp_choice``) comes first: ``sdpa`` minus that row
  is what sdpa's own node and autograd's engine cost around its kernels.

Each row: median over rounds of the wall time of N back-to-back calls, synchronised only at a
round's end, divided by N (host-bound calls: the wall time is the host's). The rounds go across
the rows (round 1 of every row, then round 2, ...), so that a slow spell of the host weighs on
every row alike and the rows of one run compare. Without CUDA the run
uses float32 and a tiny shape on the CPU, where the numbers compare the Python and dispatcher
layers only (the kernels there are PyTorch's CPU math).

GPU: ``python benchmarks/host_cost.py --json host_cost.json [--profile] [--ops]``
CPU: ``python benchmarks/host_cost.py`` (``--smoke``: one short round per row, for the tests)
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import platform
import pstats
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _minimal_node import EmptyNode, minimal_node
from _provenance import git_commit
from _timing import interleaved_medians, sync
from torch.nn.attention import SDPBackend

import attn_dispatch as ad
from attn_dispatch import NoBackendError

# (batch, query heads, KV heads, sequence length, head dim)
GPU_SHAPE = (1, 32, 8, 128, 128)
CPU_SHAPE = (1, 4, 2, 16, 16)


class Layer:
    """One layer's attention inputs: q, k, v as [B, H, S, D] leaves and the output gradient."""

    def __init__(self, shape: tuple, device: torch.device, dtype: torch.dtype):
        batch, heads, kv_heads, seqlen, d = shape
        gen = torch.Generator(device="cpu").manual_seed(0)

        def rand(h: int) -> torch.Tensor:
            t = torch.randn(batch, h, seqlen, d, generator=gen, dtype=dtype)
            return t.to(device).requires_grad_()

        self.q, self.k, self.v = rand(heads), rand(kv_heads), rand(kv_heads)
        self.grad = torch.randn(self.q.shape, generator=gen, dtype=dtype).to(device)

    def clear(self) -> None:
        self.q.grad = self.k.grad = self.v.grad = None

    def bshd(self) -> tuple[torch.Tensor, ...]:
        """q, k, v as ``ad.attention(layout="bhsd")`` hands them on: [B, S, H, D] views."""
        return tuple(t.detach().transpose(1, 2) for t in (self.q, self.k, self.v))


def sdpa_step(layer: Layer) -> Callable[[], None]:
    def step():
        layer.clear()
        F.scaled_dot_product_attention(
            layer.q, layer.k, layer.v, is_causal=True, enable_gqa=True
        ).backward(layer.grad)

    return step


def attention_step(layer: Layer, backend: str | None = None) -> Callable[[], None]:
    def step():
        layer.clear()
        ad.attention(
            layer.q, layer.k, layer.v, causal=True, layout="bhsd", backend=backend
        ).backward(layer.grad)

    return step


def transformers_step(layer: Layer) -> Callable[[], None]:
    """``ad.attention`` as the transformers integration calls it: [B, S, H, D] views of the
    [B, H, S, D] projections, the output used in that layout, so the gradient comes back as
    contiguous [B, S, H, D] rows."""
    grad = layer.grad.transpose(1, 2).contiguous()

    def step():
        layer.clear()
        q, k, v = (t.transpose(1, 2) for t in (layer.q, layer.k, layer.v))
        ad.attention(q, k, v, causal=True).backward(grad)

    return step


def minimal_node_step(layer: Layer) -> Callable[[], None]:
    """:func:`transformers_step`'s call through the least an autograd node over ``ad.forward``
    / ``ad.backward`` can do: that row minus this one is ``ad.attention``'s own node's cost."""
    grad = layer.grad.transpose(1, 2).contiguous()
    node = minimal_node()

    def step():
        layer.clear()
        node.apply(*(t.transpose(1, 2) for t in (layer.q, layer.k, layer.v))).backward(grad)

    return step


def empty_node_step(layer: Layer) -> Callable[[], None]:
    """:func:`minimal_node_step` with a node that computes nothing (``EmptyNode``): the floor
    of any Python autograd node at these layouts, to set the rows above against."""
    grad = layer.grad.transpose(1, 2).contiguous()

    def step():
        layer.clear()
        EmptyNode.apply(*(t.transpose(1, 2) for t in (layer.q, layer.k, layer.v))).backward(grad)

    return step


def _no_grad(fn: Callable[[], object]) -> Callable[[], None]:
    # The dispatcher turns grad recording off around an implementation; the rows below the
    # autograd layer run as it would, so they record no graph of their own.
    def step():
        with torch.no_grad():
            fn()

    return step


def _flags() -> tuple:
    # the operators' flags: causal, causal_align, scale, deterministic, backend, window, softcap
    return (True, "top_left", None, False, None, None, None, None)


def custom_ops_step(layer: Layer) -> Callable[[], None]:
    q, k, v = layer.bshd()
    grad = layer.grad.transpose(1, 2)
    seqlens = (None, None, None, None)
    flags = _flags()

    def fwd_bwd():
        out, lse = torch.ops.attn_dispatch.fwd(q, k, v, *seqlens, *flags)
        torch.ops.attn_dispatch.bwd(grad, q, k, v, out, lse, *seqlens, *flags)

    return _no_grad(fwd_bwd)


def public_step(layer: Layer) -> Callable[[], None]:
    q, k, v = layer.bshd()
    grad = layer.grad.transpose(1, 2)

    def fwd_bwd():
        out, lse = ad.forward(q, k, v, causal=True)
        ad.backward(q, k, v, out, lse, grad, causal=True)

    return _no_grad(fwd_bwd)


def chosen(layer: Layer, backend: str | None = None) -> tuple[ad.Choice, ad.Choice]:
    """What ``ad.attention``'s forward and backward run for this layer (or ``backend``'s
    implementation forced), with their inputs."""
    q, k, v = layer.bshd()
    grad = layer.grad.transpose(1, 2)
    fwd = ad.decide(q, k, v, mode="forward", causal=True, backend=backend)
    with torch.no_grad():
        out, lse = ad.forward(q, k, v, causal=True, backend=backend)
    bwd = ad.decide(q, k, v, out, lse, grad, causal=True, backend=backend)
    for choice in (fwd, bwd):
        # a cached decision hands its implementation the plan prepared for the signature;
        # ``decide`` prepares none (nothing runs), and without it an implementation redoes
        # that work on every call
        choice.inputs.plan = choice.implementation.prepare(choice.inputs)
    return fwd, bwd


def attention_choice(layer: Layer) -> str:
    """What eager ``ad.attention``'s forward runs for this layer: its pass is ranked as a pass
    of such a call (by the cost tables' attention rows where they cover it)."""
    return ad.explain(*layer.bshd(), causal=True, attention="bhsd").selected


# sdpa's kernel choice (``torch._fused_sdp_choice`` returns an ``SDPBackend`` value) and the
# implementation that calls the same PyTorch operators
SDPA_KERNELS = {
    SDPBackend.FLASH_ATTENTION.value: "torch_sdpa:flash",
    SDPBackend.EFFICIENT_ATTENTION.value: "torch_sdpa:efficient",
    SDPBackend.CUDNN_ATTENTION.value: "torch_sdpa:cudnn",
}


def sdpa_kernels(layer: Layer, accepting: list[str]) -> str | None:
    """The implementation that runs the kernels sdpa picks for this layer, if it is among
    ``accepting`` (``None`` otherwise: on a CPU sdpa runs kernels none of ours calls)."""
    choice = int(
        torch._fused_sdp_choice(layer.q, layer.k, layer.v, is_causal=True, enable_gqa=True)
    )
    name = SDPA_KERNELS.get(choice)
    return name if name in accepting else None


def direct_step(fwd: ad.Choice, bwd: ad.Choice) -> Callable[[], None]:
    run_fwd, fwd_inp = fwd.implementation.forward, fwd.inputs
    run_bwd, bwd_inp = bwd.implementation.backward, bwd.inputs

    def fwd_bwd():
        run_fwd(fwd_inp)
        run_bwd(bwd_inp)

    return _no_grad(fwd_bwd)


def forced_names(layer: Layer) -> list[str]:
    """Every installed implementation that runs this layer's forward and backward when forced."""
    q, k, v = layer.bshd()
    grad = layer.grad.transpose(1, 2)
    with torch.no_grad():
        out, lse = ad.forward(q, k, v, causal=True)
    names = []
    for backend in ad.backends():
        for impl in backend.implementations:
            try:
                ad.decide(q, k, v, mode="forward", causal=True, backend=impl.name)
                ad.decide(q, k, v, out, lse, grad, causal=True, backend=impl.name)
            except NoBackendError:
                continue
            names.append(impl.name)
    return sorted(names)


def profile(fn: Callable[[], object], device, number: int, top: int) -> str:
    """The ``top`` entries of a cProfile of ``number`` calls of ``fn`` (after one warm call)."""
    fn()
    sync(device)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(number):
        fn()
    sync(device)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def operator_counts(steps: dict[str, Callable[[], None]], device, number: int, top: int) -> str:
    """Per row of ``steps``: the ``top`` most frequent profiler events of ``number`` calls (after
    ten warm ones), each with its count and its own host time per call: the aten operators,
    kernel launches and autograd nodes a row's forward + backward runs."""
    from torch import profiler

    # torch 2.11 warns that a profile's events are cleared per cycle unless they accumulate
    # (``acc_events``, not in every release the project admits)
    accumulate = "acc_events" in inspect.signature(profiler.profile).parameters
    options = {"acc_events": True} if accumulate else {}
    activities = [profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(profiler.ProfilerActivity.CUDA)
    text = []
    for name, fn in steps.items():
        for _ in range(10):
            fn()
        sync(device)
        with profiler.profile(activities=activities, **options) as prof:
            for _ in range(number):
                fn()
            sync(device)
        text.append(f"\n{name}: events of {number} calls (count, own host µs per call, event)")
        events = sorted(prof.key_averages(), key=lambda e: -e.count)[:top]
        text += [
            f"{e.count:6d} {e.self_cpu_time_total / number:8.1f}  {e.key[:100]}" for e in events
        ]
    return "\n".join(text)


def versions(device: torch.device) -> dict:
    commit = git_commit()
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.machine(),
        )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attn_dispatch": ad.__version__,
        "device": where,
        "commit": commit or "unknown",
    }


def markdown(rows: list[dict], sdpa_us: float) -> str:
    lines = ["| path | µs per forward+backward | vs sdpa |", "|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['path']} | {row['us']:.1f} | {row['us'] / sdpa_us:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per row (15)")
    parser.add_argument("--number", type=int, default=None, help="calls per round (200)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per row (20)")
    parser.add_argument("--smoke", action="store_true", help="one short round per row (tests)")
    parser.add_argument("--profile", action="store_true", help="cProfile ad.attention's calls")
    parser.add_argument(
        "--ops", action="store_true", help="profiler events per call of the autograd rows"
    )
    parser.add_argument("--top", type=int, default=30, help="profile entries printed (30)")
    parser.add_argument("--json", type=Path, help="write the rows and versions here")
    args = parser.parse_args(argv)
    defaults = (1, 3, 1) if args.smoke else (15, 200, 20)
    rounds, number, warmup = (
        given if given is not None else default
        for given, default in zip((args.rounds, args.number, args.warmup), defaults)
    )
    if min(rounds, number) < 1 or warmup < 0:
        parser.error("--rounds and --number must be at least 1, --warmup at least 0")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        shape, dtype = GPU_SHAPE, torch.bfloat16
    else:
        shape, dtype = CPU_SHAPE, torch.float32
    layer = Layer(shape, device, dtype)
    fwd, bwd = chosen(layer)

    autograd_steps = {
        "sdpa": sdpa_step(layer),
        f"ad.attention (automatic: {attention_choice(layer)})": attention_step(layer),
    }
    accepting = forced_names(layer)
    for name in accepting:
        autograd_steps[f"ad.attention forced {name}"] = attention_step(layer, name)
    autograd_steps["ad.attention as transformers calls it (bshd views)"] = transformers_step(layer)
    autograd_steps["a minimal node over ad.forward + ad.backward"] = minimal_node_step(layer)
    autograd_steps["an empty Python node (computes nothing)"] = empty_node_step(layer)
    steps = {
        **autograd_steps,
        "custom ops fwd + bwd, no autograd": custom_ops_step(layer),
        "ad.forward + ad.backward": public_step(layer),
    }
    sdpa_impl = sdpa_kernels(layer, accepting)
    if sdpa_impl is not None:
        steps[f"direct: sdpa's kernels ({sdpa_impl}) forward + backward"] = direct_step(
            *chosen(layer, sdpa_impl)
        )
    steps["direct: implementations' forward + backward"] = direct_step(fwd, bwd)
    seconds = interleaved_medians(
        steps, device, warmup, rounds, number, lambda line: print(line, file=sys.stderr)
    )
    rows = [{"path": path, "us": s * 1e6} for path, s in seconds.items()]
    info = versions(device)
    batch, heads, kv_heads, seqlen, d = shape
    where = f"{info['device']}, torch {info['torch']}, python {info['python']}"
    print(
        f"B={batch} H={heads}/{kv_heads} S={seqlen} D={d} causal {str(dtype).split('.')[-1]}, "
        f"bhsd; {where}; median of {rounds} rounds of {number} calls"
    )
    print(markdown(rows, rows[0]["us"]))
    automatic, direct = rows[1]["us"], rows[-1]["us"]
    print(
        f"\nattn_dispatch's own layers: {automatic - direct:.1f} µs per forward+backward "
        f"(ad.attention minus the direct calls); sdpa: {rows[0]['us']:.1f} µs in all"
    )
    if args.profile:
        print(f"\ncProfile of {number} ad.attention forward+backward calls:")
        print(profile(attention_step(layer), device, number, args.top))
    if args.ops:
        print(operator_counts(autograd_steps, device, number, args.top))
    if args.json:
        data = {
            "shape": dict(zip(("batch", "heads", "kv_heads", "seqlen", "head_dim"), shape)),
            "dtype": str(dtype),
            "rounds": rounds,
            "number": number,
            "versions": info,
            "chosen": {"forward": fwd.name, "backward": bwd.name},
            "rows": rows,
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
