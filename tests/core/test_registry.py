"""The plugin registry: entry points that clash, malformed declarations and priorities, and a
plugin that calls the library while it loads each cost only their own plugin.

Plugins here are real entry points: a distribution's metadata (``*.dist-info``) and its module
are written to a temporary directory put first on ``sys.path`` (``dispatch_helpers.Plugins``),
and ``importlib.metadata`` discovers them as it would an installed package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dispatch_helpers import Plugins, make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch.tools import cli


def _env_with(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return env


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


def test_a_string_deterministic_declaration_fails_its_plugin(plugins, env):
    body = 'class Str(Tagged):\n    name, deterministic, priority = "str", "False", {"*": 9}\n'
    plugins.backend("strdet", body, "[Str()]")
    with pytest.warns(UserWarning, match="deterministic='False' must be a bool"):
        env.set(ATTN_DISPATCH_PLUGINS="strdet,reference")
    assert ad.explain(*make_inputs(), deterministic=True).selected == "reference:chunked"


def test_a_backend_name_no_variable_could_list_is_not_loaded(plugins, env):
    """``colon:x`` would join as ``colon:x:impl``: forcing or blocking it by its own name would
    split it at the first ``:`` and never match."""
    source = IMPOSTOR.replace('"reference", "chunked"', '"colon:x", "i"')
    plugins.add("rel-colon", {"colon:x": "rel_colon"}, {"rel_colon": source})
    with pytest.warns(UserWarning, match="'colon:x' is not loaded: the entry point's name"):
        env.set(ATTN_DISPATCH_PLUGINS="colon:x,reference")
    errors = {b.name: b.error for b in ad.backends()}
    assert "is not a name of letters, digits" in errors["colon:x"]
    assert errors["reference"] is None
    assert ad.explain(*make_inputs()).selected == "reference:chunked"


@pytest.mark.parametrize("name", ["a b", "a,b", "a:b", "", 5], ids=repr)
def test_an_implementation_name_no_variable_could_list_fails_its_plugin(plugins, env, name):
    plugins.backend("named", f"class Named(Tagged):\n    name, tag = {name!r}, 1.0\n", "[Named()]")
    with pytest.warns(UserWarning, match="'named' is invalid: .*its name"):
        env.set(ATTN_DISPATCH_PLUGINS="named,reference")
    (named,) = [b for b in ad.backends() if b.name == "named"]
    assert f"its name {name!r} is not a name of letters, digits" in named.error
    assert ad.explain(*make_inputs()).selected == "reference:chunked"
