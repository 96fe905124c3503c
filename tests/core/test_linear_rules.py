"""core:sequential and core:chunkwise against hand-written loops (float64)."""

from itertools import product

import pytest
import torch

import atlas_core as ac

from .conftest import make_inputs
from .loops import linear_memory_loop

COMBOS = list(product(["l2", "dot"], ["gd", "momentum"], ["decay", "none"], ["after", "before"]))


def _rule(bias, alg, ret, read):
    return ac.build_rule({
        "structure": "core:linear", "bias": f"core:{bias}", "retention": f"core:{ret}",
        "algorithm": f"core:{alg}", "feature_map": "core:identity", "read": read,
    })


def _gates(rule, gates):
    return {n: gates[n] for n in rule.gate_names}


@pytest.mark.parametrize("bias,alg,ret,read", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_sequential_matches_hand_written_loop(bias, alg, ret, read):
    q, k, v, gates = make_inputs()
    rule = _rule(bias, alg, ret, read)
    y, state = rule(q, k, v, gates=_gates(rule, gates), strategy="core:sequential")
    y_ref, M_ref, Z_ref = linear_memory_loop(q, k, v, gates, bias=bias, algorithm=alg,
                                             retention=ret, read=read)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(state["M"], M_ref, atol=1e-10, rtol=0)
    if alg == "momentum":
        torch.testing.assert_close(state["Z.M"], Z_ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("bias,alg,ret,read", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_chunkwise_chunk1_equals_sequential(bias, alg, ret, read):
    q, k, v, gates = make_inputs()
    rule = _rule(bias, alg, ret, read)
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy="core:sequential")
    y1, s1 = rule(q, k, v, gates=g, strategy={"use": "core:chunkwise", "chunk_size": 1})
    torch.testing.assert_close(y1, y, atol=1e-10, rtol=0)
    for key in s:
        torch.testing.assert_close(s1[key], s[key], atol=1e-10, rtol=0)


@pytest.mark.parametrize("C", [4, 16, 64])
@pytest.mark.parametrize("bias,alg", [("l2", "gd"), ("l2", "momentum"), ("dot", "momentum")])
@pytest.mark.parametrize("read", ["after", "before"])
def test_chunkwise_equals_anchored_loop(C, bias, alg, read):
    q, k, v, gates = make_inputs(T=37, H=2)  # 37 is no multiple of any chunk size
    rule = _rule(bias, alg, "decay", read)
    y, s = rule(q, k, v, gates=_gates(rule, gates), strategy={"use": "core:chunkwise", "chunk_size": C})
    y_ref, M_ref, Z_ref = linear_memory_loop(q, k, v, gates, bias=bias, algorithm=alg,
                                             retention="decay", read=read, anchor_every=C)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(s["M"], M_ref, atol=1e-10, rtol=0)
    if alg == "momentum":
        torch.testing.assert_close(s["Z.M"], Z_ref, atol=1e-10, rtol=0)


def _split_call(rule, q, k, v, g, cut, strategy):
    y1, s1 = rule(q[:, :cut], k[:, :cut], v[:, :cut], gates={n: x[:, :cut] for n, x in g.items()},
                  strategy=strategy)
    y2, s2 = rule(q[:, cut:], k[:, cut:], v[:, cut:], gates={n: x[:, cut:] for n, x in g.items()},
                  state=s1, strategy=strategy)
    return torch.cat([y1, y2], dim=1), s2


@pytest.mark.parametrize(
    "strategy,cut",
    [("core:sequential", 5), ({"use": "core:chunkwise", "chunk_size": 1}, 7),
     ({"use": "core:chunkwise", "chunk_size": 4}, 8), ({"use": "core:chunkwise", "chunk_size": 4}, 12)],
    ids=["seq-cut5", "chunk1-cut7", "chunk4-cut8", "chunk4-cut12"],
)
def test_state_carry_two_calls_equal_one(strategy, cut):
    q, k, v, gates = make_inputs(T=20)
    rule = _rule("l2", "momentum", "decay", "after")
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=strategy)
    y2, s2 = _split_call(rule, q, k, v, g, cut, strategy)
    torch.testing.assert_close(y2, y, atol=1e-10, rtol=0)
    for key in s:
        torch.testing.assert_close(s2[key], s[key], atol=1e-10, rtol=0)


def test_chunkwise_split_off_boundary_equals_anchored_loop_per_call():
    """With C > 1 the chunk grid restarts at each call (documented): check exactly that."""
    q, k, v, gates = make_inputs(T=20)
    rule = _rule("l2", "gd", "decay", "after")
    g = _gates(rule, gates)
    y2, s2 = _split_call(rule, q, k, v, g, 6, {"use": "core:chunkwise", "chunk_size": 4})
    ya, Ma, _ = linear_memory_loop(q[:, :6], k[:, :6], v[:, :6], {n: x[:, :6] for n, x in gates.items()},
                                   bias="l2", algorithm="gd", retention="decay", read="after", anchor_every=4)
    yb, Mb, _ = linear_memory_loop(q[:, 6:], k[:, 6:], v[:, 6:], {n: x[:, 6:] for n, x in gates.items()},
                                   bias="l2", algorithm="gd", retention="decay", read="after",
                                   anchor_every=4, M0=Ma)
    torch.testing.assert_close(y2, torch.cat([ya, yb], 1), atol=1e-10, rtol=0)
    torch.testing.assert_close(s2["M"], Mb, atol=1e-10, rtol=0)


def test_initial_state_is_used():
    q, k, v, gates = make_inputs(T=6)
    rule = _rule("l2", "momentum", "decay", "before")
    g = _gates(rule, gates)
    M0 = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    Z0 = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    for strategy in ["core:sequential", {"use": "core:chunkwise", "chunk_size": 3}]:
        y, s = rule(q, k, v, gates=g, state={"M": M0, "Z.M": Z0}, strategy=strategy)
        C = 1 if strategy == "core:sequential" else 3
        y_ref, M_ref, Z_ref = linear_memory_loop(q, k, v, gates, bias="l2", algorithm="momentum",
                                                 retention="decay", read="before", anchor_every=C,
                                                 M0=M0, Z0=Z0)
        torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(s["Z.M"], Z_ref, atol=1e-10, rtol=0)


def test_empty_sequence_returns_state_unchanged():
    q, k, v, gates = make_inputs(T=0)
    rule = _rule("l2", "gd", "none", "after")
    for strategy in ["core:sequential", "core:chunkwise"]:
        y, s = rule(q, k, v, gates=_gates(rule, gates), strategy=strategy)
        assert y.shape == (2, 0, 3, 5)
        assert torch.equal(s["M"], torch.zeros(2, 3, 5, 4, dtype=torch.float64))
