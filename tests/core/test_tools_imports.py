"""The tools (``attn_dispatch.tools``: the command and the bench) sit on top of the core: no
core module imports them, they import one another without a circle, and the console script
leads to them. Within the core, the settings and the measuring modules sit below autotune: none
of them is on a circle of imports."""

from __future__ import annotations

import ast
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

import pytest

import attn_dispatch as ad

PACKAGE = Path(ad.__file__).resolve().parent
# The core: the package itself and its private modules (attn_dispatch._*).
CORE = ["attn_dispatch"] + sorted(
    f"attn_dispatch.{p.stem}" for p in PACKAGE.glob("_*.py") if not p.stem.startswith("__")
)
TOOLS = sorted(
    f"attn_dispatch.tools.{p.stem}"
    for p in (PACKAGE / "tools").glob("*.py")
    if p.stem != "__init__"
)


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _imported_modules(path: Path, package: str) -> set[str]:
    """The absolute names of the modules ``path`` (a module of ``package``) imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_no_core_module_imports_the_tools_in_a_fresh_interpreter():
    code = (
        "import importlib, sys\n"
        f"for name in {CORE!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('attn_dispatch.tools')))\n"
    )
    done = _fresh(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_no_core_module_names_the_tools():
    assert len(CORE) > 10  # the glob found the core
    for name in CORE:
        module = name.removeprefix("attn_dispatch").removeprefix(".") or "__init__"
        path = PACKAGE / f"{module}.py"
        tools = {m for m in _imported_modules(path, "attn_dispatch") if ".tools" in m}
        assert not tools, f"{name} imports {sorted(tools)}"


def test_the_tools_import_one_another_without_a_circle():
    tools = PACKAGE / "tools"
    graph = {
        name: {
            m
            for m in _imported_modules(
                tools / f"{name.rsplit('.', 1)[1]}.py", "attn_dispatch.tools"
            )
            if m in TOOLS
        }
        for name in TOOLS
    }
    assert graph["attn_dispatch.tools.cli"] >= {"attn_dispatch.tools._args"}  # the parse works
    assert graph["attn_dispatch.tools._args"] == set()
    assert "attn_dispatch.tools.cli" not in graph["attn_dispatch.tools.bench"]

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(
            n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start]
        )

    assert not [name for name in TOOLS if reaches(name, name)]


@pytest.mark.parametrize(
    "name", ["attn_dispatch._settings", "attn_dispatch._autotune", "attn_dispatch._measure"]
)
def test_the_settings_and_measuring_modules_are_on_no_import_circle(name):
    def imports(module: str) -> set[str]:
        path = PACKAGE / f"{module.rsplit('.', 1)[1]}.py"
        found = _imported_modules(path, "attn_dispatch")
        return {m for m in CORE if m in found and m != "attn_dispatch"}

    seen, frontier = set(), imports(name)
    while frontier:
        seen |= frontier
        frontier = {m for module in frontier for m in imports(module)} - seen
    assert name not in seen, f"{name} imports (through others) a module that imports it"


@pytest.mark.parametrize("name", TOOLS)
def test_each_tool_module_imports_first_in_a_fresh_interpreter(name):
    done = _fresh(f"import {name}")
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_the_console_script_is_the_tools_command():
    (script,) = md.entry_points(group="console_scripts", name="attn-dispatch")
    assert script.value == "attn_dispatch.tools.cli:main"
    from attn_dispatch.tools import cli

    assert script.load() is cli.main
