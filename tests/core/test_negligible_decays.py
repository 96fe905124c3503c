"""Decay factors below `decay_floor` are 0 in the chunked forms (docs/math.md, "Negligible
factors"): no subnormal number reaches the chunk loop's products, and every result still equals
``core:sequential``. Gates here decay by e^-4 to e^-40 a token, so a chunk's products run far
past the floor and past the smallest subnormal number."""

import math

import pytest
import torch

import atlas_core as ac
from atlas_core.forms import exact_chunk
from atlas_core.forms.decay import decay_floor, decay_matrix

from .conftest import make_inputs

# per-token log-decay: a chunk of 64 sums to about -256 (float32) or -1,920 (float64), both
# beyond the smallest subnormal number (-103 and -744)
STEP = {torch.float32: 4.0, torch.float64: 30.0}


def _subnormals(x: torch.Tensor) -> int:
    return int(((x.abs() < torch.finfo(x.dtype).tiny) & (x != 0)).sum())


def _strong_gates(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    step = scale * STEP[dtype]
    return torch.exp(-step * (0.5 + torch.rand(shape, generator=g, dtype=torch.float64))).to(dtype)


def _start(rule, dtype):
    """A nonzero start for the memory (and the momentum): its decayed share runs out too."""
    return {n: 0.5 * torch.randn(x.shape, dtype=dtype) for n, x in rule.init_state(1, dtype=dtype).items()}


def test_the_floor_of_each_dtype():
    assert decay_floor(torch.float32) == 2.0 ** -102
    assert decay_floor(torch.bfloat16) == 2.0 ** -118
    assert decay_floor(torch.float64) == 2.0 ** -969
    assert decay_floor(torch.float16) == 0.0  # float16 keeps every factor


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-4), (torch.float64, 1e-11)])
def test_decay_matrix_keeps_the_factors_above_the_floor_and_zeroes_the_rest(dtype, rtol):
    a = _strong_gates((3, 64), dtype, seed=1)
    L = decay_matrix(a)
    # the products from sums of logs in float64: exp of a segment, 0 above the diagonal
    cs = torch.log(a.double()).cumsum(-1)
    seg = cs.unsqueeze(-1) - cs.unsqueeze(-2)
    ref = torch.exp(seg)
    lower = torch.ones(64, 64, dtype=torch.bool).tril()
    kept = lower & (seg >= math.log(decay_floor(dtype)))
    assert (lower & ~kept).any(), "the gates must reach the floor"
    assert (L[~kept] == 0).all()
    torch.testing.assert_close(L[kept].double(), ref[kept], rtol=rtol, atol=0)
    assert _subnormals(L) == 0


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("spec", [{"retention": "core:decay"},
                                  {"retention": "core:decay", "algorithm": "core:momentum"}],
                         ids=["gated-delta", "momentum"])
def test_exact_chunk_on_strong_decays_feeds_no_subnormals_and_equals_sequential(dtype, tol, spec,
                                                                                monkeypatch):
    q, k, v, gates = make_inputs(B=1, T=160, H=2, Dk=8, Dv=6, dtype=dtype, seed=5)
    gates["alpha"] = _strong_gates(gates["alpha"].shape, dtype, seed=2)
    gates["alpha"][:, :40] = 0.99  # slow decay first: the memory holds values when the fast part begins
    gates["eta"] = _strong_gates(gates["eta"].shape, dtype, seed=3)
    rule = ac.build_rule(spec, heads=2, d_key=8, d_value=6)
    g = {n: gates[n] for n in rule.gate_names}
    state = _start(rule, dtype)

    seen = []
    loop = exact_chunk.ExactPieces.loop
    monkeypatch.setattr(exact_chunk.ExactPieces, "loop",
                        lambda self, St: (seen.append(self), loop(self, St))[1])
    y, s = rule(q, k, v, gates=g, state=state, strategy={"use": "core:exact_chunk", "chunk_size": 64})
    assert len(seen) == 1
    for name in ("W", "U", "Dn", "Qs", "Pm", "mix"):
        assert _subnormals(getattr(seen[0], name)) == 0, name

    y_ref, s_ref = rule(q, k, v, gates=g, state=state, strategy="core:sequential")
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    for n in s_ref:
        torch.testing.assert_close(s[n], s_ref[n], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float64, 1e-10)])
