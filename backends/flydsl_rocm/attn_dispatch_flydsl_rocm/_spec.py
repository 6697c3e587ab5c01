"""What identifies one compiled kernel (plain Python, no flydsl import)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ARCHS = ("gfx942", "gfx950")
DTYPES = ("bf16", "f16")


@dataclass(frozen=True)
class KernelSpec:
    """One kernel build. The softmax scale is a run-time argument and deliberately absent."""

    kind: str  # "preprocess" | "main" | "convert"
    arch: str
    dtype: str
    head_dim: int
    varlen: bool = False
    variant: str = ""  # main only: "gfx950_fused" | "gfx942_mfma"
    causal: bool = False  # main only
    group: int = 1  # main only: query heads per kv head

    def key(self) -> str:
        """Stable cache key: arch, dtype, head dim, tiles (variant), causal, varlen, GQA ratio."""
        parts = [self.kind, self.arch, self.dtype, f"d{self.head_dim}"]
        if self.kind == "main":
            parts += [self.variant, "causal" if self.causal else "full", f"g{self.group}"]
        parts.append("varlen" if self.varlen else "dense")
        return "-".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


def specs_for(
    variant: str, arch: str, dtype: str, head_dim: int, causal: bool, varlen: bool, group: int
) -> list[KernelSpec]:
    """The three kernels one backward runs: preprocess -> main -> convert."""
    return [
        KernelSpec("preprocess", arch, dtype, head_dim, varlen),
        KernelSpec("main", arch, dtype, head_dim, varlen, variant, causal, group),
        KernelSpec("convert", arch, dtype, head_dim, varlen),
    ]
