"""Print the priority table of the installed implementations as Markdown (for the README).

Usage: python scripts/priority_table.py
"""

from __future__ import annotations

import attn_dispatch as ad

ARCHS = ("cpu", "sm_80", "sm_90", "sm_100", "gfx942", "gfx950")


def table() -> str:
    """One row per implementation: its priority on each arch ('-' = not automatic there)."""
    lines = [
        "| implementation | opt-in | deterministic | " + " | ".join(ARCHS) + " |",
        "|---|---|---|" + "---|" * len(ARCHS),
    ]
    for info in sorted(ad.backends(), key=lambda b: b.name):
        for impl in info.implementations:
            values = [impl.priority_for(arch) for arch in ARCHS]
            cells = ["-" if value is None else str(value) for value in values]
            lines.append(
                f"| `{impl.name}` | {'yes' if impl.opt_in else 'no'} | "
                f"{'yes' if impl.deterministic else 'no'} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
