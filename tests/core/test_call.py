"""``_call``: the flags of a call spelled out once, as the public calls take them, and carried as
one value (``Call``, or the operators' ``OpFlags``) by every layer below."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch._call import OpFlags

CORE = pathlib.Path(ad.__file__).parent
FLAGS = {"causal", "causal_align", "scale", "deterministic", "backend", "window", "softcap"}
# Where the flags are parameters: the public calls, the parser, make_inputs (plugin authors'
# public API) and Band.of (the band of three of them, public for plugin authors too).
LISTING = {
    "_api.py:backward",
    "_api.py:forward",
    "_api.py:explain",
    "_api.py:decide",
    "_autograd.py:attention",
    "_call.py:parse",
    "backend.py:make_inputs",
    "_inputs.py:of",
}


def _listing(path: pathlib.Path) -> set[str]:
    """The functions of ``path`` with three or more of the flags among their parameters."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            a = node.args
            names = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
            if len(names & FLAGS) >= 3:
                found.add(f"{path.name}:{node.name}")
    return found


def test_only_the_public_calls_and_the_parser_list_the_flags():
    core = [*CORE.glob("_*.py"), CORE / "backend.py"]
    assert set().union(*map(_listing, core)) == LISTING


@pytest.mark.parametrize("name", ["fwd", "bwd", "bwd_sinks"])
def test_operator_schema_passes_the_flags_in_opflags_order(name):
    """The kernels read the flags by position (``_autograd._schema_args``): after the four
    sequence arguments, exactly OpFlags' fields."""
    arguments = [a.name for a in getattr(torch.ops.attn_dispatch, name).default._schema.arguments]
    first = arguments.index("cu_seqlens_q")
    assert arguments[first : first + 4] == [
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
    ]
    flags = arguments[first + 4 : first + 4 + len(OpFlags._fields)]
    assert tuple(flags) == OpFlags._fields


def test_make_inputs_parses_its_flags_as_the_public_calls_do():
    """A bad flag is named before the tensors are looked at, as by ``ad.backward``."""
    for call in (ad.forward, adb.make_inputs):
        with pytest.raises(TypeError, match="argument 'causal'"):
            call("not a tensor", None, None, causal=1)
