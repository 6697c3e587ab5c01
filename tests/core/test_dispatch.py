"""Regression tests of the dispatch layer's reliability (issue 24): each fails without its fix.

Plugins here are real entry points: a distribution's metadata (``*.dist-info``) and its module
are written to a temporary directory put first on ``sys.path``, and ``importlib.metadata``
discovers them as it would an installed package.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import _dispatch, _guards, _selection, cli

TAGGED = """
import torch
import attn_dispatch as ad
from attn_dispatch import backend as adb


class Tagged(adb.Implementation):
    backend = {backend!r}
    tag = 0.0

    def backward(self, inp):
        return ad.Gradients(*(torch.full_like(t, self.tag) for t in (inp.q, inp.k, inp.v)))

    def forward(self, inp):
        out = inp.q.new_full(inp.q.shape[:-1] + (inp.head_dim_v,), self.tag)
        lse = (inp.heads, inp.q.shape[0]) if inp.is_varlen else (inp.batch, inp.heads, inp.seqlen_q)
        return out, torch.full(lse, self.tag, dtype=adb.lse_dtype(inp.dtype), device=inp.q.device)


class Fallback(Tagged):
    name, tag, priority = "fallback", 9.0, {{"*": 1}}
"""


class Plugins:
    """Writes plugin distributions into one directory on ``sys.path``."""

    def __init__(self, root: Path, monkeypatch) -> None:
        self.root = root
        self.modules: list[str] = []
        monkeypatch.syspath_prepend(str(root))

    def add(self, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
        for module, source in modules.items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(source))
            self.modules.append(module)
        info = self.root / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[attn_dispatch.backends]\n{lines}")

    def backend(self, name: str, body: str, provides: str) -> None:
        """A backend ``name`` (module ``rel_<name>``): TAGGED, then ``body``, then a hook
        returning ``provides`` (a list expression)."""
        source = (
            TAGGED.format(backend=name)
            + textwrap.dedent(body)
            + f"\n\n@adb.hookimpl\ndef attn_dispatch_implementations():\n    return {provides}\n"
        )
        self.add(f"rel-{name}", {name: f"rel_{name}"}, {f"rel_{name}": source})


@pytest.fixture
def plugins(env, tmp_path, monkeypatch):
    made = Plugins(tmp_path, monkeypatch)
    yield made
    for module in made.modules:
        sys.modules.pop(module, None)


def _env_with(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return env


# 1 -------------------------------------------------------------------------------------------


def test_attention_refuses_a_meta_tensor_among_real_ones(env):
    q = v = torch.randn(1, 64, 2, 8)
    k = q.to("meta")
    with pytest.raises(ValueError, match="argument 'k': expected device cpu .* got meta"):
        ad.attention(q, k, v)
    with pytest.raises(ValueError, match="argument 'v'"):
        ad.attention(q, q, k)


# 2 -------------------------------------------------------------------------------------------

ALIGN = """
SEEN = []


class Aligned(Tagged):
    '''Reads data pointers in supports (without declaring ``alignment``).'''

    name, tag, priority = "aligned", 1.0, {"*": 50}

    def supports(self, inp, arch):
        pointers = [t.data_ptr() for t in (inp.q, inp.k, inp.v)]
        SEEN.extend(pointers)
        return [] if all(p % 16 == 0 for p in pointers) else ["misaligned"]


class Declared(Tagged):
    '''Declares ``alignment``: the core reads the pointers.'''

    name, tag, priority, alignment = "declared", 2.0, {"*": 40}, 16
"""

IDENTITY = """
class SameOffsets(Tagged):
    '''Depends on ``cu_seqlens_q is cu_seqlens_k``.'''

    name, tag, priority = "same_offsets", 3.0, {"*": 50}

    def supports(self, inp, arch):
        return [] if inp.cu_seqlens_q is inp.cu_seqlens_k else ["distinct cu_seqlens"]
"""


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose data pointer is 4 bytes past an aligned one."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16
    return view


@pytest.mark.parametrize("impl", ["aligned", "declared"])
def test_a_decision_that_read_data_pointers_is_remade_for_other_alignments(plugins, env, impl):
    plugins.backend("align", ALIGN, "[Aligned(), Declared(), Fallback()]")
    other = {"aligned": "align:declared", "declared": "align:aligned"}[impl]
    env.set(ATTN_DISPATCH_PLUGINS="align", ATTN_DISPATCH_DISABLE=other)
    inputs = make_inputs()
    want = {"aligned": 1.0, "declared": 2.0}[impl]
    for _ in range(3):  # first call, dictionary, guard
        assert tag_of(ad.backward(*inputs)) == want
    bad = tuple(_misaligned(t) for t in inputs)
    assert ad.explain(*bad).selected == "align:fallback"
    for _ in range(3):
        assert tag_of(ad.backward(*bad)) == 9.0
    for _ in range(2):
        assert tag_of(ad.backward(*inputs)) == want
        assert tag_of(ad.backward(*bad)) == 9.0


TOP = """
class Top(Tagged):
    name, tag, priority = "top", 4.0, {"*": 60}
