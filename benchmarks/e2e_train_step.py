"""End-to-end training step through transformers: attn_dispatch against sdpa (and FA2 routes).

Times a full training step (forward + backward, loss from the LM head, no optimizer) of a
transformers model built from a config (random weights, bf16, no downloads) with
``attn_implementation="attn_dispatch"`` against ``"sdpa"``, and against ``"flash_attention_2"``
and ``"kernels-community/flash-attn"`` where they load (else a printed reason). Cases:

* dense causal, S=16K and S=4K (4 Llama-3-8B-shaped layers)
* packed 8x2K documents in one row (``position_ids`` restart per document)
* padded batch B=4x4K, 37% padding (right-padded ``attention_mask``)
* Mistral-shaped, sliding window 4096, S=16K
* GPT-OSS-20B-shaped (64 query / 8 KV heads, head dim 64, attention sinks, sliding-window 128
  and full layers alternating, 32 experts of which 4 per token), S=8K, 2 layers
  (``--gpt-oss-seqlen``, ``--gpt-oss-layers``): against ``"eager"``, the one attention of
  transformers for GPT-OSS that computes sinks without a download (its score matrices limit
  the length and layers that fit: about 21 GB of saved activations per layer at 8K), and
  ``"flash_attention_4"`` / ``"kernels-community/vllm-flash-attn3"`` where they load and match
  eager's loss.

Each route's first-step loss is checked against the case's reference route (sdpa; eager for
GPT-OSS) on the same weights before it is timed; another route whose loss differs is reported
as skipped with the difference (it computes something else, e.g. ignores the sinks).
Time: median over 3 rounds of the mean of 3 steps, after warm-up steps. Then a breakdown for
the dense cases: one layer's attention alone through ``ad.attention`` and
``F.scaled_dot_product_attention`` on [B, H, S, D] tensors, and through the transformers
integration and transformers' sdpa route with the layouts a Llama layer hands them ([B, S, H, D]
rows) (forward, forward + backward, times the layer count against the
step time), and forward + backward at S=128, where the time is the host's work per call: what
limits a dense step, the kernels or the per-layer overhead.

GPU run (prints a markdown table and the versions; progress on stderr):
    python benchmarks/e2e_train_step.py --json e2e.json
CPU smoke run (tiny config; about a minute and a half on two cores, most of it importing and
building the models; its times check that the paths run, they measure nothing):
    python benchmarks/e2e_train_step.py --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from _provenance import git_commit
from _timing import median_per_call, sync

import attn_dispatch as ad

ROUTES = ("sdpa", "attn_dispatch", "flash_attention_2", "kernels-community/flash-attn")
# GPT-OSS: transformers' sdpa has no attention sinks; eager is its reference.
# (transformers maps flash_attention_2 to vllm-flash-attn3 for GPT-OSS: not listed twice)
GPT_OSS_ROUTES = (
    "eager",
    "attn_dispatch",
    "flash_attention_4",
    "kernels-community/vllm-flash-attn3",
)
# First-step loss of each route against sdpa's, relative: bf16 (GPU) and float32 (smoke run).
TINY_SEQLEN = 128  # attention this short is host-bound: its time is the per-call overhead
LOSS_TOLERANCE = {torch.bfloat16: 5e-3, torch.float32: 1e-5}


@dataclass
class Shape:
    """Model and case sizes: the Llama-3-8B-shaped layers, or a tiny set for the smoke run."""

    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    layers: int = 4
    vocab: int = 32000
    long: int = 16384
    short: int = 4096
    docs: int = 8
    window: int = 4096
    padded_rows: int = 4
    padded_lengths: tuple[int, ...] = (4096, 2880, 2304, 1040)  # 37.0% of 4x4096 is padding
    gpt_oss: GptOssShape | None = None


@dataclass
class GptOssShape:
    """GPT-OSS-20B's attention and expert shapes, with fewer layers and a smaller vocabulary."""

    hidden: int = 2880
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    intermediate: int = 2880
    experts: int = 32
    experts_per_token: int = 4
    window: int = 128
    layers: int = 2
    seqlen: int = 8192
    experts_implementation: str | None = None  # transformers' default (grouped_mm on a GPU)


