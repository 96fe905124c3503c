"""core:sequential and core:chunkwise against hand-written loops (float64), per-token and anchored
(docs/math.md, "Anchoring as part of the rule", "The strategy contract")."""

from itertools import product

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError

from .conftest import make_inputs
from .loops import linear_memory_loop

COMBOS = list(product(["l2", "dot"], ["gd", "momentum"], ["decay", "none"], ["after", "before"]))


def _rule(bias, alg, ret, read, anchor=1):
    return ac.build_rule({
        "structure": "core:linear", "bias": f"core:{bias}", "retention": f"core:{ret}",
        "algorithm": f"core:{alg}", "feature_map": "core:identity", "read": read,
        "anchor": anchor,
    })


def _gates(rule, gates):
    return {n: gates[n] for n in rule.gate_names}


def chunk(C):
    return {"use": "core:chunkwise", "chunk_size": C}


def assert_state(got, want, atol=1e-10):
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=0, msg=f"state[{key!r}]")


def assert_loop_state(s, M, Z, held, alg, anchor, pos):
    """The rule's final state against the hand-written loop's, anchor entries included."""
    torch.testing.assert_close(s["M"], M, atol=1e-10, rtol=0)
    if alg == "momentum":
        torch.testing.assert_close(s["Z.M"], Z, atol=1e-10, rtol=0)
    if anchor > 1:
        assert torch.equal(s["anchor.pos"], torch.full_like(s["anchor.pos"], float(pos)))
        torch.testing.assert_close(s["anchor.M"], held, atol=1e-10, rtol=0)
    else:
        assert not any(key.startswith("anchor.") for key in s)


@pytest.mark.parametrize("bias,alg,ret,read", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_sequential_matches_hand_written_loop(bias, alg, ret, read):
    q, k, v, gates = make_inputs()
    rule = _rule(bias, alg, ret, read)
    y, state = rule(q, k, v, gates=_gates(rule, gates), strategy="core:sequential")
    y_ref, M_ref, Z_ref, _ = linear_memory_loop(q, k, v, gates, bias=bias, algorithm=alg,
                                                retention=ret, read=read)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    assert_loop_state(state, M_ref, Z_ref, None, alg, 1, 0)


@pytest.mark.parametrize("A", [2, 4, 5])
@pytest.mark.parametrize("bias,alg,read", [("l2", "gd", "after"), ("l2", "momentum", "before"),
                                           ("dot", "momentum", "after")])
def test_sequential_anchored_matches_hand_written_loop(A, bias, alg, read):
    """The rule's own loop with anchor = A: blocks of A tokens from the start of the sequence
    (T = 11 leaves a partial block, whose anchor memory the state carries)."""
    q, k, v, gates = make_inputs()
    rule = _rule(bias, alg, "decay", read, anchor=A)
    y, s = rule(q, k, v, gates=_gates(rule, gates), strategy="core:sequential")
    y_ref, M, Z, held = linear_memory_loop(q, k, v, gates, bias=bias, algorithm=alg,
                                           retention="decay", read=read, anchor=A)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    assert_loop_state(s, M, Z, held, alg, A, 11 % A)
    if bias == "l2":  # anchoring is another function than the per-token rule
        y1, _ = _rule(bias, alg, "decay", read)(q, k, v, gates=_gates(rule, gates))
        assert (y1 - y).abs().max() > 1e-6
    else:  # the dot bias's gradients ignore the memory: the anchor changes nothing
        y1, _ = _rule(bias, alg, "decay", read)(q, k, v, gates=_gates(rule, gates))
        torch.testing.assert_close(y1, y, atol=1e-12, rtol=0)


@pytest.mark.parametrize("bias,alg,ret,read", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_chunkwise_chunk1_equals_sequential(bias, alg, ret, read):
    q, k, v, gates = make_inputs()
    rule = _rule(bias, alg, ret, read)
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy="core:sequential")
    y1, s1 = rule(q, k, v, gates=g, strategy=chunk(1))
    torch.testing.assert_close(y1, y, atol=1e-10, rtol=0)
    assert_state(s1, s)


@pytest.mark.parametrize("mult", [1, 2], ids=["anchorC", "anchor2C"])
@pytest.mark.parametrize("C", [4, 16, 64])
@pytest.mark.parametrize("bias,alg", [("l2", "gd"), ("l2", "momentum"), ("dot", "momentum")])
@pytest.mark.parametrize("read", ["after", "before"])
def test_chunkwise_equals_sequential_on_the_anchored_rule(mult, C, bias, alg, read):
    """chunk_size C on a rule with anchor = C or 2C: outputs, final state (anchor entries too)
    equal core:sequential, and both equal the hand-written anchored loop."""
    A = mult * C
    q, k, v, gates = make_inputs(T=37, H=2)  # 37 is no multiple of any chunk size
    rule = _rule(bias, alg, "decay", read, anchor=A)
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=chunk(C))
    y_seq, s_seq = rule(q, k, v, gates=g, strategy="core:sequential")
    torch.testing.assert_close(y, y_seq, atol=1e-10, rtol=0)
    assert_state(s, s_seq)
    y_ref, M_ref, Z_ref, held = linear_memory_loop(q, k, v, gates, bias=bias, algorithm=alg,
                                                   retention="decay", read=read, anchor=A)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    assert_loop_state(s, M_ref, Z_ref, held, alg, A, 37 % A)


