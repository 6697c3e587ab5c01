"""A ready-made, parametrised pytest test for a backend package.

In a backend's test module::

    from attn_dispatch.testing import make_conformance_tests

    test_conformance = make_conformance_tests("mybackend", dtypes=("bfloat16", "float16"),
                                              device="cuda")

pytest collects ``test_conformance`` as one test per (check, dtype, case). A case the backend
rejects is skipped with its reasons; a wrong result fails with the diff table. Cases with a
sliding window, a soft cap or attention sinks are collected only when some implementation of
the backend declares that capability (``Implementation.window`` / ``.softcap`` / ``.sinks``);
one that declares it is
held to the oracle on them like on every other case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from .cases import Case
from .tolerances import Tolerance

_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _dtype(d: torch.dtype | str) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    try:
        return _DTYPES[d.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtypes: expected torch dtypes or {list(_DTYPES)}, got {d!r}") from None


def _device_missing(device: torch.device) -> str | None:
    if device.type == "cpu":
        return None
    if device.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA or ROCm GPU available"
    return None


def declared_capabilities(backend: str) -> set[str] | None:
    """The optional capabilities (``"window"``, ``"softcap"``, ``"sinks"``) some implementation
    named by
    ``backend`` (``"name"`` or ``"name:impl"``) declares; ``None`` when no installed
    implementation has that name (nothing is filtered then: the checks report it)."""
    import attn_dispatch as ad

    impls = [
        i
        for info in ad.backends()
        for i in info.implementations
        if i.name == backend or i.name.startswith(backend + ":")
    ]
    if not impls:
        return None
    optional = ("window", "softcap", "sinks")
    return {name for name in optional for i in impls if getattr(i, name)}


def make_conformance_tests(
    backend: str,
    *,
    dtypes: Sequence[torch.dtype | str] = ("float32",),
    device: str = "cpu",
    cases: Iterable[Case] | None = None,
    filter: Callable[[Case], bool] | None = None,  # noqa: A002 - the natural name here
    checks: Sequence[str] = ("backward", "forward", "deterministic"),
    tol: dict[torch.dtype, Tolerance] | Tolerance | None = None,
) -> Callable[..., None]:
    """A pytest test function parametrised over ``checks`` × ``dtypes`` × ``cases``.

    ``checks``: any of "backward", "forward" (drop it if the backend has no forward) and
    "deterministic" (bitwise-repeatable backward with ``deterministic=True``; skipped when the
    backend rejects that flag). ``filter`` keeps only the cases it returns True for; cases that
    need a capability the backend does not declare are left out (see the module docstring). ``tol``
    overrides the default tolerance (one for all dtypes, or a dict per dtype). Tests on a device
    that is absent are skipped and marked ``gpu``.
    """
    import pytest

    from . import conformance

    declared = declared_capabilities(backend)
    chosen = [
        c
        for c in (list(cases) if cases is not None else conformance.default_cases())
        if (filter is None or filter(c)) and (declared is None or set(c.needs) <= declared)
    ]
    dev = torch.device(device)
    unknown = set(checks) - {"backward", "forward", "deterministic"}
    if unknown:
        raise ValueError(f"checks: expected backward/forward/deterministic, got {sorted(unknown)}")
    params = []
    for check in checks:
        for d in map(_dtype, dtypes):
            for case in chosen:
                label = str(d).removeprefix("torch.")
                params.append(pytest.param(check, d, case, id=f"{check}-{label}-{case.id}"))

    def tolerance(d: torch.dtype) -> Tolerance | None:
        return tol.get(d) if isinstance(tol, dict) else tol

    @pytest.mark.parametrize(("check", "dtype", "case"), params)
    def test_conformance(check: str, dtype: torch.dtype, case: Case) -> None:
        missing = _device_missing(dev)
        if missing:
            pytest.skip(f"device {device}: {missing}")
        try:
            if check == "backward":
                conformance.check_backward(
                    backend, case, dtype=dtype, device=dev, tol=tolerance(dtype)
                )
            elif check == "forward":
                conformance.check_forward(
                    backend, case, dtype=dtype, device=dev, tol=tolerance(dtype)
                )
            else:
                conformance.check_deterministic(backend, case, dtype=dtype, device=dev)
        except conformance.Unsupported as exc:
            pytest.skip(str(exc))

    if dev.type != "cpu":
        test_conformance = pytest.mark.gpu(test_conformance)
    return test_conformance