SMOKE = Shape(
    64,
    4,
    2,
    128,
    2,
    128,
    64,
    32,
    8,
    16,
    4,
    (32, 24, 16, 8),
    GptOssShape(64, 8, 2, 8, 64, 4, 2, 8, 2, 48, experts_implementation="eager"),
)


@dataclass
class Case:
    name: str
    family: str  # llama, mistral or gpt_oss
    batch: int
    seqlen: int
    position_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    breakdown: bool = False
    extra: dict = field(default_factory=dict)
    routes: tuple[str, ...] = ROUTES  # the first is the reference every other is checked with


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cases(shape: Shape, device: torch.device) -> list[Case]:
    doc = shape.long // shape.docs
    positions = torch.arange(doc, device=device).repeat(shape.docs)[None]
    mask = torch.zeros(shape.padded_rows, shape.short, dtype=torch.long, device=device)
    for row, length in enumerate(shape.padded_lengths):
        mask[row, :length] = 1
    padding = 1 - mask.float().mean().item()
    return [
        Case(f"dense, S={shape.long}", "llama", 1, shape.long, breakdown=True),
        Case(f"dense, S={shape.short}", "llama", 1, shape.short, breakdown=True),
        Case(
            f"packed {shape.docs}x{doc} documents", "llama", 1, shape.long, position_ids=positions
        ),
        Case(
            f"Mistral-shaped, sliding window {shape.window}, S={shape.long}",
            "mistral",
            1,
            shape.long,
        ),
        Case(
            f"padded B={shape.padded_rows}x{shape.short}, {padding:.0%} padding",
            "llama",
            shape.padded_rows,
            shape.short,
            attention_mask=mask,
        ),
        gpt_oss_case(shape),
    ]


def gpt_oss_case(shape: Shape) -> Case:
    g = shape.gpt_oss or GptOssShape()
    name = (
        f"GPT-OSS-20B-shaped ({g.layers} layers), sinks, sliding window {g.window} / full, "
        f"S={g.seqlen}"
    )
    return Case(name, "gpt_oss", 1, g.seqlen, routes=GPT_OSS_ROUTES)


