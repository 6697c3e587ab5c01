"""One check per unstable FlyDSL API the backend relies on (see ``_flydsl_api``): a FlyDSL
release that moves one fails here with the API's name, not deep inside a kernel build."""

from __future__ import annotations

import pytest
from attn_dispatch_flydsl_rocm._flydsl_api import PRIVATE_APIS, FlyDSLAPIMoved
from flydsl_gate import require_flydsl


@pytest.fixture(autouse=True)
def _flydsl() -> None:
    """Skipped without a usable FlyDSL; failed instead under ATTN_DISPATCH_REQUIRE_FLYDSL=1 (CI)."""
    require_flydsl()


@pytest.mark.parametrize("api", PRIVATE_APIS, ids=lambda a: a.name)
def test_private_flydsl_api_is_still_there(api):
    api.check()


def test_a_moved_api_is_named(monkeypatch):
    import flydsl._mlir.dialects.rocdl as mrocdl

    monkeypatch.delattr(mrocdl, "ds_read_tr16_b64")
    api = next(a for a in PRIVATE_APIS if a.name == "flydsl._mlir.dialects.rocdl")
    with pytest.raises(FlyDSLAPIMoved, match=r"flydsl\._mlir\.dialects\.rocdl .*ds_read_tr16_b64"):
        api.check()


def test_a_changed_storage_is_named(monkeypatch):
    import flydsl.expr as fx

    class NoPtr:
        def __class_getitem__(cls, item):
            return lambda ptr: object()

    monkeypatch.setattr(fx, "Storage", NoPtr)
    api = next(a for a in PRIVATE_APIS if a.name == "Storage._ptr")
    with pytest.raises(FlyDSLAPIMoved, match=r"Storage\._ptr is gone or changed"):
        api.check()
