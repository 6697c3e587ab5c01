"""Arch parsing and detection."""

from __future__ import annotations

import pytest

import attn_dispatch as ad
from attn_dispatch import backend as adb


@pytest.mark.parametrize(
    ("text", "vendor", "name"),
    [
        ("cpu", "cpu", "cpu"),
        ("sm_90", "cuda", "sm_90"),
        ("sm80", "cuda", "sm_80"),
        ("gfx942", "rocm", "gfx942"),
        ("gfx950:sramecc+:xnack-", "rocm", "gfx950"),
    ],
)
def test_parse(text, vendor, name):
    arch = ad.Arch.parse(text)
    assert (arch.vendor, arch.name, arch.full) == (vendor, name, text)


@pytest.mark.parametrize("text", ["", "h100", "sm_", "gfxzz"])
def test_parse_rejects_unknown(text):
    with pytest.raises(ValueError, match="arch"):
        ad.Arch.parse(text)


def test_detect_cpu_and_override(monkeypatch):
    monkeypatch.delenv("ATTN_DISPATCH_ARCH", raising=False)
    assert ad.detect_arch("cpu") == ad.Arch("cpu", "cpu", "cpu")
    monkeypatch.setenv("ATTN_DISPATCH_ARCH", "gfx950")
    assert ad.detect_arch("cpu").name == "gfx950"


def test_priority_patterns():
    class Impl(adb.Implementation):
        backend, name = "x", "y"
        priority = {"gfx9*": 10, "gfx950": 95, "sm_*": 3}

    impl = Impl()
    assert impl.priority_for(ad.Arch.parse("gfx950")) == 95  # exact beats pattern
    assert impl.priority_for(ad.Arch.parse("gfx942")) == 10
    assert impl.priority_for(ad.Arch.parse("sm_90")) == 3
    assert impl.priority_for(ad.Arch.parse("cpu")) is None


def test_missing_requirement():
    assert adb.missing_requirement("pluggy>=1.0") is None
    assert "not installed" in adb.missing_requirement("surely-not-installed-xyz")
    assert "needs" in adb.missing_requirement("pluggy<0.1")
    with pytest.raises(ValueError, match="requirement"):
        adb.missing_requirement("not a ++ requirement")