"""


def _cached_pointers() -> list:
    return [d.pointers for d in ad._settings.current().decisions.values()]


def test_a_pointer_reader_ranked_below_the_winner_leaves_the_decision_to_any_alignment(
    plugins, env
):
    plugins.backend("align", ALIGN + TOP, "[Top(), Aligned(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="align")
    inputs = make_inputs()
    for _ in range(2):
        assert tag_of(ad.backward(*inputs)) == 4.0
        assert tag_of(ad.backward(*tuple(_misaligned(t) for t in inputs))) == 4.0
    assert _cached_pointers() == [None]


@pytest.mark.parametrize("forced", [None, "align:aligned"])
def test_a_pointer_reader_that_could_win_keys_the_decision_on_alignment(plugins, env, forced):
    plugins.backend("align", ALIGN + TOP, "[Top(), Aligned(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="align", ATTN_DISPATCH_DISABLE="align:top")
    inputs = make_inputs()
    bad = tuple(_misaligned(t) for t in inputs)
    if forced is None:
        assert tag_of(ad.backward(*bad)) == 9.0  # the reader rejected it, and it ranks above
        assert tag_of(ad.backward(*inputs)) == 1.0
    else:
        assert tag_of(ad.backward(*inputs, backend=forced)) == 1.0
        with pytest.raises(ad.NoBackendError, match="misaligned"):
            ad.backward(*bad, backend=forced)
    assert all(p is not None for p in _cached_pointers())


def test_supports_sees_only_pointer_residues(plugins, env):
    plugins.backend("align", ALIGN, "[Aligned(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="align")
    ad.backward(*make_inputs())
    seen = sys.modules["rel_align"].SEEN
    assert seen and all(0 <= p < _selection.POINTER_RESIDUE for p in seen)


def test_a_decision_is_keyed_on_cu_seqlens_identity(plugins, env):
    plugins.backend("ident", IDENTITY, "[SameOffsets(), Fallback()]")
    env.set(ATTN_DISPATCH_PLUGINS="ident")
    q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    flags = dict(max_seqlen_q=5, max_seqlen_k=5, causal=True)
    for _ in range(2):
        out, _ = ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, **flags)
        assert float(out.flatten()[0]) == 3.0
    other = cu.clone()
    for _ in range(2):
        out, _ = ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=other, **flags)
        assert float(out.flatten()[0]) == 9.0


# 3 -------------------------------------------------------------------------------------------

IMPOSTOR = """
import torch
import attn_dispatch as ad
from attn_dispatch import backend as adb


class Impostor(adb.Implementation):
    backend, name, priority = "reference", "chunked", {"*": 100}

    def backward(self, inp):
        return ad.Gradients(*(torch.full_like(t, 7.0) for t in (inp.q, inp.k, inp.v)))


@adb.hookimpl
def attn_dispatch_implementations():
    return [Impostor()]
"""


def test_a_second_backend_of_the_same_name_shadows_nothing(plugins, env):
    plugins.add("impostor", {"reference": "rel_impostor"}, {"rel_impostor": IMPOSTOR})
    with pytest.warns(UserWarning, match="'reference' is not loaded"):
        env.set(ATTN_DISPATCH_PLUGINS="reference")
    (info,) = ad.backends()
    assert "attn-dispatch-reference" in info.error and "impostor" in info.error
    inputs = make_inputs()
    report = ad.explain(*inputs)
    assert report.selected is None and "impostor" in str(report)
    with pytest.raises(ad.NoBackendError, match="declared by 2 entry points"):
        ad.backward(*inputs)
    with pytest.raises(ad.NoBackendError, match="declared by 2 entry points"):
        ad.backward(*inputs, backend="reference")
    assert cli.main(["list"]) == 0


def test_the_same_module_declared_twice_is_no_clash(plugins, env):
    plugins.add("again", {"reference": "attn_dispatch_reference.plugin"}, {})
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    (info,) = ad.backends()
    assert info.error is None
    ad.backward(*make_inputs())


# 5 -------------------------------------------------------------------------------------------

BAD_PRIORITY = """
class Word(Tagged):
    name, tag, priority = "word", 1.0, {"*": 5}

    def priority_for(self, arch):
        return "high"


class Mutable(Tagged):
    name, tag, priority = "mutable", 2.0, {"*": 5}
