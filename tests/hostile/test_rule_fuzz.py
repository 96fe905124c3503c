"""Hostile calls of `rule(...)`: a seeded fuzzer and the input checks it relies on.

The fuzzer (`atlas_core.testing.fuzz_calls`) mutates valid calls of a few rules: wrong shapes,
ranks, dtypes, devices ("meta"), containers, missing or extra gates and state entries, NaN, inf
and out-of-range gates. Every mutation the rule cannot take must end in a ValueError or TypeError
with a message; valid calls run. scripts/fuzz_rule_inputs.py runs it for longer.
"""

from __future__ import annotations

import pytest
import torch

from atlas_core.input_checks import ENV, InputCheckError
from atlas_core.knobs.gates import ALPHA, ETA, GAMMA, THETA, Gate
from atlas_core.rule import build_rule
from atlas_core.testing.fuzz_calls import fuzz, mutations, valid_call


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzed_calls_end_cleanly(seed):
    bad, made = fuzz(n=150, seed=seed)
    assert made == 150
    report = "\n".join(f"{o.spec} | {o.mutation}: expected {o.expected}, got {o.got}\n{o.trace}" for o in bad)
    assert not bad, report


def test_the_verdict_refuses_internal_errors_and_silent_runs():
    """What the fuzzer counts as broken: an internal error, an empty message, or a run where a
    refusal was due."""
    from atlas_core.testing import fuzz_calls as F

    assert not F._verdict(F.RAISE, RuntimeError("Boolean value of Tensor with more than one value is ambiguous"))
    assert not F._verdict(F.RAISE, IndexError("too many indices"))
    assert not F._verdict(F.RAISE, ValueError(""))
    assert not F._verdict(F.RAISE, None)
    assert not F._verdict(F.RUN, ValueError("refused a valid call"))
    assert F._verdict(F.RAISE, TypeError("gates must be a dict"))
    assert F._verdict(F.RUN, None) and F._verdict(F.EITHER, None)


@pytest.fixture(scope="module")
def titans():
    torch.manual_seed(0)
    return build_rule("titans:titans", heads=2, d_key=4, d_value=4)


def _call(rule, T=5):
    import random

    c = valid_call(rule, random.Random(3))
    g = torch.Generator().manual_seed(3)
    B, H = 2, 2
    q = torch.randn(B, T, H, 4, generator=g, dtype=torch.float64)
    gates = {n: 0.5 * torch.ones(B, T, H, dtype=torch.float64) for n in rule.gate_names}
    return q, q.flip(1), torch.randn(B, T, H, 4, generator=g, dtype=torch.float64), gates


@pytest.mark.parametrize("container", [list, tuple])
def test_gates_in_a_list_is_one_clear_type_error(titans, container):
    q, k, v, gates = _call(titans)
    with pytest.raises(TypeError, match=r"gates must be a dict mapping names to tensors .*got a "
                       + container.__name__ + r" of 3 item\(s\)"):
        titans(q, k, v, gates=container(gates.values()))


def test_state_as_a_tensor_is_one_clear_type_error(titans):
    q, k, v, gates = _call(titans)
    with pytest.raises(TypeError, match=r"state must be a dict mapping names to tensors .*got a Tensor"):
        titans(q, k, v, gates=gates, state=q)


def test_meta_tensors_are_refused_by_name(titans):
    q, k, v, gates = _call(titans)
    # one tensor on meta among CPU tensors: the rule's own mismatch message names both devices
    with pytest.raises(ValueError, match=r"gates\['alpha'\] is on meta but q is on cpu"):
        titans(q, k, v, gates={**gates, "alpha": gates["alpha"].to("meta")})
    # a call on meta: refused before any work, naming the first tensor
    meta = {n: g.to("meta") for n, g in gates.items()}
    with pytest.raises(ValueError, match=r"^q is on the meta device"):
        titans(q.to("meta"), k.to("meta"), v.to("meta"), gates=meta)


@pytest.mark.parametrize("gate,value,text", [
    ("alpha", 1.5, r"\[0, 1\]"), ("eta", -1.0, r"\[0, 1\]"), ("theta", -0.25, r">= 0")])
def test_a_gate_out_of_range_is_named_with_its_position(titans, gate, value, text):
    q, k, v, gates = _call(titans)
    g = gates[gate].clone()
    g[1, 3, 0] = value
    bad = {**gates, gate: g}
    titans(q, k, v, gates=bad)  # off by default: runs
    with pytest.raises(InputCheckError, match=rf"gates\['{gate}'\] = {value:g} at \(batch 1, time 3, head 0\) "
                       rf"is outside its range {text}"):
        titans(q, k, v, gates=bad, check_inputs=True)


def test_theta_may_be_large_alpha_may_be_one(titans):
    q, k, v, gates = _call(titans)
    ok = {**gates, "theta": torch.full_like(gates["theta"], 10.0), "alpha": torch.ones_like(gates["alpha"])}
    titans(q, k, v, gates=ok, check_inputs=True)  # inside the documented ranges


def test_the_environment_turns_the_checks_on_and_the_argument_wins(titans, monkeypatch):
    q, k, v, gates = _call(titans)
    q = q.clone()
    q[0, 2, 1, 3] = float("nan")
    titans(q, k, v, gates=gates)
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(InputCheckError, match=r"q has 1 non-finite value\(s\); the first is nan at "
                       r"\(batch 0, time 2, head 1, index \[3\] after those\)"):
        titans(q, k, v, gates=gates)
    titans(q, k, v, gates=gates, check_inputs=False)
    monkeypatch.setenv(ENV, "0")
    titans(q, k, v, gates=gates)


def test_a_non_finite_state_is_named_with_batch_and_head(titans):
    q, k, v, gates = _call(titans)
    _, state = titans(q, k, v, gates=gates)
    state = {key: x.clone() for key, x in state.items()}
    state["Z.M"][1, 0, 2, 2] = float("inf")
    with pytest.raises(InputCheckError, match=r"state\['Z.M'\] has 1 non-finite value\(s\); the first is inf "
                       r"at \(batch 1, head 0, index \[2, 2\] after those\)"):
        titans(q, k, v, gates=gates, state=state, check_inputs=True)


def test_gate_ranges_are_declared():
    assert ALPHA.range == ETA.range == GAMMA.range == (0.0, 1.0)
    assert THETA.range == (0.0, None)
    assert Gate("beta").range is None and Gate("beta").range_text() == "any value"
    with pytest.raises(ValueError, match="range must be"):
        Gate("beta", range=(1.0, 0.0))
    with pytest.raises(ValueError, match="range must be"):
        Gate("beta", range=(0.0, float("nan")))
