"""Autotune (``ATTN_DISPATCH_AUTOTUNE`` / ``ad.autotune``) on the ``timed`` test plugins.

``timed:slow`` (correct, highest priority, costly), ``timed:wrong`` (fast, wrong, writes into its
inputs) and ``timed:fast`` (correct, fast, lowest priority, not deterministic): priority alone
picks ``slow``, a measurement must pick ``fast`` and exclude ``wrong`` with a warning. Each one
counts its calls (``timed.CALLS``), so a test can tell a measurement (every candidate called
several times) from a reuse (only the chosen one called), and autotune times them with the
plugins' counted clock (``timed.CLOCK``): no assertion here depends on the machine's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from attn_dispatch_test_plugins import timed

import attn_dispatch as ad
from attn_dispatch import _autotune, _measure, _settings
from attn_dispatch.testing.oracle import oracle

SLOW, WRONG, FAST = "timed:slow", "timed:wrong", "timed:fast"
EXCLUDED = "autotune excluded timed:wrong: its results disagree with"


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


@pytest.fixture
def timed_env(env, cache, monkeypatch):
    """The timed plugins alone, timed by their counted clock, measurements under ``cache``;
    autotune not switched on."""
    monkeypatch.setattr(_measure, "clock", timed.CLOCK)
    timed.CALLS.clear()
    _autotune.forget()
    env.set(
        ATTN_DISPATCH_TEST_PLUGINS="timed",
        ATTN_DISPATCH_PLUGINS="timed",
        ATTN_DISPATCH_CACHE_DIR=str(cache),
    )
    yield env
    _autotune.forget()


@pytest.fixture
def tuned(timed_env):
    """As ``timed_env``, with ``ATTN_DISPATCH_AUTOTUNE=1``."""
    timed_env.set(ATTN_DISPATCH_AUTOTUNE="1")
    return timed_env


def inputs(seed=0, s=16, h=4, hkv=2, d=16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, s, h, d, generator=gen)
    k, v = (torch.randn(1, s, hkv, d, generator=gen) for _ in range(2))
    want = oracle(q, k, v, causal=True)
    out, lse = want.out.float(), want.lse.float()
    grad_out = torch.randn(q.shape, generator=gen)
    return q, k, v, out, lse, grad_out


def calls() -> dict[str, int]:
    return {name: timed.CALLS[name] for name in (SLOW, WRONG, FAST)}


def files(cache) -> list[str]:
    directory = cache / "autotune"
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_priority_alone_picks_the_slow_implementation(timed_env):
    assert ad.decide(*inputs(), causal=True).name == SLOW
    ad.backward(*inputs(), causal=True)
    assert calls() == {SLOW: 1, WRONG: 0, FAST: 0}


def test_the_fastest_agreeing_implementation_runs_and_the_wrong_one_is_excluded(tuned, cache):
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED) as caught:
        dq, dk, dv = ad.backward(*args, causal=True)
    assert "timed:wrong" in str(caught[0].message) and "float32 tolerance" in str(caught[0].message)
    measured = calls()
    assert all(n >= 1 + _autotune.REPEATS for n in measured.values()), measured
    want = oracle(*args[:3], args[5], causal=True)
    torch.testing.assert_close(dq.double(), want.dq)
    # later calls of the signature run the chosen one alone
    ad.backward(*args, causal=True)
    assert calls()[FAST] == measured[FAST] + 1
    assert (calls()[SLOW], calls()[WRONG]) == (measured[SLOW], measured[WRONG])
    report = ad.explain(*args, causal=True)
    assert report.selected == FAST and report.autotune.status == "reused"
    times = {t.name: t for t in report.autotune.timings}
    assert times[FAST].seconds < times[SLOW].seconds and times[WRONG].seconds is None
    assert times[WRONG].excluded.startswith("its results disagree with timed:slow, timed:fast")
    text = str(report)
    assert "selected: timed:fast (measured: the fastest that agreed)" in text
    assert "autotune: measured earlier, eager execution, median of 5" in text
    assert files(cache) == [report.autotune.note.rsplit("file ", 1)[1]]


@pytest.mark.parametrize("faster, chosen", [(1.01, SLOW), (1.05, FAST)])
def test_a_candidate_replaces_the_decisions_choice_only_beyond_the_margin(
    tuned, monkeypatch, faster, chosen
):
    # within the measurement's resolution the decision's own choice (here the priority's,
    # timed:slow) is kept; a candidate clearly faster replaces it
    tuned.set(ATTN_DISPATCH_DISABLE=WRONG)
    fast = type(ad._settings.current().registry.implementations[FAST])
    monkeypatch.setattr(fast, "cost", timed.SLOW_SECONDS / faster)
    args = inputs()
    ad.backward(*args, causal=True)
    report = ad.explain(*args, causal=True)
    times = {t.name: t.seconds for t in report.autotune.timings}
    assert times[FAST] < times[SLOW]
    assert report.selected == chosen
    kept = "within autotune's margin of the fastest, the decision's own"
    assert (kept in str(report)) == (chosen == SLOW)


def test_the_forward_is_tuned_too(tuned):
    q, k, v, *_ = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        out, lse = ad.forward(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), oracle(q, k, v, causal=True).out)
    assert ad.decide(q, k, v, mode="forward", causal=True).name == FAST


def test_timing_does_not_touch_the_callers_tensors(tuned):
    """timed:wrong writes into q and grad_out; it only ever sees clones."""
    args = inputs()
    before = [t.clone() for t in args]
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    for got, want in zip(args, before):
        assert torch.equal(got, want)


def test_clones_keep_strides_overlap_and_pointer_residues():
    base = torch.randn(3, 40)
    for t in (base[:, 3:19], base.t(), torch.randn(5, 1, 8).expand(5, 4, 8), torch.empty(0, 3)):
        clone = _autotune._clone(t)
        assert clone.shape == t.shape and clone.stride() == t.stride()
        assert torch.equal(clone, t)
        if t.numel():
            assert clone.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
            assert clone.data_ptr() % 256 == t.data_ptr() % 256


def test_autograd_is_unchanged_under_autotune(tuned):
    """ad.attention's gradients under autotune equal a forced correct implementation's, and
    the measurement leaves no gradient or graph on the caller's tensors."""
    q, k, v, *_ = inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with pytest.warns(UserWarning, match=EXCLUDED):
        out = ad.attention(*leaves, causal=True)
        out.square().sum().backward()
    forced = [t.clone().requires_grad_() for t in (q, k, v)]
    ad.attention(*forced, causal=True, backend=SLOW).square().sum().backward()
    for tuned_leaf, forced_leaf in zip(leaves, forced):
        torch.testing.assert_close(tuned_leaf.grad, forced_leaf.grad)
    # a second step: the decisions are made, nothing is timed, the gradients accumulate once
    before = calls()
    out = ad.attention(*leaves, causal=True)
    out.square().sum().backward()
    assert calls()[SLOW] == before[SLOW] and calls()[WRONG] == before[WRONG]
    torch.testing.assert_close(leaves[0].grad, 2 * forced[0].grad)