@pytest.mark.parametrize("C", [4, 16])
def test_chunkwise_gradients_equal_sequential_on_the_anchored_rule(C):
    q, k, v, gates = make_inputs(T=37, H=2, requires_grad=True)
    rule = _rule("l2", "momentum", "decay", "after", anchor=C).bind(2, 4, 5)
    g = _gates(rule, gates)
    M0 = torch.randn(2, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    inputs = (q, k, v, M0, *g.values())

    def grads(strategy):
        state = rule.init_state(2, dtype=torch.float64)
        state["M"] = M0
        y, s = rule(q, k, v, gates=g, state=state, strategy=strategy)
        loss = y.sin().sum() + s["M"].square().sum() + s["Z.M"].sum() + s["anchor.M"].sum()
        return torch.autograd.grad(loss, inputs)

    for a, b in zip(grads(chunk(C)), grads("core:sequential")):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("C", [4, 16, 64])
def test_dot_bias_runs_any_chunk_at_anchor_one(C):
    """A prediction-free bias on linear memory: anchoring changes nothing, so chunkwise takes any
    chunk size on the per-token rule and equals core:sequential."""
    q, k, v, gates = make_inputs(T=37, H=2)
    rule = _rule("dot", "momentum", "decay", "before")
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=chunk(C))
    y_seq, s_seq = rule(q, k, v, gates=g, strategy="core:sequential")
    torch.testing.assert_close(y, y_seq, atol=1e-10, rtol=0)
    assert_state(s, s_seq)


@pytest.mark.parametrize("C", [2, 4, 64])
def test_chunkwise_refuses_a_per_token_rule_at_chunk_above_one(C):
    q, k, v, gates = make_inputs()
    rule = _rule("l2", "momentum", "decay", "after")
    with pytest.raises(StrategyError, match=rf"chunk_size={C} .*anchor = 1.*anchor = {C}"):
        rule(q, k, v, gates=_gates(rule, gates), strategy=chunk(C))


def _split_call(rule, q, k, v, g, cuts, strategy, state=None):
    bounds = [0, *cuts, q.shape[1]]
    ys = []
    for lo, hi in zip(bounds, bounds[1:]):
        y, state = rule(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi],
                        gates={n: x[:, lo:hi] for n, x in g.items()}, state=state, strategy=strategy)
        ys.append(y)
    return torch.cat(ys, dim=1), state


@pytest.mark.parametrize(
    "strategy,anchor,cut",
    [("core:sequential", 1, 5), ("core:sequential", 4, 6), (chunk(1), 1, 7), (chunk(1), 4, 7),
     (chunk(4), 4, 8), (chunk(4), 4, 12), (chunk(4), 4, 6), (chunk(4), 8, 13), (chunk(4), 4, 19)],
    ids=["seq-cut5", "seq-anchor4-cut6", "chunk1-cut7", "chunk1-anchor4-cut7", "chunk4-cut8",
         "chunk4-cut12", "chunk4-cut6", "chunk4-anchor8-cut13", "chunk4-cut19"],
)
def test_state_carry_two_calls_equal_one(strategy, anchor, cut):
    """Any split of a sequence into calls equals one call, on a chunk boundary or not."""
    q, k, v, gates = make_inputs(T=20)
    rule = _rule("l2", "momentum", "decay", "after", anchor=anchor)
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=strategy)
    y2, s2 = _split_call(rule, q, k, v, g, [cut], strategy)
    torch.testing.assert_close(y2, y, atol=1e-10, rtol=0)
    assert_state(s2, s)


