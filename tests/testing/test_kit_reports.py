"""The kit's reports explain themselves: a detached state fails gradcheck with a message (not a
torch shape error), and a passing equivalence check lists the strategies and variants it
compared, and those it left out."""

from __future__ import annotations

import types

from atlas_core import Strategy
from atlas_core.host import hookimpl
from atlas_core.testing import Case, check_component


class DetachedState(Strategy):
    """Right forward, final state cut from the graph."""

    name = "bad:detached_state"

    def run(self, rule, inputs):
        y, state = rule.reference(inputs)
        return y, {k: v.detach() for k, v in state.items()}


def _module():
    mod = types.ModuleType("bad_state_mod")

    @hookimpl
    def atlas_register(registry):
        registry.add("strategy", "detached_state", lambda params, ctx: DetachedState())

    mod.atlas_register = atlas_register
    return mod


def test_a_detached_state_fails_gradcheck_with_a_message(host_with):
    host_with({"bad": _module()})
    res, = check_component(Case("bad:detached_state"), on_fail="collect", checks=["check_gradcheck_float64"])
    assert res.status == "failed"
    assert "the final state['M'], the final state['Z.M'] carry no gradient under bad:detached_state " \
           "(they do under core:sequential)" in res.message, res.message
    assert "must match the size" not in res.message


def test_a_passing_equivalence_check_lists_what_it_compared(host_with):
    host_with({})
    res, = check_component(Case("core:l2"), on_fail="collect", checks=["check_strategies_match_sequential"])
    assert res.status == "passed"
    note, = res.notes
    assert note.startswith("compared with core:sequential: core:chunkwise(chunk_size=1), "
                           "core:chunkwise(chunk_size=3) on the rule with anchor = 6"), note
    assert "core:exact_chunk(chunk_size=1), core:exact_chunk(chunk_size=3); left out: " in note
    assert "atlas_muon:atlas_parallel(chunk_size=1): atlas_muon:atlas_parallel runs the Muon" in note
    ran, = check_component(Case("core:l2"), on_fail="collect", checks=["check_causal"])[0].notes
    assert ran.startswith("ran under: core:sequential, core:chunkwise(chunk_size=3)"), ran
