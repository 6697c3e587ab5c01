"""Settings: the ATTN_DISPATCH_* variables as read, use_backend scoped to its thread or task, and
no kernel runtime imported by the core or its selection."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest
from dispatch_helpers import EXACT, make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import backend as adb


def test_use_backend_does_not_leak_between_threads(toys):
    results: dict[str, list[float]] = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def worker(label: str, forced: str | None) -> None:
        inputs = make_inputs()
        barrier.wait()
        for _ in range(50):
            if forced is None:
                results[label].append(tag_of(ad.backward(*inputs)))
            else:
                with ad.use_backend(forced):
                    results[label].append(tag_of(ad.backward(*inputs)))

    threads = [
        threading.Thread(target=worker, args=("a", "toy:slow")),
        threading.Thread(target=worker, args=("b", None)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results["a"]) == {2.0}  # toy:slow, forced in thread a only
    assert set(results["b"]) == {3.0}  # thread b keeps automatic choice (toy:nondet)


def test_use_backend_does_not_leak_between_asyncio_tasks(toys):
    async def task(forced: str | None) -> float:
        if forced is None:
            await asyncio.sleep(0.01)
            return tag_of(ad.backward(*make_inputs()))
        with ad.use_backend(forced):
            await asyncio.sleep(0.01)
            return tag_of(ad.backward(*make_inputs()))

    async def main():
        return await asyncio.gather(task("toy:fast"), task(None))

    assert asyncio.run(main()) == [1.0, 3.0]


def test_use_backend_nests_and_restores(toys):
    with ad.use_backend("toy:fast"):
        with ad.use_backend("toy:slow"):
            assert tag_of(ad.backward(*make_inputs())) == 2.0
        assert tag_of(ad.backward(*make_inputs())) == 1.0
    assert tag_of(ad.backward(*make_inputs())) == 3.0


PROBE = """
import sys, torch
import attn_dispatch as ad
meta = lambda *s, dt=torch.bfloat16: torch.empty(s, dtype=dt, device="meta")
args = (meta(1, 128, 8, 128), meta(1, 128, 2, 128), meta(1, 128, 2, 128), meta(1, 128, 8, 128),
        meta(1, 8, 128, dt=torch.float32), meta(1, 128, 8, 128))
for arch in ("cpu", "sm_80", "sm_90", "gfx942", "gfx950"):
    str(ad.explain(*args, arch=arch, causal=True))
    str(ad.explain(*args[:3], arch=arch))
ad.backends()
heavy = sorted(m for m in ("triton", "flydsl") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
print("BACKENDS:" + ",".join(sorted(b.name for b in ad.backends())))
"""


def test_core_and_selection_import_no_kernel_runtime():
    """Every installed plugin loads and answers supports/explain without triton or flydsl."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "HEAVY:\n" in done.stdout, done.stdout
    assert "reference" in done.stdout


def test_a_bad_arch_variable_is_named(env):
    with pytest.raises(ValueError, match="ATTN_DISPATCH_ARCH"):
        env.set(ATTN_DISPATCH_ARCH="bogus")


def test_arch_variable_is_read_with_the_settings(env, monkeypatch):
    env.set(**EXACT)
    ad.backward(*make_inputs())
    monkeypatch.setenv("ATTN_DISPATCH_ARCH", "sm_90")
    assert ad.explain(*make_inputs(sq=12)).arch.name == "cpu"
    ad.reload()
    assert ad.explain(*make_inputs(sq=12)).arch.name == "sm_90"


@pytest.mark.parametrize(
    "value, on", [("false", False), ("0", False), ("off", False), ("1", True), ("TRUE", True)]
)
def test_debug_variable_is_a_boolean(env, value, on):
    env.set(ATTN_DISPATCH_DEBUG=value)
    assert ad._settings.current().debug is on


@pytest.mark.parametrize("value", ["maybe", "", " ", "2", "tru", "on off"])
def test_debug_variable_garbage_is_an_error_naming_it(env, value):
    with pytest.raises(ad.SettingError, match=f"ATTN_DISPATCH_DEBUG={value!r} is not a boolean"):
        env.set(ATTN_DISPATCH_DEBUG=value)


@pytest.mark.parametrize(
    "variable", ["ATTN_DISPATCH_DEBUG", "ATTN_DISPATCH_AUTOTUNE", "ATTN_DISPATCH_ARCH"]
)
def test_a_reload_that_fails_leaves_no_settings_to_go_on_with(env, monkeypatch, variable):
    """After a reload refused a bad variable, calls raise too: none runs on the settings of
    the environment before."""
    env.set(**EXACT)
    ad.backward(*make_inputs())
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ad.SettingError, match=variable):
        ad.reload()
    with pytest.raises(ad.SettingError, match=variable):
        ad.explain(*make_inputs())
    monkeypatch.delenv(variable)
    assert ad.explain(*make_inputs()).selected is not None