def build_gpt_oss(shape: Shape, device: torch.device, dtype: torch.dtype):
    from transformers import GptOssConfig, GptOssForCausalLM

    g = shape.gpt_oss or GptOssShape()
    extra = {}
    if g.experts_implementation is not None:
        extra["experts_implementation"] = g.experts_implementation
    config = GptOssConfig(
        vocab_size=shape.vocab,
        hidden_size=g.hidden,
        intermediate_size=g.intermediate,
        num_hidden_layers=g.layers,  # layer_types alternate sliding and full attention
        num_attention_heads=g.heads,
        num_key_value_heads=g.kv_heads,
        head_dim=g.head_dim,
        num_local_experts=g.experts,
        num_experts_per_tok=g.experts_per_token,
        sliding_window=g.window,
        max_position_embeddings=max(g.seqlen, 2 * g.window),
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        **extra,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = GptOssForCausalLM(config)
    return model.to(dtype).train()


def build_model(family: str, shape: Shape, device: torch.device, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    if family == "gpt_oss":
        return build_gpt_oss(shape, device, dtype)

    common = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(shape.long, 2 * shape.window),
        rope_theta=500000.0,
    )
    torch.manual_seed(0)
    with torch.device(device):
        if family == "mistral":
            model = MistralForCausalLM(MistralConfig(**common, sliding_window=shape.window))
        else:
            model = LlamaForCausalLM(LlamaConfig(**common))
    return model.to(dtype).train()


def batch_for(case: Case, shape: Shape, device: torch.device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(3, shape.vocab, (case.batch, case.seqlen), generator=gen).to(device)
    labels = ids.clone()
    # use_cache=False as in training: with a cache transformers does not look for packed documents
    # in position_ids, and its sdpa/eager routes would attend across them.
    inputs = {"input_ids": ids, "labels": labels, "use_cache": False}
    if case.attention_mask is not None:
        inputs["attention_mask"] = case.attention_mask
        labels[case.attention_mask == 0] = -100
    if case.position_ids is not None:
        inputs["position_ids"] = case.position_ids
    return inputs


def train_step(model, inputs: dict) -> float:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach()


def set_route(model, route: str) -> None:
    model.set_attn_implementation(route)


def run_case(case: Case, args, shape: Shape, device: torch.device, dtype: torch.dtype) -> dict:
    log(f"case {case.name}: building the model")
    model = build_model(case.family, shape, device, dtype)
    inputs = batch_for(case, shape, device)
    result = {"case": case.name, "reference": case.routes[0], "routes": {}}
    reference_loss = None
    required = (case.routes[0], "attn_dispatch")
    for route in case.routes:
        entry: dict = {}
        result["routes"][route] = entry
        try:
            set_route(model, route)
            loss = float(train_step(model, inputs))
        except Exception as exc:  # a route that does not load or run here is reported, not fatal
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if route in required:
                raise
            entry["skipped"] = reason[:300]
            log(f"case {case.name}: {route} skipped ({entry['skipped']})")
            continue
        entry["first_loss"] = loss
        if reference_loss is None:
            reference_loss = loss
        elif abs(loss - reference_loss) > LOSS_TOLERANCE[dtype] * max(1.0, abs(reference_loss)):
            message = (
                f"first-step loss {loss:.6f} differs from {case.routes[0]}'s "
                f"{reference_loss:.6f} (relative tolerance {LOSS_TOLERANCE[dtype]:g}): not timed"
            )
            if route in required:
                raise SystemExit(f"case {case.name}: {route} {message}")
            entry["skipped"] = message
            log(f"case {case.name}: {route} skipped ({message})")
            continue
        log(f"case {case.name}: {route} loss {loss:.4f} ok; timing")
        entry["ms"] = _median_ms(functools.partial(train_step, model, inputs), device, args)
        log(f"case {case.name}: {route} {entry['ms']:.1f} ms/step")
    if case.breakdown:
        result["attention_alone"] = attention_alone(case, shape, device, dtype, args)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _median_ms(fn, device: torch.device, args) -> float:
    """Median over ``args.rounds`` of the mean time of ``args.steps`` calls, after warm-up."""
    return median_per_call(fn, device, args.warmup, args.rounds, args.steps) * 1e3


class _Layer(torch.nn.Module):
    """What transformers' attention interface reads of its attention module: the config's head
    counts, ``head_dim``, ``is_causal`` (the integration's call needs no weights)."""

    def __init__(self, shape: Shape):
        super().__init__()
        self.config = types.SimpleNamespace(
            num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads
        )
        self.head_dim = shape.hidden // shape.heads
        self.is_causal = True


# The breakdown's paths, in the order the table lists them
PATHS = (
    "sdpa",
    "attn_dispatch",
    "sdpa, transformers' layouts",
    "attn_dispatch, transformers' layouts",
)


def _attention_timings(batch: int, seqlen: int, shape: Shape, device, dtype, args) -> dict:
    """ms per call of one layer's attention through sdpa and attn_dispatch: forward alone (with
    autograd recording, as in training) and forward + backward. Each twice: on
    [B, H, S, D]-contiguous q, k, v (``layout="bhsd"``), and with the layouts a Llama layer
    hands its attention (sdpa as transformers' sdpa route calls it, attn_dispatch through the
    integration): q, k and v [B, H, S, D] views of [B, S, H, D] rows (the projections' rows,
    which the rotary embedding keeps), the output's gradient in [B, S, H, D] rows, as the
    output projection returns it."""
    from attn_dispatch.integrations import transformers as adt

    d = shape.hidden // shape.heads
    gen = torch.Generator(device="cpu").manual_seed(2)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=dtype).to(device).requires_grad_()

    heads = (shape.heads, shape.kv_heads, shape.kv_heads)
    q, k, v = (rand(batch, h, seqlen, d) for h in heads)
    rows = tuple(rand(batch, seqlen, h, d) for h in heads)
    grad = torch.randn_like(q)
    grad_rows = grad.transpose(1, 2).contiguous()
    layer = _Layer(shape)
    paths = {  # name: (forward, its leaves, the output's gradient)
        PATHS[0]: (
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            (q, k, v),
            grad,
        ),
        PATHS[1]: (lambda: ad.attention(q, k, v, causal=True, layout="bhsd"), (q, k, v), grad),
        # transformers' sdpa route: [B, H, S, D] views in, the output transposed back to rows
        PATHS[2]: (
            lambda: F.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in rows), is_causal=True, enable_gqa=True
            ).transpose(1, 2),
            rows,
            grad_rows,
        ),
        PATHS[3]: (
            lambda: adt.attention_forward(layer, *(t.transpose(1, 2) for t in rows), None)[0],
            rows,
            grad_rows,
        ),
    }
    out: dict[str, dict[str, float]] = {"forward": {}, "fwd_bwd": {}}
    steps = {}
    for name, (fn, leaves, gradient) in paths.items():

        def step(fn=fn, leaves=leaves, gradient=gradient):
            for t in leaves:
                t.grad = None
            fn().backward(gradient)

        steps[name] = step
        # both passes warmed before anything is timed: a first forward (a decision, a compile,
        # autograd's first graph) timed as "forward" was longer than a later forward+backward
        for _ in range(max(1, args.warmup)):
            step()
    sync(device)
    for name, (fn, _, _) in paths.items():
        out["forward"][name] = _median_ms(fn, device, args)
        out["fwd_bwd"][name] = _median_ms(steps[name], device, args)
    return out


