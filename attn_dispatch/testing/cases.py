"""Seeded test cases: shapes, masks and memory layouts that a backend must get right.

A :class:`Case` is a small frozen description (per-sequence lengths, heads, head dims, mask,
layout, seed); :meth:`Case.make_inputs` builds fresh random tensors for a dtype and device.
:func:`standard_cases` is a fixed list in which every feature appears at least once;
:func:`random_cases` draws more from a seed.

Layouts (how q, k, v, out, grad_out and lse sit in memory):

* ``contiguous`` — plain tensors;
* ``sliced`` — views into larger buffers (extra heads, padded head dim, padded lse rows), so
  strides are not the contiguous ones but the last dim is still contiguous;
* ``transposed`` — BSHD views of head-major storage (``[B, H, S, D]`` transposed), as produced
  by ``x.transpose(1, 2)`` of a BHSD tensor;
* ``strided`` — the last dim has stride 2 (many kernels reject this; the reasons are checked
  to be given, and the result compared when accepted).
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

    def flags(self) -> dict:
        """Keyword arguments shared by ``ad.forward`` / ``ad.backward`` / the oracle."""
        flags = {"causal": self.causal, "causal_align": self.causal_align, "scale": self.scale}
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
    """One attention problem. Dense cases have equal lengths in every sequence."""

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

    @property
    def dv(self) -> int:
        """The value head dim (``head_dim`` unless given)."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def has_masked_rows(self) -> bool:
        """Whether some query row sees no key (its lse is -inf)."""
        for sq, sk in zip(self.seqlens_q, self.seqlens_k, strict=True):
            bottom_right = self.causal and self.causal_align == "bottom_right"
            if sq and (sk == 0 or (bottom_right and sq > sk)):
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
        scale = "" if self.scale is None else f"-scale{self.scale:g}"
        return (
            f"{lens}-h{self.heads}kv{self.kv_heads}-d{self.head_dim}v{self.dv}-{mask}"
            f"-{self.layout}{scale}-s{self.seed}"
        )

    def make_inputs(self, dtype: torch.dtype = torch.float32, device="cpu") -> CaseInputs:
        """Fresh random q, k, v, grad_out (N(0, 1), seeded) in this case's layout."""
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
                torch.randn(shape, generator=gen, dtype=torch.float64), self.layout, dtype, device
            )
            for name, shape in shapes.items()
        }
        cu_q = cu_k = None
        max_q = max_k = None
        if self.varlen:
            cu_q = _cumulative(self.seqlens_q, device)
            cu_k = _cumulative(self.seqlens_k, device)
            max_q, max_k = max(self.seqlens_q), max(self.seqlens_k)
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
        )


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
        c((128,), (128,), heads=2, kv_heads=2, head_dim=128, causal=True, seed=16, tags=("d128",)),
    ]


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
) -> list[Case]:
    """``n`` seeded random cases. ``varlen``/``causal`` None draws both; lengths include 0, 1
    and odd values; Sq != Sk is common; bottom-right with Sq > Sk yields fully masked rows.
    A custom scale is drawn within [0.3, 2] x 1/sqrt(D): much larger scales make the softmax so
    peaked that dS = P(dP - rowsum(dO·O)) cancels and a low-precision ``out`` dominates."""
    rng = random.Random(seed)

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
                tags=("random",),
            )
        )
    return cases