@pytest.mark.parametrize(
    "value, on",
    [
        *((v, True) for v in ("1", "true", "True", "YES", "on", " 1", "yes\n")),
        *((v, False) for v in ("0", "false", "FALSE", "No", "off", " off ")),
    ],
)
def test_env_flag_reads_every_spelling_of_a_boolean(value, on):
    assert adb.env_flag("ATTN_DISPATCH_X", not on, {"ATTN_DISPATCH_X": value}) is on


@pytest.mark.parametrize("default", [True, False])
def test_env_flag_unset_is_its_default(default):
    assert adb.env_flag("ATTN_DISPATCH_X", default, {}) is default


@pytest.mark.parametrize("value", ["", "  ", "2", "y", "enable", "truee", "1 0"])
def test_env_flag_refuses_anything_else_naming_the_variable_and_the_values(value):
    with pytest.raises(ad.SettingError) as info:
        adb.env_flag("ATTN_DISPATCH_X", True, {"ATTN_DISPATCH_X": value})
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert message.startswith(f"ATTN_DISPATCH_X={value!r} is not a boolean")
    assert "1, true, yes, on or 0, false, no, off" in message


# A plugin whose implementation ranks itself by a boolean variable of its own (as FA4's replay
# setting does) at the given place: a bad value must reach the caller, never demote the
# implementation to "failed" so that another one runs.
READS_FLAG = """
class ReadsFlag(Tagged):
    name, tag, priority = "reads", 1.0, {{"*": 50}}

    def {hook}(self, inp, arch, *rest):
        adb.env_flag("ATTN_DISPATCH_FLAGGED_FAST", True)
        return {result}
"""


@pytest.mark.parametrize("hook, result", [("supports", "[]"), ("priority_for_execution", "50")])
def test_a_bad_variable_read_by_a_plugin_hook_is_the_callers_error(plugins, env, hook, result):
    body = READS_FLAG.format(hook=hook, result=result)
    plugins.backend("flagged", body, "[ReadsFlag(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="flagged")
    assert tag_of(ad.backward(*make_inputs())) == 1.0
    env.set(ATTN_DISPATCH_FLAGGED_FAST="maybe")
    match = "ATTN_DISPATCH_FLAGGED_FAST='maybe' is not a boolean"
    with pytest.raises(ad.SettingError, match=match):
        ad.backward(*make_inputs())
    with pytest.raises(ad.SettingError, match=match):
        ad.explain(*make_inputs())
    with pytest.raises(ad.SettingError, match=match):
        with ad.use_backend("flagged:fallback"):  # forcing another one does not hide it either
            ad.backward(*make_inputs(sq=12))


def test_a_bad_variable_read_by_a_plugin_at_load_is_the_callers_error(plugins, env):
    # its hook reads the variable, on every discovery
    provides = '[Fallback()] if adb.env_flag("ATTN_DISPATCH_FLAGGED_FAST", True) else []'
    plugins.backend("flagged", "", provides)
    env.set(ATTN_DISPATCH_PLUGINS="flagged", ATTN_DISPATCH_FLAGGED_FAST="1")
    with pytest.raises(ad.SettingError, match="ATTN_DISPATCH_FLAGGED_FAST='' is not a boolean"):
        env.set(ATTN_DISPATCH_FLAGGED_FAST="")


def test_explain_command_exits_with_a_bad_variable_named(plugins, env, capsys):
    from attn_dispatch.tools import cli

    hook = READS_FLAG.format(hook="priority_for_execution", result="50")
    plugins.backend("flagged", hook, "[ReadsFlag(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="flagged", ATTN_DISPATCH_FLAGGED_FAST="yes please")
    argv = ["explain", "--seqlen", "16", "--heads", "8", "--head-dim", "64"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert "ATTN_DISPATCH_FLAGGED_FAST='yes please' is not a boolean" in captured.err
    assert captured.out == ""


def test_use_backend_name_dropped_by_a_reload_is_unknown(plugins, env):
    """A reload inside the ``with`` that no longer loads the named backend: the next call says
    the name is unknown (with the known ones), not that the backend cannot run the inputs."""
    plugins.backend("gone", "", "[Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="gone")
    with ad.use_backend("gone"):
        assert tag_of(ad.backward(*make_inputs())) == 9.0
        env.set(**EXACT)
        for call in (ad.backward, ad.explain, ad.decide):
            with pytest.raises(ad.UnknownBackendError, match="unknown backend 'gone'; known: "):
                call(*make_inputs())


def test_backend_variable_is_stripped(toys):
    toys.set(ATTN_DISPATCH_BACKEND=" toy:slow ")
    assert tag_of(ad.backward(*make_inputs())) == 2.0
