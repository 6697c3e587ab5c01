"""Discovery through real entry points, priority, forcing, opt-in, blocking, allowlist,
broken plugins and explain, with the third-party-style plugins in tests/plugins."""

from __future__ import annotations

import json
import logging
import sys
import threading
import types
import warnings

import pytest
import torch
from dispatch_helpers import EXACT, make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import _selection
from attn_dispatch import backend as adb

FAST, SLOW, NONDET, EXPERIMENTAL, GPU_ONLY, GRAPH_ONLY = 1.0, 2.0, 3.0, 4.0, 5.0, 7.0


def run(**flags):
    return tag_of(ad.backward(*make_inputs(d=flags.pop("d", 16)), **flags))


def statuses(report: ad.Report) -> dict[str, str]:
    return {c.name: c.status for c in report.candidates}


def test_discovery_lists_every_plugin_with_versions(toys):
    infos = {b.name: b for b in ad.backends()}
    assert {
        "toy",
        "exact",
        "reference",
        "broken_import",
        "broken_hook",
        "broken_supports",
        "broken_priority",
    } <= set(infos)
    toy = infos["toy"]
    assert toy.distribution == "attn-dispatch-test-plugins" and toy.version == "0.0.1"
    assert {i.name for i in toy.implementations} >= {"toy:fast", "toy:experimental"}
    assert "ImportError" in infos["broken_import"].error
    assert "RuntimeError" in infos["broken_hook"].error


def test_highest_priority_wins_and_rejection_moves_on(toys):
    assert run() == NONDET  # 70 beats fast 50 and slow 10; experimental (100) is opt-in
    toys.set(ATTN_DISPATCH_DISABLE="toy:nondet")
    assert run() == FAST
    assert run(d=128) == SLOW  # fast rejects head_dim > 64


def test_deterministic_request_rejects_non_deterministic(toys):
    assert run(deterministic=True) == FAST
    with pytest.raises(ad.NoBackendError, match="not deterministic"):
        run(deterministic=True, backend="toy:nondet")


def test_forcing_precedence_argument_context_env(toys):
    toys.set(ATTN_DISPATCH_BACKEND="toy:slow")
    assert run() == SLOW
    with ad.use_backend("toy:fast"):
        assert run() == FAST
        assert run(backend="toy:gpu_only") == GPU_ONLY  # no priority on cpu: forcing still works
    assert run() == SLOW


def test_bare_backend_name_means_its_best_implementation(toys):
    assert run(backend="toy") == EXPERIMENTAL  # forcing a backend admits its opt-in kernels
    toys.set(ATTN_DISPATCH_DISABLE="toy:experimental")
    assert run(backend="toy") == NONDET
    assert run(backend="toy", d=128, deterministic=True) == SLOW


def test_forced_choice_never_falls_back(toys):
    with pytest.raises(ad.NoBackendError) as info:
        run(backend="toy:fast", d=128)
    message = str(info.value)
    assert "head_dim=128 > 64" in message and "never falls back" in message
    assert "q: shape=(1, 8, 4, 128)" in message  # the inputs are shown


def test_unknown_names_are_errors_that_list_known_names(toys):
    with pytest.raises(ad.UnknownBackendError, match="toy:fast"):
        run(backend="toy:fastest")
    with pytest.raises(ValueError, match="unknown backend"):
        with ad.use_backend("nope"):
            pass
    toys.set(ATTN_DISPATCH_BACKEND="nope")
    with pytest.raises(ValueError, match="ATTN_DISPATCH_BACKEND"):
        run()


def test_a_forced_name_comes_from_the_first_source_that_sets_it_and_names_it(toys):
    """The ``backend`` argument, else ``use_backend``, else ``ATTN_DISPATCH_BACKEND``: only
    the name in force is checked, and its error names where it came from."""
    toys.set(ATTN_DISPATCH_BACKEND="nope")
    with pytest.raises(ad.UnknownBackendError, match="argument 'ATTN_DISPATCH_BACKEND'"):
        run()
    assert run(backend="toy:fast") == FAST
    with ad.use_backend("toy:slow"):
        assert run() == SLOW
        assert run(backend="toy:fast") == FAST
        with pytest.raises(ad.UnknownBackendError, match="argument 'backend'"):
            run(backend="toy:fastest")


def test_opt_in_needs_enabling_but_forcing_works(toys):
    assert run() != EXPERIMENTAL
    assert run(backend="toy:experimental") == EXPERIMENTAL
    ad.enable("toy:experimental")
    assert run() == EXPERIMENTAL
    toys.set(ATTN_DISPATCH_ENABLE="toy:experimental")
    assert run() == EXPERIMENTAL
    toys.unset("ATTN_DISPATCH_ENABLE")
    assert run() != EXPERIMENTAL
    toys.set(ATTN_DISPATCH_ENABLE="toy")  # a bare backend name enables all its implementations
    assert run() == EXPERIMENTAL


