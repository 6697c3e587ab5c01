"""The test session's files stay in the clone: every cache the tests fill goes under `.cache/`.

Set before any test module imports a compiler (this file is the first conftest pytest loads), and
inherited by the subprocesses the tests start. A variable the user set is kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parent / ".cache"

# Each default location named is outside the clone (a user's home or the shared temp directory).
CACHE_VARIABLES = {
    # Triton's compiled kernels (~/.triton/cache, over 100 MB after the cross-compile tests), and
    # its home for dumps and overrides.
    "TRITON_CACHE_DIR": CACHE / "triton" / "cache",
    "TRITON_HOME": CACHE / "triton",
    # NVIDIA's CUTLASS DSL, under FlashAttention-4 (<tmp>/<user>/cutlass_python_cache): one
    # variable per DSL it defines, each read when `import cutlass` creates that DSL.
    "CUTE_DSL_CACHE_DIR": CACHE / "cutlass_python_cache",
    "CUTE_EXPERIMENTAL_DSL_CACHE_DIR": CACHE / "cutlass_python_cache",
    # FA4's own disk cache, used when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1.
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": CACHE / "flash_attention_cute_dsl",
    # torch.compile (<tmp>/torchinductor_<user>).
    "TORCHINDUCTOR_CACHE_DIR": CACHE / "torchinductor",
    # This project's backends (~/.cache/attn_dispatch_flydsl, ~/.cache/attn_dispatch_triton).
    "ATTN_DISPATCH_FLYDSL_CACHE": CACHE / "attn_dispatch_flydsl",
    "ATTN_DISPATCH_TRITON_CACHE": CACHE / "attn_dispatch_triton",
    # Anything else that follows the XDG convention (~/.cache: Hugging Face's hub directory).
    "XDG_CACHE_HOME": CACHE / "xdg",
    # pytest's tmp_path directories (<tmp>/pytest-of-<user>): pytest numbers them, keeps the
    # last three runs' and locks them, as in its default place.
    "PYTEST_DEBUG_TEMPROOT": CACHE / "pytest",
}


def route_caches(environ: dict[str, str] = os.environ) -> dict[str, str]:  # noqa: B006
    """Point each variable of CACHE_VARIABLES that ``environ`` does not set at its directory
    (created); returns the variables set."""
    routed = {}
    for name, path in CACHE_VARIABLES.items():
        if environ.get(name):
            continue
        path.mkdir(parents=True, exist_ok=True)
        environ[name] = routed[name] = str(path)
    return routed


route_caches()
# FA4 keeps the kernels it compiles on disk only when asked: parallel test workers then share
# them instead of each compiling its own (the randomized sweep compiles hundreds).
os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` keeps the tests of one ``xdist_group`` in one worker (xdist's
    ``loadgroup``; a test without a group is its own group, as under ``load``). The randomized
    sweep groups its cases by compiled kernel variant, so each variant compiles once per run."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadGroupScheduling

    return LoadGroupScheduling(config, log)