SUBPROCESS = textwrap.dedent(
    """
    import json, warnings
    import torch
    import attn_dispatch as ad
    from attn_dispatch import _measure
    from attn_dispatch_test_plugins import timed
    _measure.clock = timed.CLOCK
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, 4, 16, generator=gen)
    k, v = (torch.randn(1, 16, 2, 16, generator=gen) for _ in range(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = ad.forward(q, k, v, causal=True)
        ad.backward(q, k, v, out, lse, torch.ones_like(out), causal=True)
    status = ad.explain(q, k, v, out, lse, out, causal=True).autotune.status
    print(json.dumps({"calls": dict(timed.CALLS), "status": status,
                      "warned": [str(w.message)[:40] for w in caught]}))
    """
)


def process_env(cache, **env_vars) -> dict:
    """This process's environment without its ATTN_DISPATCH_* settings, autotuning the timed
    plugin into ``cache``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_DISPATCH_")}
    env.update(
        ATTN_DISPATCH_TEST_PLUGINS="timed",
        ATTN_DISPATCH_PLUGINS="timed",
        ATTN_DISPATCH_AUTOTUNE="1",
        ATTN_DISPATCH_CACHE_DIR=str(cache),
        **env_vars,
    )
    return env


def run_process(cache, **env_vars) -> dict:
    env = process_env(cache, **env_vars)
    done = subprocess.run(
        [sys.executable, "-c", SUBPROCESS], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_process_reuses_the_measurement_without_timing(tmp_path):
    cache = tmp_path / "shared"
    first = run_process(cache)
    assert first["calls"][SLOW] > 2 and first["calls"][WRONG] > 2, first
    assert first["warned"] == [EXCLUDED[:40]] * 2  # forward and backward
    assert len(files(cache)) == 2
    second = run_process(cache)
    assert second["calls"] == {FAST: 2}, second  # the forward and the backward, once each
    assert second["status"] == "reused" and second["warned"] == []


def test_concurrent_processes_measuring_one_key_leave_one_whole_file(tmp_path):
    cache = tmp_path / "shared"
    env = process_env(cache)
    command = [sys.executable, "-c", SUBPROCESS]
    running = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for process in running:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode()
    names = files(cache)
    assert len(names) == 2, names  # forward and backward; no temporary file left
    for name in names:
        entry = json.loads((cache / "autotune" / name).read_text())
        assert set(entry["timings"]) == {SLOW, FAST} and set(entry["excluded"]) == {WRONG}
    assert run_process(cache)["calls"] == {FAST: 2}


def test_a_fresh_decision_still_decides_what_may_run_in_a_new_process(tmp_path):
    """Blocking the remembered fastest in a later process runs the fastest admitted one that
    agreed, without timing again; the wrong one is never chosen."""
    cache = tmp_path / "shared"
    run_process(cache)
    blocked = run_process(cache, ATTN_DISPATCH_DISABLE=FAST)
    assert blocked["calls"] == {SLOW: 2}, blocked


def test_a_version_change_measures_again(tuned, cache, monkeypatch):
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    first = calls()
    versions = _autotune.versions

    def upgraded(settings, names):
        found = versions(settings, names)
        assert found["timed:attn-dispatch-test-plugins"] == "0.0.1"
        return found | {"timed:attn-dispatch-test-plugins": "0.0.2"}

    monkeypatch.setattr(_autotune, "versions", upgraded)
    ad.reload()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    assert calls()[SLOW] >= 2 * first[SLOW]  # timed again
    assert len(files(cache)) == 2  # the new versions' measurement beside the old one


def test_versions_name_the_backend_distribution_and_what_it_requires(timed_env):
    found = _autotune.versions(ad._settings.current(), [SLOW, FAST])
    assert found["timed:attn-dispatch-test-plugins"] == "0.0.1"
    assert found["torch"] == torch.__version__ and found["attn-dispatch"] == ad.__version__
    # a backend's requirements (e.g. the kernel library it wraps) are part of the key
    found = _measure.distribution_versions(["attn-dispatch"], requirements=True)
    assert found["packaging"] == _version("packaging")


def _version(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)


def test_forced_calls_are_not_tuned(tuned, cache):
    ad.backward(*inputs(), causal=True, backend=SLOW)
    with ad.use_backend("timed"):
        assert ad.decide(*inputs(), causal=True).name == SLOW
    assert calls() == {SLOW: 1, WRONG: 0, FAST: 0} and files(cache) == []


def test_blocked_implementations_are_not_measured(tuned):
    tuned.set(ATTN_DISPATCH_AUTOTUNE="1", ATTN_DISPATCH_DISABLE=WRONG)
    ad.backward(*inputs(), causal=True)  # no warning: the wrong one is not a candidate
    assert calls()[WRONG] == 0 and calls()[FAST] > 1
    assert ad.decide(*inputs(), causal=True).name == FAST


def test_a_determinism_request_keeps_out_the_non_deterministic_one(tuned):
    """Two candidates that disagree: the higher-priority one is trusted."""
    with pytest.warns(UserWarning, match="autotune excluded timed:wrong: .* with timed:slow "):
        ad.backward(*inputs(), causal=True, deterministic=True)
    assert calls()[FAST] == 0
    assert ad.decide(*inputs(), causal=True, deterministic=True).name == SLOW


def assert_pending_and_nothing_timed(report, note: str, cache) -> None:
    assert report.selected == SLOW and report.autotune.status == "pending"
    assert report.autotune.note == note
    assert report.to_dict()["autotune"]["status"] == "pending"
    assert calls() == {SLOW: 0, WRONG: 0, FAST: 0} and files(cache) == []


def test_explain_before_the_first_call_says_what_will_be_timed(tuned, cache):
    report = ad.explain(*inputs(), causal=True)
    note = (
        "not measured (explain and decide never measure); the first call will time "
        "timed:slow, timed:wrong, timed:fast"
    )
    assert_pending_and_nothing_timed(report, note, cache)


@pytest.mark.parametrize("where", ["meta", "arch"])
def test_explain_for_another_device_says_what_its_first_call_will_time(tuned, cache, where):
    """On meta tensors or for a named arch nothing can be timed, and the report says so."""
    tuned.set(ATTN_DISPATCH_ARCH="cpu")
    args = [t.to("meta") for t in inputs()] if where == "meta" else inputs()
    report = ad.explain(*args, causal=True, arch="cpu" if where == "arch" else None)
    note = (
        "not measured (no device to time: meta tensors or another arch); a first call on the "
        "device will time timed:slow, timed:wrong, timed:fast"
    )
    assert_pending_and_nothing_timed(report, note, cache)


def test_one_candidate_is_not_measured(tuned, cache):
    tuned.set(ATTN_DISPATCH_AUTOTUNE="1", ATTN_DISPATCH_DISABLE="timed:wrong,timed:fast")
    ad.backward(*inputs(), causal=True)
    assert calls()[SLOW] == 1 and files(cache) == []
    assert ad.explain(*inputs(), causal=True).autotune.status == "single"


def test_the_python_switch_and_its_context_manager(timed_env):
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED), ad.autotune():
        assert ad.backward(*args, causal=True) is not None
        assert ad.decide(*args, causal=True).name == FAST
    assert ad.decide(*args, causal=True).name == SLOW  # restored: off, decided afresh
    ad.autotune(True)
    assert ad.decide(*args, causal=True).name == FAST  # remembered in this process
    with ad.autotune(False):
        assert ad.decide(*args, causal=True).name == SLOW
    assert ad.decide(*args, causal=True).name == FAST
    ad.autotune(None)  # back to the environment variable (unset: off)
    assert ad.decide(*args, causal=True).name == SLOW
    with pytest.raises(TypeError, match="argument 'enabled': expected a bool or None"):
        ad.autotune("yes")


@pytest.mark.parametrize("value", ["maybe", "2", "enable", ""])
def test_a_bad_autotune_variable_is_a_clear_error(timed_env, value):
    with pytest.raises(ad.SettingError, match=f"ATTN_DISPATCH_AUTOTUNE='{value}' is not a boolean"):
        timed_env.set(ATTN_DISPATCH_AUTOTUNE=value)


@pytest.mark.parametrize("value", ["1", "true", "ON", "yes"])
def test_every_spelling_of_true_switches_it_on(timed_env, value):
    timed_env.set(ATTN_DISPATCH_AUTOTUNE=value)
    assert ad._settings.current().autotune is not None


def test_the_default_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTN_DISPATCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _settings.cache_directory() == tmp_path / "attn_dispatch" / "autotune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "attn_dispatch" / "autotune"
    assert _settings.cache_directory() == expected
    monkeypatch.setenv("ATTN_DISPATCH_CACHE_DIR", str(tmp_path / "mine"))
    assert _settings.cache_directory() == tmp_path / "mine" / "autotune"


def test_a_cache_directory_of_an_unknown_user_is_a_setting_error(timed_env):
    """``~user`` of no such user cannot be expanded: the error names the variable."""
    named = "ATTN_DISPATCH_CACHE_DIR='~no_such_user_4f2a/x'"
    with pytest.raises(ad.SettingError, match=named):  # setting it reloads the settings
        timed_env.set(ATTN_DISPATCH_AUTOTUNE="1", ATTN_DISPATCH_CACHE_DIR="~no_such_user_4f2a/x")
    with pytest.raises(ad.SettingError, match=named):
        ad.backward(*inputs(), causal=True)
    with pytest.raises(ad.SettingError, match="ATTN_DISPATCH_CACHE_DIR"):
        _settings.costs_directory()


DAMAGES = [
    "cut short",
    "no timings",
    "negative time",
    "deep brackets",
    "not utf-8",
    "a list",
    "timings a list",
    "time a string",
    "time a boolean",
    "reason a number",
    "time beyond float",
]


def _damaged(entry: dict, damage: str) -> bytes:
    """The bytes of ``entry``'s file after ``damage``."""
    text = json.dumps(entry)
    damaged = {
        "cut short": text[:40],
        "no timings": json.dumps({k: v for k, v in entry.items() if k != "timings"}),
        "negative time": json.dumps(entry | {"timings": {FAST: -1.0}}),
        "deep brackets": "[" * 100_000,
        "a list": json.dumps([entry]),
        "timings a list": json.dumps(entry | {"timings": [FAST, 1.0]}),
        "time a string": json.dumps(entry | {"timings": {FAST: "1e-6"}}),
        "time a boolean": json.dumps(entry | {"timings": {FAST: True, SLOW: 1.0}}),
        "reason a number": json.dumps(entry | {"excluded": {WRONG: 3}}),
        # every time an integer beyond float's range: the choice among them overflowed
        "time beyond float": json.dumps(
            entry | {"timings": {t: 10**400 for t in entry["timings"]}}
        ),
    }
    if damage == "not utf-8":
        return b"\xff\xfe" + text.encode("utf-16-le")
    return damaged[damage].encode()


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_measurement_path_that_is_no_regular_file_is_measured_again(tuned, cache, kind):
    """A directory or a FIFO where the file belongs: ignored (a FIFO's read would block the
    call for good), the call measured again."""
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    (name,) = files(cache)
    path = cache / "autotune" / name
    path.unlink()
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    _autotune.forget()
    ad.reload()
    before = calls()[SLOW]
    with pytest.warns(UserWarning) as warned:
        ad.backward(*args, causal=True)
    assert calls()[SLOW] > before
    messages = " ".join(str(w.message) for w in warned)
    assert "autotune excluded" in messages
    # a directory cannot be replaced by the new file: said once, kept in memory
    assert ("autotune cannot write" in messages) == (kind == "directory")