def test_chunkwise_split_off_boundary_keeps_absolute_blocks():
    """A call that starts inside an anchor block continues that block (absolute alignment): the
    split result equals the hand-written loop over the whole sequence, not the loop restarted at
    the split (which would be another function)."""
    q, k, v, gates = make_inputs(T=20)
    rule = _rule("l2", "gd", "decay", "after", anchor=4)
    g = _gates(rule, gates)
    y2, s2 = _split_call(rule, q, k, v, g, [6], chunk(4))
    kw = dict(bias="l2", algorithm="gd", retention="decay", read="after", anchor=4)
    y, M, _, held = linear_memory_loop(q, k, v, gates, **kw)
    torch.testing.assert_close(y2, y, atol=1e-10, rtol=0)
    assert_loop_state(s2, M, None, held, "gd", 4, 0)
    # the loop continued from the carried state at the split equals the second call
    ya, Ma, _, heldA = linear_memory_loop(q[:, :6], k[:, :6], v[:, :6],
                                          {n: x[:, :6] for n, x in gates.items()}, **kw)
    yb, Mb, _, _ = linear_memory_loop(q[:, 6:], k[:, 6:], v[:, 6:],
                                      {n: x[:, 6:] for n, x in gates.items()}, **kw,
                                      start=6, M0=Ma, A0=heldA)
    torch.testing.assert_close(torch.cat([ya, yb], 1), y, atol=1e-10, rtol=0)
    # a grid restarted at the split is a different function: the test can tell them apart
    yr, _, _, _ = linear_memory_loop(q[:, 6:], k[:, 6:], v[:, 6:],
                                     {n: x[:, 6:] for n, x in gates.items()}, **kw, M0=Ma)
    assert (yr - y2[:, 6:]).abs().max() > 1e-6


@pytest.mark.parametrize("anchor,strategies", [(1, ["core:sequential", chunk(1)]),
                                               (3, ["core:sequential", chunk(1), chunk(3)])],
                         ids=["anchor1", "anchor3"])
def test_initial_state_is_used(anchor, strategies):
    q, k, v, gates = make_inputs(T=6)
    rule = _rule("l2", "momentum", "decay", "before", anchor=anchor).bind(3, 4, 5)
    g = _gates(rule, gates)
    M0 = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    Z0 = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    state = rule.init_state(2, dtype=torch.float64)
    state.update({"M": M0, "Z.M": Z0})
    if anchor > 1:
        assert torch.equal(state["anchor.pos"], torch.zeros(2, dtype=torch.float64))
        state["anchor.M"] = M0
    for strategy in strategies:
        y, s = rule(q, k, v, gates=g, state=state, strategy=strategy)
        y_ref, M_ref, Z_ref, held = linear_memory_loop(
            q, k, v, gates, bias="l2", algorithm="momentum", retention="decay", read="before",
            anchor=anchor, M0=M0, Z0=Z0)
        torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
        assert_loop_state(s, M_ref, Z_ref, held, "momentum", anchor, 6 % anchor)


@pytest.mark.parametrize("strategy", ["core:sequential", chunk(1), chunk(4), chunk(2)],
                         ids=["sequential", "chunk1", "chunk4", "chunk2"])
def test_a_call_inside_a_block_uses_the_carried_anchor_memory(strategy):
    """A state at position 2 of a 4-token block: the first 2 tokens of the call take their
    gradients at the carried anchor memory, not at the carried memory."""
    q, k, v, gates = make_inputs(T=9)
    rule = _rule("l2", "momentum", "decay", "after", anchor=4)
    g = _gates(rule, gates)
    gen = torch.Generator().manual_seed(3)
    M0, Z0, A0 = (torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    state = {"M": M0, "Z.M": Z0, "anchor.pos": torch.full((2,), 2.0, dtype=torch.float64),
             "anchor.M": A0}
    y, s = rule(q, k, v, gates=g, state=state, strategy=strategy)
    y_ref, M, Z, held = linear_memory_loop(q, k, v, gates, bias="l2", algorithm="momentum",
                                           retention="decay", read="after", anchor=4, start=2,
                                           M0=M0, Z0=Z0, A0=A0)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    assert_loop_state(s, M, Z, held, "momentum", 4, (2 + 9) % 4)
    y0, _ = rule(q, k, v, gates=g, state={**state, "anchor.M": M0}, strategy=strategy)
    assert (y0 - y).abs().max() > 1e-6  # the carried anchor memory mattered


def test_a_batch_must_share_one_block_position():
    q, k, v, gates = make_inputs(T=3)
    rule = _rule("l2", "gd", "decay", "after", anchor=4).bind(3, 4, 5)
    state = rule.init_state(2, dtype=torch.float64)
    state["anchor.pos"] = torch.tensor([0.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"anchor\.pos.*one position for the whole batch"):
        rule(q, k, v, gates=_gates(rule, gates), state=state)


@pytest.mark.parametrize("anchor,strategies", [(1, ["core:sequential", chunk(1)]),
                                               (4, ["core:sequential", "core:chunkwise", chunk(2)])],
                         ids=["anchor1", "anchor4"])
def test_empty_sequence_returns_state_unchanged(anchor, strategies):
    q, k, v, gates = make_inputs(T=0)
    rule = _rule("l2", "gd", "none", "after", anchor=anchor).bind(3, 4, 5)
    for strategy in strategies:
        y, s = rule(q, k, v, gates=_gates(rule, gates), strategy=strategy)
        assert y.shape == (2, 0, 3, 5)
        assert_state(s, rule.init_state(2, dtype=torch.float64), atol=0)
