"""The fla backends, with fla's chunk ops computed by the CPU stand-in (stand_in.py), against
core:exact_chunk's PyTorch code and core:sequential: outputs, final state and the gradients
w.r.t. q, k, v, every gate and the initial memory, for every mapped preset, at several chunk
sizes, in one call and split into three; a strategy that dispatches (core:chunkwise) hands them
the call itself; half inputs reach fla as half operands; packed documents reach it one by one."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("fla.ops")

from tests.fla_backend.calls import (PRESETS, assert_same, call, rule_of, split, through,  # noqa: E402
                                     through_backend)

EXACT = "core:exact_chunk"
T = 19
#: the entry point each backend calls for a float32 call (fla's chunk_delta_rule refuses float32
#: q: the delta rule runs chunk_gated_delta_rule with a zero log-decay)
FLA_OP = {"fla:delta_rule": "chunk_gated_delta_rule", "fla:gated_delta_rule": "chunk_gated_delta_rule",
          "fla:kda": "chunk_kda", "fla:gla": "chunk_gla", "fla:simple_gla": "chunk_simple_gla"}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_backend_equals_exact_chunk_and_sequential(stand_in, preset):
    rule = rule_of(preset)
    args = call(rule, T)
    backend = PRESETS[preset]
    seq = through(rule, "core:sequential", args)
    first = None
    for C in (1, 5, 16):
        got = through_backend(rule, {"use": EXACT, "chunk_size": C}, backend, args)
        assert stand_in[-1]["op"] == FLA_OP[backend] and stand_in[-1]["T"] == T * rule.steps_per_token
        assert_same(got, seq, args)
        assert_same(got, through(rule, {"use": EXACT, "chunk_size": C}, args), args)
        if first is not None:  # fla's result does not depend on the strategy's chunk size
            torch.testing.assert_close(got[0], first[0], rtol=0, atol=0)
        first = got
    assert len(stand_in) == 3


@pytest.mark.parametrize("preset", list(PRESETS))
def test_split_calls_equal_one_call(stand_in, preset):
    rule = rule_of(preset)
    args = call(rule, T, seed=1)
    backend = PRESETS[preset]
    state, ys = args[4], []
    for q, k, v, gates, _ in split(args, (7, 5, 7)):
        y, state = through_backend(rule, {"use": EXACT, "chunk_size": 4}, backend, (q, k, v, gates, state))
        ys.append(y)
    assert [c["T"] for c in stand_in] == [n * rule.steps_per_token for n in (7, 5, 7)]
    assert_same((torch.cat(ys, dim=1), state), through(rule, "core:sequential", args), args)


#: the decay-first rules (gradient at the decayed memory) core:chunkwise refuses at any chunk size
DECAY_FIRST = ("zoo:gated_deltanet", "zoo:gated_delta_product", "zoo:kda")


@pytest.mark.parametrize("preset", [p for p in PRESETS if p not in DECAY_FIRST])
def test_chunkwise_hands_the_call_to_the_backend(stand_in, preset):
    """core:chunkwise dispatches to its backends: forced by name, the call reaches fla's op."""
    rule = rule_of(preset)
    args = call(rule, T, seed=2)
    backend = PRESETS[preset]
    # the dot rules at any chunk size; the delta rules (per-token, gradients at the memory) at 1
    sizes = (1, 4, 64) if rule.form.error == "dot" else (1,)
    for C in sizes:
        stand_in.clear()
        got = through(rule, {"use": "core:chunkwise", "chunk_size": C, "backend": backend}, args)
        assert [c["op"] for c in stand_in] == [FLA_OP[backend]]
        want = through(rule, {"use": "core:chunkwise", "chunk_size": C, "backend": "torch"}, args)
        assert_same(got, want, args)


@pytest.mark.parametrize("preset", DECAY_FIRST)
def test_chunkwise_refuses_the_decay_first_rules(preset):
    from atlas_core.errors import StrategyError

    with pytest.raises(StrategyError, match="decayed memory"):
        rule_of(preset).runner({"use": "core:chunkwise", "chunk_size": 1})


@pytest.mark.parametrize("preset,op", [("zoo:deltanet", "chunk_delta_rule"), ("zoo:gla", "chunk_gla"),
                                       ("zoo:kda", "chunk_kda")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_inputs_reach_fla_as_half_operands(stand_in, preset, op, dtype):
    """bfloat16 / float16 inputs: q, k, v (and beta) go to fla in that dtype (fla's own operands;
    chunk_delta_rule itself, which refuses float32), the state and log-decays in float32. For the
    delta rules the values are the inputs' own, so the result is the PyTorch code's (which
    computes in float32) up to the output's rounding; GLA's write strength is folded into k before
    the cast (fla's GLA has no beta), one more rounding of k in the half dtype."""
    rule = rule_of(preset)
    args = call(rule, T, dtype=dtype)
    got = through_backend(rule, {"use": EXACT, "chunk_size": 8}, PRESETS[preset], args)
    (c,) = stand_in
    assert c["op"] == op and c["dtype"] == c["k_dtype"] == c["v_dtype"] == dtype
    assert c["initial_state_dtype"] == torch.float32
    if "beta_dtype" in c:
        assert c["beta_dtype"] == dtype
    if "g_dtype" in c:
        assert c["g_dtype"] == torch.float32
    want = through(rule, {"use": EXACT, "chunk_size": 8}, args)
    assert got[0].dtype == want[0].dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    state_tol = tol if rule.form.error == "dot" else 1e-5
    torch.testing.assert_close(got[1]["M"], want[1]["M"], rtol=state_tol, atol=state_tol)


def test_packed_documents_reach_fla_one_by_one(stand_in):
    """Packed sequences never reach a strategy as one call (atlas_core/varlen.py): fla gets the
    documents on their own (the two of equal length batched; the stand-in refuses cu_seqlens),
    each from its own initial state, and the result is the PyTorch code's."""
    rule = rule_of("zoo:gla")
    q, k, v, gates, _ = call(rule, 17, seed=3, B=1)
    state = {n: 0.1 * torch.randn(3, *x.shape[1:]) for n, x in rule.init_state(1).items()}
    cu = torch.tensor([0, 5, 11, 17])
    strategy = {"use": "core:chunkwise", "chunk_size": 4, "backend": "fla:gla"}
    got = rule(q, k, v, gates=gates, state=state, strategy=strategy, cu_seqlens=cu)
    assert sorted((c["T"], c["B"]) for c in stand_in) == [(5, 1), (6, 2)]
    want = rule(q, k, v, gates=gates, state=state, strategy={**strategy, "backend": "torch"}, cu_seqlens=cu)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1]["M"], want[1]["M"], rtol=1e-5, atol=1e-5)