@pytest.mark.parametrize("damage", DAMAGES)
def test_an_unreadable_file_is_measured_again(tuned, cache, damage):
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    (name,) = files(cache)
    path = cache / "autotune" / name
    path.write_bytes(_damaged(json.loads(path.read_text()), damage))
    _autotune.forget()
    ad.reload()
    before = calls()[SLOW]
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    assert calls()[SLOW] > before
    assert json.loads((cache / "autotune" / name).read_text())["format"] == _autotune.FORMAT
    assert files(cache) == [name]  # rewritten whole, no temporary file left


def _with_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[(0,) * t.dim()] = float("nan")
    return t


@pytest.mark.parametrize("where", [0, 5])  # q, grad_out
def test_a_call_with_non_finite_inputs_is_run_not_measured(tuned, cache, where):
    """Every candidate's answer to NaN inputs is NaN: nothing to judge. The call runs the
    priority decision; the next call of the signature, with finite values, measures."""
    args = inputs()
    poisoned = tuple(_with_nan(t) if i == where else t for i, t in enumerate(args))
    dq, _, _ = ad.backward(*poisoned, causal=True)  # no warning: nobody is excluded
    assert calls() == {SLOW: 1, WRONG: 0, FAST: 0} and files(cache) == []
    report = ad.explain(*poisoned, causal=True)
    assert report.selected == SLOW and report.autotune.status == "pending"
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    (name,) = files(cache)
    entry = json.loads((cache / "autotune" / name).read_text())
    assert set(entry["timings"]) == {SLOW, FAST} and set(entry["excluded"]) == {WRONG}
    assert ad.explain(*args, causal=True).selected == FAST