def test_enable_survives_reload_unless_reset(toys):
    ad.enable("toy")
    ad.reload()
    assert run() == EXPERIMENTAL
    ad.reload(reset_enabled=True)
    assert run() != EXPERIMENTAL


def test_blocking_wins_over_forcing(toys):
    toys.set(ATTN_DISPATCH_DISABLE="toy:fast,toy:nondet")
    assert run() == SLOW
    with pytest.raises(ad.NoBackendError, match="blocked"):
        run(backend="toy:fast")
    toys.set(ATTN_DISPATCH_DISABLE="toy")
    report = ad.explain(*make_inputs())
    assert report.selected == "exact:oracle"  # the next by priority once every toy is blocked
    assert statuses(report)["toy:fast"] == "blocked"
    with pytest.raises(ad.NoBackendError, match="blocked"):
        run(backend="toy:slow")


def test_allowlist_loads_only_named_plugins(env):
    env.set(ATTN_DISPATCH_TEST_PLUGINS="1", ATTN_DISPATCH_PLUGINS="toy")
    assert {b.name for b in ad.backends()} == {"toy"}
    assert run() == NONDET
    env.set(ATTN_DISPATCH_PLUGINS="")
    assert ad.backends() == []
    with pytest.raises(ad.NoBackendError, match="no backend plugin is installed"):
        run()


def test_unknown_names_in_lists_warn(env):
    """Each reload reads every variable again, so it warns about every unknown name set."""
    plugins = "ATTN_DISPATCH_PLUGINS names 'nosuch'"
    disable = "ATTN_DISPATCH_DISABLE names 'gone'"
    enable = "ATTN_DISPATCH_ENABLE names 'ghost:impl'"
    for values, expected in (
        ({"ATTN_DISPATCH_PLUGINS": "reference,nosuch"}, [plugins]),
        ({"ATTN_DISPATCH_DISABLE": "gone"}, [plugins, disable]),
        ({"ATTN_DISPATCH_ENABLE": "ghost:impl"}, [plugins, disable, enable]),
    ):
        with pytest.warns(UserWarning) as caught:
            env.set(**values)
        messages = [str(w.message) for w in caught]
        assert sorted(m for m in expected if any(m in got for got in messages)) == sorted(expected)
        assert len(messages) == len(expected), messages


def test_broken_plugins_cost_only_themselves(toys):
    report = ad.explain(*make_inputs())
    status = statuses(report)
    assert status["broken_import"] == status["broken_hook"] == "failed"
    assert status["broken_supports:explodes"] == "failed"
    reasons = {c.name: c.reasons for c in report.candidates}
    assert "ZeroDivisionError" in reasons["broken_supports:explodes"][0]
    assert report.selected == "toy:nondet"
    assert run() == NONDET
    with pytest.raises(ad.NoBackendError, match="ZeroDivisionError"):
        run(backend="broken_supports")


def test_priority_can_depend_on_the_inputs(toys):
    assert run() == NONDET  # toy:slow has priority 10 at head_dim 16 ...
    assert run(d=32) == SLOW  # ... and 90 at head_dim 32
    report = ad.explain(*make_inputs(d=32))
    assert {c.name: c.priority for c in report.candidates}["toy:slow"] == 90
    assert report.selected == "toy:slow"


def _capturing(monkeypatch, on: bool) -> None:
    """What a CUDA stream capture looks like to the execution probe, without a GPU."""
    monkeypatch.setattr(ad._execution, "_cuda_capturing", lambda: on)
    monkeypatch.setattr(ad._execution, "_cuda_state", types.SimpleNamespace(_initialized=True))
    monkeypatch.setattr(ad._execution, "_cuda_bad_fork", lambda: False)


def test_priority_can_depend_on_the_execution_mode(toys, monkeypatch):
    """toy:graph_only ranks first only for captured calls; the same signature gets its own
    decision per mode, through the guard and the dictionary alike."""
    inputs = make_inputs()
    assert tag_of(ad.backward(*inputs)) == NONDET
    assert tag_of(ad.backward(*inputs)) == NONDET  # now served by the guard
    _capturing(monkeypatch, True)
    assert ad._execution.current_execution() == "graph"
    assert tag_of(ad.backward(*inputs)) == GRAPH_ONLY
    assert tag_of(ad.backward(*inputs)) == GRAPH_ONLY
    _capturing(monkeypatch, False)
    assert tag_of(ad.backward(*inputs)) == NONDET
    assert len(ad._settings.current().decisions) == 2
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    varlen = [t[0] for t in inputs[:3]] + [inputs[3][0], inputs[4][0]]
    varlen.append(inputs[5][0])
    flags = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    assert tag_of(ad.backward(*varlen, **flags)) == NONDET
    _capturing(monkeypatch, True)
    assert tag_of(ad.backward(*varlen, **flags)) == GRAPH_ONLY


