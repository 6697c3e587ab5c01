"""Entry point of the flash_attn_cute backend: ``flash_attn_cute:sm90`` and ``:sm100``.

FlashAttention-4 (distribution ``flash-attn-4``, package ``flash_attn.cute``): CuTe-DSL
kernels JIT-compiled per variant, forward and backward, for Hopper (sm_90) and Blackwell
(sm_100, sm_103). One implementation per arch family, since their head dims differ. Cheap to
import: FA4 and CUTLASS are imported on the first kernel call (``_fa4``); ``supports`` reads
package metadata alone (``_support``).

On by default on Hopper; opt-in on Blackwell (``ad.enable("flash_attn_cute")`` or
``ATTN_DISPATCH_ENABLE``, or force it), with that reason: it has not run on Blackwell hardware.

Capabilities (class attributes; the core writes the reasons): CUDA only, bf16/f16, dense and
varlen, GQA/MQA native (K/V read with Hkv heads, dK/dV returned with Hkv heads), both causal
alignments: FA4's causal mask is bottom-right aligned, and a top-left mask with Sq != Sk is
passed as FA4's window ``(None, Sq - Sk)``, which is exactly the top-left mask; sliding windows
(the top-left diagonal shifted onto FA4's the same way), soft caps and attention sinks (FA4's
``learnable_sink``, forward and backward; such calls rank below triton where no cost table
covers them, as calls with a soft cap do). On
sm_90 only the head dims D = Dv that the installed release's row of ``_releases.RELEASES``
proves (the head-dim GPU test, tests/test_flash_attn_cute_head_dims_gpu.py, showed the output
and every gradient correct): FA4's sm_90 backward returns wrong dQ (and dK/dV with GQA) at D =
8, 16, 40, 48, 72, 80, 104 and 112 in 4.0.0b36 and 4.0.0b40, 4.0.0b36 asserts D == Dv with
GQA, and its forward with D = 8 < Dv makes an illegal memory access; each refusal names its
defect. ``supports`` adds what the attributes cannot say: the installed FA4 being a release
with a row (any other keeps the backend off until that test and the GPU suite pass on it), the
row's sm_90 head dims, top-left varlen with distinct cu_seqlens (rejected: the window is one
value per call), and Blackwell's (D, Dv) pairs. Deterministic:
FA4's backward has a deterministic mode (dQ/dK/dV reductions ordered by semaphores), used when
the call asks for determinism; otherwise the faster atomic one runs.

Priorities (design and measurements: docs/backends/flash_attn_cute.md, docs/benchmarks.md):
60 on sm_90, above cuDNN (50) and triton (45 / 43). Where the recorded cost table
(``costs/sm_90.json``, ``cost_tables`` below) covers a call, the measured implementations rank
by predicted time instead (``attn_dispatch._costs``). Outside its coverage on sm_90: a call
with attention sinks or a soft cap ranks ``VARIANT_PRIORITY`` (44, below triton:fused), and in
eager execution a short backward whose every call runs FA4's host code (varlen, the replay
switched off, or a release the replay was not proven on; B*H <= 8, Sk <= 2048) ranks
``EAGER_HOST_BOUND_PRIORITY`` (42, below every other GPU implementation). Dense calls otherwise
(attention sinks included) rank the same in every execution mode: FA4's host code is replayed
per signature (``_replay``), so a call costs less host time than any other GPU
implementation's. 60 on sm_100/sm_103,
opt-in: FA4 is written for Blackwell; not run or measured by this project there.
"""

from __future__ import annotations

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

from . import _fa4
from ._support import (
    fa4_problem,
    installed_version,
    mask_problem,
    sm90_head_dim_problem,
    sm100_head_dim_problem,
    softcap_problem,
)

PRIORITY = 60
# Eager execution on sm_90 where FA4's host code runs on every call (varlen calls, which are
# not replayed, or the replay switched off): a short backward ranks below every other GPU
# implementation (cuDNN 50, triton 43-45): there FA4's host time per call is well above cuDNN's
# and triton:fused's, which makes their end-to-end latency the lower (figures:
# docs/backends/flash_attn_cute.md). Replayed dense calls need no such rule (docs/benchmarks.md
# section 6).
EAGER_HOST_BOUND_PRIORITY = 42
# Calls with attention sinks or a soft cap where no cost table covers them: below triton:fused
# (45). Both pass the randomized sweep on sm_90 (docs/benchmarks.md section 9), but the
# benchmarks found FA4 slower than triton with a soft cap and timed sinks only on GPT-OSS's
# shapes: a shape nobody timed is not assumed fast. Inside a table's coverage the measured times
# rank it.
VARIANT_PRIORITY = 44


EAGER_HOST_BOUND_HEADS = 8  # B*H at most this ...
EAGER_HOST_BOUND_SK = 2048  # ... and Sk at most this


def replay_off() -> bool:
    """Whether dense calls run FA4's host code every time: ``ATTN_DISPATCH_FA4_REPLAY=0`` or a
    release the replay was not proven on (varlen calls always do)."""
    return not _fa4.replay_enabled()


