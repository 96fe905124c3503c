"""What the core needs to know about a rule is declared on `atlas_core.rule.Rule` and read directly
(no probing): a standalone rule with its own inputs (the MRU) declares ``takes_qkv = False`` and is
not a knob composition, so ``core:lm`` refuses to host it and the chunked strategies refuse it with
their reasons; a knob-composed rule declares ``composed`` and the sub-step traits."""

from __future__ import annotations

import pytest

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError
from atlas_core.lm import build_memory_layer
from atlas_core.rule import Rule


def test_the_base_declares_every_trait_the_core_reads():
    base = Rule()
    assert (base.takes_qkv, base.composed, base.anchor, base.steps_per_token) == (True, False, 1, 1)
    assert base.gates == () and base.gate_names == () and base.step_gates == () and dict(base.spec) == {}
    assert base.bind(2, 4, 4) is base
    assert base.example_inputs(batch=1, seq_len=2) is None


def test_a_standalone_rule_is_refused_by_core_lm_and_the_chunked_strategies():
    mru = ac.build_rule("mru:mru")
    assert not mru.takes_qkv and not mru.composed
    with pytest.raises(SpecError, match="takes another input"):
        build_memory_layer({"memory": {"use": "mru:mru"}, "layer": {}}, 16, 2)
    for name in ("core:chunkwise", "core:exact_chunk"):
        with pytest.raises(StrategyError, match="knob-composed rules; this rule is standalone"):
            mru.runner(name)


def test_a_composed_rule_declares_its_sub_steps():
    rule = ac.build_rule({"use": "zoo:gated_delta_product", "steps_per_token": 3})
    assert rule.composed and rule.takes_qkv
    assert rule.steps_per_token == 3 and rule.step_gates == ("theta",)  # alpha is the retention's
    assert rule.spec["steps_per_token"] == 3
    assert "steps_per_token" not in ac.build_rule("zoo:gated_deltanet").spec  # one step: unchanged spec
