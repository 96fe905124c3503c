"""``zoo:rwkv7`` against fla-core 0.6.0's generalised delta rule reference
(``fla/ops/generalized_delta_rule/dplr/naive.py``, ``dplr_recurrence``, the loop fla's RWKV-7
kernels compute: ``chunk_rwkv7`` calls the DPLR kernels), loaded by file path, and against a
hand-written float64 loop of the equation.

Map (docs/zoo.md): fla's ``S [Dk, Dv]`` is our ``M^T``; fla multiplies q by ``Dk^-1/2`` inside
``dplr_recurrence``, so it is given ``q * Dk^1/2``; its log decay ``gk = log w``; its ``alpha =
a = -kappa_hat`` and ``beta = b = kappa_hat * iclr`` with ``kappa_hat = kappa / |kappa|``; the write
``k v^T`` carries ``theta = 1``.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError

from ..fla_refs import fla_reference
from .strategies import every_strategy

B, T, H, D = 2, 32, 2, 8
TOL = 1e-5


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=dtype) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    w = 0.7 + 0.3 * torch.rand(B, T, H, D, generator=g, dtype=dtype)
    kappa = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    iclr = torch.rand(B, T, H, D, generator=g, dtype=dtype)
    return q, k, v, {"w": w, "kappa": kappa, "iclr": iclr, "theta": torch.ones(B, T, H, dtype=dtype)}


def _fla(q, k, v, gates, S0=None):
    ref = fla_reference("ops/generalized_delta_rule/dplr/naive.py")
    kh = torch.nn.functional.normalize(gates["kappa"], dim=-1)
    a, b = -kh, kh * gates["iclr"]
    bhtd = lambda x: x.transpose(1, 2)  # noqa: E731 - fla's [B, H, T, D]
    y, S = ref.dplr_recurrence(bhtd(q * D ** 0.5), bhtd(k), bhtd(v), bhtd(a), bhtd(b), bhtd(gates["w"].log()),
                               initial_state=S0, output_final_state=True)
    return y.transpose(1, 2), S


_strategies = every_strategy


def test_rwkv7_equals_fla_dplr_reference():
    q, k, v, gates = _inputs(1)
    S0 = 0.3 * torch.randn(B, H, D, D, generator=torch.Generator().manual_seed(2))
    y_ref, S_ref = _fla(q, k, v, gates, S0.clone())
    rule = ac.build_rule("zoo:rwkv7", heads=H, d_key=D, d_value=D)
    ran, refused = [], []
    for strategy in _strategies():
        try:
            rule.runner(strategy)
        except StrategyError as exc:  # no chunked form: refused, with a reason
            assert str(exc).strip()
            refused.append(str(exc))
            continue
        with torch.no_grad():
            y, st = rule(q, k, v, gates=gates, state={"M": S0.transpose(-1, -2)}, strategy=strategy)
            ys, s = [], {"M": S0.transpose(-1, -2)}
            for a, b in ((0, 5), (5, 6), (6, T)):
                yy, s = rule(q[:, a:b], k[:, a:b], v[:, a:b], gates={n: x[:, a:b] for n, x in gates.items()},
                             state=s, strategy=strategy)
                ys.append(yy)
        scale = max(1.0, float(y_ref.abs().max()))
        torch.testing.assert_close(y, y_ref, rtol=TOL, atol=TOL * scale)
        torch.testing.assert_close(st["M"], S_ref.transpose(-1, -2), rtol=TOL, atol=TOL * scale)
        torch.testing.assert_close(torch.cat(ys, 1), y, rtol=TOL, atol=TOL * scale)
        ran.append(strategy)
    assert ran == ["core:sequential"], ran  # the chunked strategies refuse it
    assert any("strategy core:chunkwise" in r and "zoo:rwkv7" in r for r in refused), refused
    assert any("strategy core:exact_chunk" in r and "zoo:rwkv7" in r for r in refused), refused


def test_rwkv7_equals_its_equation_in_float64():
    q, k, v, gates = _inputs(3, dtype=torch.float64)
    gates["theta"] = 0.5 + 0.5 * torch.rand(B, T, H, dtype=torch.float64)
    rule = ac.build_rule("zoo:rwkv7", heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        y, st = rule(q, k, v, gates=gates)
    M, ys = torch.zeros(B, H, D, D, dtype=torch.float64), []
    for t in range(T):
        kh = gates["kappa"][:, t] / gates["kappa"][:, t].norm(dim=-1, keepdim=True)
        a, b = -kh, kh * gates["iclr"][:, t]
        A = torch.diag_embed(gates["w"][:, t]) + a[..., :, None] * b[..., None, :]  # [B, H, Dk, Dk]
        M = M @ A + gates["theta"][:, t, :, None, None] * v[:, t, :, :, None] * k[:, t, :, None, :]
        ys.append(torch.einsum("bhvk,bhk->bhv", M, q[:, t]))
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(st["M"], M, rtol=1e-12, atol=1e-12)


def test_rwkv7_needs_a_matrix_memory_and_the_key_dimension():
    with pytest.raises(SpecError, match="core:linear"):
        ac.build_rule({"use": "zoo:rwkv7", "structure": "titans:mlp"})
    rule = ac.build_rule("zoo:rwkv7")
    assert {g.name: g.shape for g in rule.gates} == {"theta": "head", "w": "key", "kappa": "key", "iclr": "key"}


def test_chunked_strategies_refuse_the_transition_with_its_reason():
    rule = ac.build_rule({"use": "zoo:rwkv7"})
    for strategy in ("core:chunkwise", "core:exact_chunk"):
        with pytest.raises(StrategyError, match="per-token matrix"):
            rule.runner(strategy)
