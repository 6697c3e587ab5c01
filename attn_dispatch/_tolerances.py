"""Per-dtype tolerances for comparing a backend's results with the float64 oracle.

One table for every comparison the project makes: the conformance kit's against the oracle
(``attn_dispatch.testing.tolerances`` re-exports it), and the cross-checks of autotune, the
``bench`` command and the cost-table writer (through :mod:`attn_dispatch._measure`).

Each result tensor is compared as a whole, with two scale-free metrics (``ref`` is the oracle):

* ``max_err = max|x - ref| / max|ref|``  — the worst element, relative to the tensor's scale;
* ``rel_l2  = ||x - ref||₂ / ||ref||₂``  — the typical error.

For gradients the scale is floored at a tenth of the largest of ``max|dq|, max|dk|, max|dv|``
(see :func:`error_metrics`): a gradient that is zero in exact arithmetic (a query that sees a
single key has ``dq = 0``) is otherwise compared against its own rounding noise.

Element-wise ``rtol`` is not used for gradients: long sums make values cross zero, where any
relative bound fails for a correct kernel. ``lse`` is log-domain and compared element-wise with
``|x - ref| <= lse_atol + lse_rtol·|ref|``; its ``-inf`` entries must match exactly.

How the numbers were chosen. The oracle runs on the *same* (already rounded) inputs in float64,
so input rounding is not counted; what remains is the kernel's own arithmetic plus rounding of
its outputs to the input dtype (unit roundoff ``u``: bf16 3.9e-3, f16 4.9e-4, f32 6.0e-8).
A simulated flash-style kernel (fp32 accumulation, P and dS rounded to the input dtype before
their matmuls) measured at most: bf16 max_err 5.3e-3, rel_l2 2.5e-3; f16 max_err 7.4e-4,
rel_l2 3.1e-4 (seqlen 128–2048, head dim 64–256, causal or not). The bounds below leave a margin
of about 4x over that for bf16/f16. float32 is held to true float32 arithmetic (a kernel that
silently uses TF32 for float32 inputs fails it; pass ``tol=TF32`` to accept that knowingly).
float64 allows only summation-order differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "BFLOAT16",
    "FLOAT16",
    "FLOAT32",
    "FLOAT64",
    "TF32",
    "Tolerance",
    "error_metrics",
    "tolerance_for",
]


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one dtype (see the module docstring for the metrics)."""

    max_err: float
    rel_l2: float
    lse_atol: float
    lse_rtol: float


FLOAT64 = Tolerance(max_err=1e-10, rel_l2=1e-11, lse_atol=1e-10, lse_rtol=1e-12)
FLOAT32 = Tolerance(max_err=1e-4, rel_l2=2e-5, lse_atol=1e-4, lse_rtol=1e-5)
#: For kernels that compute float32 inputs with TF32 matmuls (10-bit mantissa).
TF32 = Tolerance(max_err=1e-2, rel_l2=4e-3, lse_atol=2e-3, lse_rtol=1e-3)
FLOAT16 = Tolerance(max_err=4e-3, rel_l2=2e-3, lse_atol=1e-3, lse_rtol=1e-3)
BFLOAT16 = Tolerance(max_err=2e-2, rel_l2=1e-2, lse_atol=2e-3, lse_rtol=1e-3)

_BY_DTYPE = {
    torch.float64: FLOAT64,
    torch.float32: FLOAT32,
    torch.float16: FLOAT16,
    torch.bfloat16: BFLOAT16,
}


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The default tolerance for results computed from inputs of ``dtype``."""
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"dtype: expected one of {list(_BY_DTYPE)}, got {dtype}") from None


def error_metrics(x: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> tuple[float, float]:
    """``(max_err, rel_l2)`` of ``x`` against ``ref`` (both as float64).

    ``floor`` bounds the normalising scale from below (``max|ref|`` by ``floor``, ``||ref||₂`` by
    ``floor·sqrt(numel)``), so a gradient that is exactly zero in theory but only ~1e-14 in
    practice is judged against the scale of its siblings. With a zero scale, ``x`` must be all
    zero (else the metrics are ``inf``).
    """
    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    if ref.numel() == 0:
        return 0.0, 0.0
    diff = x - ref
    scale = max(ref.abs().max().item(), floor)
    norm = max(ref.norm().item(), floor * ref.numel() ** 0.5)
    if scale == 0.0:
        worst = diff.abs().max().item()
        return (0.0, 0.0) if worst == 0.0 else (float("inf"), float("inf"))
    return diff.abs().max().item() / scale, diff.norm().item() / norm
