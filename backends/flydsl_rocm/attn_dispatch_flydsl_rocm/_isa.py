"""Resource figures parsed from AMDGPU assembly (metadata and ``.amdhsa`` directives)."""

from __future__ import annotations

import re
from collections import Counter

_MFMA = re.compile(r"^\s*(v_mfma_[a-z0-9_]+)", re.M)
_TR = re.compile(r"^\s*ds_read_b64_tr_b16\b", re.M)
_ATOMIC = re.compile(r"^\s*(buffer_atomic_[a-z0-9_]+)", re.M)
_SCRATCH = re.compile(r"^\s*scratch_(load|store)", re.M)


def _directive(isa: str, name: str) -> int | None:
    m = re.search(rf"^[\s-]*\.?{re.escape(name)}:?\s+(-?\d+)", isa, re.M)
    return int(m.group(1)) if m else None


def isa_stats(isa: str) -> dict:
    """VGPRs, AGPRs, LDS, scratch, spills and instruction counts of one kernel's ISA."""
    name = re.search(r"^\s*\.amdhsa_kernel\s+(\S+)", isa, re.M)
    return {
        "kernel": name.group(1) if name else None,
        "target": (re.search(r'\.amdgcn_target\s+"([^"]+)"', isa) or [None, None])[1],
        "vgprs": _directive(isa, ".vgpr_count"),
        "agprs": _directive(isa, ".agpr_count"),
        "next_free_vgpr": _directive(isa, ".amdhsa_next_free_vgpr"),
        "lds_bytes": _directive(isa, ".group_segment_fixed_size"),
        "scratch_bytes": _directive(isa, ".private_segment_fixed_size"),
        "vgpr_spills": _directive(isa, ".vgpr_spill_count"),
        "sgpr_spills": _directive(isa, ".sgpr_spill_count"),
        "mfma": dict(sorted(Counter(_MFMA.findall(isa)).items())),
        "ds_read_b64_tr_b16": len(_TR.findall(isa)),
        "buffer_atomics": dict(sorted(Counter(_ATOMIC.findall(isa)).items())),
        "scratch_instructions": len(_SCRATCH.findall(isa)),
    }