def test_a_candidate_with_non_finite_results_is_excluded_not_trusted(tuned, monkeypatch):
    """The highest-priority candidate returning NaN agrees with nobody; it must not become the
    consensus that excludes the correct ones."""
    tuned.set(ATTN_DISPATCH_AUTOTUNE="1", ATTN_DISPATCH_DISABLE=WRONG)
    slow_backward = timed.Slow.backward

    def nan_dq(self, inp):
        dq, dk, dv = slow_backward(self, inp)
        return ad.Gradients(_with_nan(dq), dk, dv)

    monkeypatch.setattr(timed.Slow, "backward", nan_dq)
    with pytest.warns(UserWarning, match="excluded timed:slow: returned non-finite dq where"):
        ad.backward(*inputs(), causal=True)
    report = ad.explain(*inputs(), causal=True)
    assert report.selected == FAST
    times = {t.name: t for t in report.autotune.timings}
    assert times[FAST].excluded is None and times[SLOW].seconds is None


def test_no_finite_results_leave_nothing_measured(tuned, cache):
    """Finite inputs whose lse overflows float32 in every candidate: nothing is judged or kept."""
    q, k, v, *_ = inputs()
    q, k = q * 1e20, k * 1e20
    out, lse = ad.forward(q, k, v, causal=True)
    assert torch.isposinf(lse).any() and files(cache) == []
    assert calls()[WRONG] >= 1  # it was run, and not excluded: nothing was compared
    report = ad.explain(q, k, v, causal=True)
    assert report.selected == SLOW and report.autotune.status == "pending"