def test_the_anchored_form_on_strong_decays_feeds_no_subnormals_and_equals_sequential(dtype, tol,
                                                                                      monkeypatch):
    """``core:chunkwise`` (anchor 16, momentum): its decay kernels carry no subnormal number."""
    from atlas_core.forms import linear_scan
    from atlas_core.strategies import chunkwise

    q, k, v, gates = make_inputs(B=1, T=96, H=2, Dk=8, Dv=6, dtype=dtype, seed=7)
    # chunks of 16: twice the decay a token, so that a chunk still runs past the subnormals
    gates["alpha"] = _strong_gates(gates["alpha"].shape, dtype, seed=4, scale=2.0)
    gates["alpha"][:, :32] = 0.99
    gates["eta"] = _strong_gates(gates["eta"].shape, dtype, seed=6, scale=2.0)
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum", "anchor": 16},
                         heads=2, d_key=8, d_value=6)
    g = {n: gates[n] for n in rule.gate_names}
    state = _start(rule, dtype)

    seen = []
    for module, name in ((chunkwise, "chunk_kernels"), (linear_scan, "linear_kernels")):
        made = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, made=made, **kw: seen.append(made(*a, **kw)) or seen[-1])
    y, s = rule(q, k, v, gates=g, state=state, strategy={"use": "core:chunkwise", "chunk_size": 16})
    assert seen, "the anchored form ran"
    for kern in seen:
        for name, x in kern.items():
            assert _subnormals(x) == 0, name

    y_ref, s_ref = rule(q, k, v, gates=g, state=state, strategy="core:sequential")
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    for n in s_ref:
        torch.testing.assert_close(s[n], s_ref[n], atol=tol, rtol=tol)


class _ProductSpy:
    """Stands in for ``torch`` inside the per-key form: records the subnormal numbers of each
    chunk product's left operand (the form's pieces; the right one is the memory or the errors)."""

    def __init__(self):
        self.subnormals = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def bmm(self, a, b):
        self.subnormals.append(_subnormals(a))
        return torch.bmm(a, b)

    def baddbmm(self, c, a, b, **kw):
        self.subnormals.append(_subnormals(a))
        return torch.baddbmm(c, a, b, **kw)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("name, strategy",
                         [("zoo:kda", "core:exact_chunk"), ("zoo:gla", "core:chunkwise")])
def test_per_key_decay_on_strong_decays_feeds_no_subnormals_and_equals_sequential(name, strategy,
                                                                                 dtype, tol,
                                                                                 monkeypatch):
    from atlas_core.forms import key_decay_chunk

    q, k, v, gates = make_inputs(B=1, T=160, H=2, Dk=8, Dv=6, dtype=dtype, seed=9)
    alpha = _strong_gates((1, 160, 2, 8), dtype, seed=8)  # per key dimension
    alpha[:, :40] = 0.99
    rule = ac.build_rule(name, heads=2, d_key=8, d_value=6).to(dtype)
    g = {"alpha": alpha, "theta": gates["theta"]}
    g = {n: g[n] for n in rule.gate_names}
    state = {"M": 0.5 * torch.randn(1, 2, 6, 8, dtype=dtype)}

    spy = _ProductSpy()
    monkeypatch.setattr(key_decay_chunk, "torch", spy)
    y, s = rule(q, k, v, gates=g, state=state, strategy={"use": strategy, "chunk_size": 64})
    monkeypatch.undo()
    assert len(spy.subnormals) >= 3 * 3, "the per-key chunk loop ran"
    assert sum(spy.subnormals) == 0

    y_ref, s_ref = rule(q, k, v, gates=g, state=state, strategy="core:sequential")
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(s["M"], s_ref["M"], atol=tol, rtol=tol)