def test_execution_mode_declares_the_graph_decision_for_a_warm_up(toys):
    """Inside execution_mode("graph") an eager call gets (and caches) the graph decision, which
    a captured call of the same signature then reuses; outside, eager again."""
    inputs = make_inputs()
    with ad.execution_mode("graph"):
        assert tag_of(ad.backward(*inputs)) == GRAPH_ONLY
        assert ad.explain(*inputs).execution == "graph"
    assert tag_of(ad.backward(*inputs)) == NONDET
    with pytest.raises(ValueError, match="execution"):
        with ad.execution_mode("cuda_graph"):
            pass


def test_explain_takes_an_execution_mode(toys):
    inputs = make_inputs()
    eager = ad.explain(*inputs)
    assert eager.execution == "eager" and eager.selected == "toy:nondet"
    graph = ad.explain(*inputs, execution="graph")
    assert graph.execution == "graph" and graph.selected == "toy:graph_only"
    assert "graph execution" in str(graph).splitlines()[0]
    assert {c.name: c.priority for c in eager.candidates}["toy:graph_only"] is None
    with pytest.raises(ValueError, match="execution"):
        ad.explain(*inputs, execution="captured")


def test_opt_in_reason_is_shown(toys):
    report = ad.explain(*make_inputs())
    reasons = {c.name: c.reasons for c in report.candidates}["toy:experimental"]
    assert reasons[0] == "opt-in because it is a toy that only the opt-in tests enable"
    toy = next(b for b in ad.backends() if b.name == "toy")
    info = {i.name: i for i in toy.implementations}
    declared = info["toy:experimental"].to_dict()["opt_in_reason"]
    assert declared == "it is a toy that only the opt-in tests enable"
    assert info["toy:fast"].opt_in_reason is None


def test_broken_priority_hook_costs_only_itself(toys):
    report = ad.explain(*make_inputs())
    candidate = next(c for c in report.candidates if c.name == "broken_priority:explodes")
    assert candidate.status == "failed" and candidate.priority == 1000
    assert "priority_for_execution() raised KeyError" in candidate.reasons[0]
    assert report.selected == "toy:nondet"
    assert run() == NONDET


def test_explain_report_statuses_and_text(toys):
    report = ad.explain(*make_inputs())
    status = statuses(report)
    assert status["toy:nondet"] == "selected"
    assert status["toy:fast"] == status["toy:slow"] == "supported"
    assert status["toy:experimental"] == "opt-in"
    assert status["toy:gpu_only"] == "supported"
    assert (
        "no priority entry for cpu"
        in dict((c.name, c.reasons) for c in report.candidates)["toy:gpu_only"][0]
    )
    assert status["reference:chunked"] == "supported"
    text = str(report)
    assert text.splitlines()[0].startswith("attn_dispatch backward on arch cpu")
    assert "selected: toy:nondet" in text
    data = report.to_dict()
    assert set(data) == {
        "arch",
        "selected",
        "candidates",
        "mode",
        "execution",
        "forced",
        "inputs",
    }
    assert set(data["candidates"][0]) == {
        "name",
        "priority",
        "opt_in",
        "status",
        "reasons",
        "predicted_us",
        "prediction",
    }
    json.dumps(data)


def test_explain_rejection_reasons_and_hypothetical_arch(toys):
    meta = [t.to("meta") for t in make_inputs(d=128)]
    report = ad.explain(*meta, arch="sm_90")
    status = statuses(report)
    assert report.arch == ad.Arch("cuda", "sm_90", "sm_90")
    assert status["toy:gpu_only"] == "selected"  # 80 on sm_90
    assert status["toy:fast"] == "rejected"
    assert status["toy:nondet"] == "supported"  # no sm_90 entry
    forced = ad.explain(*meta, arch="sm_90", backend="toy:fast")
    assert forced.selected is None and forced.forced == "toy:fast"


def test_arch_env_override_changes_arch_not_device(toys):
    toys.set(ATTN_DISPATCH_ARCH="sm_90")
    report = ad.explain(*make_inputs())
    assert report.arch.name == "sm_90" and report.selected == "toy:gpu_only"
    assert run() == GPU_ONLY


def test_forward_dispatch_requires_a_forward(toys):
    q, k, v, *_ = make_inputs()
    out, lse = ad.forward(q, k, v)
    assert out.flatten()[0] == NONDET and lse.shape == (1, 4, 8)
    report = ad.explain(q, k, v)
    assert report.mode == "forward"
    reasons = {c.name: c.reasons for c in report.candidates}
    assert reasons["toy:trivial"] == ("provides no forward",)