"""


def test_a_malformed_priority_costs_only_its_plugin(plugins, env, capsys):
    plugins.backend("prio", BAD_PRIORITY, "[Word(), Mutable()]")
    env.set(ATTN_DISPATCH_PLUGINS="prio,reference")
    impls = ad._settings.current().registry.implementations
    for bad in ({"cpu": "high"}, None, {90: 5}):
        impls["prio:mutable"].priority = bad  # changed after the plugin loaded
        ad._settings.current().forget()
        inputs = make_inputs()
        assert tag_of(ad.backward(*inputs)) != 2.0
        report = ad.explain(*inputs)
        assert report.selected == "reference:chunked"
        statuses = {c.name: (c.status, c.reasons) for c in report.candidates}
        assert statuses["prio:word"][0] == "failed" and "'high'" in statuses["prio:word"][1][0]
        assert statuses["prio:mutable"][0] == "failed"
        (prio,) = [b for b in ad.backends() if b.name == "prio"]
        assert prio.error and "priority" in prio.error
        assert cli.main(["list"]) == 0
        assert cli.main(["explain", "--seqlen", "8", "--heads", "2", "--head-dim", "16"]) == 0
    assert "FAILED" in capsys.readouterr().out


# 6 -------------------------------------------------------------------------------------------


def test_enable_before_any_dispatch_does_not_hang():
    code = "import attn_dispatch as ad; ad.enable(); ad.enable('reference'); print('ok')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


CALLS_BACK = """
import attn_dispatch as ad
from attn_dispatch import backend as adb


@adb.hookimpl
def attn_dispatch_implementations():
    ad.backends()
    return []
"""


def test_a_plugin_calling_the_library_while_loading_fails_alone(tmp_path, monkeypatch):
    plugins = Plugins(tmp_path, monkeypatch)
    plugins.add("calls-back", {"calls_back": "rel_calls_back"}, {"rel_calls_back": CALLS_BACK})
    code = textwrap.dedent("""
        import warnings, torch, attn_dispatch as ad
        warnings.simplefilter("ignore")
        q = torch.randn(1, 8, 2, 16)
        ad.forward(q, q, q)
        (info,) = [b for b in ad.backends() if b.name == "calls_back"]
        print(info.error)
    """)
    env = _env_with(tmp_path) | {"ATTN_DISPATCH_PLUGINS": "calls_back,reference"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0, run.stderr
    assert "while it loads its backend plugins" in run.stdout


# 7 -------------------------------------------------------------------------------------------

GATE = """
import threading

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


# 9 -------------------------------------------------------------------------------------------

RECORDS = """
CALLS = []


class Records(Tagged):
    name, tag, priority = "records", 1.0, {"*": 10}

    def backward(self, inp):
        CALLS.append("backward")
        return super().backward(inp)

    def forward(self, inp):
        CALLS.append("forward")
        return super().forward(inp)
"""


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_meta_inputs_run_no_kernel(plugins, env):
    plugins.backend("rec", RECORDS, "[Records()]")
    env.set(ATTN_DISPATCH_PLUGINS="rec")
    q, k, v = _meta(2, 16, 4, 32), _meta(2, 16, 2, 32), _meta(2, 16, 2, 24)
    out, lse = ad.forward(q, k, v)
    assert (out.shape, out.device, lse.shape, lse.dtype) == (
        (2, 16, 4, 24),
        torch.device("meta"),
        (2, 4, 16),
        torch.float32,
    )
    grads = ad.backward(q, k, v, out, lse, out)
    assert isinstance(grads, ad.Gradients)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert sys.modules["rel_rec"].CALLS == []


def test_meta_backward_of_the_reference_costs_only_shape_logic(env):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    s, h, d = 2**21, 64, 128
    q, out = _meta(1, s, h, d), _meta(1, s, h, d)
    start = time.perf_counter()
    ad.backward(q, q, q, out, _meta(1, h, s, dtype=torch.float32), out)
    assert time.perf_counter() - start < 5


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


# 10 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, error",
    [
        (dict(causal=1), TypeError),
        (dict(deterministic=1), TypeError),
        (dict(deterministic="False"), TypeError),
        (dict(scale=True), TypeError),
        (dict(backend=""), ad.UnknownBackendError),
        (dict(backend=0), TypeError),
    ],
)
def test_validation_does_not_depend_on_the_cache(env, bad, error):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    inputs = make_inputs()
    good = {
        "causal": dict(causal=True),
        "deterministic": dict(deterministic=True),
        "scale": dict(scale=1.0),
        "backend": dict(),  # automatic: ``backend=""`` must not come to mean it
    }[next(iter(bad))]
    for call in (ad.backward, lambda *a, **kw: ad.forward(*a[:3], **kw)):
        with pytest.raises(error):
            call(*inputs, **bad)
        call(*inputs, **good)
        call(*inputs, **good)
        with pytest.raises(error):
            call(*inputs, **bad)


