"""The reference backward's working memory follows the chunk budget, not Sq x Sk.

Runs ``benchmarks/reference_memory.py`` (peak RSS via ``/proc/self/clear_refs`` + ``VmHWM``) in a
fresh process on a shape whose single full score matrix is 64 MiB, with a 2 MiB chunk budget.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "reference_memory.py"


def _peak_tracking_available() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ is not beside this checkout")
@pytest.mark.skipif(not _peak_tracking_available(), reason="needs Linux /proc/self/clear_refs")
def test_backward_memory_is_bounded_by_the_chunk_budget():
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--seqlen",
        "4096",
        "--heads",
        "1",
        "--head-dim",
        "32",
        "--budget-mib",
        "2",
        "--json",
    ]
    result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    full = result["one_full_score_matrix_mib"]
    assert full == 64.0
    # ~3 score-sized buffers of 2 MiB plus input-sized copies (0.5 MiB each); a naive
    # implementation would need several 64 MiB matrices.
    assert result["peak_above_inputs_and_outputs_mib"] < 16, result
