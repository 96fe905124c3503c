"""``omega:poly`` and ``omega:taylor`` against their formulas; memory shapes follow Dphi;
gradients reach learned coefficients and projections; float64 gradcheck on tiny sizes."""

import math

import pytest
import torch

import atlas_core as ac
from atlas_core.host.manager import get_registry

from .conftest import gates_for, make_inputs, window_rule


def fmap(value, d_in):
    m = get_registry().build("feature_map", value, path="feature_map")
    m.bind(d_in)
    return m


def test_poly_elementwise_fixed_is_the_sum_of_powers():
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    m = fmap({"use": "omega:poly", "degree": 3, "coefficients": "fixed"}, 4)
    assert m.out_dim(4) == 4 and not list(m.parameters())
    torch.testing.assert_close(m(x), x + x * x + x * x * x, atol=1e-14, rtol=0)


def test_poly_elementwise_learned_starts_at_inverse_factorials():
    x = torch.randn(7, 3, dtype=torch.float64)
    m = fmap({"use": "omega:poly", "degree": 4}, 3)
    assert isinstance(m.coef, torch.nn.Parameter)
    torch.testing.assert_close(m.coef.detach(), torch.tensor([1.0, 1 / 2, 1 / 6, 1 / 24]))
    with torch.no_grad():
        m.coef.copy_(torch.tensor([0.5, -2.0, 3.0, 0.25]))
    want = 0.5 * x - 2.0 * x**2 + 3.0 * x**3 + 0.25 * x**4
    torch.testing.assert_close(m(x), want, atol=1e-6, rtol=1e-6)  # coef is float32


def test_poly_degree_one_fixed_is_identity():
    x = torch.randn(4, 3, dtype=torch.float64)
    assert torch.equal(fmap({"use": "omega:poly", "degree": 1, "coefficients": "fixed"}, 3)(x), x)


@pytest.mark.parametrize("projection", ["learned", "fixed"])
def test_poly_tensor_is_a_projection_of_x_and_its_kronecker_square(projection):
    d, dim = 3, 5
    m = fmap({"use": "omega:poly", "mode": "tensor", "dim": dim, "projection": projection}, d)
    assert m.out_dim(d) == dim and tuple(m.P.shape) == (dim, d + d * d)
    assert isinstance(m.P, torch.nn.Parameter) == (projection == "learned")
    x = torch.randn(6, d, dtype=torch.float64)
    P = m.P.detach().double()
    for n in range(6):
        feats = [x[n, i] for i in range(d)] + [x[n, i] * x[n, j] for i in range(d) for j in range(d)]
        want = P @ torch.stack(feats)
        torch.testing.assert_close(m(x)[n], want, atol=1e-12, rtol=0)


def test_poly_tensor_degree_three_appends_the_cube():
    d = 2
    m = fmap({"use": "omega:poly", "mode": "tensor", "dim": 3, "degree": 3}, d)
    assert m.P.shape == (3, 2 + 4 + 8)
    x = torch.randn(d, dtype=torch.float64)
    cube = torch.stack([x[i] * x[j] * x[l] for i in range(d) for j in range(d) for l in range(d)])
    feats = torch.cat([x, torch.outer(x, x).reshape(-1), cube])
    torch.testing.assert_close(m(x), m.P.detach().double() @ feats, atol=1e-12, rtol=0)


def test_fixed_projection_is_deterministic_by_seed():
    spec = {"use": "omega:poly", "mode": "tensor", "dim": 4, "projection": "fixed", "seed": 3}
    a, b = fmap(spec, 3), fmap(spec, 3)
    c = fmap({**spec, "seed": 4}, 3)
    assert torch.equal(a.P, b.P) and not torch.equal(a.P, c.P)
    assert "P" in dict(a.named_buffers()) and not list(a.parameters())