def test_max_seqlen_type_is_checked_after_caching(env):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    for _ in range(2):
        ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        ad.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5.0, max_seqlen_k=5)


# 11 ------------------------------------------------------------------------------------------

ERRORS = """
class Boom(Tagged):
    name, priority = "boom", {"*": 10}

    def backward(self, inp):
        raise RuntimeError("rt: backward exploded")


class Nothing(Tagged):
    name = "nothing"

    def backward(self, inp):
        return None
"""


def test_a_backend_error_names_the_implementation(plugins, env):
    plugins.backend("errs", ERRORS, "[Boom(), Nothing()]")
    env.set(ATTN_DISPATCH_PLUGINS="errs")
    inputs = make_inputs()
    for _ in range(3):  # first call, dictionary, guard
        with pytest.raises(RuntimeError, match="backward exploded") as caught:
            ad.backward(*inputs)
        assert any("errs:boom" in note for note in caught.value.__notes__)
    with pytest.raises(ValueError, match="errs:nothing returned NoneType"):
        ad.backward(*inputs, backend="errs:nothing")


# 12 ------------------------------------------------------------------------------------------


def test_a_bad_arch_variable_is_named(env):
    with pytest.raises(ValueError, match="ATTN_DISPATCH_ARCH"):
        env.set(ATTN_DISPATCH_ARCH="bogus")


def test_arch_variable_is_read_with_the_settings(env, monkeypatch):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    ad.backward(*make_inputs())
    monkeypatch.setenv("ATTN_DISPATCH_ARCH", "sm_90")
    assert ad.explain(*make_inputs(sq=12)).arch.name == "cpu"
    ad.reload()
    assert ad.explain(*make_inputs(sq=12)).arch.name == "sm_90"


def test_attention_scale_is_checked_by_the_library(env):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="argument 'scale': expected a float, got str"):
        ad.attention(q, q, q, scale="abc")


@pytest.mark.parametrize(
    "value, on", [("false", False), ("0", False), ("off", False), ("1", True), ("TRUE", True)]
)
def test_debug_variable_is_a_boolean(env, value, on):
    env.set(ATTN_DISPATCH_DEBUG=value)
    assert ad._settings.current().debug is on


def test_debug_variable_garbage_is_warned_about_and_off(env):
    with pytest.warns(UserWarning, match="ATTN_DISPATCH_DEBUG='maybe' is not a boolean"):
        env.set(ATTN_DISPATCH_DEBUG="maybe")
    assert ad._settings.current().debug is False


def test_backend_variable_is_stripped(toys):
    toys.set(ATTN_DISPATCH_BACKEND=" toy:slow ")
    assert tag_of(ad.backward(*make_inputs())) == 2.0


def test_a_string_deterministic_declaration_fails_its_plugin(plugins, env):
    body = 'class Str(Tagged):\n    name, deterministic, priority = "str", "False", {"*": 9}\n'
    plugins.backend("strdet", body, "[Str()]")
    with pytest.warns(UserWarning, match="deterministic='False' must be a bool"):
        env.set(ATTN_DISPATCH_PLUGINS="strdet,reference")
    assert ad.explain(*make_inputs(), deterministic=True).selected == "reference:chunked"


# 13 ------------------------------------------------------------------------------------------


def test_backends_run_without_grad_recording(env):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    q, k, v, out, lse, do = make_inputs()
    for t in (q, k, v):
        t.requires_grad_(True)
    for _ in range(3):  # first call, dictionary, guard
        grads = ad.backward(q, k, v, out, lse, do)
        assert all(g.grad_fn is None and not g.requires_grad for g in grads)
        out2, lse2 = ad.forward(q, k, v)
        assert out2.grad_fn is None and lse2.grad_fn is None
    assert torch.is_grad_enabled()


# 15 ------------------------------------------------------------------------------------------


def test_cache_eviction_keeps_the_hot_signature_guarded(env, monkeypatch):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    monkeypatch.setattr(_dispatch, "MAX_CACHED_DECISIONS", 8)
    hot = make_inputs(sq=4)
    for _ in range(2):
        ad.backward(*hot)
    # batches of new signatures overflow the dictionary, then want the guard slots before the
    # hot signature is called again
    for batch in range(4):
        for sq in range(5 + 6 * batch, 11 + 6 * batch):
            ad.backward(*make_inputs(sq=sq))
            ad.backward(*make_inputs(sq=sq))
        ad.backward(*hot)
        settings = ad._settings.current()
        assert len(settings.decisions) <= 8
        (entries,) = settings.guarded.values()
        assert _guards.match(entries, hot) is not None, f"batch {batch}"


def test_no_warning_from_a_plain_session(env):
    env.set(ATTN_DISPATCH_PLUGINS="reference")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ad.backward(*make_inputs())