def _chosen(batch: int, seqlen: int, shape: Shape, device, dtype) -> dict:
    """The implementations the integration's call runs at this shape: forward, backward."""
    d = shape.hidden // shape.heads
    q, k, v = (
        torch.randn(batch, seqlen, h, d, device=device, dtype=dtype)
        for h in (shape.heads, shape.kv_heads, shape.kv_heads)
    )
    opts = {"causal": True, "causal_align": "bottom_right"}
    forward = ad.decide(q, k, v, mode="forward", **opts)
    with torch.no_grad():
        out, lse = ad.forward(q, k, v, **opts)
    backward = ad.decide(q, k, v, out, lse, torch.randn_like(out), **opts)
    return {"forward": forward.name, "backward": backward.name}


def attention_alone(case: Case, shape: Shape, device: torch.device, dtype, args) -> dict:
    """One layer's attention alone, through each path (ms per layer): forward, forward +
    backward, and forward + backward at a tiny sequence length, where the time is the host's
    work per call (dispatch, checks, launches) rather than the kernels'."""
    full = _attention_timings(case.batch, case.seqlen, shape, device, dtype, args)
    tiny = _attention_timings(1, TINY_SEQLEN, shape, device, dtype, args)["fwd_bwd"]
    chosen = _chosen(case.batch, case.seqlen, shape, device, dtype)
    log(f"case {case.name}: attn_dispatch runs {chosen['forward']} / {chosen['backward']}")
    for name in full["fwd_bwd"]:
        log(
            f"case {case.name}: attention alone via {name}: forward {full['forward'][name]:.2f}"
            f" ms, forward+backward {full['fwd_bwd'][name]:.2f} ms, at S={TINY_SEQLEN}"
            f" {tiny[name]:.3f} ms (per layer)"
        )
    return {**full, "tiny_fwd_bwd": tiny, "tiny_seqlen": TINY_SEQLEN, "chosen": chosen}