def test_taylor_dot_product_identity():
    d = 5
    m = fmap("omega:taylor", d)
    assert m.out_dim(d) == 1 + d + d * d
    q = torch.randn(8, d, dtype=torch.float64)
    k = torch.randn(8, d, dtype=torch.float64)
    qk = (q * k).sum(-1)
    want = 1 + qk / math.sqrt(d) + qk**2 / (2 * d)
    torch.testing.assert_close((m(q) * m(k)).sum(-1), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(m(q)[:, 0], torch.ones(8, dtype=torch.float64))


@pytest.mark.parametrize("feature_map,dphi", [
    ({"use": "omega:poly", "degree": 2}, 3),
    ({"use": "omega:poly", "mode": "tensor", "dim": 7}, 7),
    ("omega:taylor", 13),
])
@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ({"use": "core:chunkwise", "chunk_size": 4}, 4)],
                         ids=["sequential", "chunkwise4-anchor4"])
def test_memory_shape_follows_dphi(feature_map, dphi, strategy, anchor):
    q, k, v, gates = make_inputs(T=6, Dk=3, Dv=4)
    rule = window_rule(3, "gate", "core:momentum", feature_map=feature_map, anchor=anchor)
    y, s = rule(q, k, v, gates=gates_for(rule, gates), strategy=strategy)
    assert y.shape == v.shape
    assert s["M"].shape == (2, 2, 4, dphi) and s["Z.M"].shape == (2, 2, 4, dphi)
    assert s["window.k"].shape == (2, 2, 2, dphi)
    if anchor > 1:  # the block's anchor memory has the memory's shape
        assert s["anchor.M"].shape == (2, 2, 4, dphi) and s["anchor.pos"].shape == (2,)


@pytest.mark.parametrize("feature_map,param", [
    ({"use": "omega:poly", "degree": 3}, "feature_map.coef"),
    ({"use": "omega:poly", "mode": "tensor", "dim": 6}, "feature_map.P"),
])
def test_gradients_reach_learned_map_parameters(feature_map, param):
    q, k, v, gates = make_inputs(T=7, Dk=3, Dv=4)
    for anchor, strategy in ((1, "core:sequential"), (4, "core:sequential"),
                             (4, {"use": "core:chunkwise", "chunk_size": 4})):
        rule = ac.build_rule({"use": "omega:omeganet", "feature_map": feature_map, "anchor": anchor},
                             heads=2, d_key=3, d_value=4)
        params = dict(rule.named_parameters())
        assert list(params) == [param]
        y, _ = rule(q, k, v, gates=gates_for(rule, gates), strategy=strategy)
        y.pow(2).sum().backward()
        grad = params[param].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0


def _gradcheck_rule(feature_map, strategy, anchor):
    rule = window_rule(3, "gate", "core:momentum", feature_map=feature_map, anchor=anchor)
    rule = rule.bind(heads=1, d_key=2, d_value=2).double()  # creates the map's parameters
    q, k, v, gates = make_inputs(B=1, T=5, H=1, Dk=2, Dv=2, seed=9, requires_grad=True)
    g = gates_for(rule, gates)
    names = list(g)
    params = dict(rule.named_parameters())
    learned = list(params.values())
    assert len(learned) == (0 if feature_map == "omega:taylor" else 1)

    def f(q, k, v, *rest):
        gs = dict(zip(names, rest[: len(names)]))
        over = dict(zip(params, rest[len(names):]))
        y, s = torch.func.functional_call(rule, over, (q, k, v), {"gates": gs, "strategy": strategy})
        return y, s["M"], s["Z.M"]

    inputs = (q, k, v, *g.values(), *[p.detach().clone().requires_grad_(True) for p in learned])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("feature_map", [
    {"use": "omega:poly", "degree": 2},
    {"use": "omega:poly", "mode": "tensor", "dim": 3},
    "omega:taylor",
], ids=["poly-elementwise", "poly-tensor", "taylor"])
@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ({"use": "core:chunkwise", "chunk_size": 2}, 2)],
                         ids=["sequential", "chunkwise2-anchor2"])
def test_gradcheck_tiny(feature_map, strategy, anchor):
    _gradcheck_rule(feature_map, strategy, anchor)
