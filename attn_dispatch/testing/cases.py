"""Seeded test cases: shapes, masks and memory layouts that a backend must get right.

A :class:`Case` is a small frozen description (per-sequence lengths, heads, head dims, mask,
sliding window, soft cap, attention sinks, layout, seed); :meth:`Case.make_inputs` builds fresh
random tensors for a dtype and device. :func:`standard_cases` is a fixed list in which every
feature of plain attention appears at least once, :func:`variant_cases` one for sliding windows
and logit soft-capping and :func:`sink_cases` one for attention sinks (each run only by backends
that declare them); :func:`random_cases` draws more from a seed (windows and soft caps too with
``variants=True``, sinks with ``sinks=True``).

Layouts (how q, k, v, out, grad_out and lse sit in memory):

* ``contiguous`` — plain tensors;
* ``sliced`` — views into larger buffers (extra heads, padded head dim, padded lse rows), so
  strides are not the contiguous ones but the last dim is still contiguous;
* ``transposed`` — BSHD views of head-major storage (``[B, H, S, D]`` transposed), as produced
  by ``x.transpose(1, 2)`` of a BHSD tensor;
* ``strided`` — the last dim has stride 2 (many kernels reject this; the reasons are checked
  to be given, and the result compared when accepted).

A case's ``grad_layout`` puts grad_out in a layout of its own, so that its strides differ from
out's (a loss that reads the output through a transposed view hands such a gradient back).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

LAYOUTS = ("contiguous", "sliced", "transposed", "strided")


@dataclass(frozen=True)
class CaseInputs:
    """Tensors and flags of one case, ready for ``ad.backward(**inputs.kwargs(...))``."""

    q: Tensor
    k: Tensor
    v: Tensor
    grad_out: Tensor
    cu_seqlens_q: Tensor | None
    cu_seqlens_k: Tensor | None
    max_seqlen_q: int | None
    max_seqlen_k: int | None
    causal: bool
    causal_align: str
    scale: float | None
    window: tuple[int | None, int | None] | None = None
    softcap: float | None = None
    # [heads] sink logits (float32; float64 for float64 inputs), or None
    sinks: Tensor | None = None

    def flags(self) -> dict:
        """Keyword arguments shared by ``ad.forward`` / ``ad.backward`` / the oracle
        (``window`` / ``softcap`` / ``sinks`` only when set, so a callable without them still
        runs the plain cases)."""
        flags = {"causal": self.causal, "causal_align": self.causal_align, "scale": self.scale}
        if self.window is not None:
            flags["window"] = self.window
        if self.softcap is not None:
            flags["softcap"] = self.softcap
        if self.sinks is not None:
            flags["sinks"] = self.sinks
        if self.cu_seqlens_q is not None:
            flags.update(
                cu_seqlens_q=self.cu_seqlens_q,
                cu_seqlens_k=self.cu_seqlens_k,
                max_seqlen_q=self.max_seqlen_q,
                max_seqlen_k=self.max_seqlen_k,
            )
        return flags


@dataclass(frozen=True)
class Case:
    """One attention problem. Dense cases have equal lengths in every sequence. ``sinks``: the
    inputs carry ``[heads]`` sink logits (N(0, 1), drawn after the other tensors, so those are
    the same as without sinks). ``strided_vectors``: sinks and cu_seqlens are views of stride
    2 into tensors twice as long (valid input, which a kernel indexing them as ``X + i``
    misreads); the values are the same. A varlen case whose ``seqlens_q == seqlens_k`` passes
    one cu_seqlens tensor (or one strided view) as both ``cu_seqlens_q`` and ``cu_seqlens_k``,
    as self-attention callers do; unequal lengths get two. ``grad_layout``: grad_out's layout
    (``None``: ``layout``, as every other tensor's)."""

    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 32
    head_dim_v: int | None = None
    causal: bool = False
    causal_align: str = "top_left"
    varlen: bool = False
    layout: str = "contiguous"
    scale: float | None = None
    seed: int = 0
    tags: tuple[str, ...] = field(default=(), compare=False)
    window: tuple[int | None, int | None] | None = None
    softcap: float | None = None
    sinks: bool = False
    strided_vectors: bool = False
    grad_layout: str | None = None

    def __post_init__(self) -> None:
        if len(self.seqlens_q) != len(self.seqlens_k) or not self.seqlens_q:
            raise ValueError(
                f"seqlens_q/seqlens_k: expected equal non-empty tuples, got "
                f"{self.seqlens_q} and {self.seqlens_k}"
            )
        if not self.varlen and (len(set(self.seqlens_q)) > 1 or len(set(self.seqlens_k)) > 1):
            raise ValueError("seqlens: a dense case needs equal lengths; set varlen=True")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads: expected a multiple of kv_heads={self.kv_heads}, got {self.heads}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {self.layout!r}")
        if self.grad_layout is not None and (
            self.grad_layout not in LAYOUTS or self.grad_layout == self.layout
        ):
            raise ValueError(
                f"grad_layout: expected one of {LAYOUTS} other than layout={self.layout!r}, "
                f"or None, got {self.grad_layout!r}"
            )
        if self.window is not None and (
            len(self.window) != 2 or any(s is not None and s < 0 for s in self.window)
        ):
            raise ValueError(
                f"window: expected (left, right) of ints >= 0 or None, got {self.window}"
            )
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap: expected a float > 0, got {self.softcap}")

    @property
    def needs(self) -> tuple[str, ...]:
        """The optional capabilities this case exercises (``"window"``, ``"softcap"``,
        ``"sinks"``)."""
        used = (("window", self.window), ("softcap", self.softcap), ("sinks", self.sinks or None))
        return tuple(name for name, value in used if value is not None)

    @property
    def dv(self) -> int:
        """The value head dim (``head_dim`` unless given)."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def has_masked_rows(self) -> bool:
        """Whether some query row sees no key (its lse is -inf; with sinks it is the sink's
        logit and its output 0)."""
        from .oracle import visible_mask

        for sq, sk in zip(self.seqlens_q, self.seqlens_k, strict=True):
            mask = visible_mask(sq, sk, self.causal, self.causal_align, window=self.window)
            if sq and not bool(mask.any(dim=1).all()):
                return True
        return False

    @property
    def id(self) -> str:
        """A short readable id for pytest."""
        if self.varlen:
            lens = "varlen" + "_".join(f"{a}x{b}" for a, b in zip(self.seqlens_q, self.seqlens_k))
        else:
            lens = f"b{self.batch}_sq{self.seqlens_q[0]}_sk{self.seqlens_k[0]}"
        mask = (
            ("causal_tl" if self.causal_align == "top_left" else "causal_br")
            if self.causal
            else "full"
        )
        if self.window is not None:
            sides = ("inf" if s is None else str(s) for s in self.window)
            align = "tl" if self.causal_align == "top_left" else "br"
            mask += f"-win{'_'.join(sides)}{align}"
        scale = "" if self.scale is None else f"-scale{self.scale:g}"
        cap = "" if self.softcap is None else f"-cap{self.softcap:g}"
        cap += "-sinks" if self.sinks else ""
        cap += "-svec" if self.strided_vectors and (self.sinks or self.varlen) else ""
        cap += "" if self.grad_layout is None else f"-grad_{self.grad_layout}"
        return (
            f"{lens}-h{self.heads}kv{self.kv_heads}-d{self.head_dim}v{self.dv}-{mask}"
            f"-{self.layout}{scale}{cap}-s{self.seed}"
        )

    def make_inputs(self, dtype: torch.dtype = torch.float32, device="cpu") -> CaseInputs:
        """Fresh random q, k, v, grad_out (N(0, 1), seeded) in this case's layout, and sinks
        when the case has them (float32; float64 for float64 inputs)."""
        gen = torch.Generator().manual_seed(self.seed)
        b, h, hkv, d, dv = self.batch, self.heads, self.kv_heads, self.head_dim, self.dv
        if self.varlen:
            tq, tk = sum(self.seqlens_q), sum(self.seqlens_k)
            shapes = {"q": (tq, h, d), "k": (tk, hkv, d), "v": (tk, hkv, dv), "do": (tq, h, dv)}
        else:
            sq, sk = self.seqlens_q[0], self.seqlens_k[0]
            shapes = {
                "q": (b, sq, h, d),
                "k": (b, sk, hkv, d),
                "v": (b, sk, hkv, dv),
                "do": (b, sq, h, dv),
            }
        made = {
            name: place(
                torch.randn(shape, generator=gen, dtype=torch.float64),
                (self.grad_layout or self.layout) if name == "do" else self.layout,
                dtype,
                device,
            )
            for name, shape in shapes.items()
        }
        cu_q = cu_k = None
        max_q = max_k = None
        if self.varlen:
            cu_q = _cumulative(self.seqlens_q, device)
            # equal lengths: one tensor as both, as self-attention callers pass it; some
            # kernels accept only that, and it is what makes the causal alignments agree
            same = self.seqlens_q == self.seqlens_k
            cu_k = cu_q if same else _cumulative(self.seqlens_k, device)
            max_q, max_k = max(self.seqlens_q), max(self.seqlens_k)
        sinks = None
        if self.sinks:
            sinks = torch.randn(h, generator=gen, dtype=torch.float64)
            sinks = sinks.to(dtype=_sinks_dtype(dtype), device=device)
        if self.strided_vectors:
            shared = cu_q is not None and cu_q is cu_k
            cu_q, cu_k, sinks = (
                None if t is None else _every_other(t) for t in (cu_q, cu_k, sinks)
            )
            cu_k = cu_q if shared else cu_k  # one strided view as both
        return CaseInputs(
            made["q"],
            made["k"],
            made["v"],
            made["do"],
            cu_q,
            cu_k,
            max_q,
            max_k,
            self.causal,
            self.causal_align,
            self.scale,
            self.window,
            self.softcap,
            sinks,
        )


def _sinks_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _every_other(t: Tensor) -> Tensor:
    """``t``'s values as a view of stride 2 into a tensor twice as long (the slots between
    them hold other values, as the rest of a caller's buffer would)."""
    buf = torch.full((t.numel(), 2), -1, dtype=t.dtype, device=t.device)
    buf[:, 0] = t
    buf[:, 1] = 99 if not t.is_floating_point() else 7.0
    return buf[:, 0]


def _cumulative(lengths: Sequence[int], device) -> Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def place(values: Tensor, layout: str, dtype: torch.dtype, device) -> Tensor:
    """A tensor equal to ``values`` (cast to ``dtype``, on ``device``) stored as ``layout`` says.

    Works for any rank >= 2; "transposed" swaps the two dims before the last (BSHD <-> BHSD
    storage) and needs rank >= 3, else it falls back to "sliced".
    """
    values = values.to(dtype=dtype, device=device)
    if layout == "contiguous":
        return values.contiguous()
    if layout == "transposed" and values.dim() >= 3:
        return values.transpose(-2, -3).contiguous().transpose(-2, -3)
    if layout == "strided":
        buf = torch.full(
            (*values.shape[:-1], 2 * values.shape[-1]), float("nan"), dtype=dtype, device=device
        )
        buf[..., ::2] = values
        return buf[..., ::2]
    # "sliced": one extra slot in each dim but the first, and the last dim padded by 3
    pad = [0] + [1] * (values.dim() - 2) + [3]
    buf = torch.full(
        [n + p for n, p in zip(values.shape, pad, strict=True)],
        float("nan"),
        dtype=dtype,
        device=device,
    )
    view = buf[tuple(slice(0, n) for n in values.shape)]
    view.copy_(values)
    return view


def standard_cases() -> list[Case]:
    """A fixed list covering every feature at small sizes (a few dozen ms each on the CPU)."""
    c = Case
    return [
        c((64,), (64,), tags=("basic",)),
        c((37, 37), (53, 53), heads=4, kv_heads=4, head_dim=24, seed=1, tags=("odd",)),
        c(
            (53,),
            (37,),
            heads=8,
            kv_heads=2,
            head_dim=16,
            head_dim_v=24,
            seed=2,
            tags=("gqa", "dv"),
        ),
        c((48,), (48,), heads=8, kv_heads=1, head_dim=64, causal=True, seed=3, tags=("mqa",)),
        c(
            (40, 40),
            (72, 72),
            heads=4,
            kv_heads=2,
            head_dim=32,
            causal=True,
            seed=4,
            tags=("causal_tl", "sq<sk"),
        ),
        c(
            (40,),
            (72,),
            heads=4,
            kv_heads=1,
            head_dim=32,
            causal=True,
            causal_align="bottom_right",
            seed=5,
            tags=("causal_br", "sq<sk"),
        ),
        c(
            (72,),
            (40,),
            heads=4,
            kv_heads=4,
            head_dim=32,
            causal=True,
            causal_align="bottom_right",
            seed=6,
            tags=("causal_br", "masked_rows"),
        ),
        c(
            (72,),
            (40,),
            heads=8,
            kv_heads=4,
            head_dim=32,
            causal=True,
            seed=7,
            tags=("causal_tl", "sq>sk"),
        ),
        c(
            (33,),
            (33,),
            heads=2,
            kv_heads=2,
            head_dim=40,
            head_dim_v=8,
            scale=0.7,
            seed=8,
            tags=("scale", "dv"),
        ),
        c(
            (64,),
            (64,),
            heads=4,
            kv_heads=2,
            head_dim=32,
            causal=True,
            layout="sliced",
            seed=9,
            tags=("noncontig",),
        ),
        c(
            (50, 50),
            (50, 50),
            heads=4,
            kv_heads=4,
            head_dim=32,
            layout="transposed",
            seed=10,
            tags=("noncontig",),
        ),
        c(
            (24,),
            (24,),
            heads=2,
            kv_heads=1,
            head_dim=16,
            layout="strided",
            seed=11,
            tags=("noncontig", "strided"),
        ),
        c(
            (77, 77),
            (77, 77),
            heads=6,
            kv_heads=2,
            head_dim=64,
            causal=True,
            grad_layout="transposed",
            seed=36,
            tags=("noncontig", "grad_layout"),
        ),
        # one token of one head sliced from wider rows: contiguous to torch, whose size-1 dims
        # keep the wider rows' strides (a kernel that reads them faulted: benchmarks.md §9)
        c(
            (1,),
            (1,),
            heads=1,
            kv_heads=1,
            head_dim=64,
            causal=True,
            causal_align="bottom_right",
            varlen=True,
            layout="sliced",
            seed=37,
            tags=("noncontig", "single_token"),
        ),
        c(
            (17, 0, 40, 9),
            (23, 5, 40, 0),
            heads=4,
            kv_heads=2,
            head_dim=32,
            varlen=True,
            seed=12,
            tags=("varlen", "empty", "masked_rows"),
        ),
        c(
            (30, 1, 45),
            (30, 60, 20),
            heads=8,
            kv_heads=2,
            head_dim=16,
            head_dim_v=32,
            causal=True,
            varlen=True,
            seed=13,
            tags=("varlen", "causal_tl"),
        ),
        c(
            (30, 1, 45, 0),
            (30, 60, 20, 7),
            heads=4,
            kv_heads=4,
            head_dim=32,
            causal=True,
            causal_align="bottom_right",
            varlen=True,
            seed=14,
            tags=("varlen", "causal_br", "masked_rows", "empty"),
        ),
        c(
            (20, 33),
            (25, 33),
            heads=4,
            kv_heads=1,
            head_dim=32,
            causal=True,
            varlen=True,
            layout="sliced",
            seed=15,
            tags=("varlen", "noncontig"),
        ),
        # self-attention varlen: one cu_seqlens tensor as both, so the two causal alignments
        # agree (a top-left-only kernel runs this bottom-right case), and the implementations
        # that take varlen only with shared offsets run it
        c(
            (19, 0, 40),
            (19, 0, 40),
            heads=4,
            kv_heads=2,
            head_dim=32,
            causal=True,
            causal_align="bottom_right",
            varlen=True,
            seed=17,
            tags=("varlen", "shared_offsets", "causal_br", "empty", "gqa"),
        ),
        c((128,), (128,), heads=2, kv_heads=2, head_dim=128, causal=True, seed=16, tags=("d128",)),
    ]


def variant_cases() -> list[Case]:
    """Sliding windows and soft caps: one-sided and two-sided windows, both alignments with
    Sq != Sk, bands that leave rows without keys, soft cap alone and combined, varlen and GQA.
    A backend runs these only when it declares ``window`` / ``softcap``."""
    c = Case
    return [
        c((64,), (64,), window=(8, 0), seed=20, tags=("window", "sliding")),
        c(
            (48,),
            (80,),
            heads=4,
            kv_heads=2,
            window=(16, None),
            causal=True,
            causal_align="bottom_right",
            seed=21,
            tags=("window", "causal_br", "sq<sk", "gqa"),
        ),
        c(
            (40, 40),
            (72, 72),
            window=(5, 9),
            seed=22,
            tags=("window", "two_sided", "sq<sk"),
        ),
        c(
            (72,),
            (40,),
            heads=4,
            kv_heads=1,
            window=(None, 3),
            causal_align="bottom_right",
            seed=23,
            tags=("window", "right_only", "sq>sk", "masked_rows"),
        ),
        c(
            (60,),
            (24,),
            window=(2, 0),
            seed=24,
            tags=("window", "sq>sk", "masked_rows"),
        ),
        c((33,), (33,), head_dim=40, head_dim_v=24, window=(0, 0), seed=25, tags=("window", "dv")),
        c((50,), (50,), heads=4, kv_heads=2, softcap=2.0, seed=26, tags=("softcap", "gqa")),
        c(
            (45,),
            (70,),
            causal=True,
            causal_align="bottom_right",
            softcap=1.5,
            scale=0.4,
            seed=27,
            tags=("softcap", "causal_br", "scale"),
        ),
        c(
            (56,),
            (56,),
            heads=8,
            kv_heads=2,
            window=(12, 4),
            softcap=3.0,
            layout="sliced",
            seed=28,
            tags=("window", "softcap", "noncontig"),
        ),
        c(
            (30, 1, 45, 0),
            (30, 60, 20, 7),
            heads=4,
            kv_heads=2,
            window=(6, 2),
            causal_align="bottom_right",
            varlen=True,
            seed=29,
            tags=("varlen", "window", "masked_rows", "empty"),
        ),
        c(
            (17, 40, 9),
            (23, 40, 0),
            heads=4,
            kv_heads=1,
            window=(10, None),
            causal=True,
            softcap=2.5,
            varlen=True,
            seed=30,
            tags=("varlen", "window", "softcap", "masked_rows"),
        ),
    ]


def sink_cases() -> list[Case]:
    """Attention sinks, alone and with every other feature: GQA, both alignments, rows that
    see no key (where the sink takes all the mass: out 0, lse the sink's logit), windows, soft
    caps, varlen with empty sequences, non-contiguous layouts. A backend runs these only when
    it declares ``sinks``."""
    c = Case
    return [
        c((64,), (64,), sinks=True, seed=40, tags=("sinks",)),
        c((48,), (48,), heads=8, kv_heads=2, causal=True, sinks=True, seed=41, tags=("sinks",)),
        c(
            (72,),
            (40,),
            heads=4,
            kv_heads=1,
            causal=True,
            causal_align="bottom_right",
            sinks=True,
            seed=42,
            tags=("sinks", "causal_br", "masked_rows"),
        ),
        c(
            (40, 40),
            (72, 72),
            heads=4,
            kv_heads=2,
            causal=True,
            layout="transposed",
            sinks=True,
            seed=43,
            tags=("sinks", "causal_tl", "sq<sk", "noncontig"),
        ),
        c(
            (56,),
            (56,),
            heads=8,
            kv_heads=2,
            window=(12, 0),
            softcap=3.0,
            layout="sliced",
            sinks=True,
            seed=44,
            tags=("sinks", "window", "softcap", "noncontig"),
        ),
        c(
            (60,),
            (24,),
            window=(2, 0),
            sinks=True,
            seed=45,
            tags=("sinks", "window", "sq>sk", "masked_rows"),
        ),
        c(
            (17, 0, 40, 9),
            (23, 5, 40, 0),
            heads=4,
            kv_heads=2,
            varlen=True,
            sinks=True,
            seed=46,
            tags=("sinks", "varlen", "empty", "masked_rows"),
        ),
        c(
            (30, 1, 45, 0),
            (30, 60, 20, 7),
            heads=8,
            kv_heads=2,
            head_dim=16,
            head_dim_v=32,
            causal=True,
            causal_align="bottom_right",
            varlen=True,
            sinks=True,
            seed=47,
            tags=("sinks", "varlen", "causal_br", "masked_rows", "dv"),
        ),
    ]


def _draw_variant(rng: random.Random, max_seqlen: int) -> dict:
    """A window and/or a soft cap (at least one) for a random case."""

    def side() -> int | None:
        return rng.choice([None, 0, 1, rng.randint(2, 12), rng.randint(2, max_seqlen)])

    kind = rng.choice(["window", "window", "softcap", "both"])
    drawn: dict = {}
    if kind != "softcap":
        window = (side(), side())
        drawn["window"] = window if window != (None, None) else (rng.randint(0, 8), None)
    if kind != "window":
        drawn["softcap"] = round(rng.uniform(1.0, 6.0), 2)
    return drawn


def _random_variant(rng: random.Random, max_seqlen: int) -> dict:
    drawn = _draw_variant(rng, max_seqlen)
    return drawn | {"tags": ("random", *drawn)}


def random_cases(
    n: int,
    seed: int = 0,
    *,
    max_seqlen: int = 96,
    head_dims: Sequence[int] = (8, 16, 24, 32, 40, 64, 128),
    same_head_dim_v: bool = False,
    group_sizes: Sequence[int] = (1, 2, 4, 8),
    max_kv_heads: int = 3,
    layouts: Sequence[str] = ("contiguous", "contiguous", "sliced", "transposed"),
    varlen: bool | None = None,
    causal: bool | None = None,
    variants: bool = False,
    sinks: bool = False,
) -> list[Case]:
    """``n`` seeded random cases. ``varlen``/``causal`` None draws both; lengths include 0, 1
    and odd values; Sq != Sk is common; bottom-right with Sq > Sk yields fully masked rows.
    ``variants``: every case also gets a sliding window and/or a soft cap (drawn from their own
    stream, so the rest of each case is the one drawn without them). ``sinks``: every case also
    has attention sinks.
    A custom scale is drawn within [0.3, 2] x 1/sqrt(D): much larger scales make the softmax so
    peaked that dS = P(dP - rowsum(dO·O)) cancels and a low-precision ``out`` dominates."""
    rng = random.Random(seed)
    variant_rng = random.Random(seed * 1_000_003 + 17)

    def length() -> int:
        return rng.choice([0, 1, rng.randint(2, max_seqlen), rng.randint(2, max_seqlen)])

    cases = []
    for i in range(n):
        is_varlen = rng.random() < 0.35 if varlen is None else varlen
        is_causal = rng.random() < 0.6 if causal is None else causal
        batch = rng.randint(1, 4)
        if is_varlen:
            sq = tuple(length() for _ in range(batch))
            sk = tuple(length() for _ in range(batch))
        else:
            a = rng.randint(1, max_seqlen)
            b = a if rng.random() < 0.4 else rng.randint(1, max_seqlen)
            sq, sk = (a,) * batch, (b,) * batch
        d = rng.choice(list(head_dims))
        dv = d if same_head_dim_v or rng.random() < 0.6 else rng.choice(list(head_dims))
        kv = rng.randint(1, max_kv_heads)
        cases.append(
            Case(
                sq,
                sk,
                heads=kv * rng.choice(list(group_sizes)),
                kv_heads=kv,
                head_dim=d,
                head_dim_v=dv,
                causal=is_causal,
                causal_align=rng.choice(["top_left", "bottom_right"]),
                varlen=is_varlen,
                layout=rng.choice(list(layouts)),
                scale=None if rng.random() < 0.7 else round(rng.uniform(0.3, 2.0) / d**0.5, 4),
                seed=seed * 100_003 + i,
                sinks=sinks,
                **(_random_variant(variant_rng, max_seqlen) if variants else {"tags": ("random",)}),
            )
        )
    return cases
