"""Helpers shared by the core's test files (a plain module: test files import it by name, which
they cannot do with a ``conftest.py`` when several directories have one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch.testing.oracle import oracle


def make_inputs(b=1, sq=8, sk=None, h=4, hkv=2, d=16, dv=None, dtype=torch.float32, device="cpu"):
    """Random backward inputs (q, k, v, out, lse, grad_out) in the dense BSHD layout."""
    sk = sk or sq
    dv = dv or d
    lse_dtype = adb.lse_dtype(dtype)

    def rand(*shape, dt=dtype):
        return torch.randn(shape, dtype=dt, device=device)

    return (
        rand(b, sq, h, d),
        rand(b, sk, hkv, d),
        rand(b, sk, hkv, dv),
        rand(b, sq, h, dv),
        rand(b, h, sq, dt=lse_dtype),
        rand(b, sq, h, dv),
    )


def run_list_command(env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m attn_dispatch list`` in a fresh process with this environment."""
    return subprocess.run(
        [sys.executable, "-m", "attn_dispatch", "list"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


def tag_of(grads) -> float:
    """Which toy implementation produced ``grads`` (each fills its outputs with its tag)."""
    return toy_tag(grads[0])


# The source every plugin written by ``Plugins.backend`` starts with: implementations that fill
# their outputs with their ``tag``, and a fallback any input reaches.
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


# A backend (after ``TAGGED``) of two implementations a cost table can rank, ``quick`` first by
# priority, and the fallback.
COSTED = """
class Quick(Tagged):
    name, tag, priority = "quick", 1.0, {"*": 50}


class Steady(Tagged):
    name, tag, priority = "steady", 2.0, {"*": 40}


@adb.hookimpl
def attn_dispatch_implementations():
    return [Quick(), Steady(), Fallback()]
"""


class Plugins:
    """Writes plugin distributions (module and ``*.dist-info``) into one directory on
    ``sys.path``: ``importlib.metadata`` discovers them as it would installed packages."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


class IgnoresVariants(adb.Implementation):
    """Declares the three variants but computes plain attention: a wrong claim (with sinks it
    returns a zero dsinks, of the right shape, so only the numbers are wrong)."""

    backend, name = "exact", "liar"
    window = softcap = sinks = True

    def forward(self, inp):
        return self._plain(inp)[:2]

    def backward(self, inp):
        dsinks = None if inp.sinks is None else torch.zeros_like(inp.sinks)
        return ad.Gradients(*self._plain(inp, inp.grad_out)[2:], dsinks)

    @staticmethod
    def _plain(inp, grad_out=None):
        """Exact attention with the call's causal mask but no window and no soft cap."""
        result = oracle(
            inp.q,
            inp.k,
            inp.v,
            grad_out,
            causal=inp.causal,
            causal_align=inp.causal_align,
            scale=inp.scale,
            cu_seqlens_q=inp.cu_seqlens_q,
            cu_seqlens_k=inp.cu_seqlens_k,
        )
        q = inp.q
        out, lse = result.out.to(q.dtype), result.lse.to(adb.lse_dtype(q.dtype))
        if grad_out is None:
            return out, lse
        return out, lse, *(g.to(x.dtype) for g, x in zip(result[2:], (q, inp.k, inp.v)))


class DeclinesVariants(IgnoresVariants):
    """The same kernel, declaring neither: rejected, so the kit skips it."""

    name = "plain"
    window = softcap = sinks = False


# The toy backends alone (each returns its tag), and the exact:oracle test plugin alone (real
# numbers in float64, no real backend): ``env.set(**TOYS)``.
TOYS = {"ATTN_DISPATCH_TEST_PLUGINS": "1", "ATTN_DISPATCH_PLUGINS": "toy"}
EXACT = {"ATTN_DISPATCH_TEST_PLUGINS": "1", "ATTN_DISPATCH_PLUGINS": "exact"}


def toy_leaves() -> list[torch.Tensor]:
    """Seeded q, k, v (B=1, S=8, 4 query heads, 2 kv heads, D=16) that require grad."""
    gen = torch.Generator().manual_seed(0)
    shapes = ((1, 8, 4, 16), (1, 8, 2, 16), (1, 8, 2, 16))
    return [torch.randn(s, generator=gen).requires_grad_(True) for s in shapes]


def toy_tag(t: torch.Tensor) -> float:
    """The value a toy backend writes into all of its output: which one computed ``t``."""
    return float(t.detach().flatten()[0])


# Case(..., **BOTTOM_RIGHT): a causal mask aligned to the last key, as in Sq != Sk cases.
BOTTOM_RIGHT = {"causal": True, "causal_align": "bottom_right"}