def versions(device: torch.device) -> dict:
    import transformers

    commit = git_commit()
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_dispatch": ad.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "commit": commit or "unknown",
    }


def markdown(results: list[dict], shape: Shape) -> str:
    lines = []
    references = list(dict.fromkeys(r["reference"] for r in results))
    for reference in references:  # one table per reference route (sdpa; eager for GPT-OSS)
        if lines:
            lines.append("")
        lines += [
            f"| case | {reference} | attn_dispatch | speedup | other routes |",
            "|---|---|---|---|---|",
        ]
        for r in (r for r in results if r["reference"] == reference):
            routes = r["routes"]
            base, ours = routes[reference]["ms"], routes["attn_dispatch"]["ms"]
            others = "; ".join(
                f"{name}: {e['ms']:.1f} ms" if "ms" in e else f"{name}: skipped"
                for name, e in routes.items()
                if name not in (reference, "attn_dispatch")
            )
            lines.append(
                f"| {r['case']} | {base:.1f} ms | {ours:.1f} ms | {base / ours:.2f}x | {others} |"
            )
    layers = shape.layers
    lines += [
        "",
        f"One layer's attention alone (ms per layer; x {layers} layers is the model's share):",
        "",
        "| case | path | forward | forward+backward | x layers | share of sdpa step | "
        f"forward+backward at S={TINY_SEQLEN} (host) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "attention_alone" not in r:
            continue
        a, step = r["attention_alone"], r["routes"]["sdpa"]["ms"]
        for path in (p for p in PATHS if p in a["fwd_bwd"]):
            both = a["fwd_bwd"][path]
            lines.append(
                f"| {r['case']} | {path} | {a['forward'][path]:.2f} | {both:.2f} | "
                f"{both * layers:.1f} ms | {both * layers / step:.0%} | "
                f"{a['tiny_fwd_bwd'][path]:.3f} |"
            )
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny config on the CPU (about 1.5 min)"
    )
    parser.add_argument("--json", type=Path, help="write the results and versions here")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
    parser.add_argument("--cases", default=None, help="comma-separated case indices (0-5)")
    parser.add_argument(
        "--gpt-oss-seqlen",
        type=_positive,
        default=None,
        help=f"tokens of the GPT-OSS case (default {GptOssShape.seqlen})",
    )
    parser.add_argument(
        "--gpt-oss-layers",
        type=_positive,
        default=None,
        help=f"layers of the GPT-OSS case (default {GptOssShape.layers}; eager's score "
        "matrices take about 21 GB per layer at 8K)",
    )
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = 1 if args.smoke else 2
    from attn_dispatch.integrations import transformers as adt

    adt.register()
    if args.smoke:
        shape, device, dtype = SMOKE, torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            parser.error("no GPU: the full run needs one (use --smoke for the CPU check)")
        shape, device, dtype = Shape(gpt_oss=GptOssShape()), torch.device("cuda"), torch.bfloat16
    overrides = {"seqlen": args.gpt_oss_seqlen, "layers": args.gpt_oss_layers}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    shape = dataclasses.replace(shape, gpt_oss=dataclasses.replace(shape.gpt_oss, **overrides))
    selected = cases(shape, device)
    if args.cases:
        try:
            selected = [selected[int(i)] for i in args.cases.split(",")]
        except (ValueError, IndexError):
            parser.error(f"--cases: expected indices in 0..{len(selected) - 1}, got {args.cases!r}")
    results = [run_case(case, args, shape, device, dtype) for case in selected]
    env = versions(device)
    if args.smoke:  # a tiny CPU run checks that the routes run and agree; it is no benchmark
        print("smoke run: tiny CPU shapes; the times below are not results (noise dominates)\n")
    print(markdown(results, shape))
    print("\n" + ", ".join(f"{k} {v}" for k, v in env.items()))
    if args.json:
        args.json.write_text(json.dumps({"versions": env, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
