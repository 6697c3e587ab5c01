"""Declared priority rules (``attn_dispatch._priorities``): their validation, which rule applies
to a call (first match, per-mode rules first, bounds inclusive, ``when`` asked only for the
calls of the rule's kind), and selection ranking by them."""

from __future__ import annotations

import pytest
import torch
from dispatch_helpers import make_inputs, tag_of

import attn_dispatch as ad
from attn_dispatch import backend as adb

CPU = ad.Arch.parse("cpu")


def meta_inputs(backward=True, b=1, s=64, h=4, **flags) -> adb.ForwardInputs:
    q = torch.empty(b, s, h, 16, device="meta")
    lse = torch.empty(b, h, s, device="meta")
    return adb.make_inputs(q, q, q, *((q, lse, q) if backward else ()), **flags)


@pytest.mark.parametrize(
    ("changes", "error", "named"),
    [
        (dict(arch=""), TypeError, "arch"),
        (dict(priority=True), TypeError, "priority"),
        (dict(priority="44"), TypeError, "priority"),
        (dict(execution="captured"), ValueError, "execution"),
        (dict(sinks=1), TypeError, "sinks"),
        (dict(backward="yes"), TypeError, "backward"),
        (dict(max_seqlen_k=2048.0), TypeError, "max_seqlen_k"),
        (dict(max_batch_heads=0), ValueError, "max_batch_heads"),
        (dict(when=True), TypeError, "when"),
    ],
)
def test_a_malformed_rule_names_its_argument(changes, error, named):
    kwargs = dict(arch="sm_90", priority=44) | changes
    with pytest.raises(error, match=f"PriorityRule {named} must"):
        adb.PriorityRule(**kwargs)


class Ruled(adb.Implementation):
    backend, name = "ruled", "impl"
    priority = {"cpu": 50}
    sinks = softcap = True
    priority_rules = (
        adb.PriorityRule("cpu", 10, execution="eager", backward=True, max_seqlen_k=128),
        adb.PriorityRule("cpu", 30, softcap=True),
        adb.PriorityRule("cpu", 20, softcap=True, sinks=True),  # never reached: 30 comes first
        adb.PriorityRule("sm_*", 70, sinks=True),
    )


def test_the_first_matching_rule_wins_else_the_arch_entry():
    impl = Ruled()
    assert impl.priority_for_inputs(meta_inputs(), CPU) == 50
    assert impl.priority_for_inputs(meta_inputs(softcap=5.0), CPU) == 30
    sinks = torch.empty(4, device="meta")
    assert impl.priority_for_inputs(meta_inputs(softcap=5.0, sinks=sinks), CPU) == 30
    assert impl.priority_for_inputs(meta_inputs(sinks=sinks), CPU) == 50  # the rule is for sm_*
    assert impl.priority_for_inputs(meta_inputs(sinks=sinks), ad.Arch.parse("sm_90")) == 70


def test_rules_naming_a_mode_apply_in_that_mode_only_and_before_the_others():
    impl = Ruled()
    short, capped = meta_inputs(s=128), meta_inputs(s=128, softcap=5.0)
    assert impl.priority_for_execution(short, CPU, "eager") == 10
    assert impl.priority_for_execution(capped, CPU, "eager") == 10
    assert impl.priority_for_execution(capped, CPU, "graph") == 30
    assert impl.priority_for_inputs(short, CPU) == 50  # the mode-free priority ignores it
    assert impl.priority_for_execution(meta_inputs(s=129), CPU, "eager") == 50  # bound: <=
    assert impl.priority_for_execution(meta_inputs(False, s=128), CPU, "eager") == 50  # forward


def test_a_batch_heads_bound_counts_batch_times_query_heads():
    rule = adb.PriorityRule("cpu", 1, max_batch_heads=8)
    assert rule.matches(meta_inputs(b=2, h=4), CPU, None)
    assert not rule.matches(meta_inputs(b=3, h=4), CPU, None)


def test_when_is_asked_only_for_calls_of_the_rules_kind_whatever_their_size():
    asked = []

    def state() -> bool:
        asked.append(True)
        return True

    rule = adb.PriorityRule("cpu", 1, execution="eager", backward=True, max_seqlen_k=16, when=state)
    assert not rule.matches(meta_inputs(False), CPU, "eager")
    assert not rule.matches(meta_inputs(), CPU, "graph")
    assert not rule.matches(meta_inputs(), ad.Arch.parse("sm_90"), "eager")
    assert asked == []
    assert not rule.matches(meta_inputs(s=64), CPU, "eager")  # too long, yet asked
    assert len(asked) == 1
    assert rule.matches(meta_inputs(s=16), CPU, "eager")


RULED_PLUGIN = """
class Ranked(Tagged):
    name, tag, priority = "ranked", 1.0, {"*": 50}
    softcap = True
    priority_rules = (adb.PriorityRule("cpu", 5, softcap=True),)


class Other(Tagged):
    name, tag, priority = "other", 2.0, {"*": 20}
    softcap = True
"""


def test_selection_ranks_by_the_declared_rules(plugins, env):
    plugins.backend("ruled", RULED_PLUGIN, "[Ranked(), Other()]")
    env.set(ATTN_DISPATCH_PLUGINS="ruled")
    inputs = make_inputs()
    assert ad.explain(*inputs).selected == "ruled:ranked"
    report = ad.explain(*inputs, softcap=5.0)
    assert report.selected == "ruled:other"
    assert {c.name: c.priority for c in report.candidates}["ruled:ranked"] == 5
    assert tag_of(ad.backward(*inputs, softcap=5.0)) == 2.0


def test_a_malformed_rules_declaration_fails_its_plugin(plugins, env):
    body = 'class Listed(Tagged):\n    name, priority = "listed", {"*": 9}\n'
    body += '    priority_rules = [adb.PriorityRule("cpu", 1)]\n'
    plugins.backend("listed", body, "[Listed()]")
    with pytest.warns(UserWarning, match="must be a tuple of PriorityRule"):
        env.set(ATTN_DISPATCH_PLUGINS="listed,reference")
    assert ad.explain(*make_inputs()).selected == "reference:chunked"
