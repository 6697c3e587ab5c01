"""Arch parsing and detection."""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb


@pytest.mark.parametrize(
    ("text", "vendor", "name"),
    [
        ("cpu", "cpu", "cpu"),
        ("sm_90", "cuda", "sm_90"),
        ("sm80", "cuda", "sm_80"),
        ("sm_90a", "cuda", "sm_90"),
        ("sm_100a", "cuda", "sm_100"),
        ("SM90a", "cuda", "sm_90"),
        ("gfx942", "rocm", "gfx942"),
        ("gfx950:sramecc+:xnack-", "rocm", "gfx950"),
    ],
)
def test_parse(text, vendor, name):
    arch = ad.Arch.parse(text)
    assert (arch.vendor, arch.name, arch.full) == (vendor, name, text)


@pytest.mark.parametrize("text", ["", "h100", "sm_", "gfxzz", "sm_90b", "sm_a"])
def test_parse_rejects_unknown(text):
    with pytest.raises(ValueError, match="arch"):
        ad.Arch.parse(text)


def test_detect_cpu_and_override(monkeypatch):
    monkeypatch.delenv("ATTN_DISPATCH_ARCH", raising=False)
    assert ad.detect_arch("cpu") == ad.Arch("cpu", "cpu", "cpu")
    monkeypatch.setenv("ATTN_DISPATCH_ARCH", "gfx950")
    assert ad.detect_arch("cpu").name == "gfx950"


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        ("bogus", ValueError, "argument 'device': Expected one of"),
        ("cuda:99", ValueError, "argument 'device': 'cuda:99' is not a GPU of this machine"),
        (["cpu"], TypeError, "argument 'device': expected a torch.device or str, got list"),
    ],
    ids=["unknown type", "absent GPU", "a list"],
)
def test_detect_arch_names_a_device_it_cannot_read(monkeypatch, device, error, message):
    """Not torch's RuntimeError or the AssertionError of a CPU-only build."""
    monkeypatch.delenv("ATTN_DISPATCH_ARCH", raising=False)
    with pytest.raises(error, match=message):
        ad.detect_arch(device)
    monkeypatch.setenv("ATTN_DISPATCH_ARCH", "sm_90")  # an override needs no GPU to read
    if device == "cuda:99":
        assert ad.detect_arch(device).name == "sm_90"


def test_a_bad_override_is_a_setting_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_ARCH", "bogus")
    with pytest.raises(ad.SettingError, match="ATTN_DISPATCH_ARCH: arch='bogus'"):
        ad.detect_arch("cpu")


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_a_blank_override_is_unset_for_detection_and_dispatch(env, blank):
    env.set(ATTN_DISPATCH_ARCH=blank)
    assert ad.detect_arch("cpu") == ad.Arch("cpu", "cpu", "cpu")
    q = torch.zeros(1, 4, 2, 16)
    assert ad.explain(q, q, q).arch.name == "cpu"


def test_the_arch_specific_names_override_as_their_chip(env):
    env.set(ATTN_DISPATCH_ARCH="sm_90a")
    assert ad.detect_arch("cpu").name == "sm_90"
    q = torch.zeros(1, 4, 2, 16)
    assert ad.explain(q, q, q).arch.name == "sm_90"


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
