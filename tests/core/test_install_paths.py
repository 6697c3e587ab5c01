"""Install paths that work from a clone: no install line names an unpublished distribution, and
the test plugins stay in the test session."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
from pathlib import Path

import pytest
from dispatch_helpers import run_list_command

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
# `pip install ...` up to the end of the line, a backtick, a parenthesis or a shell separator
# (double-quoted words such as "attn-dispatch[x]" are part of the line).
INSTALL_LINE = re.compile(r"pip3? install\s+((?:\"[^\"\n]*\"|[^\n`;|&()\"'])*)")


def _our_distributions() -> set[str]:
    """The project's distributions (none is published): the core, each backend, the plugins."""
    names = {"attn-dispatch-test-plugins"}
    for pyproject in [ROOT / "pyproject.toml", *ROOT.glob("backends/*/pyproject.toml")]:
        names.add(tomllib.loads(pyproject.read_text())["project"]["name"])
    return {_normalise(n) for n in names}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _scanned_files() -> list[Path]:
    patterns = ["README.md", "docs/*.md", "backends/*/README.md", "attn_dispatch/**/*.py"]
    patterns += ["backends/*/**/*.py", "scripts/*", "benchmarks/**/*.py", "benchmarks/**/*.sh"]
    patterns += ["examples/**/*.py", ".ci/run", "backends/*/*.sh"]
    return sorted({p for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()})


def unpublished_install_lines(text: str, ours: set[str]) -> list[str]:
    """The `pip install` lines in ``text`` that name one of ``ours`` as a requirement (a name,
    with or without extras or a version), rather than a path of the clone."""
    bad = []
    for match in INSTALL_LINE.finditer(text):
        try:
            words = shlex.split(match.group(1), comments=True)
        except ValueError:
            words = match.group(1).split()
        for word in words:
            if word.startswith("-") or "/" in word or word.startswith("."):
                continue
            name = re.split(r"[\[<>=!~ ]", word.rstrip(",."), maxsplit=1)[0]
            if _normalise(name) in ours:
                bad.append(match.group(0).strip())
    return bad


def test_install_line_scan_finds_unpublished_names():
    ours = _our_distributions()
    assert unpublished_install_lines('pip install "attn-dispatch[transformers]"', ours)
    assert unpublished_install_lines("(pip install attn-dispatch-reference, or", ours)
    assert unpublished_install_lines("pip install attn_dispatch_triton==0.1", ours)
    assert not unpublished_install_lines('pip install -e ".[transformers]"', ours)
    assert not unpublished_install_lines("pip install -e backends/reference", ours)
    assert not unpublished_install_lines("pip install matplotlib", ours)


def test_no_install_line_names_an_unpublished_distribution():
    ours = _our_distributions()
    found = {
        str(path.relative_to(ROOT)): lines
        for path in _scanned_files()
        if (lines := unpublished_install_lines(path.read_text(errors="replace"), ours))
    }
    assert not found, f"install lines naming unpublished distributions (use clone paths): {found}"


def test_test_plugins_cannot_be_pip_installed():
    assert not (PLUGINS / "pyproject.toml").exists() and not (PLUGINS / "setup.py").exists()
    installers = [p for p in _scanned_files() if p.suffix == ".sh" or p.parent.name == "scripts"]
    assert ROOT / "scripts" / "setup.sh" in installers
    found = [str(p.relative_to(ROOT)) for p in installers if "-e tests/plugins" in p.read_text()]
    assert not found, f"scripts that pip-install the test plugins: {found}"


def test_environment_outside_the_tests_lists_no_test_plugin():
    """Without the test session's path entry, `attn-dispatch list` shows only real backends."""
    dists = importlib.metadata.distributions(name="attn-dispatch-test-plugins")
    where = {Path(str(d.locate_file(""))).resolve() for d in dists} - {PLUGINS.resolve()}
    if where:
        pytest.skip(f"attn-dispatch-test-plugins is installed in this environment ({where})")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_DISPATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != PLUGINS
    )
    done = run_list_command(env, cwd=ROOT.parent)
    assert done.returncode == 0, done.stderr
    assert "reference:chunked" in done.stdout
    for name in ("toy", "broken_import", "broken_hook", "broken_supports", "broken_priority"):
        assert not re.search(rf"^{name}\b", done.stdout, re.M), done.stdout


def test_test_session_sees_the_test_plugins(toys):
    import attn_dispatch as ad

    assert "toy" in {b.name for b in ad.backends()}
