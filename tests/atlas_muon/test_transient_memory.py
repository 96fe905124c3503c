"""``atlas_muon:atlas_parallel`` materialises per-token weights (momenta, NS iterates) one chunk at
a time: no operator, forward or backward, allocates an O(T d^2) tensor; the d^2-sized ones hold at
most the C + c - 1 tokens of one chunk's (window-extended) span."""

import pytest
import torch

import atlas_core as ac
from tests.omega.test_omega_memory import LargestAllocation

from .conftest import make_inputs

SPECS = {
    "linear": {"retention": "core:decay", "algorithm": "atlas_muon:muon", "anchor": 8},
    "linear-window8": {"use": "atlas_muon:atlas_linear"},
    "deep-window8": {"use": "atlas_muon:atlas", "structure": {"use": "titans:mlp", "expansion": 1.0}},
}


@pytest.mark.parametrize("name", list(SPECS))
def test_transient_memory_is_per_chunk(name):
    B, H, D, C, T = 1, 2, 16, 8, 128
    rule = ac.build_rule(SPECS[name], heads=H, d_key=D, d_value=D).double()
    c = rule.window
    q, k, v, gates = make_inputs(B=B, T=T, H=H, Dk=D, Dv=D, gamma=True, requires_grad=True)
    gates = {n: g for n, g in gates.items() if n in rule.gate_names}
    with LargestAllocation() as probe:
        y, s = rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": C})
        (y.sum() + sum(x.sum() for x in s.values())).backward()
    numel, shape, op = probe.largest
    N = T // C
    per_chunk = (C + c - 1) * D * D  # one chunk's per-token weights over its window span
    assert numel <= B * H * max(per_chunk, N * (C + c - 1) * D, (T + c - 1) * D), (shape, op)
    assert numel < B * H * T * D * D // 4, f"{op} produced {shape}: O(T d^2)"


@pytest.mark.parametrize("name,weights", [("linear", 1), ("deep-window8", 2)])
def test_newton_schulz_runs_once_per_weight_per_chunk_on_every_token(name, weights, monkeypatch):
    """NS is applied to all C momenta of a chunk in one batched call (per weight matrix)."""
    from atlas_plugins.atlas_muon.muon import Muon

    calls = []
    real = Muon.ns
    monkeypatch.setattr(Muon, "ns", lambda self, Z: calls.append(tuple(Z.shape)) or real(self, Z))
    B, H, D, C, T = 1, 2, 4, 4, 11
    rule = ac.build_rule(SPECS[name], heads=H, d_key=D, d_value=D).double()
    q, k, v, gates = make_inputs(B=B, T=T, H=H, Dk=D, Dv=D, gamma=True)
    gates = {n: g for n, g in gates.items() if n in rule.gate_names}
    with torch.no_grad():
        rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": C})
    assert len(calls) == 3 * weights  # chunks of 4, 4, 3 tokens
    assert sorted(s[2] for s in calls) == sorted([4, 4, 3] * weights)  # every token of the chunk
    assert all(s[:2] == (B, H) and len(s) == 5 for s in calls)  # [B, H, n, r, c]
