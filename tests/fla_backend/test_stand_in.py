"""The stand-in for fla's chunk ops (stand_in.py) before it stands in: each against fla-core
0.6.0's own naive loop (``fla/ops/<op>/naive.py``, loaded by path) with an initial state and a
scale, outputs, final state and gradients (tests/fla_oracle checks the same loop without a state);
and every call the backends make binds to the real entry point's signature (the stand-ins take
more than fla does not: a keyword fla lacks would fail here)."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("fla.ops")

from tests.fla_backend import stand_in as S  # noqa: E402
from tests.fla_backend.calls import PRESETS, call, rule_of, through_backend  # noqa: E402
from tests.fla_refs import fla_reference  # noqa: E402

B, T, H, K, V = 2, 9, 3, 8, 5


def _inputs(seed=0, key_gate=False):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=g), torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    beta = torch.rand(B, T, H, generator=g)
    gate = -torch.rand(B, T, H, *((K,) if key_gate else ()), generator=g)
    h0 = torch.randn(B, H, K, V, generator=g)
    return [x.requires_grad_() for x in (q, k, v, beta, gate, h0)]


def _same(ours, theirs, leaves):
    (o1, s1), (o2, s2) = ours, theirs
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)
    w, ws = torch.randn_like(o1), torch.randn_like(s1)
    g1 = torch.autograd.grad((o1 * w).sum() + (s1 * ws).sum(), leaves, retain_graph=True, allow_unused=True)
    g2 = torch.autograd.grad((o2 * w).sum() + (s2 * ws).sum(), leaves, allow_unused=True)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def t(x):
    return x.transpose(1, 2)


def test_delta_rule():
    ref = fla_reference("ops/delta_rule/naive.py").delta_rule_recurrence
    q, k, v, beta, _, h0 = _inputs()
    ours = S.chunk_delta_rule(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta, initial_state=h0,
                              output_final_state=True)
    o, s = ref(t(q.bfloat16()), t(k.bfloat16()), t(v.bfloat16()), t(beta), initial_state=h0)
    _same((ours[0].float(), ours[1]), (t(o).float(), s), (q, k, v, beta, h0))
    with pytest.raises(AssertionError, match="does not support float32"):
        S.chunk_delta_rule(q, k, v, beta)


def test_gated_delta_rule():
    ref = fla_reference("ops/gated_delta_rule/naive.py").naive_recurrent_gated_delta_rule
    q, k, v, beta, g, h0 = _inputs(1)
    ours = S.chunk_gated_delta_rule(q, k, v, g, beta, scale=0.7, initial_state=h0, output_final_state=True)
    theirs = ref(q, k, v, beta, g, scale=0.7, initial_state=h0, output_final_state=True)
    _same(ours, theirs, (q, k, v, beta, g, h0))


def test_kda():
    ref = fla_reference("ops/kda/naive.py").naive_recurrent_kda
    q, k, v, beta, g, h0 = _inputs(2, key_gate=True)
    ours = S.chunk_kda(q, k, v, g, beta, scale=1.0, initial_state=h0, output_final_state=True)
    theirs = ref(q, k, v, g, beta, scale=1.0, initial_state=h0, output_final_state=True)
    _same(ours, theirs, (q, k, v, beta, g, h0))
    with pytest.raises(AssertionError, match="initial_state must be in float32"):
        S.chunk_kda(q, k, v, g, beta, initial_state=h0.double())


def test_gla():
    ref = fla_reference("ops/gla/naive.py").naive_recurrent_gla  # scales q by 1/sqrt(K) itself
    q, k, v, _, g, h0 = _inputs(3, key_gate=True)
    ours = S.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    theirs = ref(q, k, v, g, initial_state=h0, output_final_state=True)
    _same(ours, theirs, (q, k, v, g, h0))


def test_simple_gla():
    ref = fla_reference("ops/simple_gla/naive.py").naive_recurrent_simple_gla
    q, k, v, _, g, h0 = _inputs(4)
    ours = S.chunk_simple_gla(q, k, v, g=g, scale=1.0, initial_state=h0, output_final_state=True)
    theirs = ref(q, k, v, g, scale=1.0, initial_state=h0, output_final_state=True)
    _same(ours, theirs, (q, k, v, g, h0))
    # no gate: linear attention
    zero = torch.zeros_like(g)
    ours = S.chunk_simple_gla(q, k, v, scale=1.0, initial_state=h0, output_final_state=True)
    theirs = ref(q, k, v, zero, scale=1.0, initial_state=h0, output_final_state=True)
    _same(ours, theirs, (q, k, v, h0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_backend_call_binds_to_fla_signature(certs, dtype):
    """The calls the backends make (recorded through the stand-ins) bind to fla 0.6.0's own
    entry points: no keyword fla lacks, no argument missing."""
    from atlas_plugins.fla_backend.mapping import OPS

    real = {}
    for module, attr in OPS.values():
        real[attr] = getattr(__import__(module, fromlist=[attr]), attr)
    seen = []

    def recorder(name):
        def fn(*args, **kwargs):
            seen.append((name, args, kwargs))
            return S.STAND_INS[name](*args, **kwargs)
        return fn

    with S.fla_ops_on_cpu({name: recorder(name) for name in S.STAND_INS}):
        for preset, backend in PRESETS.items():
            rule = rule_of(preset)
            through_backend(rule, "core:exact_chunk", backend, call(rule, 3, dtype=dtype))
    assert {name for name, _, _ in seen} == ({"chunk_gated_delta_rule", "chunk_kda", "chunk_gla", "chunk_simple_gla"}
                                             | ({"chunk_delta_rule"} if dtype == torch.bfloat16 else set()))
    for name, args, kwargs in seen:
        inspect.signature(real[name]).bind(*args, **kwargs)  # raises TypeError if it does not fit
        assert kwargs["scale"] == 1.0 and kwargs["output_final_state"] is True
        assert kwargs["initial_state"].dtype == torch.float32
        assert "cu_seqlens" not in kwargs