# A short eager backward (B*H <= 8, Sk <= 2048) on sm_90 whose every call runs FA4's host code:
# varlen, or a dense call with the replay off. Dense calls with the replay on never match:
# ``replay_off`` is asked only for them.
_HOST_BOUND = dict(
    arch="sm_90",
    priority=EAGER_HOST_BOUND_PRIORITY,
    execution="eager",
    backward=True,
    max_batch_heads=EAGER_HOST_BOUND_HEADS,
    max_seqlen_k=EAGER_HOST_BOUND_SK,
)
SM90_PRIORITY_RULES = (
    adb.PriorityRule(**_HOST_BOUND, varlen=True),
    adb.PriorityRule(**_HOST_BOUND, varlen=False, when=replay_off),
    adb.PriorityRule("sm_90", VARIANT_PRIORITY, sinks=True),
    adb.PriorityRule("sm_90", VARIANT_PRIORITY, softcap=True),
)


class FlashAttnCute(adb.Implementation):
    """FA4 forward and backward; subclasses fix the arch family and its head dims."""

    backend = "flash_attn_cute"
    # its kernels' versions, recorded by its cost tables (costs/)
    cost_requires = ("flash-attn-4", "nvidia-cutlass-dsl")
    deterministic = True  # FA4's deterministic backward runs when the call asks for it
    vendors = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)  # fp8 is forward-only in FA4: not offered
    window = True  # FA4's window_size_left / right, the alignment mapped exactly (_support)
    softcap = True  # FA4's softcap: c tanh(s / c) on the scaled scores, as the contract
    sinks = True  # FA4's learnable_sink (its lse includes the sinks, as the contract's)

    def fast_paths(self) -> list[adb.FastPath]:
        """FA4's host-code replay: on with a release it was proven on (``_releases``) unless
        ``ATTN_DISPATCH_FA4_REPLAY`` turns it off."""
        name = "host-code replay"
        problem = fa4_problem()
        if problem is not None:
            return [adb.FastPath(name, False, problem)]
        problem = _fa4.replay_problem()
        if problem is not None:
            return [adb.FastPath(name, False, problem)]
        if not adb.env_flag(_fa4.REPLAY_VARIABLE, True):
            return [adb.FastPath(name, False, f"{_fa4.REPLAY_VARIABLE} turns it off")]
        version = installed_version()
        return [adb.FastPath(name, True, f"proven on FA4 {version}, the release installed")]

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """Beyond the declarations: FA4 installed within the tested range, and a causal mask
        FA4 can express."""
        reasons = [r for r in (fa4_problem(), mask_problem(inp)) if r]
        return reasons

    def prepare(self, inp: adb.ForwardInputs) -> _fa4.Ready:
        """The signature's FA4 plan (keyword arguments, variant, replay), made once per
        decision and read by every call as ``inp.plan``."""
        return _fa4.prepare("backward" if isinstance(inp, adb.BackwardInputs) else "forward", inp)

    # ``impl.forward(inp)`` / ``impl.backward(inp)`` call FA4's wrappers with no method frame
    # of their own: at short problems the host cost per call is what decides eager speed.
    forward = staticmethod(_fa4.forward)
    backward = staticmethod(_fa4.backward)


class Sm90(FlashAttnCute):
    """FA4 on Hopper, on by default: FA4's own head dims (each of D and Dv a multiple of 8 in
    8..256), of which ``supports`` admits only those the installed release's row proves."""

    name = "sm90"
    priority = {"sm_90": PRIORITY}
    # soft caps and sinks outside the cost table: 44; short eager host-bound backwards: 42
    priority_rules = SM90_PRIORITY_RULES
    archs = ("sm_90",)
    head_dims = range(8, 257, 8)

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """The base reasons and the sm_90 head-dim table (the combinations proven correct)."""
        reasons = super().supports(inp, arch)
        gqa = inp.heads != inp.kv_heads
        problem = sm90_head_dim_problem(inp.head_dim, inp.head_dim_v, gqa)
        return reasons + ([problem] if problem else [])


class Sm100(FlashAttnCute):
    """FA4 on Blackwell (sm_100, sm_103): D and Dv each a multiple of 8 up to 128, or the
    pairs (192, 128) and (256, 256)."""

    name = "sm100"
    priority = {"sm_100": PRIORITY, "sm_103": PRIORITY}
    opt_in = True
    opt_in_reason = "this backend has not run on Blackwell hardware yet"
    archs = ("sm_100", "sm_103")
    head_dims = frozenset(range(8, 129, 8)) | {192, 256}

    def supports(self, inp: adb.ForwardInputs, arch: ad.Arch) -> list[str]:
        """The base reasons, Blackwell's (D, Dv) pairs above 128 and its (256, 256) backward
        without a soft cap."""
        reasons = super().supports(inp, arch)
        pair = (inp.head_dim, inp.head_dim_v)
        extra = (sm100_head_dim_problem(*pair), softcap_problem(inp, pair))
        return reasons + [r for r in extra if r]


@adb.hookimpl
def attn_dispatch_implementations() -> list[adb.Implementation]:
    """The flash_attn_cute backend's implementations."""
    # Checked when the plugins load, whatever FA4 release is installed (or none): a bad value
    # is an error even where the replay is never used (another arch, a release it is off for).
    adb.env_flag(_fa4.REPLAY_VARIABLE, True)
    return [Sm90(), Sm100()]
