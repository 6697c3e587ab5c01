"""Print the priority table of the installed implementations as Markdown (for the README).

Usage: python scripts/priority_table.py (`attn-dispatch list` prints the same table as text).
"""

from __future__ import annotations

import attn_dispatch as ad
from attn_dispatch.tools.cli import priority_table_markdown


def table() -> str:
    """One row per implementation: its priority on each arch ('-' = not automatic there)."""
    return priority_table_markdown([b for b in ad.backends() if b.error is None])


if __name__ == "__main__":
    print(table())
