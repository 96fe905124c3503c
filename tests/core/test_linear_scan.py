"""``core:chunkwise``'s linear path (atlas_core/forms/linear_scan.py) equals ``core:sequential``
on the same anchored rule: outputs, final state and gradients (inputs, gates, initial state), in
float64, through the hand-written backward of `_Scan` (l2 bias), through autograd (another bias,
recomputation), and through a backward pass that builds a graph (double backward)."""

import pytest
import torch

import atlas_core as ac
from atlas_core.forms import linear_scan

from .conftest import make_inputs

RULES = {
    "titans": {"use": "titans:titans", "anchor": 8},
    "titans-before": {"use": "titans:titans", "anchor": 8, "read": "before"},
    "delta-gd": {"bias": "core:l2", "algorithm": "core:gd", "retention": "core:decay", "anchor": 8},
    "dot-momentum": {"bias": "core:dot", "algorithm": "core:momentum", "retention": "core:decay",
                     "anchor": 8},
}
T = 29  # a ragged last chunk for every C below


def run(rule, strategy, cuts=(), state_grad=True, seed=0):
    q, k, v, gates = make_inputs(B=2, T=T, H=2, Dk=4, Dv=3, seed=seed)
    gates["eta"] = 0.5 + 0.5 * gates["eta"]
    g = {n: gates[n] for n in rule.gate_names}
    init = {n: x for n, x in rule.init_state(2, dtype=torch.float64).items()}
    gen = torch.Generator().manual_seed(seed + 1)
    for n in ("M", "Z.M"):  # a nonzero initial memory and momentum, with gradients
        if n in init:
            init[n] = (0.3 * torch.randn(init[n].shape, generator=gen, dtype=torch.float64)).requires_grad_(state_grad)
    leaves = [q, k, v, *g.values()]
    for t in leaves:
        t.requires_grad_(True)
    bounds, ys, state = [0, *cuts, T], [], init
    for lo, hi in zip(bounds, bounds[1:]):
        y, state = rule(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], gates={n: x[:, lo:hi] for n, x in g.items()},
                        state=state, strategy=strategy)
        ys.append(y)
    y = torch.cat(ys, dim=1)
    w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    loss = (y * w).sum() + sum((x * x).sum() for n, x in state.items() if n != "anchor.pos")
    wrt = leaves + [init[n] for n in ("M", "Z.M") if n in init and init[n].requires_grad]
    grads = torch.autograd.grad(loss, wrt)
    return y.detach(), {n: x.detach() for n, x in state.items()}, grads


def assert_same(a, b):
    ya, sa, ga = a
    yb, sb, gb = b
    torch.testing.assert_close(ya, yb, rtol=1e-9, atol=1e-10)
    assert sa.keys() == sb.keys()
    for n in sa:
        torch.testing.assert_close(sa[n], sb[n], rtol=1e-9, atol=1e-10, msg=n)
    assert len(ga) == len(gb)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-10)


@pytest.fixture(scope="module")
def rules():
    torch.manual_seed(0)
    return {name: ac.build_rule(spec, heads=2, d_key=4, d_value=3).double() for name, spec in RULES.items()}


@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("C", [2, 4, 8])
@pytest.mark.parametrize("cuts", [(), (5, 13)], ids=["one-call", "three-calls"])
def test_linear_path_equals_sequential(rules, name, C, cuts):
    rule = rules[name]
    ref = run(rule, "core:sequential", cuts)
    assert_same(run(rule, {"use": "core:chunkwise", "chunk_size": C}, cuts), ref)


@pytest.mark.parametrize("name", ["titans", "delta-gd"])
def test_recomputed_chunks_equal_the_fused_scan(rules, name):
    rule = rules[name]
    fused = run(rule, {"use": "core:chunkwise", "chunk_size": 4})
    assert_same(run(rule, {"use": "core:chunkwise", "chunk_size": 4, "checkpoint": True}), fused)


def test_l2_runs_the_fused_scan_and_other_biases_do_not(rules, monkeypatch):
    calls = []
    apply = linear_scan._Scan.apply
    monkeypatch.setattr(linear_scan._Scan, "apply", lambda *a: calls.append(1) or apply(*a))
    strategy = {"use": "core:chunkwise", "chunk_size": 4}
    run(rules["titans"], strategy)
    assert calls, "the l2 rule did not run the fused scan"
    calls.clear()
    run(rules["dot-momentum"], strategy)
    run(rules["titans"], {**strategy, "checkpoint": True})
    assert not calls


@pytest.mark.parametrize("name", ["titans", "delta-gd"])
def test_fused_scan_is_twice_differentiable(name):
    rule = ac.build_rule(RULES[name] | {"anchor": 4}, heads=1, d_key=2, d_value=2).double()
    q, k, v, gates = make_inputs(B=1, T=7, H=1, Dk=2, Dv=2, seed=3, requires_grad=True)
    names = list(rule.gate_names)

    def f(k_, v_, *g):
        y, s = rule(q, k_, v_, gates=dict(zip(names, g)), strategy={"use": "core:chunkwise", "chunk_size": 2})
        return y, s["M"]

    inputs = (k, v, *(gates[n] for n in names))
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)