def test_decision_is_cached_and_logged_once(toys, caplog):
    with caplog.at_level("INFO", logger="attn_dispatch"):
        inputs = make_inputs()
        for _ in range(3):
            ad.backward(*inputs)
    assert sum("-> toy:nondet" in r.getMessage() for r in caplog.records) == 1
    settings = ad._settings.current()
    assert len(settings.decisions) == 1


def test_cache_key_includes_strides(toys):
    """A non-contiguous view must be re-validated and re-selected, not reuse a decision."""
    q, k, v, out, lse, do = make_inputs(sq=8)
    ad.backward(q, k, v, out, lse, do)
    wide = torch.randn(1, 8, 4, 32)[..., :16]
    ad.backward(wide, k, v, out, lse, do)
    assert len(ad._settings.current().decisions) == 2


def test_implementation_returning_wrong_shapes_is_reported(env, tmp_path):
    class Wrong(adb.Implementation):
        backend, name = "exact", "wrong"

        def backward(self, inp):
            return ad.Gradients(inp.q, inp.k, inp.q)  # dv has q's shape

    env.set(**EXACT)
    registry = ad._settings.current().registry
    registry.implementations["exact:wrong"] = Wrong()
    with pytest.raises(ValueError, match="exact:wrong returned dv"):
        ad.backward(*make_inputs(h=4, hkv=2), backend="exact:wrong")


def test_no_warnings_without_test_plugins(env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ad.reload()
        assert "toy" not in {i.name.split(":")[0] for b in ad.backends() for i in b.implementations}


def test_forced_project_backend_not_installed_says_how_to_install(env, monkeypatch):
    """A project backend missing from the environment is 'not installed', with the clone's
    install line; a name that is no project backend stays 'unknown'."""
    from attn_dispatch import _settings

    registry = _settings.current().registry
    # The environment as it is without the triton plugin: no entry point, no loaded backend.
    monkeypatch.setattr(
        registry,
        "entry_point_names",
        tuple(n for n in registry.entry_point_names if n != "triton"),
    )
    monkeypatch.delitem(registry.backends, "triton", raising=False)
    for name in ("triton", "triton:some_impl"):
        with pytest.raises(ad.UnknownBackendError) as info:
            with ad.use_backend(name):
                pass
        message = str(info.value)
        assert "'triton' is not installed" in message, message
        assert "pip install -e backends/triton" in message
    with pytest.raises(ad.UnknownBackendError, match="unknown backend 'tritonn'"):
        with ad.use_backend("tritonn"):
            pass


GATE = """
import threading
import types

ENTERED, RELEASE = threading.Event(), threading.Event()


class Normal(Tagged):
    name, tag, priority = "normal", 1.0, {"*": 10}

    def supports(self, inp, arch):
        if not ENTERED.is_set():  # the first selection waits for the test
            ENTERED.set()
            assert RELEASE.wait(60)
        return []


class Better(Tagged):
    name, tag, priority, opt_in = "better", 2.0, {"*": 100}, True
"""


def test_enable_during_a_selection_invalidates_its_decision(plugins, env):
    plugins.backend("gate", GATE, "[Normal(), Better()]")
    env.set(ATTN_DISPATCH_PLUGINS="gate")
    gate = sys.modules["rel_gate"]
    inputs = make_inputs()
    results = []
    worker = threading.Thread(target=lambda: results.append(ad.backward(*inputs)))
    worker.start()
    assert gate.ENTERED.wait(60)
    ad.enable("gate:better")
    gate.RELEASE.set()
    worker.join(60)
    assert tag_of(results[0]) == 1.0  # that call began before the change
    assert ad.explain(*inputs).selected == "gate:better"
    for _ in range(3):
        assert tag_of(ad.backward(*inputs)) == 2.0


SLEEPY = """
import time


class Slow(Tagged):
    name, tag, priority = "slow", 1.0, {"*": 10}

    def supports(self, inp, arch):
        time.sleep(1.5)
        return []
"""


def test_a_slow_supports_is_named_while_it_runs(plugins, env, monkeypatch, caplog):
    plugins.backend("sleepy", SLEEPY, "[Slow()]")
    env.set(ATTN_DISPATCH_PLUGINS="sleepy")
    monkeypatch.setattr(_selection, "SLOW_HOOK_S", 0.3)
    monkeypatch.setattr(_selection, "WATCH_INTERVAL_S", 0.05)
    caplog.set_level(logging.WARNING, logger="attn_dispatch")
    with pytest.warns(UserWarning, match=r"sleepy:slow supports\(\) took 1\.\d s"):
        ad.backward(*make_inputs())
    assert "sleepy:slow supports() has been running for" in caplog.text
