"""The dual form of ``core:chunkwise`` on ``titans:mlp`` (`atlas_core.forms.anchored_chunk.dual_chunk`): every token is
read at its own weights through rank-one gradient factors, never forming per-token weights. It must
equal the per-token path (`_generic_chunk`, which forms them) and the anchored reference loop on
outputs, final state and gradients (the reference on the rule with anchor = C, the block the
chunk's gradients are taken at), float64, for gd and momentum, windows 1 and 3, reads after and
before, depths 1 to 3, with and without the residual."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import atlas_core as ac
from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams

DT = torch.float64
CASES = [
    ("core:gd", "core:l2", "after", 2, True, "silu"),
    ("core:gd", "core:l2", "before", 1, True, "tanh"),
    ("core:momentum", "core:l2", "after", 2, True, "gelu"),
    ("core:momentum", "core:l2", "before", 3, False, "silu"),
    ("core:gd", {"use": "omega:window", "window": 3}, "after", 3, False, "tanh"),
    ("core:momentum", {"use": "omega:window", "window": 3}, "before", 2, True, "silu"),
    ("core:momentum", "core:dot", "after", 2, True, "silu"),
]


def make(alg, bias, read, depth, residual, act, B=2, T=21, H=2, D=4, seed=0, anchor=None):
    torch.manual_seed(seed)
    spec = {"use": "titans:titans_deep", "algorithm": alg, "bias": bias, "read": read,
            "structure": {"use": "titans:mlp", "depth": depth, "expansion": 2.0,
                          "residual": residual, "activation": act}}
    if anchor is not None:
        spec["anchor"] = anchor
    rule = ac.build_rule(spec, heads=H, d_key=D, d_value=D).to(DT)
    g = torch.Generator().manual_seed(seed + 1)
    q, k, v = (F.normalize(torch.randn(B, T, H, D, generator=g, dtype=DT), dim=-1) for _ in range(3))
    gates = {}
    for n in rule.gate_names:
        lo = 0.85 if n in ("alpha", "eta", "gamma") else 0.05
        gates[n] = lo + 0.1 * torch.rand(B, T, H, generator=g, dtype=DT)
    return rule, q, k, v, gates


class PerToken(Chunkwise):
    """core:chunkwise with the dual form switched off: per-token weights (`generic_chunk`)."""

    def dual_path(self, rule) -> bool:
        return False


def run(strategy, rule, q, k, v, gates):
    p = rule.prepare(q, k, v, gates)
    y, state = strategy.run_torch(rule, p)
    return y, state


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) if not isinstance(x, dict) else "win3" for x in c))
@pytest.mark.parametrize("C", [1, 8])
def test_dual_form_equals_per_token_path_and_anchored_reference(case, C):
    rule, q, k, v, gates = make(*case, anchor=C)
    dual, per_token = Chunkwise(ChunkwiseParams(chunk_size=C)), PerToken(ChunkwiseParams(chunk_size=C))
    assert dual.dual_path(rule)
    y1, s1 = run(dual, rule, q, k, v, gates)
    y2, s2 = run(per_token, rule, q, k, v, gates)
    yr, sr = rule.reference(rule.prepare(q, k, v, gates))  # core:sequential on the anchored rule
    scale = yr.abs().max()
    assert (y1 - y2).abs().max() <= 1e-12 * scale
    assert (y1 - yr).abs().max() <= 1e-12 * scale
    assert set(s1) == set(sr)
    for key in sr:
        torch.testing.assert_close(s1[key], s2[key], rtol=1e-11, atol=1e-13)
        torch.testing.assert_close(s1[key], sr[key], rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("case", CASES[:4] + CASES[5:6], ids=["gd-after", "gd-before", "mom-after", "mom-before", "mom-win3"])
def test_dual_form_gradients_equal_per_token_path(case):
    rule, q, k, v, gates = make(*case, T=13)
    leaves = [q, k, v, *gates.values()]
    for x in leaves:
        x.requires_grad_(True)
    params = list(rule.parameters())
    assert params, "titans:mlp has learned initial weights"

    def grads(strategy):
        y, state = run(strategy, rule, q, k, v, gates)
        g = torch.Generator().manual_seed(7)
        loss = (y * torch.randn(y.shape, generator=g, dtype=DT)).sum()
        for key in sorted(state):
            loss = loss + (state[key] * torch.randn(state[key].shape, generator=g, dtype=DT)).sum()
        return torch.autograd.grad(loss, leaves + params)

    a = grads(Chunkwise(ChunkwiseParams(chunk_size=4)))
    b = grads(PerToken(ChunkwiseParams(chunk_size=4)))
    for ga, gb in zip(a, b):
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


def test_dual_form_is_twice_differentiable_gradcheck():
    rule, q, k, v, gates = make("core:momentum", "core:l2", "after", 2, True, "silu", B=1, T=6, H=1, D=2)
    strategy = Chunkwise(ChunkwiseParams(chunk_size=3))

    def f(k_, v_):
        y, state = run(strategy, rule, q, k_, v_, gates)
        return y, state["W1"]

    k.requires_grad_(True)
    v.requires_grad_(True)
    assert torch.autograd.gradcheck(f, (k, v))
    assert torch.autograd.gradgradcheck(f, (k, v))


@pytest.mark.parametrize("depth,residual", [(1, False), (2, True), (3, False)])
def test_grad_factors_rebuild_the_per_token_gradients(depth, residual):
    rule, q, k, v, gates = make("core:gd", "core:l2", "after", depth, residual, "gelu")
    S = rule.structure
    W = rule.init_state(2, dtype=DT)
    W = {name: W[name] for name in S.weight_shapes()}
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 5, S.d_in, generator=g, dtype=DT)
    u = torch.randn(2, 2, 5, S.d_out, generator=g, dtype=DT)
    full = S.grad_per_token(W, x, u)
    factors = S.grad_factors(W, x, u)
    assert set(factors) == set(full)
    for name, (delta, z) in factors.items():
        rebuilt = delta.unsqueeze(-1) * z.unsqueeze(-2)
        torch.testing.assert_close(rebuilt, full[name], rtol=1e-12, atol=1e-14)


def test_structures_without_factors_keep_the_per_token_path():
    """A structure that does not declare rank_one_grads (here titans:mlp with the declaration
    withdrawn) is not sent to the dual form."""
    rule, *_ = make("core:gd", "core:l2", "after", 2, True, "silu")
    assert Chunkwise().dual_path(rule)

    class Plain(type(rule.structure)):
        rank_one_grads = False

    rule.structure.__class__ = Plain
    rule.structure = rule.structure  # a knob set again: the rule's form (read once) is read again
    assert not Chunkwise().dual_path(rule)