def test_a_measurement_records_what_it_was_measured_on(tuned, cache):
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    (name,) = files(cache)
    path = cache / "autotune" / name
    entry = json.loads(path.read_text())
    on = entry["measured_on"]
    assert on["finite"] is True
    assert on["largest"]["q"] == args[0].abs().max().item()
    assert set(on["largest"]) == {"q", "k", "v", "out", "lse", "grad_out"}
    # a verdict of the earlier format, which holds no such record (it may have been taken from
    # NaN answers: the highest priority alone, the others excluded), is measured again
    poisoned = dict(entry, format=1, timings={SLOW: 1.0}, excluded={WRONG: "x", FAST: "x"})
    del poisoned["measured_on"]
    path.write_text(json.dumps(poisoned))
    _autotune.forget()
    ad.reload()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    assert ad.explain(*args, causal=True).selected == FAST


def test_an_unwritable_directory_keeps_the_measurement_in_the_process(tuned, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tuned.set(ATTN_DISPATCH_AUTOTUNE="1", ATTN_DISPATCH_CACHE_DIR=str(blocker))
    with pytest.warns(UserWarning, match="autotune cannot write its measurements"):
        with pytest.warns(UserWarning, match=EXCLUDED):
            ad.backward(*inputs(), causal=True)
    assert ad.decide(*inputs(), causal=True).name == FAST


def test_graph_and_eager_execution_are_measured_apart(tuned, cache):
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    with pytest.warns(UserWarning, match=EXCLUDED), ad.execution_mode("graph"):
        ad.backward(*args, causal=True)
        report = ad.explain(*args, causal=True)
    assert report.autotune.note.startswith("measured earlier, graph execution")
    assert len(files(cache)) == 2


def test_meta_tensors_are_decided_by_priority(tuned):
    tuned.set(ATTN_DISPATCH_ARCH="cpu")  # meta stands for the GPU where there is one
    meta = [t.to("meta") for t in inputs()]
    dq, _, _ = ad.backward(*meta, causal=True)
    assert dq.device.type == "meta" and sum(calls().values()) == 0
    assert ad.decide(*meta, causal=True).name == SLOW


def tune(*argv: str) -> int:
    from attn_dispatch.tools.cli import main

    return main(["tune", *argv])


def test_the_tune_command_measures_each_shape_once(timed_env, cache, capsys, tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# a model's attention shapes\n1,16,4,2,16\n\n2,8,4,4,16,24  # cross\n")
    flags = ("--dtype", "f32", "--causal", "--device", "cpu")
    with pytest.warns(UserWarning, match=EXCLUDED):
        assert tune("--shapes", str(shapes), "--shape", "1,8,2,1,16", *flags) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"tuning 3 shape(s) on cpu, eager execution -> {cache / 'autotune'}"
    assert lines[1].startswith("[1/3] B=1 S=8 H=2/1 D=16 f32 causal: forward timed:fast ")
    assert lines[2].startswith("[2/3] B=1 S=16 H=4/2 D=16 f32 causal: forward timed:fast ")
    assert lines[3].startswith("[3/3] B=2 S=8 Sk=24 H=4/4 D=16 f32 causal: forward timed:fast ")
    for line in lines[1:]:
        assert line.count("(3 timed, 1 excluded)") == 2, line
    assert len(files(cache)) == 6
    # a second run (here: after reload, as a new process would) times nothing
    ad.reload()
    _autotune.forget()
    before = calls()
    assert tune("--shape", "1,16,4,2,16", "--json", str(tmp_path / "r.json"), *flags) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.count("(measured before, 1 excluded)") == 2, line
    assert calls()[SLOW] == before[SLOW]
    (record,) = json.loads((tmp_path / "r.json").read_text())
    assert record["backward"]["selected"] == FAST and record["backward"]["measured_now"] is False
    assert ad._settings.current().autotune is None  # the command's switch is undone


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--shape", "1,2,3"), "argument --shape: expected B,S,H,HKV,D or B,S,H,HKV,D,SK"),
        (("--shape", "1,8,3,2,16"), "H=3 is not a multiple of HKV=2"),
        (("--shape", "1,0,2,2,16"), "expected an integer >= 1, got 0"),
        ((), "no shape to tune: give --shape"),
        (("--shape", "1,8,2,2,16", "--passes", "sideways"), "--passes: expected a comma list"),
        (("--shape", "1,8,2,2,16", "--device", "warp"), "--device: expected a device such as"),
        (("--shape", "1,8,2,2,16", "--device", "meta"), "--device meta: expected cuda or cpu"),
    ],
)
def test_the_tune_command_names_bad_arguments(timed_env, capsys, argv, message):
    assert tune(*argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a missing directory", "a directory"])
def test_the_tune_command_checks_its_output_path_before_tuning(
    timed_env, cache, capsys, tmp_path, where
):
    path = tmp_path / "no-such-dir" / "r.json" if where == "a missing directory" else tmp_path
    assert tune("--shape", "1,8,2,2,16", "--device", "cpu", "--json", str(path)) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("attn-dispatch tune: error: --json: ")
    assert captured.out == "" and files(cache) == [] and sum(calls().values()) == 0


def test_the_tune_command_names_a_bad_line_of_its_file(timed_env, capsys, tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1,8,2,2,16\n1,8,2,2\n")
    assert tune("--shapes", str(shapes)) == 2
    assert f"--shapes {shapes}, line 2: expected B,S,H,HKV,D" in capsys.readouterr().err


def test_a_hopeless_candidate_is_not_sampled_further(timed_env):
    """Measured after a much faster one, the slow implementation gets one timed call."""
    from attn_dispatch._dispatch import BACKWARD
    from attn_dispatch.backend import make_inputs

    args = inputs()
    inp = make_inputs(*args, causal=True, causal_align="top_left", scale=None, deterministic=False)
    registry = ad._settings.current().registry
    pool = [registry.implementations[FAST], registry.implementations[SLOW]]
    found = _autotune._measure_pool(BACKWARD, inp, args, pool, "eager")
    # the cross-checked run and the settling calls, each hopeless
    assert calls()[SLOW] == 1 + _autotune.SETTLE_CALLS
    assert calls()[FAST] >= 1 + _autotune.SETTLE_CALLS + _autotune.REPEATS
    assert found["timings"] == pytest.approx({FAST: timed.FAST_SECONDS, SLOW: timed.SLOW_SECONDS})
    assert found["excluded"] == {}


def record_early_calls(monkeypatch, name: str) -> None:
    """``name``'s second and third calls cost 25 times ``timed:slow``'s, as an implementation
    that records its early calls to replay the later ones (FA4's host-code replay)."""
    impl = ad._settings.current().registry.implementations[name]
    plain = type(impl).backward

    def recording(self, inp):
        if timed.CALLS[name] in (1, 2):
            timed.CLOCK.advance(25 * timed.SLOW_SECONDS)
        return plain(self, inp)

    monkeypatch.setattr(type(impl), "backward", recording)


def measure(*names: str) -> dict:
    """``_measure_pool`` of a backward over ``names``, measured in that order."""
    from attn_dispatch._dispatch import BACKWARD
    from attn_dispatch.backend import make_inputs

    args = inputs()
    inp = make_inputs(*args, causal=True, causal_align="top_left", scale=None, deterministic=False)
    registry = ad._settings.current().registry
    pool = [registry.implementations[n] for n in names]
    return _autotune._measure_pool(BACKWARD, inp, args, pool, "eager")


def test_a_candidate_whose_early_calls_record_is_not_judged_hopeless(timed_env, monkeypatch):
    """Measured after a faster one, an implementation whose early calls record is timed by its
    replays, not judged hopeless on one recording call."""
    record_early_calls(monkeypatch, FAST)
    found = measure(SLOW, FAST)
    assert found["timings"] == pytest.approx({FAST: timed.FAST_SECONDS, SLOW: timed.SLOW_SECONDS})


def test_samples_are_sized_by_a_replayed_call_not_a_recording_one(timed_env, monkeypatch):
    """Measured first (nothing to be hopeless against), an implementation whose early calls
    record gets samples sized by its fastest settling call: as many calls per sample as its
    replays need, not the one call a recording call would size them to."""
    record_early_calls(monkeypatch, FAST)
    found = measure(FAST)
    assert _autotune.SAMPLE_SECONDS >= 2 * timed.FAST_SECONDS  # two replays fill a sample
    in_samples = calls()[FAST] - 1 - _autotune.SETTLE_CALLS
    assert in_samples >= 2 * _autotune.REPEATS
    assert found["timings"] == pytest.approx({FAST: timed.FAST_SECONDS})


def test_a_candidate_whose_clones_cannot_be_allocated_is_excluded_alone(timed_env, monkeypatch):
    """Every candidate's clones live until all are timed; one that no longer fits (the device
    out of memory) costs only that candidate."""
    real = _autotune._cloned
    made = []

    def cloned(inp):
        made.append(inp)
        if len(made) == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(inp)

    monkeypatch.setattr(_autotune, "_cloned", cloned)
    found = measure(SLOW, FAST)
    assert found["timings"] == pytest.approx({SLOW: timed.SLOW_SECONDS})
    assert found["excluded"] == {
        FAST: "raised RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    }


def test_a_call_with_sinks_is_measured_apart_and_its_dsinks_cross_checked(timed_env):
    """The measurement key holds the sinks' metadata (a call without them keeps the key it
    had), and two candidates whose dsinks differ disagree."""
    from attn_dispatch import _call
    from attn_dispatch import backend as adb

    q, k, v, out, lse, grad_out = inputs()
    sinks = torch.zeros(4)
    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    call = _call.Call(_call.Kind.BACKWARD, **flags)
    settings = ad._settings.current()
    tensors = (q, k, v, out, lse, grad_out)
    seqlens = (None, None, None, None)
    keys = [
        _autotune.signature_key(
            settings, "backward", call, tensors, seqlens, adb.make_inputs(*tensors, **kw), []
        )
        for kw in (dict(flags), dict(flags, sinks=sinks))
    ]
    assert "sinks" not in keys[0] and keys[1].pop("sinks") == [[4], [1], "float32"]
    assert keys[0] == keys[1]
    grads = (torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3))
    same = _measure.agreement((*grads, sinks), (*grads, sinks.clone()), False, torch.float32)
    other = _measure.agreement((*grads, sinks), (*grads, sinks + 1), False, torch.float32)
    assert same is None and other.startswith("dsinks:")


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values at the same shape and strides, 4 bytes off its alignment."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


def test_a_measured_choice_never_runs_where_a_fresh_decision_rejects_it(tuned, monkeypatch):
    # timed:fast (lowest priority) needs 16-byte aligned tensors. Priority alone picks slow,
    # whose verdict reads no pointers, so the decision would hold for any alignment; once
    # measurement picked fast, a misaligned call must not reuse it.
    monkeypatch.setattr(timed.Fast, "alignment", 16)
    args = inputs()
    with pytest.warns(UserWarning, match=EXCLUDED):
        ad.backward(*args, causal=True)
    assert ad.explain(*args, causal=True).selected == FAST
    before = calls()[FAST]
    shifted = (_misaligned(args[0]), *args[1:])
    assert "alignment" in " ".join(
        r for c in ad.explain(*shifted, causal=True).candidates if c.name == FAST for r in c.reasons
    )
    ad.backward(*shifted, causal=True)
    assert calls()[FAST] == before


def test_the_python_switch_overrides_a_bad_variable(timed_env, monkeypatch):
    with ad.autotune(False):  # the variable is not read while the switch decides
        monkeypatch.setenv("ATTN_DISPATCH_AUTOTUNE", "maybe")
        ad.reload()
        assert ad.decide(*inputs(), causal=True).name == SLOW
        monkeypatch.delenv("ATTN_DISPATCH_AUTOTUNE")


def test_a_bad_setting_read_by_a_candidate_is_the_callers_error(tuned, monkeypatch):
    def reads_a_bad_setting(self, inp):
        raise ad.SettingError("ATTN_DISPATCH_SOMETHING='x': expected a boolean")

    monkeypatch.setattr(timed.Fast, "backward", reads_a_bad_setting)
    with pytest.raises(ad.SettingError, match="ATTN_DISPATCH_SOMETHING"):
        ad.backward(*inputs(), causal=True)


def test_dsinks_does_not_loosen_the_cross_check_of_the_other_gradients():
    dq = torch.ones(64)
    big_dsinks = torch.full((4,), 1000.0)
    wrong = (dq * 1.5, dq, dq, big_dsinks)
    assert _measure.agreement(wrong, (dq, dq, dq, big_dsinks), False, torch.bfloat16)


ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"


def test_a_device_fault_ends_the_measurement_naming_the_candidate(tuned, cache, monkeypatch):
    """A candidate whose call reports a device fault is not excluded like one that raised: no
    other candidate can run after it, and nothing is cached or written."""
    impl = ad._settings.current().registry.implementations[FAST]

    def faults(self, inp):
        raise RuntimeError(ILLEGAL_ACCESS)

    monkeypatch.setattr(type(impl), "backward", faults)
    with pytest.raises(_measure.DeviceFault, match=f"autotune's backward of {FAST} ran: .*illegal"):
        ad.backward(*inputs(), causal=True)
    assert calls()[SLOW] <= 1 and files(cache) == []
    report = ad.explain(*inputs(), causal=True)
    assert report.autotune.status == "pending"


def test_a_fault_shown_only_at_the_measurement_s_end_is_charged_to_the_measurement(
    timed_env, monkeypatch
):
    """A fault the device reports only once the candidates' graphs and clones are released
    names the measurement (execution, candidates, kind); its timings are not returned."""
    asked = []

    def device_fault(device):
        asked.append(device)
        return f"AcceleratorError: {ILLEGAL_ACCESS}"

    monkeypatch.setattr(_measure, "device_fault", device_fault)
    with pytest.raises(_measure.DeviceFault) as caught:
        measure(SLOW, FAST)
    assert str(caught.value) == (
        f"the device faulted during autotune's eager measurement of {SLOW}, {FAST} (backward): "
        f"AcceleratorError: {ILLEGAL_ACCESS}"
    )
    assert len(asked) == 1


def test_a_pass_of_an_eager_attention_call_keeps_the_measurement_key_of_a_plain_call(timed_env):
    """Autotune times each pass alone: an eager ``attention`` call's pass (``Call.attention``,
    which the cost tables rank apart) finds the measurements of the same plain call."""
    from attn_dispatch import _call
    from attn_dispatch import backend as adb

    q, k, v, out, lse, grad_out = inputs()
    flags = dict(causal=True, causal_align="top_left", scale=None, deterministic=False)
    tensors = (q, k, v, out, lse, grad_out)
    inp = adb.make_inputs(*tensors, **flags)
    keys = [
        _autotune.signature_key(
            ad._settings.current(),
            "backward",
            _call.Call(_call.Kind.BACKWARD, **flags, attention=layout),
            tensors,
            (None, None, None, None),
            inp,
            [],
        )
        for layout in (None, "bshd", "bhsd")
    ]
    assert keys[0] == keys[1] == keys[2]
